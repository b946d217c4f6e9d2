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
import time

from mpilaunch.launcher.decide.events import (
    Abort,
    AgentLost,
    AgentNote,
    Events,
    FinishAgents,
    Forward,
    RankEnded,
    RunEnded,
    SignalReceived,
    table,
)
from mpilaunch.launcher.decide.policy import Policy
from mpilaunch.launcher.decide.states import RankState
from mpilaunch.launcher.loop.agent_frames import AgentFrames
from mpilaunch.launcher.loop.links import HostLink, Links
from mpilaunch.launcher.loop.signals import FAULTS_AFTER, SignalPipe
from mpilaunch.launcher.loop.stdin import StdinFeed
from mpilaunch.launcher.output.sink import OutputSink
from mpilaunch.launcher.report.console_report import ConsoleReporter
from mpilaunch.launcher.stacks.watch import StacksWatch
from mpilaunch.plan.build import JobPlan, LaunchPlan, launch_messages
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import (
    Bye,
    Checked,
    Exited,
    Failed,
    Finish,
    Gone,
    Hello,
    Kill,
    Note,
    Ping,
    PmiAbort,
    PmiError,
    PmiFence,
    PmiName,
    PmiSpawn,
    PmixDmodex,
    PmixDmodexData,
    PmixFence,
    PmixJoin,
    PmixLookup,
    PmixPublish,
    PmixSpawn,
    PmixUnpublish,
    PutDone,
    Signal,
    Started,
    StdinAck,
    encode,
)
from mpilaunch.protocol.record import Record
from mpilaunch.protocol.wire import STDERR
from mpilaunch.transport.local import LocalTransport

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.launcher.mpi.jobwide_pmi import JobWidePmi
    from mpilaunch.launcher.mpi.spawn_agents import AgentStarts
    from mpilaunch.transport.base import HostResult, Link

PINGS_PER_TIMEOUT = 6  # a remote link carries at least this many frames per heartbeat timeout


STOPPED_DRAIN = 0.5  # seconds a run stopped by a signal waits for a console that is behind
HOLD_LOOK = 0.02  # seconds between looks at a console that is behind, while the links wait for it
# What agents send to the MPI rooms (launcher/mpi/: job-wide PMI and PMIx, MPI_Comm_spawn)
MPI_MESSAGES = (PmiFence, PmiName, PmiSpawn, PmixDmodex, PmixDmodexData, PmixFence, PmixJoin, PmixLookup,
                PmixPublish, PmixSpawn, PmixUnpublish)  # fmt: skip


class Controller:
    """The run's loop over what its world gives it: links to agents (those started before the
    run, and `agents`, which starts this machine's agent for a host that has none yet), a clock,
    a source of signals and a selector. The launcher gives the real ones; tests replay whole
    runs through this loop with fakes (tests/unit/test_controller_replay.py)."""

    def __init__(
        self,
        plan: LaunchPlan,
        output: OutputSink,
        links: dict | None = None,
        summary: bool = True,
        launched: bool = False,
        *,
        agents: Callable[[], Link] | None = None,
        remote_agents: Callable[[JobPlan, list[int]], dict[int, HostResult]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        signals: SignalPipe | None = None,
        selector: selectors.BaseSelector | None = None,
    ) -> None:
        """launched: job 1's Launch messages were sent before the controller was made (see
        launch.execute), so its ranks started while these modules were imported."""
        self.plan = plan
        self.launched = launched
        self.options = plan.options
        self.output = output
        self.agents = agents if agents is not None else LocalTransport().agent
        self.clock = clock
        self.events = Events()
        self.policy = Policy(plan.options, self.events.publish, clock)
        self.jobs: dict[int, JobPlan] = {}
        self.sel = selector if selector is not None else selectors.DefaultSelector()
        self.links = Links(self.sel, clock)
        self.pmi: JobWidePmi | None = None  # with the spawner, made by the first MPI message
        self.signals = signals if signals is not None else SignalPipe()
        self.heartbeat = plan.heartbeat  # seconds of silence after which a remote host is lost
        self.started = False  # the loop started: links adopted later are read at once
        self.stacks = StacksWatch(plan, self.policy, self.links, output, clock)  # and `mpilaunch top`
        self.remote_agents = remote_agents
        self.agent_starts: AgentStarts | None = None
        self.stdin = StdinFeed(  # job 1's process ids are its ranks
            self.sel, list(plan.stdin_ranks), self.send_stdin, self.in_flight, lambda p: self.procs[p].done
        )
        self.handlers: dict[type, Callable[[HostLink, Record], None]] = {}
        self.frames = AgentFrames(
            plan, self.policy, self.links, output, self.events, self.stacks, self.handlers, self.heartbeat
        )
        self.read_link, self.give_up_silent = self.frames.read_link, self.frames.give_up_silent
        ignore = lambda link, message: None  # noqa: E731
        self.handlers |= {
            Started: self.to_policy,
            Exited: self.exited,
            Failed: self.to_policy,
            PmiAbort: self.to_policy,
            PmiError: self.to_policy,
            StdinAck: self.stdin_ack,
            Note: lambda link, message: self.events.publish(AgentNote(message.text)),
            Gone: self.frames.gone,
            Ping: ignore,  # any frame is a word
            Hello: ignore,
            Checked: ignore,
            PutDone: ignore,
            Bye: self.frames.bye,  # end of file follows
            **dict.fromkeys(MPI_MESSAGES, self.first_mpi_message),
            **self.stacks.rows(),
        }
        self.events.subscribe(
            table(
                {
                    Abort: lambda event: self.links.broadcast(Kill(event.grace)),
                    Forward: lambda event: self.links.broadcast(Signal(event.sig)),
                    FinishAgents: lambda event: self.links.broadcast(Finish(event.grace)),
                    AgentLost: lambda event: self.kill_groups([self.procs[p] for p in event.procs]),
                    RankEnded: lambda event: self.output.rank_done(event.proc),
                }
            )
        )
        self.events.subscribe(self.stacks)  # WantStacks
        closing = summary and not plan.options.quiet and _is_terminal(output.writer.fds[STDERR])
        self.events.subscribe(ConsoleReporter(plan.hosts, self.policy, self.jobs, output, summary, closing))
        for index, link in (links or {}).items():  # agents started before the run (remote hosts)
            self.adopt(index, link)
        self.add_job(plan.job)

    @property
    def procs(self) -> list[RankState]:
        return self.policy.procs

    # -- jobs -----------------------------------------------------------------------------
    def add_job(self, job: JobPlan) -> list[int]:
        procs = self.policy.add_job(job.job, job.named_ranks)
        self.jobs[job.job] = job
        if self.pmi is not None:
            self.pmi.add_job(job)
        return procs

    def first_mpi_message(self, link: HostLink, message: Record) -> None:
        """Job-wide PMI and PMIx and MPI_Comm_spawn are made (their modules imported) when an
        agent first asks for them: a job that never calls MPI runs without them."""
        from mpilaunch.launcher.mpi.jobwide_pmi import JobWidePmi
        from mpilaunch.launcher.mpi.spawns import Spawner

        self.pmi = JobWidePmi(self.links, self.policy, self.clock)
        for job in self.jobs.values():
            self.pmi.add_job(job)
        if self.remote_agents is not None:
            from mpilaunch.launcher.mpi.spawn_agents import AgentStarts

            self.agent_starts = AgentStarts(self.sel, self.remote_agents)
        spawner = Spawner(
            self.plan, self.policy, self.links, self.events, self.output, self.jobs, self.add_job, self.launch,
            self.agent_starts, self.adopt,
        )  # fmt: skip
        self.handlers |= {**self.pmi.rows(), **spawner.rows()}
        self.handlers[type(message)](link, message)

    def adopt(self, index: int, link: Link) -> None:
        """A greeted agent's link becomes the run's: before it (job 1's hosts), or during it (a
        spawned job's host that had none); frames it sent after its greeting are read at once."""
        host_link = self.links.add(index, link)
        if not link.local:
            link.ping_every(self.heartbeat / PINGS_PER_TIMEOUT, encode(Ping()))
        if self.started and link.unread:
            self.read_link(host_link, self.clock())

    def launch(self, job: JobPlan) -> None:
        """Start an agent where there is none yet, then hand each agent its share of the job."""
        procs = [s.proc for s in sorted((s for s in self.procs if s.job == job.job), key=lambda s: s.rank.rank)]
        others = [j.pmix for j in self.jobs.values() if j.pmix is not None and j.job != job.job]
        for index, launch in launch_messages(self.plan, job, procs, set(self.stdin.procs), others).items():
            link = self.links.get(index) or self.links.add(index, self.agents())
            self.links.send(link, launch)

    # -- what agents send ------------------------------------------------------------------
    def to_policy(self, link: HostLink, message: Record) -> None:
        self.policy.handle(message)

    def exited(self, link: HostLink, message: Exited) -> None:
        if message.error:  # the agent's copy is gone with the agent: the log tree keeps one
            message = message._replace(error_file=self.output.keep_error(message.proc, message.error))
        self.policy.handle(message)

    def stdin_ack(self, link: HostLink, message: StdinAck) -> None:
        self.links.connection_of(link).inflight -= message.n

    def send_stdin(self, proc: int, data: bytes) -> None:
        link = self.links.get(self.procs[proc].rank.host)
        assert link is not None
        self.links.connection_of(link).inflight += len(data)
        self.links.send_frame(link, wire.stdin(proc, data))

    def in_flight(self, proc: int) -> int:
        return self.links.connection_of(self.links.get(self.procs[proc].rank.host)).inflight  # type: ignore[arg-type]

    def kill_groups(self, states: list[RankState]) -> None:
        self.links.kill_local([(state.rank.host, state.pid) for state in states])

    # -- loop -----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        finally:  # on any way out, no rank may outlive the launcher: kill what is still recorded as running
            self.links.close_all()
            if self.agent_starts is not None:
                self.agent_starts.close()
            self.stacks.close()
            self.kill_groups([s for s in self.procs if not s.done])
            self.links.wait_all()
            self.output.unlock()
            self.signals.release()  # a launcher embedded in a longer-lived process runs many jobs
            self.sel.close()

    def start(self) -> None:
        self.started = True
        self.signals.install(self.sel)
        self.stacks.serve(self.sel)
        now = self.clock()
        for link in self.links:
            if link.link.unread:  # frames read during start-up, not used there
                self.read_link(link, now)
        self.policy.start()
        if not self.launched:
            self.launch(self.plan.job)
        self.stdin.start()
        self.signals.catch_faults_at(self.clock() + FAULTS_AFTER)

    def _run(self) -> int:
        self.start()
        while self.links.any_open():
            self.policy.tick()
            read_stdin_now = self.stdin.update()
            now = self.clock()
            silent_at = self.links.next_silence(self.heartbeat)
            if silent_at is not None and silent_at < now:  # a remote link went quiet too long: look closer
                self.give_up_silent(now)
            held = self.output.writer.holding_back()
            self.links.hold(held)
            look_again = now + HOLD_LOOK if held else None  # the console's progress is not an event here
            timers = [
                t
                for t in (
                    self.policy.next_deadline(),
                    self.output.next_deadline(),
                    self.pmi.next_deadline() if self.pmi is not None else None,
                    self.stacks.next_deadline(),
                    silent_at,
                    look_again,
                    self.signals.next_deadline(),
                )
                if t is not None
            ]
            timeout = max(0.0, min(timers) - now) if timers else None
            if read_stdin_now:
                self.stdin.read()
                timeout = 0.0
            events = self.sel.select(timeout)
            now = self.clock()
            for key, _ in events:
                if isinstance(key.data, HostLink):
                    self.read_link(key.data, now)
                elif key.data == "stdin":
                    self.stdin.read()
                elif callable(key.data):  # a store the loop serves (torchrun's way: launcher/meeting/rendezvous.py)
                    key.data(key.fd)
                else:
                    for sig in self.signals.drain():
                        self.policy.handle(SignalReceived(sig))
            self.output.flush_idle(now)
            if self.pmi is not None:
                self.pmi.tick(now)
            self.stacks.tick(now)
            self.signals.tick(now)
        self.output.close()
        self.policy.links_closed()
        status = self.policy.exit_status()
        self.events.publish(RunEnded(status))
        self.drain_console()
        self.signals.restore()
        return status

    def drain_console(self) -> None:
        """Wait for the console to show what is queued for it, as any program's last write
        would; a stopped run waits STOPPED_DRAIN seconds at most, and a signal meanwhile ends the
        wait (what the console did not take is dropped; the log files have it)."""
        waited = 0.0
        while not self.output.writer.wait_drained(0.05):
            waited += 0.05
            if self.signals.drain() or (self.policy.stop_signal is not None and waited >= STOPPED_DRAIN):
                return


def _is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False
