"""What /proc says about processes: children, without psutil (this runs on hosts with only Python)."""

from __future__ import annotations

import os


def children_of(pid: int) -> list[int]:
    """Children of pid: from /proc/PID/task/*/children (cheap) where the kernel has it, else a scan."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        found: list[int] = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found.extend(int(child) for child in handle.read().split())
        return found
    except (OSError, ValueError):
        return _scan_children_of(pid)


def _scan_children_of(pid: int) -> list[int]:
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(name))
    return found


def with_descendants(pid: int, limit: int = 4096) -> list[int]:
    """pid and every process below it (at most limit of them)."""
    found: dict[int, None] = {}  # in order, each once
    stack = [pid]
    while stack and len(found) < limit:
        current = stack.pop()
        if current not in found:
            found[current] = None
            stack.extend(children_of(current))
    return list(found)


def start_time(pid: int) -> bytes | None:
    """When pid started (field 22 of /proc/PID/stat, in clock ticks since boot); None when it is
    gone. A pid with another start time than before is another process: the pid was reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def started_at(pid: int) -> float | None:
    """When pid started, in seconds since the epoch (to a second: the boot time is whole
    seconds); None when it is gone or /proc does not say."""
    ticks = start_time(pid)
    try:
        with open("/proc/stat", "rb") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith(b"btime "))
        return boot + int(ticks) / os.sysconf("SC_CLK_TCK") if ticks is not None else None
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def has_ancestor(name: str, pid: int | None = None, limit: int = 64) -> bool:
    """Whether a process named `name` (its comm) is above pid (default: this process), e.g.
    slurmstepd above a batch script: this process then runs inside a Slurm job step."""
    pid = os.getppid() if pid is None else pid
    for _ in range(limit):
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            return False
        if stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace") == name:
            return True
        pid = int(stat[stat.rfind(b")") + 2 :].split()[1])
    return False
