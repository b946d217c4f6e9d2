"""PMI-1 and PMI-2 for MPICH-family ranks, as agent services: over an inherited socket pair
(PMI_FD, service "pmi") or over loopback TCP (PMI_PORT and PMI_ID, service "pmi-tcp").

Each job gets a JobServer (pmi_job.py); these classes give it its connections and watch them
on the agent's loop, and report a rank that hangs up while initialized and keeps running
(its peers would wait for it in the next barrier).
"""

from __future__ import annotations

import _socket
import os
import time

from mpilaunch.agent.services.base import Service
from mpilaunch.agent.services.pmi_server import JobServer
from mpilaunch.protocol.messages import Note, PmiError, PmiFenceDone, PmiNameReply, PmiSpawnReply

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

    from mpilaunch.protocol.messages import Launch, RankSpec
    from mpilaunch.protocol.record import Record

HANGUP_GRACE = 0.5  # a rank that closed its PMI socket early has this long to exit instead
MAX_REFUSED = 16  # wrong PMI_IDs before the TCP PMI port is closed


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


class PmiTcp(PmiFd):
    """PMI over loopback TCP: PMI_PORT is a listener of this agent, PMI_ID a secret per rank that
    the first line of a connection must present (`cmd=initack pmiid=ID`), as hydra's clients do."""

    name = "pmi-tcp"

    def __init__(self, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(host)
        self.listener: socket.socket | None = None
        self.ids: dict[int, tuple[JobServer, int]] = {}  # secret PMI_ID -> (server, process id)
        self.hello: dict[int, tuple[_socket.socket, bytearray]] = {}  # connections yet to present an id
        self.refused = 0  # connections that presented a wrong id

    def prepare(self, job: int, spec: RankSpec, env: dict[str, str]) -> list[int]:
        secret = self.new_id()
        self.jobs[job].expect(spec.proc, spec.rank, spec.app)
        self.ids[secret] = (self.jobs[job], spec.proc)
        env["PMI_PORT"] = f"127.0.0.1:{self.port()}"
        env["PMI_ID"] = str(secret)
        return []

    def spawned(self, job: int, spec: RankSpec, pid: int) -> None:
        pass  # it connects when it initializes

    def not_spawned(self, job: int, spec: RankSpec) -> None:
        self.ids = {secret: entry for secret, entry in self.ids.items() if entry[1] != spec.proc}
        self.jobs[job].detach(spec.proc)

    def port(self) -> int:
        """A listener on loopback only: ranks are on this host, nobody else needs to reach it."""
        if self.listener is None:
            import socket  # its accept() (PMI over TCP only), off a plain job's path

            self.listener = socket.socket()
            self.listener.bind(("127.0.0.1", 0))
            self.listener.listen(128)
            self.listener.setblocking(False)
            self.host.loop.watch(self.listener, self.accept)
        return self.listener.getsockname()[1]

    def new_id(self) -> int:
        """An unguessable id per rank (the client parses it as an int): its only credential."""
        while True:
            secret = int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF
            if secret > 1 and secret not in self.ids:
                return secret

    def accept(self, fd: int) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        self.hello[sock.fileno()] = (sock, bytearray())
        self.host.loop.watch(sock, self.hello_readable)

    def hello_readable(self, fd: int) -> None:
        """The first line of a TCP client must be `cmd=initack pmiid=<its PMI_ID>`; else it is refused."""
        sock, buf = self.hello[fd]
        try:
            data = sock.recv(512)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buf += data
        if data and b"\n" not in buf and len(buf) < 512 and not pmi2_first(buf):
            return
        self.host.loop.unwatch(sock)
        del self.hello[fd]
        words = hello_words(buf)
        claimed = words.get("pmiid", "")
        entry = self.ids.pop(int(claimed), None) if words.get("cmd") == "initack" and claimed.isdigit() else None
        if entry is None:
            sock.close()
            self.refused += 1
            self.host.send(Note(text=refusal(buf, words)))
            if self.refused == MAX_REFUSED:  # someone is guessing ids: close the door for this job
                self.close_port()
            return
        server, ident = entry
        server.connect(ident, sock)
        self.serve(sock, server)

    def close_port(self) -> None:
        """Stop listening; ranks that have not connected yet can no longer, so the job must end."""
        if self.listener is not None:
            self.host.loop.unwatch(self.listener)
            self.listener.close()
            self.listener = None
        error = f"PMI port closed after {MAX_REFUSED} connections with a wrong PMI_ID"
        for _, ident in self.ids.values():
            self.host.send(PmiError(proc=ident, error=error))
        self.ids.clear()


REFUSED = "mpilaunch: refused a PMI connection that did not present a valid PMI_ID"
PMI2_REFUSED = (
    "a PMI-2 client connected over --pmi-tcp, and PMI-2 does not send PMI_ID; drop --pmi-tcp to serve it over PMI_FD"
)


def hello_words(buf: bytes | bytearray) -> dict[str, str]:
    """The `key=value` words of a TCP client's first line."""
    line = bytes(buf).split(b"\n", 1)[0].decode("ascii", "replace")
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def pmi2_first(buf: bytes | bytearray) -> bool:
    """A PMI-2 frame where the first line was expected: it has no newline to wait for."""
    from mpilaunch.agent.services.pmi2 import looks_like_frame  # compiles its patterns: TCP hellos only

    return looks_like_frame(buf)


def refusal(buf: bytes | bytearray, words: dict[str, str]) -> str:
    """Why a TCP connection was refused. PMI-2 clients (MPICH's, Slurm's libpmi2) open with
    `cmd=init pmi_version=2` or a frame and never send PMI_ID, so the user is told the way out."""
    if (words.get("cmd") == "init" and words.get("pmi_version") == "2") or pmi2_first(buf):
        return f"{REFUSED}: {PMI2_REFUSED}"
    return REFUSED
