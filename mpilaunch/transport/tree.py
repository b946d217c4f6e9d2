"""Tree spawn, the launcher's side: connect to a few hosts, and let their agents start the rest.

With `--ssh-tree-width K` the launcher opens SSH connections (with either SSH transport) to K hosts only; each
of their agents starts up to K more with OpenSSH's `ssh` (agent.relay), and so on down, so a
host count N takes about log_K(N) rounds of connections instead of N connections from one
process. The hosts must be able to reach one another over SSH, as Open MPI's tree spawn needs.

Every host still has its own link in the controller: a RelayedLink sends through the head
host's connection, wrapped in ROUTED frames that the relays pass down, and the relays wrap
what comes up. Each relaying host is sent its RelayHosts right behind its check; the hosts
below greet the launcher through the heads (launcher/start/greeting.py), as any other.

Only remote hosts are in the tree (a relay ships its own code, which a forked local agent does
not have: Agent.start_relay refuses), and `mpilaunch check` and `allrun` start their hosts
directly. Collectives are not merged per level: each host's fence goes up on its own (a PMI
barrier's answer comes down once per head, as an ALL frame).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from mpilaunch.plan.hosts import Host
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import Drop, RelayHost, RelayHosts, encode
from mpilaunch.transport.base import HostResult, Link, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_command
from mpilaunch.transport.sshcommon import CONNECT_TIMEOUT, SshOptions


def tree_layout(indices: Iterable[int], width: int) -> dict[int, int | None]:
    """Each host's parent (None: the launcher) in a breadth-first tree where the launcher and
    every host have at most width children, in the given order: the first width hosts are
    the heads, the next width² their children, and so on."""
    order = list(indices)
    return {host: None if j < width else order[(j - width) // width] for j, host in enumerate(order)}


def path_up(parents: Mapping[int, int | None], host: int) -> list[int]:
    """host, its relay, that one's relay... up to its head (the last one)."""
    path = [host]
    while parents[path[-1]] is not None:
        path.append(parents[path[-1]])  # type: ignore[arg-type]
    return path


class RelayedLink(Link):
    """A host's agent reached through relays: frames go through the head host's connection."""

    relayed = True

    marked = False  # its relay skips what a login script printed

    def __init__(self, index: int, name: str, head: Link, head_index: int, parent: int, depth: int) -> None:
        super().__init__(name)
        self.index = index
        self.head = head
        self.head_index = head_index
        self.parent = parent  # the host whose agent started this one
        self.patience = CONNECT_TIMEOUT * (1 + depth)  # a round of connections per relay above it

    def fileno(self) -> int:
        return -1  # nothing to select on: its frames arrive on the head's connection

    def send(self, frame: bytes) -> None:
        self.head.send(wire.routed(self.index, frame))  # type: ignore[union-attr]

    def readable(self) -> bool:
        return self.head.readable()  # type: ignore[union-attr]

    def ping_every(self, interval: float, frame: bytes) -> None:
        """Nothing to do: its relay pings it, and its own pings come up through the relays."""

    def close(self) -> None:
        """Ask its relay to cut it off (best effort: the head may be gone already)."""
        drop = encode(Drop(host=self.index))
        try:
            self.head.send(drop if self.parent == self.head_index else wire.routed(self.parent, drop))  # type: ignore[union-attr, arg-type]
        except Exception:
            pass


class TreeTransport(Transport):
    """The first `width` hosts started by the launcher with heads (a transport of its own: paramiko
    or OpenSSH), the rest by relays: each relaying host gets its RelayHosts behind its check."""

    name = "tree"

    def __init__(self, heads: Transport, options: SshOptions, width: int) -> None:
        self.heads = heads
        self.options = options
        self.width = width

    def retry(self, error: TransportError) -> bool:
        return self.heads.retry(error)

    def start(self, hosts: Mapping[int, Host]) -> dict[int, HostResult]:
        parents = tree_layout(sorted(hosts), self.width)
        children: dict[int | None, list[int]] = {}
        for host, parent in parents.items():
            children.setdefault(parent, []).append(host)

        def spec(host: int) -> RelayHost:
            where = hosts[host]
            below = tuple(spec(c) for c in children.get(host, []))
            return RelayHost(host, where.name, where.user, where.port, below)

        options = self.options
        ssh = options.spec(os.path.abspath(options.config) if options.config else None)
        command = agent_command(options.python)
        heads = children.get(None, [])
        results = self.heads.start({h: hosts[h] for h in heads})
        links: dict[int, Link] = {h: r.link for h, r in results.items() if r.link is not None}
        for host in [h for h in sorted(hosts) if parents[h] is not None]:  # parents before their children
            results[host] = HostResult(host)
            path = path_up(parents, host)
            head, parent = path[-1], path[1]
            if head not in links or parent not in links:
                relay = hosts[parent if parent not in links else head].name
                results[host].error = TransportError("agent", f"not started: its relay {relay} could not be used")
                continue
            links[host] = RelayedLink(host, hosts[host].name, links[head], head, parent, len(path) - 1)
            results[host].link = links[host]
        for host, link in links.items():
            below = [c for c in children.get(host, []) if c in links]
            if below:
                link.follow.append(encode(RelayHosts(ssh=ssh, command=command, hosts=tuple(spec(c) for c in below))))
        return dict(sorted(results.items()))
