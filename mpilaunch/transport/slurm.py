"""Agents started by Slurm (`--launcher slurm`, and by default inside an allocation), as
`mpirun` (plm/slurm) and hydra (bootstrap slurm) start their daemons there.

One `srun` job step runs one agent per node, so the ranks run inside the step: its cgroup,
accounting and limits apply to them, and `scancel` reaches them. `srun` mixes its tasks'
stdio, so each agent connects back to the launcher over TCP, as hydra's proxies do: it presents
a per-run secret that travels in the step's environment (never on a command line) and its node
name; the listener takes exactly one connection per node of the step and then closes. The socket
then is the agent's stdin and stdout: the launcher writes the agent's code and greets it
(launcher/greeting.py), as any other. The step's command line and its start before the launch are in
slurm_step.py.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Mapping

from mpilaunch.plan.hosts import Host
from mpilaunch.transport.base import HostResult, Link, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_payload
from mpilaunch.transport.slurm_step import (
    StartedStep,
    claim_started_step,
    end_srun,
    start_step,
)
from mpilaunch.transport.sshcommon import CONNECT_TIMEOUT, SshOptions, ping_from_thread

ACCEPT_TIMEOUT = 60.0  # seconds for srun to start every node's agent and for each to connect back
REAP_GRACE = 3.0  # seconds srun gets to leave once every agent's link is closed


class Step:
    """The srun process of a run's agents: reaped once, after every link is closed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.status: int | None = None
        self.open_links = 0
        self.lock = threading.Lock()

    def poll(self) -> int | None:
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.status = -1
            else:
                if pid:
                    self.status = os.waitstatus_to_exitcode(status)
        return self.status

    def end(self, grace: float) -> None:
        """Wait up to grace for srun to leave; then SIGTERM (srun ends the step), then SIGKILL."""
        if self.poll() is None:
            self.status = end_srun(self.pid, grace)


class SlurmLink(Link):
    """An agent of the step, on its TCP connection back to the launcher."""

    def __init__(self, name: str, sock: socket.socket, step: Step) -> None:
        super().__init__(name)
        self.sock = sock
        self.step = step
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._in = sock.fileno()
        self._out = os.dup(sock.fileno())  # the greeting watches reading and writing apart
        self.stderr_text = bytearray()
        with step.lock:
            step.open_links += 1

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
        status = self.step.poll()
        return f"srun exited with status {status} before the agent answered" if status is not None else ""

    def reap(self, within: float | None) -> int | None:
        return self.step.poll()

    def lost_because(self) -> str:
        status = self.step.poll()
        return f"its Slurm job step ended (srun exited with status {status})" if status is not None else ""

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

    def readable(self) -> bool:
        return bool(self.unread) or bool(select.select([self._out], [], [], 0)[0])

    def send(self, frame: bytes) -> None:
        with self._lock:
            self.sock.sendall(frame)

    def ping_every(self, interval: float, frame: bytes) -> None:
        ping_from_thread(self.name, self.send, self._stop, interval, frame)

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
                with self.step.lock:
                    self.step.open_links -= 1

    def wait(self) -> None:
        """The last link closed reaps srun (which leaves once its agents have)."""
        if self._out >= 0:
            os.close(self._out)
            self._out = -1
        with self.step.lock:
            last = self.step.open_links == 0
        if last:
            self.step.end(REAP_GRACE)


class SlurmTransport(Transport):
    """One srun step of agents that connect back. Both ends of each connection set TCP_NODELAY:
    with Nagle's algorithm a small frame written right after another (the agent's check reply
    after its hello, a rank's exit after another's) waits for the peer's delayed ACK each time."""

    name = "slurm"

    def __init__(self, options: SshOptions) -> None:
        self.options = options

    def start(self, hosts: Mapping[int, Host]) -> dict[int, HostResult]:
        if not hosts:
            return {}
        by_name = {host.name: index for index, host in hosts.items()}
        started = claim_started_step()  # the step entry.main started over the whole allocation, if it did
        if started is not None and started.nodes < len(hosts):  # not the allocation's hosts after all
            send_away(started)
            started = None
        if started is None:
            names = [hosts[i].name for i in sorted(hosts)]
            started = start_step(names, os.environ, self.options.python or _python())
        listener = socket.socket(fileno=started.listener.detach())
        secret, expected = started.secret, started.nodes
        step = Step(started.pid)
        agent_payload()  # read (or built) while Slurm starts the step, not after the agents connect
        results = {index: HostResult(index) for index in hosts}
        try:
            joined = _accept(listener, by_name, secret, step, expected)
        except BaseException:
            listener.close()
            step.end(0.5)
            raise
        listener.close()  # exactly the expected agents: no other connection is taken
        for name, index in by_name.items():
            if name not in joined:
                results[index].error = TransportError("agent", _missing(step))
        payload = agent_payload()
        for name, (sock, rest) in joined.items():
            link = SlurmLink(name, sock, step)
            link.outbox += payload
            link.unread = rest  # what the agent sent behind its first line: its marker, perhaps more
            results[by_name[name]].address = f"slurm:{name}"
            results[by_name[name]].link = link
        return results


def _python() -> str:
    import sys

    return sys.executable


def _missing(step: Step) -> str:
    status = step.poll()
    if status is not None:
        return f"srun exited with status {status} before this node's agent connected back"
    return f"the agent did not connect back within {ACCEPT_TIMEOUT:g} s"


def _accept(
    listener: socket.socket,
    by_name: Mapping[str, int],
    secret: str,
    step: Step,
    expected: int,
    within: float = ACCEPT_TIMEOUT,
) -> dict[str, tuple[socket.socket, bytes]]:
    """One authenticated connection per node of the step, `expected` in all (with what each sent
    after its first line: the agent's marker may come in the same read); a wrong secret or a
    repeated node is closed unanswered; an agent of a node the job does not use (a step started
    over the whole allocation) is sent away; srun leaving early, or the deadline, ends the wait."""
    joined: dict[str, tuple[socket.socket, bytes]] = {}
    spare: set[str] = set()
    pending: dict[socket.socket, bytearray] = {}
    deadline = time.monotonic() + within
    listener.setblocking(False)
    while len(joined) + len(spare) < expected and time.monotonic() < deadline:
        if step.poll() is not None and not pending:
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
            given, _, name = first.decode(errors="replace").partition(" ")
            if given != secret or not name or name in joined or name in spare:
                sock.close()
                continue
            sock.setblocking(True)
            if name not in by_name:
                if len(spare) < expected - len(by_name):
                    spare.add(name)
                    _send_away(sock)
                else:
                    sock.close()
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            joined[name] = (sock, rest)
    for sock in pending:
        sock.close()
    return joined


def discard_early_step() -> None:
    """End the step entry.main started if no launch took it (a refused command line): its
    agents are sent away as they connect, each ending with status 0, and srun leaves quietly."""
    early = claim_started_step()
    if early is not None:
        send_away(early)


def send_away(early: StartedStep, within: float = 10.0) -> None:
    """A step started early that no launch took: every agent is sent away as it connects back,
    then srun leaves (or is stopped, after `within`)."""
    listener = socket.socket(fileno=early.listener.detach())
    step = Step(early.pid)
    try:
        _accept(listener, {}, early.secret, step, early.nodes, within)
    finally:
        listener.close()
        step.end(REAP_GRACE)


def _send_away(sock: socket.socket) -> None:
    """An agent with no ranks to run: its loader is sent a program that ends it with status 0
    (an agent that failed would end the step, --kill-on-bad-exit)."""
    program = b"pass"
    try:
        sock.sendall(b"%010d" % len(program) + program)
    except OSError:
        pass
    sock.close()
