"""What each running rank of this host uses now, for `mpilaunch top`: CPU seconds and resident
memory of the rank and every process below it, read from /proc (nothing is stopped or asked).

The CPU seconds are totals so far; whoever asks twice divides the difference by the time between
(cli/topcli.py). Stdlib only: shipped with the agent, imported on the first request.
"""

from __future__ import annotations

import os

from mpilaunch.host.procfs import with_descendants
from mpilaunch.protocol.messages import RankUsage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

TREE_LIMIT = 256  # processes counted below one rank
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_usage(pid: int) -> tuple[str, float, int] | None:
    """(state, CPU seconds, resident bytes) of one process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        with open(f"/proc/{pid}/statm", "rb") as handle:
            resident = int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), (int(fields[11]) + int(fields[12])) / _TICK, resident
    except (IndexError, ValueError):
        return None


def rank_usage(proc: int, pid: int) -> RankUsage | None:
    """The rank's own state, with the CPU and memory of its whole tree; None when it is gone."""
    own = process_usage(pid)
    if own is None:
        return None
    state, cpu, rss = own
    count = 1
    for below in with_descendants(pid, TREE_LIMIT)[1:]:
        found = process_usage(below)
        if found is not None:
            cpu, rss, count = cpu + found[1], rss + found[2], count + 1
    return RankUsage(proc=proc, cpu=round(cpu, 2), rss=rss, state=state, processes=count)


def measure(ranks: Iterable[tuple[int, int]]) -> tuple[RankUsage, ...]:
    """Each (proc, pid) still there, measured."""
    return tuple(found for proc, pid in ranks if (found := rank_usage(proc, pid)) is not None)
