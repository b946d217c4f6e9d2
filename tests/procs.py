"""What /proc says of a process, for the tests and their beds (the sshd bed, the Slurm bed): no
pytest here, so the benchmarks can use the beds without it."""

from __future__ import annotations


def stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, session, ...);
    [] when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def parent_pid(pid: int) -> int:
    """A process's parent, 0 when it is gone."""
    fields = stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def process_name(pid: int) -> str:
    """The kernel's comm of a process (slurmstepd shows as `slurmstepd`), '' when gone."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""
