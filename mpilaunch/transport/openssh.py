"""Remote agents over OpenSSH's `ssh` client (`--ssh-client openssh`), as hydra and Open MPI do.

One `ssh` per host, with pipes for its streams. Each client does its cryptography in its own
process, so N connections use every core instead of taking turns on this interpreter's lock
(paramiko), and the launcher never imports paramiko (about 100 ms). OpenSSH reads the ssh
config itself (ProxyJump, Match, ControlMaster included) and applies its host-key policy with
BatchMode: known_hosts, unknown hosts refused unless --ssh-accept-new, changed keys always
refused. A host that cannot be used is named with ssh's own last words.

The start-up is one selector loop over every client: write the agent's code and the check,
skip what a login script prints before the agent's marker, read the hello and the check's
answer. What comes after them stays in the link for the controller.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import threading
import time
from collections.abc import Callable, Mapping

from mpilaunch.errors import LaunchError
from mpilaunch.host import spawn
from mpilaunch.host.sshcmd import is_ssh, ssh_argv, ssh_options, ssh_version
from mpilaunch.plan.hosts import Host
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import UP, Checked, Hello, decode
from mpilaunch.transport.base import HostResult, Link, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_command, agent_payload
from mpilaunch.transport.sshcommon import CONNECT_TIMEOUT, SshOptions, ping_from_thread, show_agent_lines

READ_SIZE = 1 << 18
# What to do about ssh's terse refusals (BatchMode asks nothing).
HINTS = {
    "Host key verification failed.": "(its key is unknown: --ssh-accept-new records it; or it CHANGED: always refused)",
}
REAP_GRACE = 2.0  # seconds an ssh client gets to leave after its agent's stream ended
RETRIES = 3  # tries more for a connection dropped before the SSH banner
# ssh's words for a connection closed before the key exchange began (sshd's MaxStartups)
DROPPED = ("kex_exchange_identification", "Connection reset by", "Connection closed by")


def _dropped(why: str) -> bool:
    return any(words in why for words in DROPPED)


class OpensshLink(Link):
    """A remote agent behind an `ssh` client process that this launcher started."""

    def __init__(self, name: str, started: spawn.Started) -> None:
        super().__init__(name)
        self.pid = started.pid
        self.status: int | None = None  # the client's exit status, once reaped
        self.stderr_text = bytearray()  # ssh's and the agent's own messages
        self._lock = threading.Lock()  # pings from a thread and frames from the loop never interleave
        self._stop = threading.Event()
        self._out = started.stdout
        self._err: int = started.stderr  # type: ignore[assignment]
        self._in: int = started.stdin  # type: ignore[assignment]
        self._in_open = True
        os.set_blocking(self._out, False)
        os.set_blocking(self._err, False)

    def take_hello(self, hello: Hello) -> None:
        self.hello = hello
        self.peer = hello.addr or self.name  # the address its sshd was reached at
        self.local_address = hello.client

    def fileno(self) -> int:
        return self._out

    def recv(self) -> bytes | None:
        """Data, None when there is nothing yet, b'' at end (the agent or its connection is gone)."""
        if self.unread:
            data, self.unread = self.unread, b""
            return data
        self.read_stderr(show=True)
        try:
            data = os.read(self._out, READ_SIZE)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self.read_stderr(show=True, final=True)
        return data

    def read_stderr(self, show: bool, final: bool = False) -> None:
        """Take what ssh wrote on stderr; with show, whole lines are printed with the host's
        name (final: the unfinished one too)."""
        data = b""
        while True:
            try:
                chunk = os.read(self._err, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            data += chunk
        if show:
            show_agent_lines(self.name, self.stderr_text, data + b"\n" if final else data)
        else:
            self.stderr_text += data

    def last_words(self) -> str:
        """ssh's last non-empty line on stderr: why the connection or the agent did not start."""
        self.read_stderr(show=False)
        lines = [line for line in bytes(self.stderr_text).decode(errors="replace").splitlines() if line.strip()]
        last = lines[-1].strip() if lines else ""
        return f"{last} {HINTS[last]}" if last in HINTS else last

    def readable(self) -> bool:
        return bool(self.unread) or bool(select.select([self._out], [], [], 0)[0])

    def send(self, frame: bytes) -> None:
        with self._lock:
            view = memoryview(frame)
            while view:
                view = view[os.write(self._in, view) :]

    def ping_every(self, interval: float, frame: bytes) -> None:
        ping_from_thread(self.name, self.send, self._stop, interval, frame)

    def close(self) -> None:
        """End of our side: the agent reads the end of its stdin and stops its ranks."""
        self._stop.set()
        with self._lock:  # not while the ping thread writes
            if self._in_open:
                self._in_open = False
                os.close(self._in)

    def wait(self) -> None:
        """Reap the ssh client; one that outstays the grace is killed, with its process group."""
        if self.status is None and self.reap(REAP_GRACE) is None:
            _kill_group(self.pid)
            self.reap(None)
        for fd in (self._out, self._err):
            try:
                os.close(fd)
            except OSError:
                pass
        self._out = self._err = -1

    def reap(self, within: float | None) -> int | None:
        """The client's exit status once it has left (waiting up to within seconds; None: for
        as long as it takes), or None if it is still running."""
        deadline = None if within is None else time.monotonic() + within
        while self.status is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            except ChildProcessError:
                self.status = -1
                break
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() >= deadline:  # type: ignore[operator]
                return None
            time.sleep(0.002)  # the client leaves a moment after its agent: the job's end waits on this
        return self.status


def _kill_group(pid: int) -> None:
    """The client runs in a session of its own (so Ctrl-C reaches the launcher only); its group
    holds it and anything it started (a ProxyCommand)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class _Start:
    """One host's start-up: what is left to write, what was read, where it stands."""

    def __init__(self, index: int, link: OpensshLink, first: bytes) -> None:
        self.index = index
        self.link = link
        self.out = memoryview(agent_payload() + first)
        self.inbox = bytearray()
        self.marked = False  # the agent's marker was seen
        self.frames: list[bytes] = []  # read after the hello and the reply
        self.hello: Hello | None = None
        self.reply: Checked | None = None
        self.wants_reply = bool(first)

    @property
    def done(self) -> bool:
        return not self.out and self.hello is not None and (self.reply is not None or not self.wants_reply)

    def take(self, data: bytes) -> str | None:
        """Bytes from the agent's stdout; an error in words, or None."""
        self.inbox += data
        if not self.marked:
            at = self.inbox.find(wire.MARKER)
            if at < 0:
                if len(self.inbox) > wire.MAX_NOISE + len(wire.MARKER):
                    return f"the remote shell printed more than {wire.MAX_NOISE} bytes before the agent"
                return None
            del self.inbox[: at + len(wire.MARKER)]
            self.marked = True
        try:
            frames = wire.split(self.inbox)
        except wire.FrameError as exc:
            return f"the agent's stream is garbled: {exc}"
        for kind, frame in frames:
            if self.done or kind != wire.CONTROL:
                self.frames.append(frame)
                continue
            try:
                message = decode(wire.decode_frame(frame)[1], UP)  # type: ignore[arg-type]
            except wire.FrameError as exc:
                return f"the agent's stream is garbled: {exc}"
            if self.hello is None:
                if not isinstance(message, Hello):
                    return "the agent did not say hello"
                self.hello = message
            elif isinstance(message, Checked):
                self.reply = message
            else:
                self.frames.append(frame)
        return None


class OpensshTransport(Transport):
    """One OpenSSH `ssh` client per host, every host's start-up in one selector loop."""

    name = "openssh"

    def __init__(self, options: SshOptions) -> None:
        self.options = options

    def start(self, hosts: Mapping[int, Host], first: Callable[[int], bytes | None]) -> dict[int, HostResult]:
        """Every host's agent; a connection an sshd dropped before its banner (MaxStartups under a
        burst of logins) is tried again, up to RETRIES times, after a short random wait."""
        results = self._start_once(hosts, first)
        for attempt in range(1, RETRIES + 1):
            again = {i: hosts[i] for i, r in results.items() if r.error is not None and _dropped(str(r.error))}
            if not again:
                break
            import random

            time.sleep(random.uniform(0.05, 0.25) * attempt)
            results.update(self._start_once(again, first))
        return results

    def _start_once(self, hosts: Mapping[int, Host], first: Callable[[int], bytes | None]) -> dict[int, HostResult]:
        if not hosts:
            return {}
        options = self.options
        if options.config and not os.path.isfile(options.config):
            raise LaunchError(f"--ssh-config {options.config}: cannot read: no such file")
        env = dict(os.environ)
        spec = options.spec()
        openssh = is_ssh(spec)
        version = ssh_version(env, spec.command[0] if spec.command else "ssh") if openssh else (0, 0)
        if openssh and version == (0, 0):
            raise LaunchError("--ssh-client openssh: no OpenSSH `ssh` client found on PATH")
        base = ssh_options(spec, version)
        if openssh:  # after the user's arguments: ssh takes an option's first value, so theirs wins
            base += ["-o", f"ConnectTimeout={int(CONNECT_TIMEOUT)}"]
        command = agent_command(options.python)
        results = {index: HostResult(index) for index in sorted(hosts)}
        starting: dict[int, _Start] = {}
        sel = selectors.DefaultSelector()
        # Each client starts as a small shell waiting at a gate, released when all are spawned:
        # spawning waits for the child's exec, and once the first clients run their key exchange
        # that wait grew to 40-70 ms per host on 2 cores (the agent starts its ranks the same way).
        gate = spawn.Gate()
        try:
            spawned = False
            try:
                for index in sorted(hosts):
                    host = hosts[index]
                    if not openssh and (host.user or host.port):
                        why = f"{spec.command[0]} is not ssh: it takes no user or port (give them to it yourself)"
                        results[index].error = TransportError("connect", why)
                        continue
                    argv = ssh_argv(base, host.name, host.user, host.port, command, openssh)
                    try:
                        started = spawn.start(argv, env, None, stdin=True, merge=False, pass_fds=(), gate=gate)
                    except OSError as exc:
                        results[index].error = TransportError("connect", f"cannot run ssh: {exc.strerror or exc}")
                        continue
                    link = OpensshLink(host.name, started)
                    results[index].link = link
                    start = starting[index] = _Start(index, link, first(index) or b"")
                    os.set_blocking(link._in, False)
                    sel.register(link._in, selectors.EVENT_WRITE, (start, "in"))
                    sel.register(link._out, selectors.EVENT_READ, (start, "out"))
                spawned = True
            finally:  # released with no line after a failure: the shells waiting there leave without running ssh
                gate.release(len(starting) if spawned else 0)
            _run(sel, starting, results, time.monotonic() + CONNECT_TIMEOUT * 2)
        except BaseException:
            for start in starting.values():
                _give_up(start.link)
            raise
        finally:
            sel.close()
        for index, start in starting.items():
            result = results[index]
            if result.error is not None:
                _give_up(start.link)
                result.link = None
                continue
            os.set_blocking(start.link._in, True)
            assert start.hello is not None
            start.link.take_hello(start.hello)
            start.link.unread = b"".join(start.frames) + bytes(start.inbox)
            result.reply = start.reply
        return results


def _run(
    sel: selectors.BaseSelector, starting: dict[int, _Start], results: dict[int, HostResult], deadline: float
) -> None:
    """Write the code, read the hellos and replies, until every host has answered or failed."""
    waiting = set(starting)

    def forget(start: _Start) -> None:
        waiting.discard(start.index)
        for fd in (start.link._in, start.link._out):
            try:
                sel.unregister(fd)
            except (KeyError, ValueError):  # the payload was written: stdin is not watched any more
                pass

    def fail(start: _Start, why: str) -> None:
        results[start.index].error = TransportError("agent", why)
        forget(start)

    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            for index in sorted(waiting):
                start = starting[index]
                fail(start, start.link.last_words() or f"no answer in {CONNECT_TIMEOUT * 2:g} s")
            return
        for key, _ in sel.select(left):
            start, stream = key.data
            if start.index not in waiting:
                continue
            link = start.link
            if stream == "in":
                try:
                    start.out = start.out[os.write(link._in, start.out) :]
                except BlockingIOError:
                    continue
                except OSError:  # ssh left before taking it all: its stderr says why
                    start.out = memoryview(b"")
                if not start.out:
                    sel.unregister(link._in)
                continue
            link.read_stderr(show=False)  # a full stderr pipe would stall the client
            try:
                data = os.read(link._out, READ_SIZE)
            except BlockingIOError:
                continue
            if not data:
                fail(start, link.last_words() or _status_words(link))
                continue
            problem = start.take(data)
            if problem:
                fail(start, problem)
            elif start.done:
                forget(start)


def _status_words(link: OpensshLink) -> str:
    status = link.reap(REAP_GRACE)
    if status is None:
        return "the agent closed its stream"
    return f"ssh exited with status {status} before the agent answered"


def _give_up(link: OpensshLink) -> None:
    link.close()
    _kill_group(link.pid)
    link.wait()
