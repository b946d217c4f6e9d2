"""The controller's table of its agents' links: registered in its selector, written to, read
through the connections that carry them, given up when silent, closed.

Behind relays (tree spawn) a host has no descriptor of its own: its frames arrive on its
head's connection, and frames for it go down that connection in ROUTED frames.

A link that closed or was given up stays closed: nothing reconnects, and its host's ranks are
lost with it (the controller's HostLost), as are the hosts it relayed to.
"""

from __future__ import annotations

import os
import selectors
import signal
import time

from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import MessageError, encode
from mpilaunch.protocol.record import Record
from mpilaunch.transport.base import Link

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from mpilaunch.launcher.decide.states import RankState

PENDING_READS = 16  # reads of a head's backlog (up to 4 MB) before a silent host behind it is lost


class HostLink:
    """The loop's end of one agent's link."""

    __slots__ = ("decoder", "heard", "index", "inflight", "last_words", "link", "open")

    def __init__(self, index: int, link: Link, heard: float = 0.0) -> None:
        self.index = index
        self.link = link
        self.decoder = wire.Decoder()
        self.inflight = 0  # stdin bytes sent on this connection and not yet acknowledged
        self.open = True
        self.heard = heard  # when the agent last sent anything (remote links are lost after a silence)
        self.last_words = ""  # what stopped the agent, as its Bye said (a limit of its host)


def own_proc(procs: Sequence[RankState], link: HostLink, proc: int) -> int:
    """A process id an agent sent: one of the processes of its own host, or the frame is bad."""
    if not 0 <= proc < len(procs) or procs[proc].rank.host != link.index:
        raise MessageError(f"process {proc!r} is not one of this host's")
    return proc


class Links:
    def __init__(self, sel: selectors.BaseSelector, clock: Callable[[], float] = time.monotonic) -> None:
        self.sel = sel
        self.clock = clock
        self.by_host: dict[int, HostLink] = {}
        self.relays: set[int] = set()  # tree spawn: hosts whose connection carries hosts below them
        self.held = False  # not read for now: the console is behind (launcher/output/console_writer.py)

    def __iter__(self) -> Iterator[HostLink]:
        return iter(list(self.by_host.values()))

    def __contains__(self, index: int) -> bool:
        return index in self.by_host

    def __getitem__(self, index: int) -> HostLink:
        return self.by_host[index]

    def get(self, index: int) -> HostLink | None:
        return self.by_host.get(index)

    def is_open(self, index: int) -> bool:
        link = self.by_host.get(index)
        return link is not None and link.open

    def add(self, index: int, agent: Link) -> HostLink:
        link = self.by_host[index] = HostLink(index, agent, heard=self.clock())
        if agent.relayed:  # its frames come on its head's connection
            self.relays.add(agent.head_index)  # type: ignore[arg-type]
        elif not self.held:
            self.sel.register(agent.fileno(), selectors.EVENT_READ, link)
        return link

    def hold(self, held: bool) -> None:
        """Stop reading the agents (held) or read them again. While the console is behind but
        taking output, the agents' and then the ranks' pipes fill, and the ranks wait for it as
        they would writing to it themselves; the loop goes on serving signals and timers."""
        if held == self.held:
            return
        self.held = held
        for link in self.by_host.values():
            if link.open and not link.link.relayed:
                if held:
                    self.sel.unregister(link.link.fileno())
                else:
                    self.sel.register(link.link.fileno(), selectors.EVENT_READ, link)

    def any_open(self) -> bool:
        return any(link.open for link in self.by_host.values())

    # -- sending -------------------------------------------------------------------------
    def send(self, link: HostLink, message: Record) -> None:
        self.send_frame(link, encode(message))

    def send_frame(self, link: HostLink, frame: bytes) -> None:
        if not link.open:
            return
        try:
            link.link.send(frame)
        except OSError:
            pass  # the agent is gone; its EOF is handled by the loop

    def send_to(self, hosts: Iterable[int], message: Record) -> None:
        """To each of these hosts that has a link, in host order."""
        for host in sorted(hosts):
            link = self.by_host.get(host)
            if link is not None:
                self.send(link, message)

    def broadcast(self, message: Record) -> None:
        """To every agent; a relay passes an ALL frame to the hosts below it (one frame per head)."""
        frame = encode(message)
        routed = None
        for link in self.by_host.values():
            if link.link.relayed:
                continue
            if link.index in self.relays:
                routed = routed or wire.routed(wire.ALL, frame)
                self.send_frame(link, routed)
            else:
                self.send_frame(link, frame)

    def connection_of(self, link: HostLink) -> HostLink:
        """The link whose connection carries this host's frames: its head's behind relays (the
        stdin window is per connection, or many hosts under one head could fill its channel)."""
        return self.by_host[link.link.head_index] if link.link.relayed else link  # type: ignore[index]

    # -- silence -------------------------------------------------------------------------
    def next_silence(self, timeout: float) -> float | None:
        """When the remote link heard from longest ago will have been silent for timeout."""
        heard = [link.heard for link in self.by_host.values() if link.open and not link.link.local]
        return min(heard) + timeout if heard else None

    def silent(self, now: float, timeout: float, read: Callable[[HostLink], None]) -> list[HostLink]:
        """Remote links that said nothing for a whole heartbeat timeout (their pings come every
        timeout/6). One may have spoken while the loop was busy elsewhere, so what waits is read
        first; behind a relay its frames may wait behind other hosts' on the head's connection:
        read on, but not for ever (a busy neighbour must not hide a silent host)."""
        found = []
        for link in list(self.by_host.values()):
            if link.open and not link.link.local and now - link.heard > timeout:
                connection = self.connection_of(link)
                for _ in range(PENDING_READS if connection is not link else 1):
                    if not (link.open and connection.open and link.link.readable()):
                        break
                    read(connection)
                    if now - link.heard <= timeout:
                        break
                if link.open and now - link.heard > timeout:
                    found.append(link)
        return found

    # -- closing -------------------------------------------------------------------------
    def close(self, link: HostLink, tell_relay: bool = True) -> list[HostLink]:
        """Close one link (a host behind relays is cut off by its relay when tell_relay); the
        open links of the hosts it relayed to, which are lost with it."""
        link.open = False
        if link.link.relayed:
            if tell_relay:
                link.link.close()
        else:
            if not self.held:
                self.sel.unregister(link.link.fileno())
            link.link.close()
        link.link.wait()
        return [other for other in self.by_host.values() if other.open and other.link.parent == link.index]

    def close_all(self) -> None:
        """On any way out of the run: every link closed (each agent then stops its ranks)."""
        for link in self.by_host.values():
            if link.open:
                link.open = False
                link.link.close()

    def wait_all(self) -> None:
        for link in self.by_host.values():
            link.link.wait()

    def kill_local(self, hosts_and_pids: list[tuple[int, int | None]]) -> None:
        """SIGKILL these ranks' process groups by recorded pid, for ranks on this machine only
        (a pid an agent reported means something only on its own host)."""
        local = {index for index, link in self.by_host.items() if link.link.local}
        for host, pid in hosts_and_pids:
            if pid and host in local:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
