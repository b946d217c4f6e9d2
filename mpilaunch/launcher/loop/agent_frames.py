"""What the agents' links carry, read and checked, for the controller's loop.

Output frames go to the output sink (and reset --hang-timeout's clock); control messages to
the controller's table of handlers, each naming only processes of the host that sent it;
routed frames (tree spawn) to the host below the relay that carried them. A link that ends,
garbles or falls silent is lost, with its ranks and every host it relayed to.
"""

from __future__ import annotations

from mpilaunch.launcher.decide.events import Garbled, HostLost
from mpilaunch.launcher.loop.links import own_proc
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import UP, Bye, Gone, MessageError, decode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.launcher.decide.events import Events
    from mpilaunch.launcher.decide.policy import Policy
    from mpilaunch.launcher.loop.links import HostLink, Links
    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.launcher.stacks.watch import StacksWatch
    from mpilaunch.plan.build import LaunchPlan
    from mpilaunch.protocol.record import Record


class AgentFrames:
    def __init__(
        self,
        plan: LaunchPlan,
        policy: Policy,
        links: Links,
        output: OutputSink,
        events: Events,
        stacks: StacksWatch,
        handlers: dict[type, Callable[[HostLink, Record], None]],
        heartbeat: float,
    ) -> None:
        """handlers: the controller's table, message type -> handler (filled by it)."""
        self.plan, self.policy, self.links, self.output = plan, policy, links, output
        self.events, self.stacks, self.handlers, self.heartbeat = events, stacks, handlers, heartbeat

    def gone(self, link: HostLink, message: Gone) -> None:
        """A relay's child ended (tree spawn)."""
        below = self.links.get(message.host)
        if below is None or below.link.parent != link.index:
            raise MessageError(f"host {message.host!r} is not one this agent started")
        if below.open:
            self.link_closed(below, message.why, tell_relay=False)

    def bye(self, link: HostLink, message: Bye) -> None:
        """The agent's last message: why it stopped, if something stopped it (said when its
        link ends, which follows)."""
        link.last_words = message.why

    def read_link(self, link: HostLink, now: float) -> None:
        data = link.link.recv()
        if data is None:
            return
        link.heard = now
        if not data:
            self.link_closed(link)
            return
        try:
            for kind, value in link.decoder.feed(data):
                self._frame(link, kind, value, now)
        except wire.FrameError as exc:
            self._garbled(link, exc)

    def _garbled(self, link: HostLink, exc: wire.FrameError) -> None:
        """Bytes that are no frame, or a message we cannot use: the link is not to be trusted."""
        self.events.publish(Garbled(link.index, str(exc)))
        if link.open:
            self.link_closed(link)

    def _frame(self, link: HostLink, kind: int, value: object, now: float) -> None:
        if kind == wire.OUTPUT:
            proc, stream, chunk = value  # type: ignore[misc]
            self.stacks.last_output = now  # --hang-timeout counts from here
            self.output.write(own_proc(self.policy.procs, link, proc), stream, chunk, now)
        elif kind == wire.CONTROL:
            message = decode(value, UP)  # type: ignore[arg-type]
            if "proc" in message._fields:
                own_proc(self.policy.procs, link, message.proc)  # type: ignore[attr-defined]
            self.handlers[type(message)](link, message)  # type: ignore[operator]
        elif kind == wire.ROUTED:  # from a host below this one (tree spawn)
            host, frame = value  # type: ignore[misc]
            below = self.links.get(host)
            if below is None or below.link.head_index != link.index:
                raise MessageError(f"a frame of host {host!r}, which is not below this one")
            if not below.open:
                return
            below.heard = now
            try:
                kind, value = wire.decode_frame(frame)
                if kind == wire.ROUTED:
                    raise wire.FrameError("a routed frame inside a routed frame")
                self._frame(below, kind, value, now)
            except wire.FrameError as exc:  # that host is not to be trusted; its relay and neighbours still are
                self._garbled(below, exc)

    def link_closed(self, link: HostLink, why: str = "", tell_relay: bool = True, confirmed: bool = True) -> None:
        """The agent's link ended (or was given up): its ranks are lost, and so is every host
        it relayed to. A host behind relays is cut off by its relay when tell_relay. Not
        confirmed: given up after a silence, the agent may still run its ranks (HostLost)."""
        why = why or link.last_words or link.link.lost_because()
        below = self.links.close(link, tell_relay)
        host = self.plan.hosts[link.index].name
        self.policy.handle(HostLost(link.index, host, why, confirmed))
        for other in below:
            if other.open:
                self.link_closed(other, f"its relay {host} was lost", tell_relay=False, confirmed=confirmed)

    def give_up_silent(self, now: float) -> None:
        """A network cut that sends no reset would otherwise leave the job waiting for ever.
        Pings to the agents go from a thread of each link, so a launcher stuck on a full
        console pipe does not make the agents give up."""
        for link in self.links.silent(now, self.heartbeat, lambda connection: self.read_link(connection, now)):
            self.link_closed(link, f"no word from it for {self.heartbeat:g} s", confirmed=False)
