"""Tree spawn, an agent's side: start the agents of other hosts with OpenSSH's `ssh`, and carry
frames between them and the launcher.

Stdlib only: shipped with the agent. Frames pass through without their payloads being decoded.
What a child sends goes up wrapped in a ROUTED frame that names the child; frames that are
routed already (from hosts further down) go up as they are. A frame that comes down for a host
of a child's subtree goes to that child, unwrapped when it is for the child itself, and an ALL
frame goes to every child. The relay pings its children (they take its silence for the
launcher's) and reports `gone` when a child's stream ends, with ssh's last words if it never
started.
"""

from __future__ import annotations

import _signal as signal
import os

from mpilaunch.agent.loop import WRITE, Loop
from mpilaunch.host import spawn
from mpilaunch.host.sshcmd import is_ssh, ssh_argv, ssh_options
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import Gone, Note, Ping, RelayHost, RelayHosts, encode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.host_os import HostOS

READ_SIZE = 1 << 18


def subtree_of(spec: RelayHost) -> set[int]:
    """The host indices of a child and everything below it."""
    found = {spec.index}
    for below in spec.below:
        found |= subtree_of(below)
    return found


class Child:
    """One host this agent started over ssh, with the subtree it relays to in turn."""

    def __init__(self, spec: RelayHost, started: spawn.Started) -> None:
        self.index = spec.index
        self.name = spec.name
        self.subtree = subtree_of(spec)
        self.pid = started.pid
        self.stdin: int | None = started.stdin
        self.stdout: int | None = started.stdout
        self.stderr: int | None = started.stderr
        self.outbox = bytearray()  # frames for the child that its pipe did not take yet
        self.inbox = bytearray()  # bytes from the child: noise before the marker, then frames
        self.greeted = False  # its marker came: frames follow
        self.err = bytearray()
        self.last_words = ""  # ssh's (or the agent's) last line on stderr
        self.status: int | None = None
        self.dropped = False

    def frames(self, data: bytes) -> tuple[list[bytes], str]:
        """The whole frames data completes, ready to go up (each of the child's own wrapped in a
        ROUTED frame that names it, those routed from below as they are), and why its stream is
        to be closed ("": it is not): bytes that are no frames (before the marker, ssh's own noise
        is skipped), or a frame in the name of a host it does not relay to."""
        self.inbox += data
        up: list[bytes] = []
        try:
            self.greeted = self.greeted or wire.past_marker(self.inbox)
            frames = wire.split(self.inbox) if self.greeted else []
        except wire.FrameError as exc:
            return up, f"garbled stream: {exc}" if self.greeted else str(exc)
        for kind, frame in frames:
            if kind != wire.ROUTED:
                up.append(wire.routed(self.index, frame))
            elif wire.routed_host(frame) in self.subtree - {self.index}:
                up.append(frame)  # from a host below the child, which the child relays
            else:  # a frame in another host's name: the child is not to be trusted
                return up, "it sent a frame in the name of a host it does not relay to"
        return up, ""

    def lines(self, data: bytes) -> list[str]:
        """The whole lines of the child's stderr that data completes (all of it at its end: b"")."""
        self.err += data or b"\n"
        *lines, rest = bytes(self.err).split(b"\n")
        self.err[:] = rest
        found = [text for text in (line.decode(errors="replace").strip() for line in lines) if text]
        self.last_words = found[-1] if found else self.last_words
        return found


class Relay:
    """The children of one agent, their descriptors watched on the agent's loop."""

    def __init__(self, payload: bytes, send_up: Callable[[bytes], None], loop: Loop, host_os: HostOS) -> None:
        self.payload = payload  # the agent's own loader and modules, for its children
        self.send_up = send_up  # whole frames, to the launcher
        self.loop = loop
        self.os = host_os  # ssh clients started and signalled: the seam tests replace
        self.children: dict[int, Child] = {}  # by host index
        self.route: dict[int, Child] = {}  # every host below, by index -> the child it is under
        self.by_pid: dict[int, Child] = {}
        self.by_fd: dict[int, Child] = {}
        self.version: tuple[int, int] | None = None  # of the ssh client, once asked

    # -- starting ---------------------------------------------------------------------------
    def start(self, msg: RelayHosts, env: dict[str, str]) -> list[int]:
        """Start one child per host of the message, its code queued; the launcher's frames for it
        (its check, its own RelayHosts where it relays in turn) follow, routed to it. Returns the
        pids (for the guardian)."""
        if self.version is None:
            self.version = self.os.ssh_version(env, msg.ssh.command[0] if msg.ssh.command else "ssh")
        options = ssh_options(msg.ssh, self.version)
        openssh = is_ssh(msg.ssh)
        gate = spawn.Gate()
        started = []
        try:
            for spec in msg.hosts:
                argv = ssh_argv(options, spec.name, spec.user, spec.port, msg.command, openssh)
                try:
                    proc = self.os.start(argv, env, None, stdin=True, merge=False, pass_fds=(), gate=gate)
                except OSError as exc:
                    self._gone(spec.index, f"cannot run ssh: {exc.strerror or exc}")
                    continue
                child = Child(spec, proc)
                started.append(child.pid)
                self.children[child.index] = child
                self.by_pid[child.pid] = child
                for index in child.subtree:
                    self.route[index] = child
                for fd, handler in ((child.stdout, self.read_out), (child.stderr, self.read_err), (child.stdin, None)):
                    os.set_blocking(fd, False)  # type: ignore[arg-type]
                    self.by_fd[fd] = child  # type: ignore[index]
                    if handler is not None:  # its stdin is watched while it has frames to take
                        self.loop.watch(fd, handler)
                self.write(child, self.payload)  # its check, and its own RelayHosts, come from the launcher
        finally:
            gate.release(len(started))
        return started

    # -- down -------------------------------------------------------------------------------
    def down(self, host: int, frame: bytes) -> None:
        """A frame from the launcher for a host below (ROUTED to it): on towards that host."""
        if host == wire.ALL:
            self.broadcast(frame)
            return
        child = self.route.get(host)
        if child is not None:
            self.write(child, frame if host == child.index else wire.routed(host, frame))

    def broadcast(self, frame: bytes) -> None:
        """An ALL frame (its inner frame given): to every child, which passes it on below."""
        wrapped = wire.routed(wire.ALL, frame)
        for child in self.children.values():
            self.write(child, wrapped)

    def write(self, child: Child, data: bytes) -> None:
        if child.stdin is None:
            return
        was_empty = not child.outbox
        child.outbox += data
        self.flush(child)
        if was_empty and child.outbox and child.stdin is not None:
            self.loop.watch(child.stdin, self.writable, WRITE)

    def flush(self, child: Child) -> None:
        """Write what the child's pipe takes now (ssh reads it once the session is up)."""
        fd = child.stdin
        if fd is None:
            return
        try:
            while child.outbox:
                written = os.write(fd, child.outbox)
                del child.outbox[:written]
        except BlockingIOError:
            return
        except OSError:  # ssh is gone: its stdout's end says so
            self.close_stdin(child)
            return
        self.loop.unwatch(fd)

    def close_stdin(self, child: Child) -> None:
        """End of the child's link: its agent stops its ranks and exits."""
        child.outbox.clear()
        self._unwatch(child, "stdin")

    # -- up ---------------------------------------------------------------------------------
    def writable(self, fd: int) -> None:
        child = self.by_fd.get(fd)
        if child is not None:
            self.flush(child)

    def read_out(self, fd: int) -> None:
        child, data = self._read(fd)
        if child is None:
            return
        up, why = child.frames(data) if data else ([], "its connection closed")
        if up:
            self.send_up(b"".join(up))
        if why:
            self._closed(child, why)

    def read_err(self, fd: int) -> None:
        child, data = self._read(fd)
        if child is not None:
            self._stderr(child, data)

    def _read(self, fd: int) -> tuple[Child | None, bytes]:
        child = self.by_fd.get(fd)
        if child is None:
            return None, b""
        try:
            return child, os.read(fd, READ_SIZE)
        except BlockingIOError:
            return None, b""
        except OSError:
            return child, b""

    def _stderr(self, child: Child, data: bytes) -> None:
        """The child's agent's own messages (and ssh's), shown with its name, like the launcher
        shows those of the agents it started itself."""
        if not data:
            self._unwatch(child, "stderr")
        for text in child.lines(data):
            if child.greeted:
                self.send_up(encode(Note(text=f"mpilaunch: agent on {child.name}: {text}")))

    def _unwatch(self, child: Child, which: str) -> None:
        fd = getattr(child, which)
        if fd is None:
            return
        setattr(child, which, None)
        self.loop.unwatch(fd)
        self.by_fd.pop(fd, None)
        os.close(fd)

    def _closed(self, child: Child, why: str) -> None:
        """The child's stream ended: say so upward (the launcher closes that host and every host
        under it) and stop routing to it."""
        if child.stderr is not None:  # its last words, if ssh said why
            try:
                self._stderr(child, os.read(child.stderr, READ_SIZE))
            except OSError:
                pass
        self._unwatch(child, "stdout")
        self.close_stdin(child)
        for index in child.subtree:
            if self.route.get(index) is child:
                del self.route[index]
        if not child.dropped:
            if not child.greeted:  # ssh's own words say why: a refused key, an unknown host
                why = child.last_words or "the connection closed before the agent started"
            self._gone(child.index, why)
        if child.status is None:  # ssh may linger; it is ours to end
            self.os.killpg(child.pid, signal.SIGTERM)

    def _gone(self, index: int, why: str) -> None:
        self.send_up(encode(Gone(host=index, why=why)))

    # -- ending -----------------------------------------------------------------------------
    def drop(self, index: int) -> None:
        """The launcher gave up on this child: cut it off (its agent sees the end of its link)."""
        child = self.children.get(index)
        if child is not None and child.stdout is not None:
            child.dropped = True
            self._closed(child, "dropped")

    def close_all(self) -> None:
        """This agent is done or lost its launcher: every child's link ends, and their agents stop."""
        for child in self.children.values():
            self.close_stdin(child)

    def ping(self) -> None:
        frame = encode(Ping())
        for child in self.children.values():
            self.write(child, frame)

    def reaped(self, pid: int, status: int) -> bool:
        """Whether pid was one of our ssh clients (then it is recorded)."""
        child = self.by_pid.get(pid)
        if child is None:
            return False
        child.status = status
        return True

    def pids(self) -> set[int]:
        return set(self.by_pid)

    def done(self) -> bool:
        return all(c.stdout is None and c.status is not None for c in self.children.values())

    def running(self) -> bool:
        """Whether an ssh client is still to be reaped (the last sweep waits for no stream)."""
        return any(c.status is None for c in self.children.values())

    def kill(self) -> None:
        for child in self.children.values():
            if child.status is None:
                self.os.killpg(child.pid, signal.SIGKILL)
