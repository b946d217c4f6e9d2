"""Tree spawn, the launcher's side: connect to a few hosts, and let their agents start the rest.

With `--ssh-tree-width K` the launcher opens SSH connections (with either SSH transport) to K hosts only; each
of their agents starts up to K more with OpenSSH's `ssh` (agent.relay), and so on down, so a
host count N takes about log_K(N) rounds of connections instead of N connections from one
process. The hosts must be able to reach one another over SSH, as Open MPI's tree spawn needs.

Every host still has its own link in the controller: a RelayedLink sends through the head
host's connection, wrapped in ROUTED frames that the relays pass down, and the relays wrap
what comes up. The start-up phase (hellos and checks of hosts below the heads) is read here,
through the heads, before the controller takes over.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping

from mpilaunch.plan.hosts import Host
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import Checked, Drop, Gone, Hello, Note, RelayHost, RelayHosts, encode
from mpilaunch.protocol.record import Record
from mpilaunch.transport.base import HostResult, Link, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_command
from mpilaunch.transport.gather import HeadReader
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


def depth_of(parents: Mapping[int, int | None], host: int) -> int:
    return len(path_up(parents, host))


class RelayedLink(Link):
    """A host's agent reached through relays: frames go through the head host's connection."""

    relayed = True

    def __init__(self, index: int, name: str, head: Link, head_index: int, parent: int, hello: Hello) -> None:
        super().__init__(name)
        self.index = index
        self.head = head
        self.head_index = head_index
        self.parent = parent  # the host whose agent started this one
        self.hello = hello
        self.peer = hello.addr or name  # the address its sshd was reached at

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
    or OpenSSH), the rest by relays, each checked with first(index) like any start."""

    name = "tree"

    def __init__(self, heads: Transport, options: SshOptions, width: int) -> None:
        self.heads = heads
        self.options = options
        self.width = width

    def start(self, hosts: Mapping[int, Host], first: Callable[[int], bytes | None]) -> dict[int, HostResult]:
        parents = tree_layout(sorted(hosts), self.width)
        children: dict[int | None, list[int]] = {}
        for host, parent in parents.items():
            children.setdefault(parent, []).append(host)
        heads = children.get(None, [])

        def spec(host: int) -> RelayHost:
            where = hosts[host]
            frame = first(host) or b""
            below = tuple(spec(c) for c in children.get(host, []))
            return RelayHost(host, where.name, where.user, where.port, frame.decode("latin-1"), below)

        options = self.options
        ssh = options.spec(os.path.abspath(options.config) if options.config else None)
        command = agent_command(options.python)

        def first_of_head(head: int) -> bytes:
            """The check, and right behind it the order to start the hosts below: a head starts its
            children as soon as it has answered, without waiting for the other heads."""
            frame = first(head) or b""
            if head in children:
                frame += encode(RelayHosts(ssh=ssh, command=command, hosts=tuple(spec(c) for c in children[head])))
            return frame

        results = self.heads.start({h: hosts[h] for h in heads}, first_of_head)
        below = [h for h in sorted(hosts) if parents[h] is not None]
        if not below:
            return results
        started = {h: r.link for h, r in results.items() if r.link is not None and h in children}
        tree = _Tree(hosts, parents, children, results, started)  # type: ignore[arg-type]
        for host in below:
            results[host] = HostResult(host)
            head = tree.head_of(host)
            if head in started:
                tree.waiting.add(host)
            else:
                why = f"not started: its relay {hosts[head].name} could not be used"
                results[host].error = TransportError("agent", why)
        reader = HeadReader(started)  # type: ignore[arg-type]
        deadline = time.monotonic() + CONNECT_TIMEOUT * (1 + max(depth_of(parents, h) for h in below))
        try:
            while tree.waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for origin, message, key in reader.read(left):
                    if not tree.take(origin, message):
                        reader.keep(key)
                for head in reader.closed:
                    for host in [h for h in tree.waiting if tree.head_of(h) == head]:
                        tree.fail(host, f"its relay {hosts[head].name} was lost")
        finally:
            reader.close()
        for host in sorted(tree.waiting):
            relay = hosts[parents[host]].name  # type: ignore[index]
            results[host].error = TransportError("agent", f"no answer through relay {relay} in time")
        return dict(sorted(results.items()))


class _Tree:
    """The start-up of the hosts below the heads: who waits, and what each message means."""

    def __init__(
        self,
        hosts: Mapping[int, Host],
        parents: Mapping[int, int | None],
        children: Mapping[int | None, list[int]],
        results: dict[int, HostResult],
        heads: Mapping[int, Link],
    ) -> None:
        self.hosts = hosts
        self.parents = parents
        self.children = children
        self.results = results
        self.heads = heads
        self.waiting: set[int] = set()
        self.rows = {Note: self.note, Gone: self.gone, Hello: self.hello, Checked: self.checked}

    def head_of(self, host: int) -> int:
        return path_up(self.parents, host)[-1]

    def take(self, origin: int, message: Record) -> bool:
        """One start-up message from a host below the heads, or a relay's word about one; False
        when it is not for start-up (the controller gets it)."""
        row = self.rows.get(type(message))
        return row is not None and row(origin, message)  # type: ignore[operator]

    def note(self, origin: int, message: Note) -> bool:
        print(message.text, file=sys.stderr)
        return True

    def gone(self, origin: int, message: Gone) -> bool:
        if message.host in self.waiting and self.parents.get(message.host) == origin:
            self.fail(message.host, message.why)
            return True
        return False

    def hello(self, origin: int, message: Hello) -> bool:
        if origin not in self.waiting:
            return False
        head = self.head_of(origin)
        parent = self.parents[origin]
        assert parent is not None
        name = self.hosts[origin].name
        self.results[origin].link = RelayedLink(origin, name, self.heads[head], head, parent, message)
        return True

    def checked(self, origin: int, message: Checked) -> bool:
        result = self.results[origin]
        if origin not in self.waiting or result.link is None:
            return False
        result.reply = message
        self.waiting.discard(origin)
        return True

    def fail(self, host: int, why: str) -> None:
        """host could not be started through its relay; nor can anything below it."""
        self.results[host].error = TransportError("agent", why)
        self.waiting.discard(host)
        for child in self.children.get(host, []):
            if child in self.waiting:
                self.fail(child, f"not started: its relay {self.hosts[host].name} failed")
