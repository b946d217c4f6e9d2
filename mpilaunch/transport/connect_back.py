"""Agents that connect back to the launcher over TCP: what the engines' transports share
(Slurm's srun step, slurm.py; Grid Engine's qrsh tasks, sge.py).

An engine's tasks mix or keep their stdio, so each agent connects back, as hydra's proxies and
Open MPI's daemons do: it presents a per-run secret that travels in the task's environment
(never on a command line) and a token saying which host it is; the listener takes exactly one
connection per expected token and then closes. The socket then is the agent's stdin and
stdout: the launcher writes the agent's code and greets it (launcher/start/greeting.py), as any
other. The process that started the agents (srun, or one qrsh per host) is their carrier: it
is reaped once every link it carries is closed.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping

from mpilaunch.transport.sshcommon import CONNECT_TIMEOUT, RemoteLink, reap

LOST_SETTLE = 0.5  # seconds a lost link waits for its carrier to end, to say why it was lost


class Carrier:
    """The engine's process that started agents (srun for all, a qrsh per host): reaped once,
    after every link it carries is closed. `program` names it; `ended` says what its end means
    for a link (`its Slurm job step ended`)."""

    program = ""
    ended = ""
    grace = 3.0  # seconds it gets to leave once every agent's link is closed, before SIGTERM

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status: int | None = None
        self.open_links = 0
        self.lock = threading.Lock()

    def poll(self) -> int | None:
        if self.status is None:
            self.status = reap(self.pid, 0)
        return self.status

    def end(self, grace: float) -> None:
        """Wait up to grace for it to leave; then SIGTERM its group (the engine ends its tasks), then SIGKILL."""
        if self.poll() is None:
            self.status = end_group(self.pid, grace)

    def exited(self) -> str:
        """`srun exited with status 1` (and what it said, where it is known), or "" while it runs."""
        status = self.poll()
        return f"{self.program} exited with status {status}" if status is not None else ""

    def missing(self, within: float, before: str) -> str:
        """Why an agent it started did not connect back: it exited (`exited`, then `before`), or
        the wait of `within` seconds ended."""
        exited = self.exited()
        return f"{exited}{before}" if exited else f"the agent did not connect back within {within:g} s"


class BackLink(RemoteLink):
    """An agent on its TCP connection back to the launcher."""

    def __init__(self, name: str, sock: socket.socket, carrier: Carrier) -> None:
        super().__init__(name)
        self.sock = sock
        self.carrier = carrier
        self._in = sock.fileno()
        self._out = os.dup(sock.fileno())  # the greeting watches reading and writing apart
        with carrier.lock:
            carrier.open_links += 1

    patience = CONNECT_TIMEOUT * 2

    def write_fileno(self) -> int:
        return self._in

    def write_outbox(self) -> bool:
        try:
            del self.outbox[: self.sock.send(self.outbox, socket.MSG_DONTWAIT)]
        except BlockingIOError:
            return True
        except OSError:  # the agent is gone: its stream's end says so
            self.outbox.clear()
        return bool(self.outbox)

    def last_words(self) -> str:
        exited = self.carrier.exited()
        return f"{exited} before the agent answered" if exited else ""

    def lost_because(self) -> str:
        """The carrier's end, when that is why: it ends a moment before its agent's link does (a
        killed qrsh makes Grid Engine kill its task), and may not be reaped yet."""
        deadline = time.monotonic() + LOST_SETTLE
        while self.carrier.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        exited = self.carrier.exited()
        return f"{self.carrier.ended} ({exited})" if exited else ""

    def fileno(self) -> int:
        return self._out

    def recv(self) -> bytes | None:
        if self.unread:
            data, self.unread = self.unread, b""
            return data
        try:
            return self.sock.recv(1 << 18, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def send(self, frame: bytes) -> None:
        with self._lock:
            self.sock.sendall(frame)

    def close(self) -> None:
        """The agent reads the end of its link and stops its ranks."""
        self._stop.set()
        with self._lock:
            if self.sock.fileno() >= 0:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.sock.close()
                with self.carrier.lock:
                    self.carrier.open_links -= 1

    def wait(self) -> None:
        """The last link closed reaps the carrier (which leaves once its agents have)."""
        if self._out >= 0:
            os.close(self._out)
            self._out = -1
        with self.carrier.lock:
            last = self.carrier.open_links == 0
        if last:
            self.carrier.end(self.carrier.grace)


def accept_agents(
    listener: socket.socket,
    tokens: Collection[str],
    secret: str,
    expected: int,
    gone: Callable[[Mapping[str, object]], bool],
    within: float,
) -> dict[str, tuple[socket.socket, bytes]]:
    """One authenticated connection per token (a node's name, a host's index), `expected` in
    all, each with what it sent after its first line (the agent's marker may come in the same
    read); a wrong secret or a repeated token is closed unanswered; an agent with a token the job
    does not use (a step started over the whole allocation) is sent away; `gone(joined)` (the
    carriers of every agent not joined have left) or the deadline ends the wait."""
    joined: dict[str, tuple[socket.socket, bytes]] = {}
    spare: set[str] = set()
    pending: dict[socket.socket, bytearray] = {}
    deadline = time.monotonic() + within
    listener.setblocking(False)
    while len(joined) + len(spare) < expected and time.monotonic() < deadline:
        if not pending and gone(joined):
            break
        ready, _, _ = select.select([listener, *pending], [], [], 0.1)
        for sock in ready:
            if sock is listener:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                pending[conn] = bytearray()
                continue
            try:
                data = sock.recv(256)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            line = pending[sock]
            line += data
            if not data or len(line) > 200:
                pending.pop(sock).close()
                continue
            if b"\n" not in line:
                continue
            del pending[sock]
            first, _, rest = bytes(line).partition(b"\n")
            given, _, token = first.decode(errors="replace").partition(" ")
            if given != secret or not token or token in joined or token in spare:
                sock.close()
                continue
            sock.setblocking(True)
            if token not in tokens:
                if len(spare) < expected - len(tokens):
                    spare.add(token)
                    send_away(sock)
                else:
                    sock.close()
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            joined[token] = (sock, rest)
    for sock in pending:
        sock.close()
    return joined


def send_away(sock: socket.socket) -> None:
    """An agent with no ranks to run: its loader is sent a program that ends it with status 0
    (an agent that failed would end Slurm's step, --kill-on-bad-exit, or Grid Engine's job)."""
    program = b"pass"
    try:
        sock.sendall(b"%010d" % len(program) + program)
    except OSError:
        pass
    sock.close()


def end_group(pid: int, grace: float) -> int:
    """Wait up to grace for a carrier to leave; then SIGTERM its group, then SIGKILL. Its exit
    status (-1 when it was not our child)."""
    import signal

    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        status = reap(pid, grace)
        if status is not None:
            return status
    return reap(pid, None)  # type: ignore[return-value]  # waited for: never None
