"""The agent's end of its link: a remote agent's pipes (PipeLink), and its heartbeat.

A local agent's link is a socket pair (socket.socket has what PipeLink has: fileno, recv,
sendall); a remote agent's is its stdin and stdout, which sshd joins to the SSH channel.
"""

from __future__ import annotations

import os
import select
import sys
import time

from mpilaunch.agent.loop import Timer
from mpilaunch.protocol.messages import Ping

TYPE_CHECKING = False
if TYPE_CHECKING:
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


class LinkOwner:
    """What the heartbeat needs of the agent that owns the link."""

    link: object  # the link: selectable (a socket or a PipeLink)
    link_open: bool
    relay: Relay | None  # tree spawn: the hosts this agent started, pinged with the launcher's schedule

    def send(self, message: Record) -> None:
        raise NotImplementedError

    def link_lost(self) -> None:
        raise NotImplementedError


class Heartbeat(Timer):
    """A remote agent pings the launcher and stops when it has heard nothing for a heartbeat
    timeout: after a network cut without a reset, the channel would never close. A relay
    pings its children on the same schedule (they count its silence as the launcher's)."""

    def __init__(self, agent: LinkOwner) -> None:
        self.agent = agent
        self.timeout: float | None = None  # seconds; set by Check (local agents have none)
        self.heard = time.monotonic()
        self.next_ping = 0.0
        self.next_relay_ping = 0.0

    def start(self, timeout: float) -> None:
        self.timeout = timeout
        link = self.agent.link
        if isinstance(link, PipeLink):
            link.stall_every = timeout / PINGS_PER_TIMEOUT
            link.on_stall = self.ping_children

    def next_deadline(self) -> float | None:
        if not self.timeout or not self.agent.link_open:
            return None
        return min(self.next_ping, self.heard + self.timeout)

    def tick(self, now: float) -> None:
        if not self.timeout or not self.agent.link_open:
            return
        if now >= self.next_ping:
            self.next_ping = now + self.timeout / PINGS_PER_TIMEOUT
            self.agent.send(Ping())
            self.ping_children(now)
        if now - self.heard > self.timeout and not select.select([self.agent.link], [], [], 0)[0]:
            print(f"mpilaunch agent: no word from the launcher for {self.timeout:g} s; stopping", file=sys.stderr)
            self.agent.link_lost()

    def ping_children(self, now: float | None = None) -> None:
        """Tree spawn: from the loop, and from inside a send to the launcher that waits."""
        relay = self.agent.relay
        if relay is None or not self.timeout:
            return
        now = time.monotonic() if now is None else now
        if now >= self.next_relay_ping:
            self.next_relay_ping = now + self.timeout / PINGS_PER_TIMEOUT
            relay.ping()
