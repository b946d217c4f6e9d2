"""Every new agent's greeting, driven by the launcher in one selector, whatever started it.

A transport only starts agents (a forked child, an `ssh` client, a paramiko channel, an srun
step, a relay's child) and hands back links whose agent code may still be queued. Here each
link is written its code, its Check (and, for tree spawn, what follows it), and read until its
agent has greeted: a login script's output up to the agent's MARKER (where a shell started
it), its Hello, then the Checked that answers the Check. A host behind relays greets through
its head's connection, in ROUTED frames. What comes after the greeting stays in the link for
the controller. Failures are results: the host's error, in words.
"""

from __future__ import annotations

import selectors
import sys
import time
from collections.abc import Callable, Mapping

from mpilaunch.launcher.start.window import StartWindow
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import UP, Bye, Checked, Gone, Hello, Note, decode
from mpilaunch.protocol.record import Record
from mpilaunch.transport.base import HostResult, Link, Transport, TransportError

RETRIES = 3  # starts more for hosts whose connection was dropped before the SSH banner (MaxStartups)
WINDOW = 32  # hosts whose connections are set up at once (--ssh-concurrent; Open MPI's plm_rsh_num_concurrent)


class GreetingError(Exception):
    """Why an agent's greeting failed, in words for its host's line."""


class Greeting:
    """One agent's greeting, fed its frames: Hello first, then Checked when a Check was sent;
    the frames after them (or between, not theirs) are kept for the controller."""

    def __init__(self, checked: bool, wait_hello: bool = True) -> None:
        self.checked = checked  # a Check was sent: its Checked is awaited
        self.wait_hello = wait_hello  # False: done at once (this machine's forked agent)
        self.hello: Hello | None = None
        self.reply: Checked | None = None
        self.later: list[bytes] = []

    @property
    def done(self) -> bool:
        if not self.wait_hello:
            return True
        return self.hello is not None and (self.reply is not None or not self.checked)

    def on_frame(self, kind: int, frame: bytes) -> None:
        """One whole frame of the agent's (a ROUTED one's inner frame for a relayed host)."""
        if self.done or kind != wire.CONTROL:
            self.later.append(frame)
            return
        message = message_of(frame)
        if isinstance(message, Bye) and message.why:  # it could not go on (a limit of its host)
            raise GreetingError(f"its agent stopped: {message.why}")
        if self.hello is None:
            if not isinstance(message, Hello):
                raise GreetingError("the agent did not say hello")
            self.hello = message
        elif isinstance(message, Checked):
            self.reply = message
        else:
            self.later.append(frame)


def message_of(frame: bytes) -> Record:
    try:
        return decode(wire.decode_frame(frame)[1], UP)  # type: ignore[arg-type]
    except wire.FrameError as exc:
        raise GreetingError(f"the agent's stream is garbled: {exc}") from None


class Stream:
    """The bytes of one connection: a login script's output skipped up to the marker (when a
    shell started its agent), then whole frames."""

    def __init__(self, marked: bool) -> None:
        self.inbox = bytearray()
        self.past = not marked

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.inbox += data
        try:
            self.past = self.past or wire.past_marker(self.inbox)
            return wire.split(self.inbox) if self.past else []
        except wire.FrameError as exc:
            raise GreetingError(str(exc) if not self.past else f"the agent's stream is garbled: {exc}") from None


class _Greeter:
    """The greetings of a start: who waits, what each connection carries, and the outcomes."""

    def __init__(self, checks: Callable[[int], bytes | None]) -> None:
        self.checks = checks
        self.results: dict[int, HostResult] = {}
        self.links: dict[int, Link] = {}
        self.greetings: dict[int, Greeting] = {}
        self.heads: dict[int, Link] = {}
        self.streams: dict[int, Stream] = {}
        self.kept: dict[int, list[bytes]] = {}  # later frames of relayed hosts
        self.deadlines: dict[int, float] = {}

    def add(self, results: Mapping[int, HostResult]) -> None:
        """Hosts just started: each one's patience counts from now, its code and Check queued."""
        self.results.update(results)
        links = {i: r.link for i, r in results.items() if r.link is not None}
        self.links.update(links)
        now = time.monotonic()
        for index, link in sorted(links.items(), key=lambda item: item[1].relayed):
            self.deadlines[index] = now + link.patience
            if not link.relayed:
                self.heads[index] = link
                self.streams[index] = Stream(link.marked)
                self.kept[index] = []
            check = self.checks(index)
            self.greetings[index] = Greeting(check is not None, link.await_hello)
            frames = ([check] if check is not None else []) + link.follow
            if link.relayed:  # behind its head's own frames, routed to it
                link.head.outbox += b"".join(wire.routed(index, f) for f in frames)  # type: ignore[union-attr]
            else:
                link.outbox += b"".join(frames)

    def done(self, index: int) -> bool:
        return index in self.links and self.greetings[index].done

    def waiting(self) -> list[int]:
        return [i for i, g in self.greetings.items() if i in self.links and not g.done]

    def fail(self, index: int, why: str) -> None:
        """The host's greeting failed, at the step its link names (an `ssh` client's words say how
        far it got); the hosts it relays to fail with it."""
        if index not in self.links:
            return
        link = self.links.pop(index)
        self.results[index].error = TransportError(link.failed_step(), why)
        self.heads.pop(index, None)
        for other, below in list(self.links.items()):
            if below.relayed and below.parent == index:
                self.fail(other, f"not started: its relay {link.name} failed")
            elif below.relayed and below.head_index == index:
                self.fail(other, f"its relay {link.name} was lost")

    def read(self, head: int) -> None:
        link = self.heads[head]
        data = link.recv()
        if data is None:
            return
        if not data:
            self.fail(head, link.last_words() or link.ended_words())
            return
        self.feed(head, data)

    def feed(self, head: int, data: bytes) -> None:
        try:
            for kind, frame in self.streams[head].feed(data):
                self.frame(head, kind, frame)
        except GreetingError as exc:
            self.fail(head, str(exc))

    def frame(self, head: int, kind: int, frame: bytes) -> None:
        if kind != wire.ROUTED:
            if kind == wire.CONTROL and self.greetings[head].done and self.relay_word(head, frame):
                return
            self.greetings[head].on_frame(kind, frame)
            return
        origin, inner = wire.decode_frame(frame)[1]  # type: ignore[misc]
        below = self.links.get(origin)
        if below is None or below.head_index != head or self.greetings[origin].done:
            self.kept[head].append(frame)  # the controller's (or a host given up: it decides)
            return
        try:
            inner_kind, _ = wire.decode_frame(inner)
            self.greetings[origin].on_frame(inner_kind, inner)
        except (GreetingError, wire.FrameError) as exc:
            self.fail(origin, str(exc))
            return
        greeting = self.greetings[origin]
        if greeting.later:  # what came between its own frames: the controller's, through the head
            self.kept[head].extend(wire.routed(origin, f) for f in greeting.later)
            greeting.later.clear()

    def relay_word(self, head: int, frame: bytes) -> bool:
        """A relay's own word about a host it starts (`gone`), or a note: taken here while the
        hosts below still greet."""
        message = message_of(frame)
        if isinstance(message, Note) and self.waiting():
            print(message.text, file=sys.stderr)
            return True
        if isinstance(message, Gone) and message.host in self.links and message.host in self.waiting():
            link = self.links[message.host]
            if link.parent == head or link.head_index == head:
                by = self.links[link.parent].name if link.parent in self.links else "its relay"
                self.fail(
                    message.host,
                    f"{message.why} (tree spawn through {by}; --ssh-tree-width 0 starts each host from here)",
                )
                return True
        return False

    def finish(self) -> None:
        """Each greeted link takes its Hello and keeps what followed; its host's reply is set."""
        for index, link in self.links.items():
            greeting = self.greetings[index]
            self.results[index].reply = greeting.reply
            if greeting.hello is not None:
                link.on_hello(greeting.hello)
            if not link.relayed:
                later = greeting.later + self.kept.get(index, [])
                link.unread = b"".join(later) + bytes(self.streams[index].inbox) + link.unread


class _Greetings:
    """The one selector over every connection being greeted, hosts added as they are started."""

    def __init__(self, checks: Callable[[int], bytes | None]) -> None:
        self.greeter = _Greeter(checks)
        self.sel = selectors.DefaultSelector()
        self.fds: dict[int, list[int]] = {}  # each head's registered descriptors

    def add(self, results: Mapping[int, HostResult]) -> None:
        greeter = self.greeter
        before = set(greeter.heads)
        greeter.add(results)
        new = [i for i in greeter.heads if i not in before]
        for index in new:
            link = greeter.heads[index]
            self.sel.register(link.fileno(), selectors.EVENT_READ, ("in", index))
            self.fds[index] = [link.fileno()]
            if link.unread:  # read by the transport already (what an srun agent sent behind its first line)
                data, link.unread = link.unread, b""
                greeter.feed(index, data)
        for index in new:
            link = greeter.heads.get(index)  # type: ignore[assignment]
            if link is None or not link.outbox:
                continue
            fd = link.write_fileno()
            if fd is None:  # a link that takes a whole write (paramiko's channel)
                link.send(bytes(link.outbox))
                link.outbox.clear()
            else:
                self.sel.register(fd, selectors.EVENT_WRITE, ("out", index))
                self.fds[index].append(fd)

    def step(self, wake: float | None) -> None:
        """One wait for the connections (at most until the next deadline, or wake seconds), what
        they carry read or written; then the hosts still waiting past their patience fail (read
        first: a start that kept the loop busy made no answer that came meanwhile late)."""
        greeter = self.greeter
        now = time.monotonic()
        left = [greeter.deadlines[i] - now for i in greeter.waiting()] + ([wake] if wake is not None else [])
        if not left:
            return
        for key, _ in self.sel.select(max(0.0, min(left))):
            way, index = key.data
            if index not in greeter.heads:
                _forget(self.sel, key.fd)
            elif way == "out":
                if not greeter.heads[index].write_outbox():
                    _forget(self.sel, key.fd)
            else:
                greeter.read(index)
        for link in list(greeter.heads.values()):
            link.read_diagnostics()  # a full stderr pipe would stall an ssh client
        now = time.monotonic()
        for index in [i for i in greeter.waiting() if greeter.deadlines[i] <= now]:
            link = greeter.links[index]
            greeter.fail(index, link.last_words() or f"no answer in {link.patience:g} s")

    def drop(self, index: int) -> None:
        """A failed host to be started again: its connection is closed and forgotten now (its
        descriptors' numbers may be the next connection's)."""
        for fd in self.fds.pop(index, []):
            _forget(self.sel, fd)
        result = self.greeter.results.pop(index)
        self.greeter.links.pop(index, None)
        if result.link is not None:
            result.link.give_up()

    def close(self) -> None:
        """Every greeted link takes its Hello; a host whose greeting failed has its error, and
        its link is closed and reaped."""
        self.sel.close()
        self.greeter.finish()
        for result in self.greeter.results.values():
            if result.error is not None and result.link is not None:
                result.link.give_up()
                result.link = None


def _forget(sel: selectors.BaseSelector, fd: int) -> None:
    try:
        sel.unregister(fd)
    except (KeyError, ValueError):
        pass


def start_agents(
    transport: Transport,
    hosts: Mapping[int, object],
    checks: Callable[[int], bytes | None],
    window: int | None = None,
) -> dict[int, HostResult]:
    """One greeted agent on every host (or its error): started by transport, greeted here, at
    most window hosts in flight (None: all at once), the next one started as soon as an earlier
    one greets or fails (launcher/start/window.py). A host whose connection its sshd dropped
    before the banner is started again, up to RETRIES times, after a short random wait."""
    win = StartWindow(hosts, window, RETRIES)
    least = max(1, win.size // 4) if transport.start_blocks else 1
    greetings = _Greetings(checks)
    greeter = greetings.greeter
    try:
        while True:
            taken = win.take(time.monotonic(), least)
            if taken:
                greetings.add(transport.start({i: hosts[i] for i in taken}))  # type: ignore[arg-type]
            for index in sorted(win.in_flight):
                error = greeter.results[index].error
                if error is not None:
                    wait = _retry_wait(win.tries[index]) if transport.retry(error) else 0.0
                    if win.failed(index, bool(wait), time.monotonic(), wait):
                        greetings.drop(index)
                elif greeter.done(index):
                    win.greeted(index)
            if win.finished:
                break
            if not taken or not win.in_flight:
                greetings.step(win.next_wake(time.monotonic()))
    finally:
        greetings.close()
    return dict(sorted(greeter.results.items()))


def _retry_wait(attempt: int) -> float:
    import random  # a retry only: not on every start's path

    return random.uniform(0.05, 0.25) * attempt
