"""Agents started by Slurm (`--launcher slurm`, and by default inside an allocation), as
`mpirun` (plm/slurm) and hydra (bootstrap slurm) start their daemons there.

One `srun` job step runs one agent per node, so the ranks run inside the step: its cgroup,
accounting and limits apply to them, and `scancel` reaches them. `srun` mixes its tasks'
stdio, so each agent connects back to the launcher over TCP, as hydra's proxies do: it presents
a per-run secret that travels in the step's environment (never on a command line) and its node
name; the listener takes exactly one connection per expected node and then closes. The socket
then is the agent's stdin and stdout, and the start-up is the OpenSSH client's: the agent's
code, the check, the hello.
"""

from __future__ import annotations

import os
import select
import selectors
import shlex
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from mpilaunch.errors import LaunchError
from mpilaunch.plan.hosts import Host
from mpilaunch.transport.base import HostResult, Link, Transport, TransportError
from mpilaunch.transport.bootstrap import STAGE1, agent_payload
from mpilaunch.transport.sshcommon import CONNECT_TIMEOUT, SshOptions, ping_from_thread

SECRET_VAR = "MPILAUNCH_AGENT_SECRET"  # in the step's environment; the agent takes it out of its own
ACCEPT_TIMEOUT = 60.0  # seconds for srun to start every node's agent and for each to connect back
REAP_GRACE = 3.0  # seconds srun gets to leave once every agent's link is closed


def srun_command(nodes: Sequence[str], agent: str, srun: str = "srun") -> list[str]:
    """The job step that starts one agent on each node: one task per node, every CPU of the
    node's allocation given to it and no binding by Slurm (the agent binds its ranks when
    asked), beside other steps of the allocation, ended whole if one agent fails."""
    return [
        srun,
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--cpu-bind=none",
        "--whole",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--input=none",
        "--job-name=mpilaunch",
        "sh",
        "-c",
        agent,
    ]


def agent_shell(address: str, port: int, python: str) -> str:
    """What each task runs: Python connects back, says who it is, and makes the connection its
    stdin and stdout; then it is the agent's loader, as over SSH. The name goes as bytes, which
    spares the agent the idna codec's import (2 ms); TCP_NODELAY: see SlurmTransport.start."""
    prelude = (
        "import os, socket\n"
        f"s = socket.create_connection(({address.encode()!r}, {port}))\n"
        "s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
        f'who = os.environ.pop("{SECRET_VAR}", "") + " " + os.environ.get("SLURMD_NODENAME", "")\n'
        's.sendall((who + "\\n").encode())\n'
        "os.dup2(s.fileno(), 0)\n"
        "os.dup2(s.fileno(), 1)\n"
    )
    code = shlex.quote(prelude + STAGE1)
    return f'p={shlex.quote(python)}; [ -x "$p" ] || p=python3; exec "$p" -S -c {code}'


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
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                try:
                    os.killpg(self.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if self.status is not None:
                return
        os.waitpid(self.pid, 0)


class SlurmLink(Link):
    """An agent of the step, on its TCP connection back to the launcher."""

    def __init__(self, name: str, sock: socket.socket, step: Step) -> None:
        super().__init__(name)
        self.sock = sock
        self.step = step
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._in = sock.fileno()
        self._out = os.dup(sock.fileno())  # the start-up loop watches reading and writing apart
        self.stderr_text = bytearray()
        with step.lock:
            step.open_links += 1

    # what the shared start-up loop (transport/openssh._run) asks of a link
    def read_stderr(self, show: bool = False) -> None:
        """The agents' stderr goes through srun to the launcher's own."""

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
    after its hello, a rank's exit after another's) waits for the peer's delayed ACK, 40 ms
    each time; it cost `-n 8 true` 80 of its 187 ms in an allocation."""

    name = "slurm"

    def __init__(self, options: SshOptions) -> None:
        self.options = options

    def start(self, hosts: Mapping[int, Host], first: Callable[[int], bytes | None]) -> dict[int, HostResult]:
        if not hosts:
            return {}
        from mpilaunch.host.programs import find_program

        env = dict(os.environ)
        try:
            srun = find_program("srun", env)
        except OSError:
            raise LaunchError("--launcher slurm: no `srun` found on PATH") from None
        by_name = {host.name: index for index, host in hosts.items()}
        listener = socket.create_server(("", 0), backlog=len(hosts) + 8)
        secret = os.urandom(16).hex()
        address = os.environ.get("MPILAUNCH_SLURM_ADDRESS") or os.uname().nodename
        agent = agent_shell(address, listener.getsockname()[1], self.options.python or _python())
        argv = srun_command([hosts[i].name for i in sorted(hosts)], agent, srun)
        pid = _spawn(argv, {**env, SECRET_VAR: secret})
        step = Step(pid)
        agent_payload()  # read (or built) while Slurm starts the step, not after the agents connect
        results = {index: HostResult(index) for index in hosts}
        try:
            joined = _accept(listener, by_name, secret, step)
        except BaseException:
            listener.close()
            step.end(0.5)
            raise
        listener.close()  # exactly the expected agents: no other connection is taken
        for name, index in by_name.items():
            if name not in joined:
                results[index].error = TransportError("agent", _missing(step))
        links = {by_name[name]: SlurmLink(name, sock, step) for name, (sock, _) in joined.items()}
        for index, link in links.items():
            results[index].address = f"slurm:{link.name}"
            results[index].link = link
        _handshake(links, {by_name[name]: rest for name, (_, rest) in joined.items()}, first, results)
        return results


def _python() -> str:
    import sys

    return sys.executable


def _missing(step: Step) -> str:
    status = step.poll()
    if status is not None:
        return f"srun exited with status {status} before this node's agent connected back"
    return f"the agent did not connect back within {ACCEPT_TIMEOUT:g} s"


def _spawn(argv: list[str], env: dict[str, str]) -> int:
    """srun in a session of its own: Ctrl-C reaches the launcher, which stops the job its way."""
    import subprocess

    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def _accept(
    listener: socket.socket, by_name: Mapping[str, int], secret: str, step: Step
) -> dict[str, tuple[socket.socket, bytes]]:
    """One authenticated connection per expected node (with what it sent after its first line:
    the agent's marker may come in the same read); a wrong secret, an unknown or repeated node
    is closed unanswered; srun leaving early, or the deadline, ends the wait."""
    joined: dict[str, tuple[socket.socket, bytes]] = {}
    pending: dict[socket.socket, bytearray] = {}
    deadline = time.monotonic() + ACCEPT_TIMEOUT
    listener.setblocking(False)
    while len(joined) < len(by_name) and time.monotonic() < deadline:
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
            if given != secret or name not in by_name or name in joined:
                sock.close()
                continue
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            joined[name] = (sock, rest)
    for sock in pending:
        sock.close()
    return joined


def _handshake(
    links: Mapping[int, SlurmLink], early: Mapping[int, bytes], first: Callable[[int], bytes | None], results: dict
) -> None:
    """The agent's code, the check and the hello over each connection (openssh's loop); early:
    what each agent sent behind its first line."""
    from mpilaunch.transport.openssh import _run, _Start

    sel = selectors.DefaultSelector()
    starting = {}
    for index, link in links.items():
        link.sock.setblocking(False)
        start = starting[index] = _Start(index, link, first(index) or b"")  # type: ignore[arg-type]
        problem = start.take(early.get(index, b""))
        if problem:
            results[index].error = TransportError("agent", problem)
        sel.register(link._in, selectors.EVENT_WRITE, (start, "in"))
        sel.register(link._out, selectors.EVENT_READ, (start, "out"))
    try:
        _run(sel, starting, results, time.monotonic() + CONNECT_TIMEOUT * 2)
    finally:
        sel.close()
    for index, start in starting.items():
        result = results[index]
        link = start.link
        link.sock.setblocking(True)
        if result.error is not None:
            link.close()
            result.link = None
            continue
        assert start.hello is not None
        link.hello = start.hello
        link.peer = start.hello.addr or link.name
        link.local_address = start.hello.client
        link.unread = b"".join(start.frames) + bytes(start.inbox)
        result.reply = start.reply
