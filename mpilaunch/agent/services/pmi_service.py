"""PMI-1 and PMI-2 for MPICH-family ranks, as agent services: over an inherited socket pair
(PMI_FD, service "pmi"), and the base of the one over loopback TCP (PMI_PORT and PMI_ID,
service "pmi-tcp", pmi_tcp.py).

Each job gets a JobServer (pmi_job.py); these classes give it its connections and watch them
on the agent's loop, and report a rank that hangs up while initialized and keeps running
(its peers would wait for it in the next barrier).
"""

from __future__ import annotations

import _socket
import time

from mpilaunch.agent.services.base import Service
from mpilaunch.agent.services.pmi_server import JobServer
from mpilaunch.protocol.messages import PmiError, PmiFenceDone, PmiNameReply, PmiSpawnReply

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.protocol.messages import Launch, RankSpec
    from mpilaunch.protocol.record import Record

HANGUP_GRACE = 0.5  # a rank that closed its PMI socket early has this long to exit instead


class PmiFd(Service):
    """PMI over a socket pair per rank, its end inherited as PMI_FD (hydra's default)."""

    name = "pmi"
    protocol = "PMI"
    handles = (PmiFenceDone, PmiNameReply, PmiSpawnReply)

    def __init__(self, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(host)
        self.jobs: dict[int, JobServer] = {}
        self.by_fd: dict[int, JobServer] = {}  # a rank's socket -> its job's server
        self.pairs: dict[int, tuple[_socket.socket, _socket.socket]] = {}  # process id -> (ours, the rank's)
        self.hangups: dict[int, float] = {}  # process id -> when it closed its PMI socket early

    def start_job(self, launch: Launch) -> None:
        if launch.pmi is not None and launch.job not in self.jobs:
            job = launch.job
            self.jobs[job] = JobServer(
                launch.pmi, self.host.send, self.hangup, lambda ident, rank: self.host.spoke(job, ident, rank, "PMI")
            )

    def prepare(self, job: int, spec: RankSpec, env: dict[str, str]) -> list[int]:
        ours, theirs = self.jobs[job].attach(spec.proc, spec.rank, spec.app)
        self.pairs[spec.proc] = (ours, theirs)
        env["PMI_FD"] = str(theirs.fileno())
        return [theirs.fileno()]

    def spawned(self, job: int, spec: RankSpec, pid: int) -> None:
        ours, theirs = self.pairs.pop(spec.proc)
        theirs.close()
        self.serve(ours, self.jobs[job])

    def not_spawned(self, job: int, spec: RankSpec) -> None:
        pair = self.pairs.pop(spec.proc, None)
        if pair is not None:
            pair[1].close()
        self.jobs[job].detach(spec.proc)

    def serve(self, sock: _socket.socket, server: JobServer) -> None:
        self.by_fd[sock.fileno()] = server
        self.host.loop.watch(sock.fileno(), self.readable)

    def readable(self, fd: int) -> None:
        server = self.by_fd[fd]
        if not server.readable(fd):
            self.host.loop.unwatch(fd)
            server.drop(fd)
            del self.by_fd[fd]

    def handle(self, message: Record) -> None:
        server = self.jobs.get(message.job)  # type: ignore[attr-defined]
        if server is not None:
            server.handle(message)

    def state_of(self, job: int, ident: int) -> str | None:
        server = self.jobs.get(job)
        return server.state_of(ident) if server is not None else None

    # -- hang-ups -------------------------------------------------------------------------
    def hangup(self, ident: int) -> None:
        self.hangups[ident] = time.monotonic()

    def next_deadline(self) -> float | None:
        return min(self.hangups.values()) + HANGUP_GRACE if self.hangups else None

    def tick(self, now: float) -> None:
        """A rank that closed its PMI socket before finalize: if it is dying its exit says why;
        if it is still running after HANGUP_GRACE, its peers would wait for it, so say so."""
        for ident, since in list(self.hangups.items()):
            if not self.host.rank_running(ident):
                del self.hangups[ident]
            elif now - since >= HANGUP_GRACE:
                del self.hangups[ident]
                self.host.send(PmiError(proc=ident, error="closed its PMI connection before finalize"))
