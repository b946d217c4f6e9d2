"""What the transports of remote agents share: the SSH options of a run, the connect timeout,
how an agent's own stderr is shown, a remote link's lock and heartbeat (RemoteLink), and the
reaping of the processes that carry links (ssh clients, srun, qrsh)."""

from __future__ import annotations

import os
import select
import sys
import time

from mpilaunch.protocol.record import Record
from mpilaunch.transport.base import Link

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.protocol.messages import SshSpec

CONNECT_TIMEOUT = 10.0  # seconds for TCP connect, banner, auth and the agent's hello (ConnectTimeout overrides)


class SshOptions(Record):
    """How to use SSH for a run."""

    config: str | None = None  # --ssh-config; None means ~/.ssh/config when it exists
    accept_new: bool = False  # --ssh-accept-new
    python: str | None = None  # interpreter for the agent where that path exists (default: ours)
    command: tuple[str, ...] = ()  # in place of `ssh` (plm_rsh_agent, -bootstrap-exec)
    extra: tuple[str, ...] = ()  # more arguments for it (plm_rsh_args, -bootstrap-exec-args)

    def spec(self, config: str | None = None) -> SshSpec:
        """What a relay (or OpenSSH's transport) needs of these options to start its ssh clients."""
        from mpilaunch.protocol.messages import SshSpec

        return SshSpec(
            config=self.config if config is None else config,
            accept_new=self.accept_new,
            command=self.command,
            extra=self.extra,
        )


def ssh_client(requested: str, path: str | None = None) -> str:
    """--ssh-client's transport: auto is OpenSSH's `ssh` when it is on PATH (as mpirun and hydra
    use it: the user's whole ssh config applies), else paramiko (a machine with no ssh client)."""
    if requested != "auto":
        return requested
    return "openssh" if ssh_on_path(path) else "paramiko"


def ssh_on_path(path: str | None = None) -> str | None:
    """The `ssh` on PATH (this process's, unless path is given), or None."""
    from mpilaunch.host.programs import find_program

    try:
        return find_program("ssh", {"PATH": path if path is not None else os.environ.get("PATH", os.defpath)})
    except OSError:
        return None


def show_agent_lines(name: str, pending: bytearray, data: bytes) -> None:
    """A remote agent's own messages (not its ranks'), shown line by line with the host's name;
    an unfinished line waits in pending (data b"\n" flushes it)."""
    pending += data
    *lines, rest = bytes(pending).split(b"\n")
    pending[:] = rest
    for line in lines:
        if line.strip():
            print(f"mpilaunch: agent on {name}: {line.decode(errors='replace')}", file=sys.stderr)


def reap(pid: int, within: float | None) -> int | None:
    """The exit status of a child that carries remote links (an ssh client, srun, qrsh) once it
    has left, waiting up to within seconds (None: for as long as it takes; polled every 2 ms:
    the end of every job waits for it); None while it still runs; -1 when it is not our child."""
    deadline = None if within is None else time.monotonic() + within
    while True:
        try:
            done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        except ChildProcessError:
            return -1
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:  # type: ignore[operator]
            return None
        time.sleep(0.002)


class RemoteLink(Link):
    """A link to an agent on another host: frames from two threads never interleave (`_lock`),
    and a thread keeps the agent's heartbeat until the link is closed (`_stop`)."""

    def __init__(self, name: str) -> None:
        import threading  # here: a local run (which imports this module for SshOptions) needs no threads

        super().__init__(name)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def readable(self) -> bool:
        """What start-up left unread, or data (or the end) waiting on the link's descriptor."""
        return bool(self.unread) or bool(select.select([self.fileno()], [], [], 0)[0])

    def ping_every(self, interval: float, frame: bytes) -> None:
        """Send frame from a thread until the link is closed or a send fails: the event loop may
        be blocked (a console pipe nobody reads), and the agent must not take that for a lost
        launcher."""
        import threading

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.send(frame)
                except Exception:
                    return

        threading.Thread(target=loop, name=f"ping {self.name}", daemon=True).start()
