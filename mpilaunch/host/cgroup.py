"""A cgroup (v2) of the job's ranks, where this host lets the agent make one: every process
started under a rank stays in it whatever it does with sessions, groups and signals, and one
write to `cgroup.kill` ends them all (systemd's scopes and Slurm's proctrack/cgroup work the same
way). Where it cannot be made (no cgroup2 mount, no permission, an old kernel) the agent has
its subreaper sweep alone; nothing here raises. On request only (MPILAUNCH_CGROUP=1): moving
each rank in costs the kernel a cgroup migration, a visible part of a short job's start, and
the sweep alone already ends every tree while the agent lives.
"""

from __future__ import annotations

import _signal as signal
import os
import time


def _own_cgroup_dir() -> str | None:
    """Where this process's cgroup v2 directory is mounted, or None."""
    try:
        with open("/proc/self/cgroup") as handle:
            path = next((line[3:].strip() for line in handle if line.startswith("0::")), None)
        if path is None:
            return None
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                before, _, after = line.partition(" - ")
                if after.split(" ", 1)[0] == "cgroup2":
                    fields = before.split()
                    root, mount = fields[3], fields[4]
                    if path == root or path.startswith(root.rstrip("/") + "/"):
                        relative = path[len(root.rstrip("/")) :].lstrip("/")
                        return os.path.join(mount, relative) if relative else mount
    except OSError:
        pass
    return None


class JobCgroup:
    """One directory below the agent's own cgroup; the ranks are moved in before they run."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.has_kill = os.path.exists(os.path.join(path, "cgroup.kill"))  # Linux 5.14+

    @classmethod
    def create(cls, name: str) -> JobCgroup | None:
        """The cgroup, or None where the host does not let this agent make and use one."""
        parent = _own_cgroup_dir()
        if parent is None:
            return None
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError:
            return None
        made = cls(path)
        if not made.add(os.getpid(), probe=True):
            made.remove()
            return None
        return made

    def add(self, pid: int, probe: bool = False) -> bool:
        """Move pid (a rank held at its start gate) into the cgroup. probe: check that moving
        works at all, by moving this agent in and straight back out."""
        try:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as handle:
                handle.write(str(pid))
            if probe:
                with open(os.path.join(os.path.dirname(self.path), "cgroup.procs"), "w") as handle:
                    handle.write(str(pid))
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as handle:
                return [int(word) for word in handle.read().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """SIGKILL everything in the cgroup: at once where the kernel has cgroup.kill, else each
        listed process (a listed pid is in the cgroup, so it is not a reused one of someone else)."""
        if self.has_kill:
            try:
                with open(os.path.join(self.path, "cgroup.kill"), "w") as handle:
                    handle.write("1")
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self, tries: int = 1) -> bool:
        """rmdir: possible once no process is left in it (the kernel may say busy for a moment
        after the last one was reaped: tries, 5 ms apart)."""
        for attempt in range(tries):
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if attempt + 1 < tries:
                    time.sleep(0.005)
        return False
