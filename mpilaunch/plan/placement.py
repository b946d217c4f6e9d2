"""Slot allocation: hosts and app sizes in, one Rank per process out (Open MPI 4.1 rules)."""

from __future__ import annotations

from mpilaunch.errors import LaunchError
from mpilaunch.plan.hosts import Host
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

# The largest job planned, all its app contexts and spawned jobs together (cli/cliopts.py says it too).
MAX_RANKS = 65536


class Rank(Record):
    """Where one process runs and what it is called there."""

    rank: int
    app: int
    host: int  # index into the job's host list
    local_rank: int  # among the job's ranks on its host, in rank order
    local_size: int
    node_rank: int  # index of the host among the hosts that run ranks


def parse_map_by(map_by: str, npernode: int | None, sockets: int = 1) -> tuple[str, int]:
    """Normalise --map-by / --npernode to ("slot"|"node"|"ppr", per_node); ppr:N:socket places
    N per socket of a host that has `sockets` of them."""
    if npernode is not None:
        if npernode < 1:
            raise LaunchError(f"--npernode must be at least 1, not {npernode}")
        return "ppr", npernode
    policy = map_by.split(":", 1)[0].lower() if not map_by.lower().startswith("ppr") else map_by.lower()
    if policy in ("slot", "core", "hwthread", "socket", "numa", "l3cache", "l2cache", "l1cache", "board"):
        return "slot", 0
    if policy == "node":
        return "node", 0
    parts = policy.split(":")
    if parts[0] == "ppr" and len(parts) == 3 and parts[2] in ("node", "socket") and parts[1].isdigit():
        per = int(parts[1]) * (sockets if parts[2] == "socket" else 1)
        if per > 0:
            return "ppr", per
    raise LaunchError(f"--map-by {map_by!r}: expected slot, node, ppr:N:node or ppr:N:socket")


def _capacity(host: Host, used: int, oversubscribe: bool) -> int:
    """How many more ranks a host takes: its free slots, or up to max_slots when oversubscribing."""
    assert host.slots is not None
    if not oversubscribe:
        return max(host.slots - used, 0)
    if host.max_slots is not None and host.max_slots > 0:
        return max(host.max_slots - used, 0)
    return 1 << 30


def _not_enough(requested: int, hosts: list[Host], argv0: str, oversubscribe: bool) -> LaunchError:
    slots = ", ".join(f"{h.name}:{h.slots}" for h in hosts)
    total = sum(h.slots or 0 for h in hosts)
    capped = oversubscribe and any(h.max_slots for h in hosts)
    hint = (
        "max_slots caps every host even with --oversubscribe"
        if capped
        else "request fewer ranks, add slots, or use --oversubscribe"
    )
    return LaunchError(
        f"There are not enough slots available in the system to satisfy the {requested} slots "
        f"that were requested by the application: {argv0} (slots: {slots}; {total} in all); {hint}"
    )


def _none_left(app: int, argv0: str, hosts: list[Host]) -> LaunchError:
    """A program without -n gets the slots left, and the programs before it took them all."""
    total = sum(h.slots or 0 for h in hosts)
    return LaunchError(
        f"program {app + 1} ({argv0}) has no -n and the programs before it take every slot ({total} in all); give it -n"
    )


def _by_slot(np: int, hosts: list[Host], used: list[int], oversubscribe: bool, argv0: str) -> list[int]:
    """Fill each host's free slots in order; extra ranks are then spread evenly."""
    counts = [0] * len(hosts)
    left = np
    for i, host in enumerate(hosts):
        take = min(_capacity(host, used[i], False), left)
        counts[i] += take
        left -= take
    if left and not oversubscribe:
        raise _not_enough(np + sum(used), hosts, argv0, oversubscribe)
    while left:
        room = [i for i in range(len(hosts)) if _capacity(hosts[i], used[i] + counts[i], True) > 0]
        if not room:
            raise _not_enough(np + sum(used), hosts, argv0, oversubscribe)
        share, extra = divmod(left, len(room))
        for k, i in enumerate(room):
            want = share + (1 if k < extra else 0)
            take = min(want, _capacity(hosts[i], used[i] + counts[i], True))
            counts[i] += take
            left -= take
    return counts


def _by_node(np: int, hosts: list[Host], used: list[int], oversubscribe: bool, argv0: str) -> list[int]:
    """Open MPI 4.1's by-node balance: an average per host plus extras for the first hosts.

    Hosts with fewer free slots than their share take what they have, and later passes place
    the rest; when oversubscribed every host takes its share (up to max_slots here).
    """
    free = sum(_capacity(h, used[i], False) for i, h in enumerate(hosts))
    over = np > free
    if over and not oversubscribe:
        raise _not_enough(np + sum(used), hosts, argv0, oversubscribe)
    counts = [0] * len(hosts)
    nnodes = len(hosts)
    mapped = 0
    while mapped < np:
        before = mapped
        left = np - mapped
        navg = max(left // nnodes, 1)
        balance = (left - navg * nnodes) / nnodes
        extra = int(balance)
        spare_nodes, add_one = 0, False
        if balance - extra > 0:
            spare_nodes = left - (navg + extra) * nnodes
            extra += 1
            add_one = True
        for i, host in enumerate(hosts):
            in_use = used[i] + counts[i]
            if over:
                take = min(navg + extra, _capacity(host, in_use, True))
            elif _capacity(host, in_use, False) == 0:
                continue
            else:
                if add_one:
                    if spare_nodes == 0:
                        extra -= 1
                        add_one = False
                    else:
                        spare_nodes -= 1
                take = min(_capacity(host, in_use, False), navg + extra)
            take = min(take, np - mapped)
            counts[i] += take
            mapped += take
            if mapped == np:
                break
        if mapped == before:
            raise _not_enough(np + sum(used), hosts, argv0, oversubscribe)
    return counts


def _cycle(counts: list[int], order: list[int]) -> list[int]:
    """Rank order of a by-node mapping: one rank per host per round, hosts in job-map order."""
    return [i for round_ in range(max(counts, default=0)) for i in order if counts[i] > round_]


def _by_ppr(np: int | None, per: int, hosts: list[Host], used: list[int], oversubscribe: bool, argv0: str) -> list[int]:
    want = per * len(hosts) if np is None else np
    counts = [0] * len(hosts)
    left = want
    for i, host in enumerate(hosts):
        take = min(per, left)
        if take > _capacity(host, used[i], oversubscribe):
            raise _not_enough(want + sum(used), hosts, argv0, oversubscribe)
        counts[i] = take
        left -= take
    if left:
        raise LaunchError(f"{want} ranks requested but ppr:{per}:node on {len(hosts)} hosts places {per * len(hosts)}")
    return counts


def place(
    hosts: list[Host],
    apps: list[tuple[int | None, str]],
    map_by: str = "slot",
    npernode: int | None = None,
    oversubscribe: bool = False,
    in_use: list[int] | None = None,
    rank_by: str | None = None,
    sockets: int = 1,
    only: Sequence[Collection[int] | None] | None = None,
) -> list[Rank]:
    """Map every app's ranks onto the hosts; apps fill slots one after another, as in mpirun.

    in_use counts slots already taken per host (by the running jobs, when MPI_Comm_spawn asks).
    rank_by (Open MPI's --rank-by) numbers a host's ranks in blocks (slot) or one host at a time
    round the hosts (node); by default as the mapping does. sockets: of each host (ppr:N:socket).
    only: per app, the hosts it may use (MPI_Comm_spawn's info host), None for any.
    """
    if any(h.slots is None for h in hosts):
        raise ValueError("place() needs every host's slot count")
    policy, per = parse_map_by(map_by, npernode, sockets)
    cyclic = (rank_by or ("node" if policy == "node" else "slot")) == "node"
    used = list(in_use) if in_use is not None else [0] * len(hosts)
    planned = sum(used)
    placed: list[tuple[int, int]] = []  # (app, host) in rank order
    map_order: list[int] = []  # hosts in the order they first got ranks: how ranks are numbered
    for app, (np, argv0) in enumerate(apps):
        if np is not None and np < 1:
            raise LaunchError(f"-n must be at least 1, not {np}")
        # As Open MPI 4.1 does for later app contexts: hosts with free slots first, then full
        # ones, then oversubscribed ones (the order within each kind is kept).
        allowed = only[app] if only is not None else None
        rotation = sorted(
            (i for i in range(len(hosts)) if allowed is None or i in allowed),
            key=lambda i: (used[i] >= (hosts[i].slots or 0)) + (used[i] > (hosts[i].slots or 0)),
        )
        r_hosts = [hosts[i] for i in rotation]
        r_used = [used[i] for i in rotation]
        if policy == "ppr":
            _check_size(planned + (per * len(r_hosts) if np is None else np))
            r_counts = _by_ppr(np, per, r_hosts, r_used, oversubscribe, argv0)
        else:
            if np is None:
                np = sum(_capacity(hosts[i], used[i], False) for i in rotation)
                if np == 0:
                    raise _none_left(app, argv0, hosts)
            _check_size(planned + np)
            spread = _by_node if policy == "node" else _by_slot
            r_counts = spread(np, r_hosts, r_used, oversubscribe, argv0)
        counts = [0] * len(hosts)
        for position, host in enumerate(rotation):
            counts[host] = r_counts[position]
            if counts[host] and host not in map_order:
                map_order.append(host)
        if cyclic:
            order = _cycle(counts, map_order)
        else:
            order = [i for i in map_order for _ in range(counts[i])]
        for i in order:
            used[i] += 1
        planned += len(order)
        placed.extend((app, i) for i in order)
    return number_ranks(placed, len(hosts))


def place_round_robin(
    entries: list[tuple[int, int]], apps: list[int | None], nhosts: int, ppn: int | None = None
) -> list[Rank]:
    """hydra's placement (-hosts, -ppn, -f): each entry of the host list, (host index, count), in
    turn takes its count of consecutive ranks (every entry -ppn's, when given), round the list
    and round again, with no slot limit; a later program continues where the last one stopped.
    A program without -n has one rank per count of the list."""
    counts = [ppn or count for _, count in entries]
    placed: list[tuple[int, int]] = []
    entry, taken = 0, 0
    for app, np in enumerate(apps):
        if np is not None and np < 1:
            raise LaunchError(f"-n must be at least 1, not {np}")
        np = sum(counts) if np is None else np
        _check_size(len(placed) + np)
        for _ in range(np):
            if taken == counts[entry]:
                entry, taken = (entry + 1) % len(entries), 0
            placed.append((app, entries[entry][0]))
            taken += 1
    return number_ranks(placed, nhosts)


def _check_size(total: int) -> None:
    """A job larger than MAX_RANKS is refused before a rank of it is planned (placing, and then
    an environment per rank, would take memory without end)."""
    if total > MAX_RANKS:
        raise LaunchError(f"the job would have {total} ranks; mpilaunch starts at most {MAX_RANKS}")


def number_ranks(placed: list[tuple[int, int]], nhosts: int) -> list[Rank]:
    """Derive local ranks, local sizes and node indexes from (app, host) pairs in rank order."""
    local_size = [0] * nhosts
    for _, host in placed:
        local_size[host] += 1
    node_of = {h: n for n, h in enumerate(h for h in range(nhosts) if local_size[h])}  # used hosts, in order
    seen = [0] * nhosts
    ranks = []
    for rank, (app, host) in enumerate(placed):
        ranks.append(Rank(rank, app, host, seen[host], local_size[host], node_of[host]))
        seen[host] += 1
    return ranks
