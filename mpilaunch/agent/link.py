"""The agent's end of its link: a remote agent's pipes (PipeLink), the frames that cross it
(Uplink), and its heartbeat.

A local agent's link is a socket pair (socket.socket has what PipeLink has: fileno, recv,
sendall); a remote agent's is its stdin and stdout, which sshd joins to the SSH channel.
"""

from __future__ import annotations

import os
import select
import sys
import time

from mpilaunch.agent.loop import Loop, Timer
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import DOWN, Ping, decode, encode

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket
    from collections.abc import Callable

    from mpilaunch.agent.relay import Relay
    from mpilaunch.protocol.record import Record

PINGS_PER_TIMEOUT = 6  # a link carries at least this many frames per heartbeat timeout


class PipeLink:
    """The link of a remote agent: its stdin and stdout.

    A send waits while the launcher does not read (its console is paused, say). Every
    stall_every seconds of that wait it calls on_stall: a relay pings its children from
    there, or an idle child would take the silence for a lost launcher."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        os.set_blocking(write_fd, False)
        self.stall_every = 5.0
        self.on_stall: Callable[[], None] | None = None

    def fileno(self) -> int:
        return self.read_fd

    def recv(self, size: int) -> bytes:
        return os.read(self.read_fd, size)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.write_fd, view) :]
            except BlockingIOError:
                select.select([], [self.write_fd], [], self.stall_every)
                if self.on_stall is not None:
                    self.on_stall()  # after every wait: a slow reader stalls a long send too


class Uplink:
    """The frames between the agent and the launcher. Up: what one turn of the agent's loop says
    goes in one write (hold, release). Down: a rank's stdin to `stdin`, a routed frame to the
    hosts this agent relays to (or, for ALL, to them and to itself), a message to its handler.
    A link that fails either way, or that carries what is no frame or no message the agent can
    take, is lost: closed here, then `lost` is called (the agent stops its ranks)."""

    def __init__(self, link: _socket.socket | PipeLink, loop: Loop, lost: Callable[[], None]) -> None:
        self.link = link
        self.loop = loop
        self.lost = lost
        self.open = True
        self.decoder = wire.Decoder()
        self.held: list[bytes] | None = None  # frames kept for one write (hold)
        self.heard = time.monotonic()  # when the launcher last said anything (Heartbeat)
        self.handlers: dict[type, Callable[[Record], None]] = {}  # the agent's, by message type
        self.stdin: Callable[[int, bytes], None] = lambda ident, data: None  # the ranks' stdin feed
        self.relay: Relay | None = None  # tree spawn: the hosts this agent started

    def send(self, message: Record) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        if not self.open:
            return
        if self.held is not None:
            self.held.append(frame)
            return
        try:
            self.link.sendall(frame)
        except OSError:
            self.lose()

    def hold(self) -> None:
        """Frames are kept until release: what one turn of the loop has to say (a launch's report
        per rank, the exits reaped together) goes to the launcher in one write."""
        self.held = []

    def release(self) -> None:
        held, self.held = self.held, None
        if held:
            self.send_frame(b"".join(held))

    def lose(self) -> None:
        """The launcher is gone (or not to be trusted): what this turn said before (a stop
        signal's note) goes up if it still can, the link is no longer read, the agent is told."""
        if not self.open:
            return
        held, self.held = self.held, None
        if held:
            try:
                self.link.sendall(b"".join(held))
            except OSError:
                pass
        self.open = False
        self.loop.unwatch(self.link)
        self.lost()

    def read(self, fd: int) -> None:
        try:
            data = self.link.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.lose()
            return
        self.heard = time.monotonic()
        try:
            for kind, value in self.decoder.feed(data):
                self.on_frame(kind, value)
        except wire.FrameError as exc:  # bytes that are no frame, or a message we cannot take
            print(f"mpilaunch agent: bad request from the launcher ({exc}); stopping", file=sys.stderr)
            self.lose()

    def on_frame(self, kind: int, value: object) -> None:
        if kind == wire.STDIN:
            ident, _, data = value  # type: ignore[misc]
            self.stdin(ident, data)
        elif kind == wire.ROUTED:  # tree spawn: for the hosts below, or (ALL) for them and us
            host, frame = value  # type: ignore[misc]
            if self.relay is not None:
                self.relay.down(host, frame)
            if host == wire.ALL:
                self.on_frame(*wire.decode_frame(frame))
        elif kind == wire.CONTROL:
            message = decode(value, DOWN)  # type: ignore[arg-type]
            self.handlers[type(message)](message)
        else:
            raise wire.FrameError(f"a frame of kind {kind} from the launcher")


class Heartbeat(Timer):
    """A remote agent pings the launcher and stops when it has heard nothing for a heartbeat
    timeout: after a network cut without a reset, the channel would never close. A relay
    pings its children on the same schedule (they count its silence as the launcher's)."""

    def __init__(self, uplink: Uplink) -> None:
        self.uplink = uplink
        self.timeout: float | None = None  # seconds; set by Check (local agents have none)
        self.next_ping = 0.0
        self.next_relay_ping = 0.0

    def start(self, timeout: float) -> None:
        self.timeout = timeout
        link = self.uplink.link
        if isinstance(link, PipeLink):
            link.stall_every = timeout / PINGS_PER_TIMEOUT
            link.on_stall = self.ping_children

    def next_deadline(self) -> float | None:
        if not self.timeout or not self.uplink.open:
            return None
        return min(self.next_ping, self.uplink.heard + self.timeout)

    def tick(self, now: float) -> None:
        if not self.timeout or not self.uplink.open:
            return
        if now >= self.next_ping:
            self.next_ping = now + self.timeout / PINGS_PER_TIMEOUT
            self.uplink.send(Ping())
            self.ping_children(now)
        if now - self.uplink.heard > self.timeout and not select.select([self.uplink.link], [], [], 0)[0]:
            print(f"mpilaunch agent: no word from the launcher for {self.timeout:g} s; stopping", file=sys.stderr)
            self.uplink.lose()

    def ping_children(self, now: float | None = None) -> None:
        """Tree spawn: from the loop, and from inside a send to the launcher that waits."""
        relay = self.uplink.relay
        if relay is None or not self.timeout:
            return
        now = time.monotonic() if now is None else now
        if now >= self.next_relay_ping:
            self.next_relay_ping = now + self.timeout / PINGS_PER_TIMEOUT
            relay.ping()
