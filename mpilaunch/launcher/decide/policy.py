"""The run's decisions, apart from any descriptor: events in, a clock, decisions out.

What the agents report (a rank started, ended, could not start, called MPI_Abort, broke PMI)
and what the controller sees (a signal, a lost agent, time passing) go in through `take` and
`tick`; what to do about it (abort every rank, forward a signal, finish) comes out as events
on the run's stream, with each rank's and the run's state changes (states.py). The exit
status is computed from the same state. Nothing here reads a descriptor or the real clock,
so the tests replay event histories against it with a fake clock in milliseconds.
"""

from __future__ import annotations

import signal

from mpilaunch.launcher.decide import run_status, states
from mpilaunch.launcher.decide.events import (
    Abort,
    AgentLost,
    FinishAgents,
    HostLost,
    MpiFailure,
    NodesEnded,
    NodesRegroup,
    RankEnded,
    RankNotStarted,
    RankStarted,
    SignalReceived,
    Silent,
    StacksTaken,
    TimedOut,
    WantStacks,
)
from mpilaunch.launcher.decide.states import (
    ABORTING,
    DONE,
    EXITED,
    FAILED,
    FINISHING,
    INTERRUPTED,
    RUNNING,
    STOPPING,
    RankState,
)
from mpilaunch.launcher.decide.stop_signals import StopSignals
from mpilaunch.plan.placement import Rank
from mpilaunch.plan.spec import Options
from mpilaunch.protocol.messages import Exited, Failed, PmiAbort, PmiError, Started
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

NOT_STARTED = 2  # a rank its agent ended before starting: the launcher's trouble (a limit, a lost host)
FINISH_GRACE = 0.5  # what the agents give leftovers (a rank's daemon) once every rank ended
STACKS_WAIT = 60.0  # a kill that waits for the ranks' stacks waits this long at most


class Policy:
    def __init__(self, options: Options, publish: Callable[[Record], None], clock: Callable[[], float]) -> None:
        self.options = options
        self.publish = publish
        self.clock = clock
        self.started_at: float | None = None  # when the run started (start)
        self.procs: list[RankState] = []
        self.phase = RUNNING
        self.aborted = False  # a kill went out to every agent
        self.timed_out = False
        self.stops = StopSignals(self)  # the launcher's own signals
        self.deadline: float | None = None  # --timeout
        self.kill_after: set[str] = set()  # the stacks a kill waits for (timeout, hang)
        self.kill_at: float | None = None  # ... and when it stops waiting
        self.timed_out_by = ""  # --timeout or --hang-timeout
        self.first_failure: RankState | None = None
        self.failed: list[int] = []  # process ids, in the order they failed
        self.elsewhere: str | None = None  # why another node's job ended this one (torchrun's way)
        self.regroup: str | None = None  # why the ranks stop to start again with a late node (torchrun's way)
        self.hydra = options.rules == "hydra"  # hydra's failure and signal rules, else Open MPI's
        self.inputs = {
            Started: self.started,
            Exited: self.exited,
            Failed: self.not_started,
            PmiAbort: self.mpi_abort,
            PmiError: self.pmi_error,
            SignalReceived: self.stops.take,
            HostLost: self.host_lost,
            NodesEnded: self.nodes_ended,
            NodesRegroup: self.nodes_regroup,
            Silent: self.silent,
            StacksTaken: self.stacks_taken,
        }

    # -- the table of processes -------------------------------------------------------------
    def start(self) -> None:
        """The run starts now: the --timeout clock runs from here."""
        self.started_at = self.clock()
        if self.options.timeout:
            self.deadline = self.clock() + self.options.timeout

    def add_job(self, job: int, ranks: Sequence[Rank]) -> list[int]:
        """ranks as reports name them (JobPlan.named_ranks: job-wide numbers when this launcher
        runs one node's, torchrun's way)."""
        first = len(self.procs)
        self.procs.extend(RankState(first + i, job, rank) for i, rank in enumerate(ranks))
        return list(range(first, len(self.procs)))

    def all_done(self) -> bool:
        return all(state.done for state in self.procs)

    @property
    def ending(self) -> bool:
        """Aborting or finishing: no new job (MPI_Comm_spawn) may start."""
        return self.phase in (ABORTING, FINISHING, DONE)

    # -- events in -----------------------------------------------------------------------------
    def handle(self, event: Record) -> None:
        self.inputs[type(event)](event)  # type: ignore[operator]

    def started(self, event: Started) -> None:
        state = self.procs[event.proc]
        state.pid = event.pid
        if state.started_at is None:
            state.started_at = self.clock()
        if state.state == states.PLANNED:
            state.move(states.RUNNING)
            self.publish(RankStarted(event.proc))

    def exited(self, event: Exited) -> None:
        state = self.procs[event.proc]
        state.cpu, state.rss, state.death = event.cpu, event.rss, event.death
        state.error, state.error_file = event.error, event.error_file
        self.rank_ended(state, event.status, mpi=event.mpi)

    def not_started(self, event: Failed) -> None:
        state = self.procs[event.proc]
        if not state.done:
            state.killed = False  # an abort sent meanwhile found nothing of it to kill
            self.publish(RankNotStarted(event.proc, event.error))
        self.rank_ended(state, event.code, reason=event.error)

    def mpi_abort(self, event: PmiAbort) -> None:
        text = f"called MPI_Abort with code {event.code}" + (f": {event.message}" if event.message else "")
        self.mpi_failure(self.procs[event.proc], event.code, text)

    def pmi_error(self, event: PmiError) -> None:
        self.mpi_failure(self.procs[event.proc], 1, event.error)

    def host_lost(self, event: HostLost) -> None:
        """Its ranks are gone: killed there by the agent or its guardian, here by the controller.
        A host lost to silence (a frozen agent, a network cut) may still run them: they end here
        with no status, as not confirmed ended, and none of them counts as killed by the run."""
        lost = [s for s in self.procs if s.rank.host == event.host and not s.done]
        if not lost:
            return
        self.publish(AgentLost(event.host, event.why, tuple(s.proc for s in lost), event.confirmed))
        if event.confirmed:
            for state in lost:
                self.rank_ended(state, *lost_with_its_host(state, event))
            return
        for state in lost:
            self.rank_ended(state, None, reason=f"host {event.name} lost; its ranks could not be confirmed ended")
        for state in lost:
            state.killed = False  # the abort the first one started could not reach them

    def nodes_ended(self, event: NodesEnded) -> None:
        if self.elsewhere is None and self.phase not in (FINISHING, DONE):
            self.elsewhere = event.why
            self.abort(self.options.kill_timeout)

    def nodes_regroup(self, event: NodesRegroup) -> None:
        """Only ranks that all run well start again for a late node (torchrun's HEALTHY state)."""
        if self.regroup is None and self.elsewhere is None and self.phase == RUNNING and not self.failed:
            self.regroup = event.why
            self.abort(self.options.kill_timeout)

    def silent(self, event: Silent) -> None:
        """--hang-timeout: stacks, and with --hang-action kill the end of the job once they are out."""
        if self.phase not in (RUNNING, INTERRUPTED):
            return
        if self.options.hang_action != "kill":
            self.publish(WantStacks("hang"))
            return
        self.timed_out, self.timed_out_by = True, "--hang-timeout"
        self.publish(TimedOut(event.seconds, hang=True, stacks=True))
        self.kill_after_stacks("hang")

    def kill_after_stacks(self, why: str) -> None:
        self.kill_after.add(why)
        self.kill_at = self.clock() + STACKS_WAIT
        self.publish(WantStacks(why))

    def stacks_taken(self, event: StacksTaken) -> None:
        if event.why in self.kill_after:
            self.kill_after.clear()
            self.kill_at = None
            self.abort(self.options.kill_timeout)

    def tick(self) -> None:
        """Time passed: the grace after a stop signal, the --timeout, and the end of the ranks."""
        now = self.clock()
        if self.kill_at is not None and now >= self.kill_at:  # the stacks never came: the kill goes on
            self.stacks_taken(StacksTaken(next(iter(self.kill_after))))
        self.stops.tick(now)
        if self.deadline is not None and now >= self.deadline:
            self.deadline = None
            if not self.all_done():
                self.timed_out, self.timed_out_by = True, "--timeout"
                stacks = self.options.get_stack_traces
                self.publish(TimedOut(self.options.timeout or 0.0, stacks=stacks))
                if stacks:
                    self.kill_after_stacks("timeout")
                else:
                    self.abort(self.options.kill_timeout)
        if self.phase in (RUNNING, INTERRUPTED, ABORTING) and self.all_done():
            self.move(FINISHING)
            self.publish(FinishAgents(FINISH_GRACE))

    def next_deadline(self) -> float | None:
        due = [t for t in (self.deadline, self.kill_at, self.stops.escalate_at) if t is not None]
        return min(due) if due else None

    def links_closed(self) -> None:
        """Every agent's link is closed: the run is over, whatever its phase."""
        if self.phase != DONE:
            self.move(DONE)

    # -- decisions ------------------------------------------------------------------------------
    def rank_ended(self, state: RankState, status: int | None, reason: str | None = None, mpi: str = "new") -> None:
        if state.done:
            return
        state.status = status
        state.reason = state.reason or reason
        state.ended_at = self.clock()
        if status == 0 and mpi == "init" and not all(s.done or s is state for s in self.procs):
            # Its peers would wait for it in the next barrier for ever (an MPI_Abort's code stays).
            if state.abort_code is None:
                state.reason = "exited without MPI_Finalize while other ranks run"
                state.abort_code = 1
                state.unfinalized = True
            state.move(FAILED)
            self.publish(RankEnded(state.proc))
            self.count_failure(state)
            self.abort(self.options.kill_timeout)
            return
        state.move(EXITED if status == 0 else FAILED)
        self.publish(RankEnded(state.proc))
        if status == 0:
            return
        self.count_failure(state)
        if not self.options.abort_on_failure or self.stop_signal is not None:
            # After the user's signal every rank may still be acting on it (a traceback, a
            # checkpoint): the others keep the signal's grace before they are stopped.
            return
        if self.hydra and status is not None and status > 0 and mpi != "init":
            return  # hydra's: a rank's own exit, outside MPI, ends only that rank
        self.abort(self.options.kill_timeout)

    def count_failure(self, state: RankState) -> None:
        if state.proc not in self.failed:
            self.failed.append(state.proc)
        stopping = self.timed_out or self.stop_signal is not None or self.elsewhere is not None or bool(self.regroup)
        if self.first_failure is None and (not stopping or state.abort_code is not None):
            self.first_failure = state  # after a signal, the timeout or another node's end: its effects

    def mpi_failure(self, state: RankState, code: int, reason: str) -> None:
        """MPI_Abort or a broken PMI client: the job ends as if that rank failed with code."""
        self.publish(MpiFailure(state.proc, reason))
        if state.abort_code is None:
            state.abort_code = code
            state.reason = reason
        self.count_failure(state)
        self.abort(self.options.kill_timeout)

    def abort(self, grace: float) -> None:
        """Stop every rank: SIGTERM to each process group, SIGKILL after grace seconds. Sent once;
        a later abort(0) still goes out (escalation)."""
        if self.phase in (FINISHING, DONE) or (self.phase == ABORTING and grace > 0):
            return
        for state in self.procs:
            if not state.done and state.state != STOPPING:
                state.killed = True
                state.move(STOPPING)
        if self.phase != ABORTING:
            self.move(ABORTING)
        self.aborted = True
        self.publish(Abort(grace))

    def move(self, phase: str) -> None:
        self.phase = states.moved(self.phase, phase, states.RUN_MOVES)

    # -- results ----------------------------------------------------------------------------------
    @property
    def stop_signal(self) -> int | None:
        """The first signal that stopped the run (SIGINT, SIGTERM...), if one did."""
        return self.stops.first

    def exit_status(self) -> int:
        return run_status.exit_status(self)


def lost_with_its_host(state: RankState, event: HostLost) -> tuple[int, str]:
    """(status, reason) of a rank whose agent ended: killed with it if it had started; if its
    agent never said it started, not started, and no signal ended it (nor did the run's kill)."""
    if state.started_at is not None:
        return -signal.SIGKILL, f"agent of host {event.name} lost"
    state.killed = False
    return NOT_STARTED, f"its agent on {event.name} ended before starting it" + (f": {event.why}" if event.why else "")
