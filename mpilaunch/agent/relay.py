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

import os
import selectors
import signal

from mpilaunch.host import spawn
from mpilaunch.host.programs import find_program
from mpilaunch.protocol import wire

READ_SIZE = 1 << 18
# Key exchange first tried: the one mpilaunch's own connections (paramiko) use. OpenSSH 9's
# default, sntrup761x25519, costs client and server about three times the CPU per connection
# (16 connections at once on 2 cores: 1.5 s against 0.5 s). `^` (OpenSSH 8.0 and later) puts
# it first and keeps the default list behind it.
KEX = "KexAlgorithms=^curve25519-sha256"


def ssh_options(ssh: dict, version: tuple[int, int] = (8, 0)) -> list[str]:
    """OpenSSH's command line up to the host, the same for every child: the launcher's ssh
    config (where that path exists here too; else this host's own) and host-key policy.
    version is the ssh client's (for KEX)."""
    argv = ["ssh", "-T", "-o", "BatchMode=yes"]
    if version >= (8, 0):
        argv += ["-o", KEX]
    if ssh.get("config") and os.path.isfile(str(ssh["config"])):
        argv += ["-F", str(ssh["config"])]
    if ssh.get("accept_new"):
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    return argv


def ssh_argv(options: list[str], host: dict, command: str) -> list[str]:
    """One child's command line: ssh_options, the hostfile's user and port, the host, and the
    agent's loader as the remote command."""
    argv = list(options)
    if host.get("user"):
        argv += ["-l", str(host["user"])]
    if host.get("port"):
        argv += ["-p", str(int(host["port"]))]
    return [*argv, "--", str(host["name"]), command]


def ssh_version(env: dict[str, str]) -> tuple[int, int]:
    """(major, minor) of the `ssh` on env's PATH, (0, 0) if there is none or it cannot tell:
    asked once per relay and per launcher with --ssh-client openssh. posix_spawn, not
    subprocess, whose import alone costs about 8 ms."""
    import re

    read, write = os.pipe()
    try:
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        actions += [(os.POSIX_SPAWN_DUP2, write, 1), (os.POSIX_SPAWN_DUP2, write, 2)]
        pid = os.posix_spawn(find_program("ssh", env), ["ssh", "-V"], env, file_actions=actions)
    except OSError:
        os.close(read)
        return (0, 0)
    finally:
        os.close(write)
    with open(read, "rb") as said:
        text = said.read(1 << 16)
    os.waitpid(pid, 0)
    match = re.search(rb"OpenSSH_(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def subtree_of(spec: dict) -> set[int]:
    """The host indices of a child and everything below it."""
    found = {int(spec["index"])}
    for below in spec.get("below", ()):
        found |= subtree_of(below)
    return found


class Child:
    """One host this agent started over ssh, with the subtree it relays to in turn."""

    def __init__(self, spec: dict, started: spawn.Started) -> None:
        self.index = int(spec["index"])
        self.name = str(spec["name"])
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


class Relay:
    """The children of one agent. The agent owns the selector and the loop; this class says
    which descriptors to watch (tags "relay_out", "relay_err", "relay_in") and handles them."""

    def __init__(self, payload: bytes, send_up, sel) -> None:  # type: ignore[no-untyped-def]
        self.payload = payload  # the agent's own loader and modules, for its children
        self.send_up = send_up
        self.sel = sel
        self.children: dict[int, Child] = {}  # by host index
        self.route: dict[int, Child] = {}  # every host below, by index -> the child it is under
        self.by_pid: dict[int, Child] = {}
        self.by_fd: dict[int, Child] = {}
        self.version: tuple[int, int] | None = None  # of the ssh client, once asked

    # -- starting ---------------------------------------------------------------------------
    def start(self, msg: dict, env: dict[str, str]) -> list[int]:
        """Start one child per host of the `relay` message; its check and, where it relays in
        turn, its own `relay` are queued behind its code. Returns the pids (for the guardian)."""
        if self.version is None:
            self.version = ssh_version(env)
        options = ssh_options(msg.get("ssh") or {}, self.version)
        gate = spawn.Gate()
        started = []
        try:
            for spec in msg["hosts"]:
                argv = ssh_argv(options, spec, str(msg["command"]))
                try:
                    proc = spawn.start(argv, env, None, stdin=True, merge=False, pass_fd=None, gate=gate)
                except OSError as exc:
                    self._gone(int(spec["index"]), f"cannot run ssh: {exc.strerror or exc}")
                    continue
                child = Child(spec, proc)
                started.append(child.pid)
                self.children[child.index] = child
                self.by_pid[child.pid] = child
                for index in child.subtree:
                    self.route[index] = child
                for fd, tag in ((child.stdout, "relay_out"), (child.stderr, "relay_err")):
                    assert fd is not None
                    os.set_blocking(fd, False)
                    self.by_fd[fd] = child
                    self.sel.register(fd, selectors.EVENT_READ, tag)
                assert child.stdin is not None
                os.set_blocking(child.stdin, False)
                self.by_fd[child.stdin] = child
                first = spec.get("first") or ""
                below = spec.get("below") or []
                queued = self.payload + first.encode("latin-1")
                if below:
                    queued += wire.control("relay", ssh=msg.get("ssh"), command=msg["command"], hosts=below)
                self.write(child, queued)
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
            self.sel.register(child.stdin, selectors.EVENT_WRITE, "relay_in")

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
            child.outbox.clear()
            self.close_stdin(child)
            return
        if fd in self.sel.get_map():
            self.sel.unregister(fd)

    def close_stdin(self, child: Child) -> None:
        """End of the child's link: its agent stops its ranks and exits."""
        fd, child.stdin = child.stdin, None
        if fd is None:
            return
        if fd in self.sel.get_map():
            self.sel.unregister(fd)
        self.by_fd.pop(fd, None)
        child.outbox.clear()
        os.close(fd)

    # -- up ---------------------------------------------------------------------------------
    def readable(self, fd: int, tag: str) -> None:
        child = self.by_fd.get(fd)
        if child is None:
            return
        if tag == "relay_in":
            self.flush(child)
            return
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if tag == "relay_err":
            self._stderr(child, data)
        elif data:
            self._frames(child, data)
        else:
            self._closed(child, "its connection closed")

    def _frames(self, child: Child, data: bytes) -> None:
        child.inbox += data
        if not child.greeted:
            at = child.inbox.find(wire.MARKER)
            if at < 0:
                if len(child.inbox) > wire.MAX_NOISE + len(wire.MARKER):
                    self._closed(child, f"the remote shell printed more than {wire.MAX_NOISE} bytes before the agent")
                return
            del child.inbox[: at + len(wire.MARKER)]
            child.greeted = True
        try:
            frames = wire.split(child.inbox)
        except wire.FrameError as exc:
            self._closed(child, f"garbled stream: {exc}")
            return
        up = []
        for kind, frame in frames:
            if kind != wire.ROUTED:
                up.append(wire.routed(child.index, frame))
            elif wire.routed_host(frame) in child.subtree - {child.index}:
                up.append(frame)  # from a host below the child, which the child relays
            else:  # a frame in another host's name: the child is not to be trusted
                self.send_up(b"".join(up))
                self._closed(child, "it sent a frame in the name of a host it does not relay to")
                return
        if up:
            self.send_up(b"".join(up))

    def _stderr(self, child: Child, data: bytes) -> None:
        """The child's agent's own messages (and ssh's), shown with its name, like the launcher
        shows those of the agents it started itself."""
        if not data:
            self._unwatch(child, "stderr")
            data = b"\n"
        child.err += data
        *lines, rest = bytes(child.err).split(b"\n")
        child.err[:] = rest
        for line in lines:
            text = line.decode(errors="replace").strip()
            if text:
                child.last_words = text
                if child.greeted:
                    self.send_up(wire.control("note", text=f"mpilaunch: agent on {child.name}: {text}"))

    def _unwatch(self, child: Child, which: str) -> None:
        fd = getattr(child, which)
        if fd is None:
            return
        setattr(child, which, None)
        if fd in self.sel.get_map():
            self.sel.unregister(fd)
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
            self._signal(child, signal.SIGTERM)

    def _gone(self, index: int, why: str) -> None:
        self.send_up(wire.control("gone", host=index, why=why))

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
        frame = wire.control("ping")
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
                self._signal(child, signal.SIGKILL)

    @staticmethod
    def _signal(child: Child, sig: int) -> None:
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
