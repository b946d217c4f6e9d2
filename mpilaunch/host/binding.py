"""CPU sets for --bind-to, read from this host's topology (stdlib only: runs in the agent)."""

from __future__ import annotations

import os


def _topology_value(cpu: int, name: str) -> int:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/{name}") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return cpu if name == "core_id" else 0


def numa_nodes() -> dict[int, int]:
    """cpu -> its NUMA node, from /sys (empty where the kernel shows none)."""
    nodes: dict[int, int] = {}
    base = "/sys/devices/system/node"
    try:
        names = [n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit()]
    except OSError:
        return nodes
    for name in names:
        try:
            with open(f"{base}/{name}/cpulist") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        for part in filter(None, text.split(",")):
            first, _, last = part.partition("-")
            for cpu in range(int(first), int(last or first) + 1):
                nodes[cpu] = int(name[4:])
    return nodes


def cpu_groups(level: str, cpus: list[int] | None = None) -> list[list[int]]:
    """The host's usable CPUs grouped by hwthread, core, socket or NUMA node, in CPU order."""
    usable = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if level == "hwthread":
        return [[c] for c in usable]
    numa = numa_nodes() if level == "numa" else {}
    groups: dict[tuple[int, ...], list[int]] = {}
    for cpu in usable:
        package = _topology_value(cpu, "physical_package_id")
        if level == "numa":
            key: tuple[int, ...] = (numa.get(cpu, package),)
        else:
            key = (package,) if level == "socket" else (package, _topology_value(cpu, "core_id"))
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values())


def domains(count: int, cpus: list[int] | None = None) -> list[list[int]]:
    """Intel MPI's default pinning (I_MPI_PIN_DOMAIN=auto:compact): the host's usable CPUs cut
    into `count` equal runs in CPU order; with more ranks than CPUs, one CPU each, round-robin."""
    usable = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    size = max(1, len(usable) // max(count, 1))
    return [usable[i * size : (i + 1) * size] for i in range(min(count, len(usable)))]


def cpus_for(level: str, local_rank: int, groups: list[list[int]], per: int = 1) -> list[int] | None:
    """Local rank i gets group i (wrapping around when ranks outnumber groups); with per > 1
    (Open MPI's PE=per), the per groups i*per to i*per+per-1 together."""
    if level == "none" or not groups:
        return None
    first = local_rank * per
    return [cpu for k in range(first, first + per) for cpu in groups[k % len(groups)]]


def report(cpus: list[int] | None, usable: list[int] | None = None) -> str:
    """Open MPI's words for a rank's binding (`--report-bindings`): `bound to socket 0[core 1[hwt
    0]]: [./B]` (each bound core, then a map per socket: a letter per hwthread, cores split by
    /), or `is not bound (or bound to all available processors)`."""
    every = sorted(usable if usable is not None else os.sched_getaffinity(0))
    if not cpus or set(cpus) >= set(every):
        return "is not bound (or bound to all available processors)"
    where: dict[int, tuple[int, int]] = {}  # cpu -> (package, core id)
    for cpu in every:
        where[cpu] = (_topology_value(cpu, "physical_package_id"), _topology_value(cpu, "core_id"))
    packages = sorted({p for p, _ in where.values()})
    cores = {p: sorted({c for q, c in where.values() if q == p}) for p in packages}
    threads = {key: sorted(cpu for cpu, at in where.items() if at == key) for key in set(where.values())}
    bound = set(cpus)
    named = []
    for p in packages:
        for c in cores[p]:
            hwts = [h for h, cpu in enumerate(threads[(p, c)]) if cpu in bound]
            if hwts:
                span = str(hwts[0]) if len(hwts) == 1 else f"{hwts[0]}-{hwts[-1]}"
                named.append(f"socket {packages.index(p)}[core {cores[p].index(c)}[hwt {span}]]")
    picture = "".join(
        "[" + "/".join("".join("B" if cpu in bound else "." for cpu in threads[(p, c)]) for c in cores[p]) + "]"
        for p in packages
    )
    return f"bound to {', '.join(named)}: {picture}"
