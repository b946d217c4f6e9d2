"""The run's event loop: the agents' links, the signals, stdin and the timers, in one selector.

What arrives is turned into events for the policy (policy.py), which decides; the decisions
come back on the run's event stream (events.py) and are carried out here (a kill, a signal,
the finish), while the console reporter prints what a user should read. Agents' messages are
dispatched through one table (message type -> handler); rank output goes to the OutputSink.

Processes are known by a process id, their index in the policy's table, unique over every
job of the run (job 1 is the one launched; MPI_Comm_spawn adds jobs 2, 3, ...). Agents and
the wire use process ids; ranks are numbers within a job.
"""

from __future__ import annotations

import os
import selectors
import signal
import time

from mpilaunch.launcher.events import (
    Abort,
    AgentLost,
    AgentNote,
    Events,
    FinishAgents,
    Forward,
    Garbled,
    HostLost,
    RankEnded,
    RunEnded,
    SignalReceived,
    table,
)
from mpilaunch.launcher.output import OutputSink
from mpilaunch.launcher.pmi import JobWidePmi
from mpilaunch.launcher.policy import Policy
from mpilaunch.launcher.reporter import ConsoleReporter
from mpilaunch.launcher.states import RankState
from mpilaunch.launcher.stdin import StdinFeed
from mpilaunch.plan.build import JobPlan, LaunchPlan
from mpilaunch.plan.rank_env import LEAK_NAMES, LEAK_PREFIXES
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import (
    UP,
    Bye,
    Checked,
    Exited,
    Failed,
    Finish,
    Gone,
    Hello,
    Kill,
    Launch,
    MessageError,
    Note,
    Ping,
    PmiAbort,
    PmiError,
    PutDone,
    RankSpec,
    Signal,
    Started,
    StdinAck,
    decode,
    encode,
)
from mpilaunch.protocol.record import Record
from mpilaunch.transport.base import Link
from mpilaunch.transport.local import start_local_agent

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
PINGS_PER_TIMEOUT = 6  # a remote link carries at least this many frames per heartbeat timeout
PENDING_READS = 16  # reads of a head's backlog (up to 4 MB) before a silent host behind it is lost


class HostLink:
    """The loop's end of one agent's link."""

    __slots__ = ("decoder", "heard", "index", "inflight", "link", "open")

    def __init__(self, index: int, link: Link, heard: float = 0.0) -> None:
        self.index = index
        self.link = link
        self.decoder = wire.Decoder()
        self.inflight = 0  # stdin bytes sent on this connection and not yet acknowledged
        self.open = True
        self.heard = heard  # when the agent last sent anything (remote links are lost after a silence)


class Controller:
    def __init__(self, plan: LaunchPlan, output: OutputSink, links: dict | None = None, summary: bool = True) -> None:
        self.plan = plan
        self.options = plan.options
        self.output = output
        self.events = Events()
        self.policy = Policy(plan.options, self.events.publish, time.monotonic)
        self.pmi = JobWidePmi(self)
        self.jobs: dict[int, JobPlan] = {}
        self.sel = selectors.DefaultSelector()
        self.links: dict[int, HostLink] = {}
        self.relays: set[int] = set()  # tree spawn: hosts whose connection carries hosts below them
        self.heartbeat = plan.heartbeat  # seconds of silence after which a remote host is lost
        self.stdin = StdinFeed(  # job 1's process ids are its ranks
            self.sel, list(plan.stdin_ranks), self.send_stdin, self.in_flight, lambda p: self.procs[p].done
        )
        ignore = lambda link, message: None  # noqa: E731
        self.handlers = {
            Started: self.to_policy,
            Exited: self.to_policy,
            Failed: self.to_policy,
            PmiAbort: self.to_policy,
            PmiError: self.to_policy,
            StdinAck: self.stdin_ack,
            Note: lambda link, message: self.events.publish(AgentNote(message.text)),
            Gone: self.gone,
            Ping: ignore,  # any frame is a word
            Hello: ignore,
            Checked: ignore,
            PutDone: ignore,
            Bye: ignore,  # end of file follows
            **self.pmi.rows(),
        }
        self.events.subscribe(
            table(
                {
                    Abort: lambda event: self.broadcast(Kill(event.grace)),
                    Forward: lambda event: self.broadcast(Signal(event.sig)),
                    FinishAgents: lambda event: self.broadcast(Finish(event.grace)),
                    AgentLost: lambda event: self.kill_groups([self.procs[p] for p in event.procs]),
                    RankEnded: lambda event: self.output.rank_done(event.proc),
                }
            )
        )
        self.events.subscribe(ConsoleReporter(plan.hosts, self.policy, self.jobs, output, summary))
        for index, link in (links or {}).items():  # agents started before the run (remote hosts)
            self.add_link(index, link)
            if not link.local:
                link.ping_every(self.heartbeat / PINGS_PER_TIMEOUT, encode(Ping()))
        self.add_job(plan.job)

    @property
    def procs(self) -> list[RankState]:
        return self.policy.procs

    # -- jobs -----------------------------------------------------------------------------
    def add_job(self, job: JobPlan) -> list[int]:
        procs = self.policy.add_job(job.job, job.ranks)
        self.jobs[job.job] = job
        self.pmi.add_job(job)
        return procs

    def launch(self, job: JobPlan) -> None:
        """Start an agent where there is none yet, then hand each agent its share of the job."""
        states = [s for s in self.procs if s.job == job.job]
        options = self.options
        for index in sorted({s.rank.host for s in states}):
            link = self.links.get(index)
            if link is None:
                link = self.add_link(index, start_local_agent())
            ranks = tuple(
                RankSpec(
                    proc=s.proc,
                    rank=s.rank.rank,
                    local_rank=s.rank.local_rank,
                    app=s.rank.app,
                    argv=tuple(job.argvs[s.rank.app]),
                    wdir=job.wdirs[s.rank.app],
                    env=job.envs[s.rank.rank],
                    stdin=s.proc in self.stdin.procs,
                )
                for s in states
                if s.rank.host == index
            )
            launch = Launch(
                job=job.job,
                ranks=ranks,
                services=job.services,
                pmi=job.pmi,
                merge=options.merge_stderr_to_stdout,
                bind_to=options.bind_to,
                report_bindings=options.report_bindings,
                drop_prefixes=LEAK_PREFIXES,
                drop_names=tuple(sorted(LEAK_NAMES)),
            )
            self.send(link, launch)

    def add_link(self, index: int, agent: Link) -> HostLink:
        link = self.links[index] = HostLink(index, agent, heard=time.monotonic())
        if agent.relayed:  # its frames come on its head's connection
            self.relays.add(agent.head_index)  # type: ignore[arg-type]
        else:
            self.sel.register(agent.fileno(), selectors.EVENT_READ, link)
        return link

    def start(self) -> None:
        self._install_signals()
        now = time.monotonic()
        for link in list(self.links.values()):
            if link.link.unread:  # frames read during start-up, not used there
                self.read_link(link, now)
        self.policy.start()
        self.launch(self.plan.job)
        self.stdin.start()

    def _install_signals(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.saved_signals = {sig: signal.getsignal(sig) for sig in FORWARDED}
        for sig in FORWARDED:
            signal.signal(sig, lambda *_: None)
        self.saved_wakeup_fd = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "signal")

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

    def broadcast(self, message: Record) -> None:
        """To every agent; a relay passes an ALL frame to the hosts below it (one frame per head)."""
        frame = encode(message)
        routed = None
        for link in self.links.values():
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
        return self.links[link.link.head_index] if link.link.relayed else link  # type: ignore[index]

    def send_stdin(self, proc: int, data: bytes) -> None:
        link = self.links[self.procs[proc].rank.host]
        self.connection_of(link).inflight += len(data)
        self.send_frame(link, wire.stdin(proc, data))

    def in_flight(self, proc: int) -> int:
        return self.connection_of(self.links[self.procs[proc].rank.host]).inflight

    # -- what agents send ------------------------------------------------------------------
    def to_policy(self, link: HostLink, message: Record) -> None:
        self.policy.take(message)

    def stdin_ack(self, link: HostLink, message: StdinAck) -> None:
        self.connection_of(link).inflight -= message.n

    def gone(self, link: HostLink, message: Gone) -> None:
        """A relay's child ended (tree spawn)."""
        below = self.links.get(message.host)
        if below is None or below.link.parent != link.index:
            raise MessageError(f"host {message.host!r} is not one this agent started")
        if below.open:
            self.link_closed(below, message.why, tell_relay=False)

    def _own_proc(self, link: HostLink, proc: int) -> int:
        """A process id an agent sent: one of the processes of its own host, or the frame is bad."""
        if not 0 <= proc < len(self.procs) or self.procs[proc].rank.host != link.index:
            raise MessageError(f"process {proc!r} is not one of this host's")
        return proc

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
            self.output.write(self._own_proc(link, proc), stream, chunk, now)
        elif kind == wire.CONTROL:
            message = decode(value, UP)  # type: ignore[arg-type]
            if "proc" in message._fields:
                self._own_proc(link, message.proc)  # type: ignore[attr-defined]
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

    def keep_alive(self, now: float) -> None:
        """Give up on a remote agent that said nothing for a whole heartbeat timeout (its pings
        come every timeout/6): a network cut that sends no reset would otherwise leave the job
        waiting for ever. Pings to the agents go from a thread of each link, so a launcher
        stuck on a full console pipe does not make the agents give up."""
        for link in list(self.links.values()):
            if link.open and not link.link.local and now - link.heard > self.heartbeat:
                connection = self.connection_of(link)
                # It may have spoken while this loop was busy elsewhere. Behind a relay, its frames
                # may wait behind other hosts' on the head's connection: read on, but not for
                # ever (a busy neighbour must not hide a silent host).
                for _ in range(PENDING_READS if connection is not link else 1):
                    if not (link.open and connection.open and link.link.readable()):
                        break
                    self.read_link(connection, now)
                    if now - link.heard <= self.heartbeat:
                        break
                if link.open and now - link.heard > self.heartbeat:
                    self.link_closed(link, f"no word from it for {self.heartbeat:g} s")

    def link_closed(self, link: HostLink, why: str = "", tell_relay: bool = True) -> None:
        """The agent's link ended (or was given up): its ranks are lost, and so is every host
        it relayed to. A host behind relays is cut off by its relay when tell_relay."""
        link.open = False
        if link.link.relayed:
            if tell_relay:
                link.link.close()
        else:
            self.sel.unregister(link.link.fileno())
            link.link.close()
        link.link.wait()
        host = self.plan.hosts[link.index].name
        self.policy.take(HostLost(link.index, host, why))
        for other in self.links.values():
            if other.open and other.link.parent == link.index:
                self.link_closed(other, f"its relay {host} was lost", tell_relay=False)

    # -- loop -----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self._emergency_stop()
            self._release()

    def _release(self) -> None:
        """Give the process back what the run took (a launcher embedded in a longer-lived process
        runs many jobs): the signal handlers, the wake-up pipe and the selector."""
        self._restore_signals()
        for name in ("wake_r", "wake_w"):  # taken off the object: a second release closes nothing
            fd = vars(self).pop(name, None)
            if fd is not None:
                os.close(fd)
        self.sel.close()

    def _emergency_stop(self) -> None:
        """On any way out, no rank may outlive the launcher: kill what is still recorded as running."""
        for link in self.links.values():
            if link.open:
                link.open = False
                link.link.close()
        self.kill_groups([s for s in self.procs if not s.done])
        for link in self.links.values():
            link.link.wait()

    def kill_groups(self, states: list[RankState]) -> None:
        """SIGKILL these ranks' process groups by recorded pid, for ranks on this machine only
        (a pid an agent reported means something only on its own host)."""
        local = {index for index, link in self.links.items() if link.link.local}
        for state in states:
            if state.pid and state.rank.host in local:
                try:
                    os.killpg(state.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _run(self) -> int:
        self.start()
        while any(link.open for link in self.links.values()):
            self.policy.tick()
            read_stdin_now = self.stdin.update()
            now = time.monotonic()
            remote = [link.heard for link in self.links.values() if link.open and not link.link.local]
            silent_at = min(remote) + self.heartbeat if remote else None
            if silent_at is not None and silent_at < now:  # a remote link went quiet too long: look closer
                self.keep_alive(now)
            timers = [t for t in (self.policy.next_deadline(), self.output.next_deadline(), silent_at) if t is not None]
            timeout = max(0.0, min(timers) - now) if timers else None
            if read_stdin_now:
                self.stdin.read()
                timeout = 0.0
            events = self.sel.select(timeout)
            now = time.monotonic()
            for key, _ in events:
                if isinstance(key.data, HostLink):
                    self.read_link(key.data, now)
                elif key.data == "stdin":
                    self.stdin.read()
                else:
                    self._drain_signals()
            self.output.flush_idle(now)
        self._restore_signals()
        return self.finish()

    def _drain_signals(self) -> None:
        try:
            data = os.read(self.wake_r, 512)
        except BlockingIOError:
            return
        for sig in data:
            self.policy.take(SignalReceived(sig))

    def _restore_signals(self) -> None:
        saved = getattr(self, "saved_signals", None)
        if saved is None:  # never installed, or already restored
            return
        signal.set_wakeup_fd(self.saved_wakeup_fd)
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self.saved_signals = None

    def finish(self) -> int:
        self.output.close()
        self.policy.links_closed()
        status = self.policy.exit_status()
        self.events.publish(RunEnded(status))
        return status

    def exit_status(self) -> int:
        return self.policy.exit_status()
