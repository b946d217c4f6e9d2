"""CPU sets for --bind-to, read from this host's topology (stdlib only: runs in the agent)."""

from __future__ import annotations

import os


def _topology_value(cpu: int, name: str) -> int:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/{name}") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return cpu if name == "core_id" else 0


def cpu_groups(level: str, cpus: list[int] | None = None) -> list[list[int]]:
    """The host's usable CPUs grouped by hwthread, core or socket, in CPU order."""
    usable = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if level == "hwthread":
        return [[c] for c in usable]
    groups: dict[tuple[int, ...], list[int]] = {}
    for cpu in usable:
        package = _topology_value(cpu, "physical_package_id")
        key = (package,) if level == "socket" else (package, _topology_value(cpu, "core_id"))
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values())


def cpus_for(level: str, local_rank: int, groups: list[list[int]]) -> list[int] | None:
    """Local rank i gets group i (wrapping around when ranks outnumber groups)."""
    if level == "none" or not groups:
        return None
    return groups[local_rank % len(groups)]
