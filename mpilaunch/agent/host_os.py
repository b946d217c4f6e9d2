"""What the agent asks of the operating system to start, signal and reap processes, in one seam.

Ranks (ranks.py) and the Reaper (reaper.py) start, signal and reap through a HostOS, as
supervisor's processes do through its `options`: the real one here, a fake in the unit tests
(tests/unit/test_agent_os.py), so the code that spawns and kills is tested without processes.
Stdlib only: shipped with the agent.
"""

from __future__ import annotations

import os
import time

from mpilaunch.host import spawn
from mpilaunch.host.procfs import children_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

KMSG_RECORDS = 1 << 16  # records of the kernel log read at most (a ring of a few MB holds fewer)


class HostOS:
    """The real operating system."""

    def start(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        wdir: str | None,
        *,
        stdin: bool,
        merge: bool,
        pass_fds: Sequence[int],
        gate: spawn.Gate,
        cpus: list[int] | None = None,
    ) -> spawn.Started:
        """A process in a session of its own, held at gate; bound to cpus from its first
        instruction (we bind ourselves around its spawn: the child inherits the mask, and no
        Python runs in the child, which would cost a full fork instead of vfork)."""
        saved = None
        if cpus:
            saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)
        try:
            return spawn.start(argv, env, wdir, stdin=stdin, merge=merge, pass_fds=pass_fds, gate=gate)
        finally:
            if saved is not None:
                os.sched_setaffinity(0, saved)

    def killpg(self, group: int, sig: int) -> None:
        os.killpg(group, sig)

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)

    def getpgid(self, pid: int) -> int:
        return os.getpgid(pid)

    def getpgrp(self) -> int:
        return os.getpgrp()

    zombie: tuple[int, str | None] = (0, None)  # the last child a signal ended, and its /proc/PID/cgroup

    def reap(self) -> tuple[int, int, os.struct_rusage] | None:
        """A child that ended (pid, wait status, resource use), None if none has, without waiting;
        ChildProcessError when there is no child at all. A child a signal ended is looked at
        before it is reaped: a zombie still shows its cgroup v2 path (agent/death.py)."""
        found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if found is None:
            return None
        if found.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            self.zombie = (found.si_pid, self.read_text(f"/proc/{found.si_pid}/cgroup"))
        pid, status, usage = os.wait4(found.si_pid, 0)
        return pid, status, usage

    def zombie_cgroup(self, pid: int) -> str | None:
        """pid's /proc/PID/cgroup as it was just before it was reaped, if a signal ended it."""
        return self.zombie[1] if self.zombie[0] == pid else None

    def children(self, pid: int | None = None) -> list[int]:
        """The children of pid (this process's by default)."""
        return children_of(os.getpid() if pid is None else pid)

    def clock(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    # -- what agent/death.py reads ---------------------------------------------------------------
    def read_text(self, path: str) -> str | None:
        """A small file's text (a /proc or cgroup file), None if it cannot be read."""
        try:
            with open(path, "rb") as handle:
                return handle.read(1 << 16).decode("utf-8", "replace")
        except OSError:
            return None

    def cwd_of(self, pid: int | None) -> str | None:
        """pid's working directory (this process's for None), None if it cannot be read."""
        try:
            return os.getcwd() if pid is None else os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return None

    def kernel_log(self) -> list[str] | None:
        """The records of the kernel log (/dev/kmsg), None where this user may not read it."""
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        records: list[str] = []
        try:
            while len(records) < KMSG_RECORDS:
                try:
                    data = os.read(fd, 8192)
                except BrokenPipeError:  # a record was overwritten while we read: go on from the next
                    continue
                except OSError:  # EAGAIN: the end; EPERM: not ours to read after all
                    break
                if not data:
                    break
                records.append(data.decode("utf-8", "replace"))
        finally:
            os.close(fd)
        return records or None

    def matches(self, pattern: str) -> list[tuple[str, float]]:
        """Files matching a glob pattern, with their modification times."""
        import glob

        found = []
        for path in glob.glob(pattern):
            try:
                found.append((path, os.stat(path).st_mtime))
            except OSError:
                pass
        return found

    def identity(self) -> tuple[int, int, str]:
        """This process's uid, gid and host name (what a rank it started has, unless it changed them)."""
        return os.getuid(), os.getgid(), os.uname().nodename
