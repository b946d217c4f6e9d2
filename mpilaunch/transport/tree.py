"""Tree spawn, the launcher's side: connect to a few hosts, and let their agents start the rest.

With `--ssh-tree-width K` the launcher opens SSH connections (paramiko) to K hosts only; each
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
import selectors
import sys
import time
from collections.abc import Callable, Iterable, Mapping

from mpilaunch import wire
from mpilaunch.transport.bootstrap import agent_command
from mpilaunch.transport.ssh import CONNECT_TIMEOUT, HostResult, SshError, SshLink, SshOptions, start_agents


def tree_layout(indices: Iterable[int], width: int) -> dict[int, int | None]:
    """Each host's parent (None: the launcher) in a breadth-first tree where the launcher and
    every host have at most width children, in the given order: the first width hosts are
    the heads, the next width² their children, and so on."""
    order = list(indices)
    return {host: None if j < width else order[(j - width) // width] for j, host in enumerate(order)}


def depth_of(parents: Mapping[int, int | None], host: int) -> int:
    depth = 1
    parent = parents[host]
    while parent is not None:
        depth += 1
        parent = parents[parent]
    return depth


class RelayedLink:
    """A host's agent reached through relays: frames go through the head host's connection."""

    local = False
    relayed = True

    def __init__(self, index: int, name: str, head: SshLink, head_index: int, parent: int, hello: dict) -> None:
        self.index = index
        self.name = name
        self.head = head
        self.head_index = head_index
        self.parent = parent  # the host whose agent started this one
        self.hello = hello
        self.peer = str(hello.get("addr") or name)  # the address its sshd was reached at
        self.local_address = ""

    def fileno(self) -> int:
        return -1  # nothing to select on: its frames arrive on the head's connection

    def send(self, frame: bytes) -> None:
        self.head.send(wire.routed(self.index, frame))

    def readable(self) -> bool:
        return self.head.readable()

    def ping_every(self, interval: float, frame: bytes) -> None:
        """Nothing to do: its relay pings it, and its own pings come up through the relays."""

    def close(self) -> None:
        """Ask its relay to cut it off (best effort: the head may be gone already)."""
        drop = wire.control("drop", host=self.index)
        try:
            self.head.send(drop if self.parent == self.head_index else wire.routed(self.parent, drop))
        except Exception:
            pass

    def wait(self) -> None:
        pass


class HeadReader:
    """Control frames from the head connections during start-up, as (host, message): the host is
    the head itself or the one a ROUTED frame came from. Whatever is left unread of a frame is
    handed back to its link for the controller."""

    def __init__(self, heads: Mapping[int, SshLink]) -> None:
        self.heads = dict(heads)
        self.decoders = {index: wire.Decoder() for index in heads}
        self.sel = selectors.DefaultSelector()
        for index, link in heads.items():
            self.sel.register(link.fileno(), selectors.EVENT_READ, index)
        self.closed: set[int] = set()

    def read(self, timeout: float) -> list[tuple[int, dict]]:
        """Messages that arrived within timeout; a head whose connection ended is added to closed."""
        found: list[tuple[int, dict]] = []
        for key, _ in self.sel.select(timeout):
            head = key.data
            link = self.heads[head]
            data = link.recv()
            if data is None:
                continue
            if not data:
                self.sel.unregister(key.fd)
                self.closed.add(head)
                continue
            try:
                frames = self.decoders[head].feed(data)
            except wire.FrameError:
                self.sel.unregister(key.fd)
                self.closed.add(head)
                continue
            for kind, value in frames:
                origin = head
                if kind == wire.ROUTED:
                    origin, inner = value  # type: ignore[misc]
                    try:
                        kind, value = wire.decode_frame(inner)
                    except wire.FrameError:
                        continue
                if kind == wire.CONTROL:
                    found.append((origin, value))  # type: ignore[arg-type]
        return found

    def close(self) -> None:
        for index, link in self.heads.items():
            if index not in self.closed:
                link.unread = self.decoders[index].pending()
        self.sel.close()


def gather(links: Mapping[int, SshLink | RelayedLink], op: str, timeout: float) -> dict[int, dict]:
    """The next control frame with this op from each of these remote agents, read through the
    connections that carry them (a relayed host's comes through its head); a host missing from
    the answer said nothing of the kind in time."""
    heads: dict[int, SshLink] = {}
    for index, link in links.items():
        if isinstance(link, RelayedLink):
            heads[link.head_index] = link.head
        else:
            heads[index] = link
    reader = HeadReader(heads)
    found: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < len(links) and len(reader.closed) < len(heads):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for origin, msg in reader.read(left):
                if origin in links and msg.get("op") == op:
                    found.setdefault(origin, msg)
    finally:
        reader.close()
    return found


def start_tree(
    names: Mapping[int, tuple[str, str | None, int | None]],
    options: SshOptions,
    first: Callable[[int], bytes | None],
    width: int,
) -> dict[int, HostResult]:
    """Start every host's agent, the first `width` by the launcher and the rest by relays, each
    checked with first(index) like start_agents does; failures are results."""
    parents = tree_layout(sorted(names), width)
    children: dict[int | None, list[int]] = {}
    for host, parent in parents.items():
        children.setdefault(parent, []).append(host)
    heads = children.get(None, [])

    def spec(host: int) -> dict:
        name, user, port = names[host]
        frame = first(host) or b""
        return {
            "index": host,
            "name": name,
            "user": user,
            "port": port,
            "first": frame.decode("latin-1"),
            "below": [spec(c) for c in children.get(host, [])],
        }

    ssh = {"config": os.path.abspath(options.config) if options.config else None, "accept_new": options.accept_new}
    command = agent_command(options.python)

    def first_of_head(head: int) -> bytes:
        """The check, and right behind it the order to start the hosts below: a head starts its
        children as soon as it has answered, without waiting for the other heads."""
        frame = first(head) or b""
        if head in children:
            hosts = [spec(c) for c in children[head]]
            frame += wire.control("relay", ssh=ssh, command=command, hosts=hosts)
        return frame

    results = start_agents({h: names[h] for h in heads}, options, first_of_head)
    below = [h for h in sorted(names) if parents[h] is not None]
    if not below:
        return results
    started = {h: r.link for h, r in results.items() if r.link is not None and h in children}
    tree = _Tree(names, parents, children, results, started)
    for host in below:
        results[host] = HostResult(host)
        head = tree.head_of(host)
        if head in started:
            tree.waiting.add(host)
        else:
            results[host].error = SshError("agent", f"not started: its relay {names[head][0]} could not be used")
    reader = HeadReader(started)
    deadline = time.monotonic() + CONNECT_TIMEOUT * (1 + max(depth_of(parents, h) for h in below))
    try:
        while tree.waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for origin, msg in reader.read(left):
                tree.take(origin, msg)
            for head in reader.closed:
                for host in [h for h in tree.waiting if tree.head_of(h) == head]:
                    tree.fail(host, f"its relay {names[head][0]} was lost")
    finally:
        reader.close()
    for host in sorted(tree.waiting):
        relay = names[parents[host]][0]  # type: ignore[index]
        results[host].error = SshError("agent", f"no answer through relay {relay} in time")
    return dict(sorted(results.items()))


class _Tree:
    """The start-up of the hosts below the heads: who waits, and what each message means."""

    def __init__(
        self,
        names: Mapping[int, tuple[str, str | None, int | None]],
        parents: Mapping[int, int | None],
        children: Mapping[int | None, list[int]],
        results: dict[int, HostResult],
        heads: Mapping[int, SshLink],
    ) -> None:
        self.names = names
        self.parents = parents
        self.children = children
        self.results = results
        self.heads = heads
        self.waiting: set[int] = set()

    def head_of(self, host: int) -> int:
        parent = self.parents[host]
        while parent is not None:
            host, parent = parent, self.parents[parent]
        return host

    def take(self, origin: int, msg: dict) -> None:
        """One start-up message from a host below the heads, or a relay's word about one."""
        op = msg.get("op")
        if op == "note":
            print(msg.get("text", ""), file=sys.stderr)
        elif op == "gone":
            host = msg.get("host")
            if host in self.waiting and self.parents.get(host) == origin:  # type: ignore[arg-type]
                self.fail(host, str(msg.get("why", "")))  # type: ignore[arg-type]
        elif origin in self.waiting:
            result = self.results[origin]
            if op == "hello":
                head = self.head_of(origin)
                parent = self.parents[origin]
                assert parent is not None
                result.link = RelayedLink(origin, self.names[origin][0], self.heads[head], head, parent, msg)  # type: ignore[assignment]
            elif op == "checked" and result.link is not None:
                result.reply = msg
                self.waiting.discard(origin)

    def fail(self, host: int, why: str) -> None:
        """host could not be started through its relay; nor can anything below it."""
        self.results[host].error = SshError("agent", why)
        self.waiting.discard(host)
        for child in self.children.get(host, []):
            if child in self.waiting:
                self.fail(child, f"not started: its relay {self.names[host][0]} failed")
