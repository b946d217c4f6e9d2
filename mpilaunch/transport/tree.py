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

from mpilaunch.protocol import wire
from mpilaunch.transport.bootstrap import agent_command
from mpilaunch.transport.ssh import CONNECT_TIMEOUT, HostResult, SshError, SshLink, SshOptions, start_agents


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
    """Control frames from the head connections during start-up, as (host, message, key): the
    host is the head itself or the one a ROUTED frame came from. A frame the caller does not
    take (keep(key)) goes back to its link, with whatever is left unread of the next one, for
    the controller: a host that said `gone` right after its check is not missed."""

    def __init__(self, heads: Mapping[int, SshLink]) -> None:
        self.heads = dict(heads)
        self.buffers = {index: bytearray() for index in heads}
        self.kept: dict[int, list[bytes]] = {index: [] for index in heads}
        self.sel = selectors.DefaultSelector()
        for index, link in heads.items():
            self.sel.register(link.fileno(), selectors.EVENT_READ, index)
        self.closed: set[int] = set()

    def read(self, timeout: float) -> list[tuple[int, dict, tuple[int, bytes]]]:
        """Messages that arrived within timeout; a head whose connection ended is added to closed."""
        found: list[tuple[int, dict, tuple[int, bytes]]] = []
        for key, _ in self.sel.select(timeout):
            head = key.data
            data = self.heads[head].recv()
            if data is None:
                continue
            buffer = self.buffers[head]
            buffer += data
            try:
                frames = wire.split(buffer) if data else []
            except wire.FrameError:
                frames = []
                data = b""
            if not data:
                self.sel.unregister(key.fd)
                self.closed.add(head)
            for kind, frame in frames:
                origin, inner = head, frame
                try:
                    if kind == wire.ROUTED:
                        origin, inner = wire.decode_frame(frame)[1]  # type: ignore[misc]
                    inner_kind, value = wire.decode_frame(inner)
                except wire.FrameError:
                    continue  # the controller would close the head for it; start-up has no use for it
                if inner_kind == wire.CONTROL:
                    found.append((origin, value, (head, frame)))  # type: ignore[arg-type]
                else:
                    self.keep((head, frame))
        return found

    def keep(self, key: tuple[int, bytes]) -> None:
        head, frame = key
        self.kept[head].append(frame)

    def close(self) -> None:
        for index, link in self.heads.items():
            if index not in self.closed:
                link.unread = b"".join(self.kept[index]) + bytes(self.buffers[index])
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
            for origin, msg, key in reader.read(left):
                if origin in links and origin not in found and msg.get("op") == op:
                    found[origin] = msg
                else:
                    reader.keep(key)
    finally:
        reader.close()
    return found


def start_tree(
    names: Mapping[int, tuple[str, str | None, int | None]],
    options: SshOptions,
    first: Callable[[int], bytes | None],
    width: int,
    start_heads: Callable[..., dict[int, HostResult]] = start_agents,
) -> dict[int, HostResult]:
    """Start every host's agent, the first `width` by the launcher (with start_heads: paramiko's
    start_agents or OpenSSH's) and the rest by relays, each checked with first(index) like
    start_agents does; failures are results."""
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

    results = start_heads({h: names[h] for h in heads}, options, first_of_head)
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
            for origin, msg, key in reader.read(left):
                if not tree.take(origin, msg):
                    reader.keep(key)
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
        return path_up(self.parents, host)[-1]

    def take(self, origin: int, msg: dict) -> bool:
        """One start-up message from a host below the heads, or a relay's word about one; False
        when it is not for start-up (the controller gets it)."""
        op = msg.get("op")
        if op == "note":
            print(msg.get("text", ""), file=sys.stderr)
            return True
        if op == "gone":
            host = msg.get("host")
            if host in self.waiting and self.parents.get(host) == origin:  # type: ignore[arg-type]
                self.fail(host, str(msg.get("why", "")))  # type: ignore[arg-type]
                return True
            return False
        if origin not in self.waiting:
            return False
        result = self.results[origin]
        if op == "hello":
            head = self.head_of(origin)
            parent = self.parents[origin]
            assert parent is not None
            result.link = RelayedLink(origin, self.names[origin][0], self.heads[head], head, parent, msg)  # type: ignore[assignment]
            return True
        if op == "checked" and result.link is not None:
            result.reply = msg
            self.waiting.discard(origin)
            return True
        return False

    def fail(self, host: int, why: str) -> None:
        """host could not be started through its relay; nor can anything below it."""
        self.results[host].error = SshError("agent", why)
        self.waiting.discard(host)
        for child in self.children.get(host, []):
            if child in self.waiting:
                self.fail(child, f"not started: its relay {self.names[host][0]} failed")
