"""The console's view of the run: the lines a user reads on stderr, from the run's events.

Nothing else in the run prints its decisions: the policy and the controller publish events
(events.py), and this subscriber turns those a person should see into one line each, and the
end of a failed or stopped run into its summary.
"""

from __future__ import annotations

from signal import SIGINT

from mpilaunch.launcher.decide.events import (
    AgentLost,
    AgentNote,
    Garbled,
    HardStop,
    MpiFailure,
    RankNotStarted,
    RunEnded,
    SpawnRefused,
    StopNotice,
    TimedOut,
    table,
)
from mpilaunch.launcher.decide.policy import Policy
from mpilaunch.launcher.decide.run_status import abort_status
from mpilaunch.launcher.decide.signal_table import ACTIONS, name_of
from mpilaunch.launcher.decide.states import RankState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.plan.build import JobPlan
    from mpilaunch.plan.hosts import Host
    from mpilaunch.protocol.record import Record


def describe(state: RankState) -> str:
    return f"rank {state.rank.rank}" + (f" of spawned job {state.job}" if state.job != 1 else "")


def closing_line(policy: Policy, hosts: Sequence[Host]) -> str:
    """`4 ranks, 12.3 s; largest memory 45 MiB (rank 2 on node1)`."""
    from mpilaunch.launcher.report.report_text import size

    ranks = [s for s in policy.procs if s.job == 1]
    text = f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}, {policy.clock() - (policy.started_at or 0.0):.1f} s"
    spawned = len(policy.procs) - len(ranks)
    if spawned:
        text += f" (and {spawned} spawned)"
    largest = max((s for s in policy.procs if s.rss), key=lambda s: s.rss or 0, default=None)
    if largest is not None:
        text += f"; largest memory {size(largest.rss or 0)} ({describe(largest)} on {hosts[largest.rank.host].name})"
    return text


class ConsoleReporter:
    """summary=False leaves out the failure summary (allrun prints a table of hosts instead)."""

    def __init__(
        self,
        hosts: Sequence[Host],
        policy: Policy,
        jobs: Mapping[int, JobPlan],
        output: OutputSink,
        summary: bool = True,
        closing: bool = False,
    ) -> None:
        """closing: one line at the end of the run (ranks, wall time, the largest memory), for a
        person at a terminal."""
        self.closing = closing
        self.hosts = hosts
        self.policy = policy
        self.jobs = jobs
        self.output = output
        self.summary = summary
        self.dispatch = table(
            {
                RankNotStarted: lambda e: self.say(f"{describe(self.policy.procs[e.proc])} could not start: {e.error}"),
                MpiFailure: lambda e: self.say(f"{describe(self.policy.procs[e.proc])} {e.reason}"),
                HardStop: lambda e: self.say(f"{name_of(e.sig)} again: killing every rank"),
                StopNotice: self.stop_notice,
                TimedOut: self.timed_out,
                AgentLost: self.agent_lost,
                Garbled: lambda e: self.say(f"garbled message from the agent of {self.hosts[e.host].name}: {e.why}"),
                AgentNote: lambda e: self.output.say(e.text),
                SpawnRefused: lambda e: self.say(
                    f"MPI_Comm_spawn from {describe(self.policy.procs[e.proc])} refused: {e.why}"
                ),
                RunEnded: self.run_ended,
            }
        )

    def __call__(self, event: Record) -> None:
        self.dispatch(event)

    def say(self, text: str) -> None:
        self.output.say(f"mpilaunch: {text}")

    def stop_notice(self, event: StopNotice) -> None:
        """What happens next, said as the first stop signal goes out (hydra says as much)."""
        name = name_of(event.sig)
        sent = f"{name} forwarded" if event.sent == event.sig else f"{name}: {name_of(event.sent)} sent"
        then = "SIGTERM, then SIGKILL" if event.term else "SIGKILL"
        again = "Ctrl-C again" if event.sig == SIGINT else "a second signal"
        self.say(f"{sent} to every rank; ranks still running in {event.grace:g} s get {then} ({again} kills them now)")

    def timed_out(self, event: TimedOut) -> None:
        if event.hang:
            what = f"no rank wrote any output for {event.timeout:g} s (--hang-timeout, --hang-action kill)"
        else:
            what = f"the job exceeded --timeout {event.timeout:g} s"
        then = "taking every rank's stack, then " if event.stacks else ""
        self.say(f"{what}; {then}killing every rank")

    def agent_lost(self, event: AgentLost) -> None:
        host = self.hosts[event.host].name
        if event.confirmed and all(self.policy.procs[p].started_at is None for p in event.procs):
            self.say(
                f"the agent of host {host} ended before starting its ranks" + (f": {event.why}" if event.why else "")
            )
            return
        because = f" ({event.why})" if event.why else ""
        fate = "its ranks are killed" if event.confirmed else "its ranks could not be confirmed ended"
        self.say(f"lost the agent of host {host}{because}; {fate}")

    def run_ended(self, event: RunEnded) -> None:
        policy = self.policy
        failure = policy.first_failure
        ended = [policy.procs[p] for p in policy.failed if policy.procs[p] is not failure]
        if failure is None and ended and policy.stop_signal is not None:
            from mpilaunch.launcher.report.report_text import rank_list  # only a failed or stopped run reports

            stop = policy.stop_signal
            sent = ACTIONS.get(stop, ("", stop))[1]
            how = "forwarded to every rank" if sent == stop else f"{name_of(sent)} sent to every rank"
            which = rank_list([s.rank.rank for s in ended if s.job == 1], sum(1 for s in ended if s.job != 1))
            self.say(f"stopped by {name_of(stop)} ({how}); {which} ended")
        ran = any(s.started_at is not None for s in policy.procs)  # else the lines said already are all there is
        if failure is not None and self.summary and ran:
            from mpilaunch.launcher.report.report_text import failure_summary
            from mpilaunch.launcher.report.root_cause import root_cause

            killed = [s for s in policy.procs if s.killed and s is not failure]
            unfinalized = failure.unfinalized
            status = failure.status
            if failure.abort_code is not None and not unfinalized:
                status = abort_status(failure.abort_code)
            text = failure_summary(
                rank=failure.rank.rank,
                job=failure.job,
                host=self.hosts[failure.rank.host].name,
                pid=failure.pid,
                status=status,
                argv=self.jobs[failure.job].argvs[failure.rank.app],
                last_lines=self.output.last_lines(failure.proc),
                killed=[s.rank.rank for s in killed if s.job == 1],
                killed_other=len([s for s in killed if s.job != 1]),
                aborted=policy.aborted or (policy.options.abort_on_failure and not policy.hydra),
                failed_total=len(policy.failed),
                ran_on="under hydra's rules a rank's exit ends only that rank" if policy.hydra else None,
                reason=failure.reason,
                before_finalizing=unfinalized,
                started=failure.started_at is not None,
                cause=root_cause(failure.error, failure.error_file, self.output.last_lines(failure.proc, 200)),
                death=failure.death,
            )
            self.output.say(text)
        if self.closing:
            self.say(closing_line(policy, self.hosts))
