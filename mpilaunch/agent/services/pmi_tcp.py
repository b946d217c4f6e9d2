"""PMI over loopback TCP (service "pmi-tcp"): PMI_PORT is a listener of this agent on
127.0.0.1, PMI_ID a secret per rank that the first line of a connection must present
(`cmd=initack pmiid=ID`), as hydra's clients do; the connection is then served as PMI_FD's is.

Anyone on the host may connect to that port, so what connects to it decides nothing about the
job. A connection that sends nothing within HELLO_WAIT, sends no PMI hello, presents a wrong or
used id, speaks PMI-2 (which sends no id) or comes from another user's process is closed and
counted (pmi_hello.Refusals: the first one said, all of them summed up once), and the job goes
on. The id keeps other users out, who cannot read a rank's environment: their connections are
refused whatever id they present (the kernel says who holds a connection's other end:
host/tcp_peer.py), so guessing gains them nothing, and a right id they presented stays its
rank's. Processes of the job's own user could read any id in /proc/PID/environ; their wrong
ids are only counted.

At most MAX_HELLOS connections wait to speak; at that many, the one that waited longest is
closed to make room. Ranks speak as they connect, so connections that stay silent hold the
port's places for HELLO_WAIT at most and do not keep a rank out.
"""

from __future__ import annotations

import os
import time

from mpilaunch.agent.services.pmi_hello import HELLO_MAX, ID, WAIT, Refusals, verdict
from mpilaunch.agent.services.pmi_service import PmiFd
from mpilaunch.host.tcp_peer import peer_uid
from mpilaunch.protocol.messages import Note

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

    from mpilaunch.agent.services.pmi_server import JobServer
    from mpilaunch.protocol.messages import RankSpec

HELLO_WAIT = 5.0  # seconds a connection has to send its first line (a rank sends it as it connects)
MAX_HELLOS = 64  # connections waiting to speak; one more closes the one that waited longest
ACCEPT_PAUSE = 0.1  # seconds the port is not watched after an accept failed (no descriptor left)


class Hello:
    """A connection that has not presented an id yet."""

    __slots__ = ("buf", "since", "sock")

    def __init__(self, sock: socket.socket, since: float) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.since = since


class PmiTcp(PmiFd):
    name = "pmi-tcp"

    def __init__(self, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(host)
        self.listener: socket.socket | None = None
        self.where = ""  # 127.0.0.1:PORT, for the summary
        self.ids: dict[int, tuple[JobServer, int]] = {}  # secret PMI_ID -> (server, process id)
        self.hellos: dict[int, Hello] = {}  # by descriptor, the longest waiting first
        self.refusals = Refusals()
        self.uid = os.geteuid()  # the ranks' user: the only one served
        self.paused_until: float | None = None

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
            self.listener.listen(socket.SOMAXCONN)  # a host's ranks connect at once
            self.listener.setblocking(False)
            self.host.loop.watch(self.listener, self.accept)
            self.where = f"127.0.0.1:{self.listener.getsockname()[1]}"
        return self.listener.getsockname()[1]  # type: ignore[no-any-return]

    def new_id(self) -> int:
        """An unguessable id per rank (the client parses it as an int)."""
        while True:
            secret = int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF
            if secret > 1 and secret not in self.ids:
                return secret

    # -- the door -------------------------------------------------------------------------------
    def accept(self, fd: int) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError:  # no descriptor left: watching the port now would only spin the loop
            self.pause(time.monotonic() + ACCEPT_PAUSE)
            return
        if len(self.hellos) >= MAX_HELLOS:
            self.judge(next(iter(self.hellos)), ended=True)
        sock.setblocking(False)
        self.hellos[sock.fileno()] = Hello(sock, time.monotonic())
        self.host.loop.watch(sock, self.hello_readable)
        self.hello_readable(sock.fileno())  # a rank's first line is usually here already

    def hello_readable(self, fd: int) -> None:
        hello = self.hellos.get(fd)
        if hello is None:  # closed earlier in this turn of the loop
            return
        try:
            data = hello.sock.recv(HELLO_MAX - len(hello.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        hello.buf += data
        self.judge(fd, ended=not data)

    def judge(self, fd: int, ended: bool) -> None:
        """Serve the connection once its first line presents a rank's id from the ranks' user;
        close it and count why when it cannot (ended: it closed, or its time is up)."""
        hello = self.hellos[fd]
        kind, claimed = verdict(hello.buf, ended)
        if kind == WAIT:
            return
        self.host.loop.unwatch(hello.sock)
        del self.hellos[fd]
        uid = None
        if kind == ID:
            kind, uid = self.check(hello.sock, claimed)
        if kind != ID:
            hello.sock.close()
            self.refuse(kind, uid)
            return
        server, ident = self.ids.pop(claimed)
        server.connect(ident, hello.sock)
        self.serve(hello.sock, server)

    def check(self, sock: socket.socket, claimed: int) -> tuple[str, int | None]:
        """(ID, uid) when `claimed` is a waiting rank's id and the peer runs as the ranks' user;
        else why not, with the peer's uid when known."""
        if claimed not in self.ids:
            return "wrong", None
        try:
            peer = sock.getpeername()
        except OSError:
            return "left", None
        try:
            uid = peer_uid(sock.getsockname(), peer)
        except OSError:  # the kernel cannot say here: the id alone decides, as with hydra
            return ID, None
        if uid is None:
            return "left", None
        return (ID, uid) if uid == self.uid else ("foreign", uid)

    def refuse(self, kind: str, uid: int | None = None) -> None:
        said = self.refusals.add(kind, uid)
        if said is not None:
            self.host.send(Note(text=said))

    def pause(self, until: float) -> None:
        assert self.listener is not None
        self.host.loop.unwatch(self.listener)
        self.paused_until = until

    # -- time -----------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        oldest = next(iter(self.hellos.values()), None)
        due = (super().next_deadline(), self.paused_until, oldest.since + HELLO_WAIT if oldest else None)
        return min((t for t in due if t is not None), default=None)

    def tick(self, now: float) -> None:
        super().tick(now)
        for fd, hello in list(self.hellos.items()):
            if hello.since + HELLO_WAIT > now:
                break  # the others came later
            self.judge(fd, ended=True)
        if self.paused_until is not None and now >= self.paused_until and self.listener is not None:
            self.paused_until = None
            self.host.loop.watch(self.listener, self.accept)

    def close(self) -> None:
        """The agent is done: every refusal said in one line, if there were several (connections
        still waiting to speak among them)."""
        for hello in self.hellos.values():
            hello.sock.close()
            self.refuse("garbage" if hello.buf else "silent")
        self.hellos.clear()
        said = self.refusals.summary(self.where)
        if said is not None:
            self.host.send(Note(text=said))
        if self.listener is not None:
            self.host.loop.unwatch(self.listener)
            self.listener.close()
            self.listener = None
