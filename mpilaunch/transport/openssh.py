"""Remote agents over OpenSSH's `ssh` client (`--ssh-client openssh`), as hydra and Open MPI do.

One `ssh` per host, with pipes for its streams. Each client does its cryptography in its own
process, so N connections use every core instead of taking turns on this interpreter's lock
(paramiko), and the launcher never imports paramiko. OpenSSH reads the ssh
config itself (ProxyJump, Match, ControlMaster included) and applies its host-key policy with
BatchMode: known_hosts, unknown hosts refused unless --ssh-accept-new, changed keys always
refused. A host that cannot be used is named with ssh's own last words.

Each client is started with the agent's code queued in its link's outbox; the launcher writes
it and greets the agent (launcher/start/greeting.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from mpilaunch.errors import LaunchError
from mpilaunch.host import spawn
from mpilaunch.host.sshcmd import is_ssh, ssh_argv, ssh_options, ssh_version
from mpilaunch.plan.hosts import Host
from mpilaunch.transport.base import HostResult, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_command, agent_payload
from mpilaunch.transport.ssh_steps import failed_step, host_key_hint, resolved
from mpilaunch.transport.sshcommon import CONNECT_TIMEOUT, RemoteLink, SshOptions, reap, show_agent_lines

READ_SIZE = 1 << 18
REAP_GRACE = 2.0  # seconds an ssh client gets to leave after its agent's stream ended
# ssh's words for a connection closed before the key exchange began (sshd's MaxStartups)
DROPPED = ("kex_exchange_identification", "Connection reset by", "Connection closed by")


class OpensshLink(RemoteLink):
    """A remote agent behind an `ssh` client process that this launcher started."""

    def __init__(self, name: str, started: spawn.Started, openssh: bool = True) -> None:
        super().__init__(name)
        self.pid = started.pid
        self.openssh = openssh  # OpenSSH's ssh, not a command in its place: its words name a failed step
        self.status: int | None = None  # the client's exit status, once reaped
        self.reached = False  # the remote command wrote: the connection was made and authenticated
        self.ended = False  # its stdout ended
        self.stderr_text = bytearray()  # ssh's and the agent's own messages
        self._out = started.stdout
        self._err: int = started.stderr  # type: ignore[assignment]
        self._in: int = started.stdin  # type: ignore[assignment]
        self._in_open = True
        os.set_blocking(self._out, False)
        os.set_blocking(self._err, False)
        os.set_blocking(self._in, False)  # the code is written by the greeting, as the pipe takes it

    def fileno(self) -> int:
        return self._out

    def write_fileno(self) -> int:
        return self._in

    def write_outbox(self) -> bool:
        try:
            del self.outbox[: os.write(self._in, self.outbox)]
        except BlockingIOError:
            return True
        except OSError:  # ssh left before taking it all: its stderr says why
            self.outbox.clear()
        if not self.outbox:
            os.set_blocking(self._in, True)  # frames from now on are sent whole (send)
        return bool(self.outbox)

    def read_diagnostics(self) -> None:
        if self.hello is None:
            self.read_stderr(show=False)

    def ended_words(self) -> str:
        status = self.reap(REAP_GRACE)
        if status is None:
            return "the agent closed its stream"
        return f"ssh exited with status {status} before the agent answered"

    def give_up(self) -> None:
        self.close()
        _kill_group(self.pid, self.status is not None)
        self.wait()

    def recv(self) -> bytes | None:
        """Data, None when there is nothing yet, b'' at end (the agent or its connection is gone)."""
        if self.unread:
            data, self.unread = self.unread, b""
            return data
        greeted = self.hello is not None  # before, ssh's words are kept for the host's error line
        self.read_stderr(show=greeted)
        try:
            data = os.read(self._out, READ_SIZE)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self.ended = True
            self.read_stderr(show=greeted, final=True)
        self.reached = self.reached or bool(data)
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
        if self.openssh and last == "Host key verification failed.":
            return f"{last} {host_key_hint(bytes(self.stderr_text).decode(errors='replace'))}"
        return last

    def failed_step(self) -> str:
        """The step ssh failed at, from its exit status and words (transport/ssh_steps.py). A
        client whose stream ended is given a moment to exit; one still running is not waited for."""
        self.read_stderr(show=False)
        status = self.reap(REAP_GRACE if self.ended else 0)
        said = bytes(self.stderr_text).decode(errors="replace")
        return failed_step(status, said, self.reached, self.openssh)

    def send(self, frame: bytes) -> None:
        with self._lock:
            view = memoryview(frame)
            while view:
                view = view[os.write(self._in, view) :]

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
            _kill_group(self.pid, False)
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
        if self.status is None:
            self.status = reap(self.pid, within)  # the client leaves a moment after its agent
        return self.status


def _ssh_settings(options: list[str], hosts: Mapping[int, Host], at_once: int = 32) -> dict[int, dict]:
    """What `ssh -G` says of each host with these options (a config ssh cannot read: no entry),
    run a few at a time."""
    import subprocess

    from mpilaunch.transport.sshconfig import parse_dump

    found = {}
    order = sorted(hosts)
    for first in range(0, len(order), at_once):
        asked = {}
        for index in order[first : first + at_once]:
            host = hosts[index]
            argv = ssh_argv(options, host.name, host.user, host.port, "")[:-1]  # no remote command
            try:
                devnull = subprocess.DEVNULL
                asked[index] = subprocess.Popen(
                    [argv[0], "-G", *argv[1:]], stdin=devnull, stdout=subprocess.PIPE, stderr=devnull
                )
            except OSError:
                continue
        for index, proc in asked.items():
            out, _ = proc.communicate()
            if proc.returncode == 0:
                found[index] = parse_dump(out.decode(errors="replace"))
    return found


def _kill_group(pid: int, reaped: bool) -> None:
    """The client runs in a session of its own (so Ctrl-C reaches the launcher only); its group
    holds it and anything it started (a ProxyCommand). Once the client is reaped its pid alone
    is never signalled again: it may be another process's now."""
    for kill in (os.killpg,) if reaped else (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class OpensshTransport(Transport):
    """One OpenSSH `ssh` client per host (or the command the user gave in its place)."""

    name = "openssh"

    def __init__(self, options: SshOptions) -> None:
        self.options = options
        self._command: tuple[bool, list[str]] | None = None  # (OpenSSH's?, options up to the host), once started

    def retry(self, error: TransportError) -> bool:
        return any(words in str(error) for words in DROPPED)

    def addresses(self, hosts: Mapping[int, Host], results: Mapping[int, HostResult]) -> None:
        """Each host's address as ssh reaches it, user@address:port: user and port from `ssh -G`
        with the connection's own options, and the address its agent says it was reached at
        (SSH_CONNECTION), else the HostName resolved here as ssh resolves it (not behind a
        ProxyJump or ProxyCommand, whose hop resolves it: then the name). For `mpilaunch check`
        only: a job does not pay for the `ssh -G` runs."""
        if self._command is None or not self._command[0]:
            return  # not started, or not OpenSSH's ssh: only what its agents say
        for index, settings in _ssh_settings(self._command[1], hosts).items():
            result = results[index]
            hello = result.link.hello if result.link is not None else None
            hostname = settings.get("hostname", hosts[index].name)
            port = settings.get("port", "22")
            proxied = settings.get("proxycommand", "none") != "none" or "proxyjump" in settings
            reached = hello.addr if hello is not None and hello.addr else ""
            if not reached and not proxied:
                reached = resolved(hostname, port, settings.get("addressfamily", "any"))
            result.address = f"{settings.get('user', '?')}@{reached or hostname}:{port}"

    def _command_line(self, env: dict[str, str]) -> tuple[bool, list[str]]:
        """Whether the client is OpenSSH's, and its options up to the host: asked once (`ssh
        -V`), not at every start of the window's next hosts."""
        if self._command is None:
            spec = self.options.spec()
            openssh = is_ssh(spec)
            version = ssh_version(env, spec.command[0] if spec.command else "ssh") if openssh else (0, 0)
            if openssh and version == (0, 0):
                raise LaunchError("--ssh-client openssh: no OpenSSH `ssh` client found on PATH")
            base = ssh_options(spec, version)
            if openssh:  # after the user's arguments: ssh takes an option's first value, so theirs wins
                base += ["-o", f"ConnectTimeout={int(CONNECT_TIMEOUT)}"]
            self._command = (openssh, base)
        return self._command

    def start(self, hosts: Mapping[int, Host]) -> dict[int, HostResult]:
        if not hosts:
            return {}
        options = self.options
        if options.config and not os.path.isfile(options.config):
            raise LaunchError(f"--ssh-config {options.config}: cannot read: no such file")
        env = dict(os.environ)
        openssh, base = self._command_line(env)
        command = agent_command(options.python)
        payload = agent_payload()
        results = {index: HostResult(index) for index in sorted(hosts)}
        # Each client starts as a small shell waiting at a gate, released when all are spawned:
        # spawning waits for the child's exec, and once the first clients run their key exchange
        # that wait grows with every host on a busy machine (the agent starts its ranks the same way).
        gate = spawn.Gate()
        spawned = 0
        try:
            for index in sorted(hosts):
                host = hosts[index]
                if not openssh and (host.user or host.port):
                    why = f"{base[0]} is not ssh: it takes no user or port (give them to it yourself)"
                    results[index].error = TransportError("connect", why)
                    continue
                argv = ssh_argv(base, host.name, host.user, host.port, command, openssh)
                try:
                    started = spawn.start(argv, env, None, stdin=True, merge=False, pass_fds=(), gate=gate)
                except OSError as exc:
                    results[index].error = TransportError("connect", f"cannot run ssh: {exc.strerror or exc}")
                    continue
                link = results[index].link = OpensshLink(host.name, started, openssh)
                link.outbox += payload
                spawned += 1
        except BaseException:
            gate.release(0)  # the shells waiting there leave without running ssh
            for result in results.values():
                if result.link is not None:
                    result.link.give_up()
            raise
        gate.release(spawned)
        return results
