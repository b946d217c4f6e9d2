"""The data exchange of a host's PMIx server with the others (services/pmix.py hosts it):
fences that span hosts and direct modex.

PMIx completes a fence among this host's ranks itself and calls up once per host when the
fence spans hosts: the agent sends its host's data up (PmixFence), the controller joins every
host's and sends the result back (PmixFenceDone). A fence over ranks of several jobs (Open MPI's
MPI_Comm_disconnect) is a collective of services/pmix_dyn.py. A rank that wants another host's
rank's data before any fence asks its server, which calls up (direct modex): the request goes
to that rank's host (PmixDmodex), whose server gives the data once the rank has committed it.
"""

from __future__ import annotations

import base64
import ctypes
import time

from mpilaunch.agent.services import pmix_lib as lib
from mpilaunch.protocol.messages import (
    Note,
    PmixDmodex,
    PmixDmodexAsk,
    PmixDmodexData,
    PmixDmodexDone,
    PmixFence,
    PmixFenceDone,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.services.pmix_served import PmixSide


REQUIRED_KEY = "pmix.req.key"  # PMIX_REQUIRED_KEY in a direct modex's info
DMODEX_RETRY = 0.01  # seconds between asks for data that lacks the required key
DMODEX_PATIENCE = 10.0  # ... for at most this long


class PmixModex:
    """Fences across hosts and direct modex, for one agent's PMIx server."""

    def __init__(self, service: PmixSide, across: Callable[..., None]) -> None:
        self.service = service
        self.across = across  # a fence over ranks of several jobs: (kind, members, data, callback, cbdata)
        self.waiting: dict[tuple[int, str], tuple[object, int]] = {}  # (job, fence key) -> (callback, cbdata)
        self.held: dict[int, tuple[object, object]] = {}  # buffers PMIx has not released yet
        self.dmodex_waiting: dict[int, tuple[object, int]] = {}  # our request -> (modex callback, cbdata)
        self.last_req = 0
        self.early_asks: dict[int, list[PmixDmodexAsk]] = {}  # job -> asks that came before its launch
        self.asks_later: list[tuple[float, PmixDmodexAsk]] = []  # asked again at that time (see tries)
        self.asked_since: dict[tuple[int, int, int], float] = {}  # (job, asking host, req) -> first asked

    # -- upcalls, on PMIx's thread: queued for the loop ---------------------------------------
    def fence_upcall(self, procs, nprocs, info, ninfo, data, ndata, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        members = sorted({(procs[i].nspace.decode(errors="replace"), int(procs[i].rank)) for i in range(nprocs)})
        blob = ctypes.string_at(data, ndata) if ndata else b""
        if len({nspace for nspace, _ in members}) > 1:  # ranks of several jobs: MPI_Comm_disconnect
            self.service.post(self.across, "fence", members, blob, cb, cbdata)
        else:
            self.service.post(self.fence, members[0][0], tuple(rank for _, rank in members), blob, cb, cbdata)
        return lib.SUCCESS  # answered through cb when every host's data is in

    def dmodex_upcall(self, who, info, ninfo, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        """A local rank wants a rank's data that is on another host (direct modex), and may say
        which key it needs (PMIX_REQUIRED_KEY)."""
        key = next((str(v) for k, t, v in lib.infos(info, ninfo) if k == REQUIRED_KEY and t == lib.STRING), "")
        nspace = who.contents.nspace.decode(errors="replace")
        self.service.post(self.dmodex, nspace, int(who.contents.rank), cb, cbdata, key)
        return lib.SUCCESS  # answered through cb when the rank's host has answered

    # -- the loop's side ----------------------------------------------------------------------
    def fence(self, nspace: str, ranks: tuple[int, ...], blob: bytes, cb: object, cbdata: int) -> None:
        served = self.service.by_nspace.get(nspace)
        if served is None:  # not a job of this host's ranks: nothing to wait for
            self.answer((cb, cbdata), lib.ERR_NOT_FOUND, b"")
            return
        everyone = lib.RANK_WILDCARD in ranks
        who = "*" if everyone else ",".join(map(str, ranks))
        count = served.fences.get(who, 0)
        served.fences[who] = count + 1
        key = f"{who}#{count}"
        self.waiting[(served.number, key)] = (cb, cbdata)
        text = base64.b64encode(blob).decode()
        self.service.host.send(PmixFence(job=served.number, key=key, ranks=() if everyone else ranks, blob=text))

    def fence_done(self, done: PmixFenceDone) -> None:
        entry = self.waiting.pop((done.job, done.key), None)
        if entry is None:
            self.service.host.send(Note(text=f"mpilaunch agent: a PMIx fence {done.key!r} that nobody waits for"))
            return
        self.answer(entry, done.status, base64.b64decode(done.blob))

    def dmodex(self, nspace: str, rank: int, cb: object, cbdata: int, key: str) -> None:
        job = self.service.job_number(nspace)
        if job is None or rank == lib.RANK_WILDCARD:  # a job of another run, or its job-level data: not here
            self.answer((cb, cbdata), lib.ERR_NOT_FOUND, b"")
            return
        self.last_req += 1  # never reused: a late answer to an old request finds nothing
        self.dmodex_waiting[self.last_req] = (cb, cbdata)
        self.service.host.send(PmixDmodex(job=job, rank=rank, req=self.last_req, key=key))

    def dmodex_done(self, message: PmixDmodexDone) -> None:
        entry = self.dmodex_waiting.pop(message.req, None)
        if entry is not None:
            self.answer(entry, message.status, base64.b64decode(message.blob))

    def ask(self, ask: PmixDmodexAsk) -> None:
        """Another host's rank wants the data of one of ours: PMIx gives it once committed. A job
        this agent has not registered yet (its launch is on the way) keeps the ask until then."""
        service = self.service
        if ask.job in service.refused:
            self.dmodex_data(ask, lib.ERR_NOT_FOUND, b"")
            return
        served = service.jobs.get(ask.job)
        if served is None or service.server is None:
            self.early_asks.setdefault(ask.job, []).append(ask)
            return
        nspace = served.spec.nspace
        answer = lambda status, data: service.post(self.dmodex_data, ask, status, data)  # noqa: E731 (PMIx's thread)
        service.server.dmodex_request(lib.proc(nspace, ask.rank), answer)

    def launched(self, job: int) -> None:
        """The job is registered here now (or refused): the asks that came before it."""
        for ask in self.early_asks.pop(job, []):
            self.ask(ask)

    def dmodex_data(self, ask: PmixDmodexAsk, status: int, data: bytes) -> None:
        if status == lib.SUCCESS and ask.key and ask.key.encode() not in data and self.tries(ask):
            self.asks_later.append((time.monotonic() + DMODEX_RETRY, ask))  # committed, not yet that key
            return
        self.asked_since.pop((ask.job, ask.host, ask.req), None)
        blob = base64.b64encode(data).decode()
        self.service.host.send(
            PmixDmodexData(job=ask.job, rank=ask.rank, host=ask.host, req=ask.req, blob=blob, status=status)
        )

    def tries(self, ask: PmixDmodexAsk) -> bool:
        """Whether to ask PMIx again for data that lacks the key wanted (a rank commits its data
        in parts): for DMODEX_PATIENCE seconds, after which what there is goes back."""
        first = self.asked_since.setdefault((ask.job, ask.host, ask.req), time.monotonic())
        return time.monotonic() - first < DMODEX_PATIENCE

    def next_deadline(self) -> float | None:
        return min((when for when, _ in self.asks_later), default=None)

    def tick(self, now: float) -> None:
        due = [ask for when, ask in self.asks_later if when <= now]
        self.asks_later = [(when, ask) for when, ask in self.asks_later if when > now]
        for ask in due:
            self.ask(ask)

    def answer(self, entry: tuple[object, int], status: int, data: bytes) -> None:
        """Give data to a PMIx callback that waits for it; PMIx keeps the buffer until release."""
        callback, cbdata = entry
        buffer = ctypes.create_string_buffer(data, max(1, len(data)))
        token = id(buffer)

        def release(arg: object) -> None:
            self.held.pop(token, None)

        released = lib.RELEASE_CB(release)
        self.held[token] = (buffer, released)
        callback(status, ctypes.cast(buffer, ctypes.c_void_p), len(data), cbdata, released, None)  # type: ignore[operator]
