"""What the agent asks of the operating system to start, signal and reap processes, in one seam.

Every process the agent starts, signals or waits for, and every /proc file it reads, goes
through a HostOS, as supervisor's processes do through its `options`: the ranks (ranks.py), the
reaper and the guardian (reaper.py), how a rank died (death.py), a relay's ssh clients
(relay.py) and the stack tools (stacks.py). The real one is here, a fake in the unit tests
(tests/fakeos.py), so the code that spawns and kills is tested without processes. Pipes and
files the agent reads and writes are its own business. Stdlib only: shipped with the agent.
"""

from __future__ import annotations

import _signal as signal
import os
import time

from mpilaunch.host import procfs, spawn

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
        found: dict[tuple[str, str | None], str] | None = None,
    ) -> spawn.Started:
        """A process in a session of its own, held at gate; bound to cpus from its first
        instruction (we bind ourselves around its spawn: the child inherits the mask, and no
        Python runs in the child, which would cost a full fork instead of vfork)."""
        saved = None
        if cpus:
            saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)
        try:
            return spawn.start(argv, env, wdir, stdin=stdin, merge=merge, pass_fds=pass_fds, gate=gate, found=found)
        finally:
            if saved is not None:
                os.sched_setaffinity(0, saved)

    def start_guardian(self, argv: list[str], pipe: int, table: int) -> int:
        """The guardian's shell (reaper.Guardian), the agent's pipe on its descriptor 3 and the
        table on 4. Forked and exec'd, not posix_spawn'd: that waits for the exec, which on a busy
        machine keeps the agent (and the job's start) waiting for a core for the shell."""
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()  # out of the agent's group and session: a batch system's kill of those leaves it
                signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGHUP, signal.SIGINT))
                for sig in spawn.RESTORED_SIGNALS:  # Python ignores them; the shell should not
                    signal.signal(sig, signal.SIG_DFL)
                os.dup2(pipe, 3)
                os.dup2(table, 4)
                os.execv(spawn.SHELL, argv)
            finally:
                os._exit(127)
        return pid

    def ssh_version(self, env: dict[str, str], program: str) -> tuple[int, int]:
        """(major, minor) of that OpenSSH client (`ssh -V`), (0, 0) if it cannot tell."""
        from mpilaunch.host.sshcmd import ssh_version

        return ssh_version(env, program)

    # The system's own calls, as they are: a fake answers and records them.
    start_tool = staticmethod(spawn.start_tool)  # a stack tool in a session of its own: its pid, its output's pipe
    start_time = staticmethod(procfs.start_time)  # when pid started: another time later is another process
    getpgid = staticmethod(os.getpgid)
    getpgrp = staticmethod(os.getpgrp)
    clock = staticmethod(time.monotonic)
    wall = staticmethod(time.time)
    sleep = staticmethod(time.sleep)

    def killpg(self, group: int, sig: int) -> None:
        """Signal a process group, if it is there: one that is gone, or no longer ours, hears nothing."""
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, pid: int, sig: int) -> None:
        """Signal a process, if it is there."""
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

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
        return os.wait4(found.si_pid, 0)

    def zombie_cgroup(self, pid: int) -> str | None:
        """pid's /proc/PID/cgroup as it was just before it was reaped, if a signal ended it."""
        return self.zombie[1] if self.zombie[0] == pid else None

    def wait(self, pid: int) -> None:
        """Wait for a child of ours to end (nothing if it was reaped already)."""
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def children(self, pid: int | None = None) -> list[int]:
        """The children of pid (this process's by default)."""
        return procfs.children_of(os.getpid() if pid is None else pid)

    def program_of(self, pid: int) -> str:
        """The name of pid's program file (/proc/PID/exe), "" if it cannot be read."""
        try:
            return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return ""

    def maps(self, pid: int) -> bytes:
        """pid's memory map (/proc/PID/maps), b"" if it cannot be read."""
        try:
            with open(f"/proc/{pid}/maps", "rb") as handle:
                return handle.read()
        except OSError:
            return b""

    def executables(self, names: Sequence[str], folders: Sequence[str]) -> dict[str, str]:
        """name -> the first executable file of that name in folders, for the names found."""
        found: dict[str, str] = {}
        for name in names:
            for folder in folders:
                candidate = os.path.join(folder or ".", name)
                if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                    found[name] = candidate
                    break
        return found

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
