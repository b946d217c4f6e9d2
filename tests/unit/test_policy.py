"""The run's policy, replayed: event histories in, with a fake clock; decisions and the exit
status out. Each history is what the controller would feed the policy in a real run (agents'
messages, signals, a lost agent, the clock's ticks), in milliseconds instead of seconds."""

from __future__ import annotations

import signal

import pytest

from mpilaunch.launcher.decide import states
from mpilaunch.launcher.decide.events import (
    Abort,
    AgentLost,
    FinishAgents,
    Forward,
    HardStop,
    HostLost,
    MpiFailure,
    NodesRegroup,
    RankEnded,
    RankNotStarted,
    RankStarted,
    SignalReceived,
    Silent,
    StacksTaken,
    StopNotice,
    TimedOut,
    WantStacks,
)
from mpilaunch.launcher.decide.policy import STACKS_WAIT, Policy
from mpilaunch.plan.placement import Rank
from mpilaunch.plan.spec import Options, TorchRun
from mpilaunch.protocol.messages import Exited, Failed, PmiAbort, PmiError, Started

TICK = object()  # the loop's turn: time passed, nothing arrived
DECISIONS = (Abort, Forward, FinishAgents)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(history: list, ranks: int = 2, hosts: int = 1, **options) -> tuple[Policy, list[tuple[float, object]]]:
    """Feed the history (pairs of a time and an event, or TICK) to a policy of a job of `ranks`
    ranks spread over `hosts` hosts; return it and what it published, with the time of each."""
    clock = Clock()
    published: list[tuple[float, object]] = []
    policy = Policy(Options(**options), lambda event: published.append((clock.now, event)), clock)
    per_host = ranks // hosts
    policy.add_job(1, [Rank(r, 0, r // per_host, r % per_host, per_host, r // per_host) for r in range(ranks)])
    policy.start()
    for when, event in history:
        clock.now = when
        if event is not TICK:
            policy.handle(event)
        policy.tick()  # the controller ticks the policy once a loop turn
    return policy, published


def decisions(published: list[tuple[float, object]]) -> list[tuple[float, object]]:
    return [(when, event) for when, event in published if isinstance(event, DECISIONS)]


def started(ranks: int = 2) -> list:
    return [(0.0, Started(proc=r, pid=100 + r)) for r in range(ranks)]


def test_every_rank_exits_0_and_the_agents_are_told_to_finish() -> None:
    policy, out = replay([*started(), (1.0, Exited(0, 0, "finalized")), (1.1, Exited(1, 0, "finalized"))])
    assert decisions(out) == [(1.1, FinishAgents(0.5))]
    assert policy.exit_status() == 0 and policy.phase == states.FINISHING
    assert [s.state for s in policy.procs] == [states.EXITED, states.EXITED]
    assert [e for _, e in out if isinstance(e, RankStarted)] == [RankStarted(0), RankStarted(1)]


def test_the_first_failure_aborts_the_others_and_gives_the_status() -> None:
    policy, out = replay([*started(), (1.0, Exited(1, 3)), (1.5, Exited(0, -signal.SIGTERM))], kill_timeout=2.0)
    assert decisions(out) == [(1.0, Abort(2.0)), (1.5, FinishAgents(0.5))]
    assert policy.exit_status() == 3
    assert policy.first_failure is policy.procs[1]
    assert policy.procs[0].killed and not policy.procs[1].killed
    assert policy.aborted and policy.failed == [1, 0]


def test_with_abort_off_the_others_run_on_and_the_status_is_still_the_failure() -> None:
    mca = (("orte_abort_on_non_zero_status", "0"),)
    policy, out = replay([*started(), (1.0, Exited(1, 3)), (5.0, Exited(0, 0))], mca=mca)
    assert decisions(out) == [(5.0, FinishAgents(0.5))]
    assert policy.exit_status() == 3 and not policy.aborted


def test_ctrl_c_gives_a_rank_that_failed_of_it_the_grace_before_the_others_are_killed() -> None:
    """The race of commit 66b81b5: after a forwarded SIGINT, rank 0 dies of it first; rank 1 is
    still printing its traceback and must get the signal's grace (--kill-timeout) to end on its
    own, not a SIGTERM at once."""
    history = [*started(), (1.0, SignalReceived(signal.SIGINT)), (1.1, Exited(0, -signal.SIGINT)), (2.0, TICK)]
    policy, out = replay(history, kill_timeout=2.0)
    assert decisions(out) == [(1.0, Forward(signal.SIGINT))]
    assert policy.phase == states.INTERRUPTED and policy.next_deadline() == pytest.approx(3.0)
    policy.clock.now = 3.0  # type: ignore[attr-defined]
    policy.tick()
    assert decisions(out)[-1] == (3.0, Abort(2.0))
    policy.handle(Exited(1, -signal.SIGTERM))
    policy.tick()
    assert policy.first_failure is None and policy.exit_status() == 128 + signal.SIGINT


def test_ctrl_c_that_every_rank_acts_on_in_time_kills_nothing() -> None:
    history = [*started(), (1.0, SignalReceived(signal.SIGINT)), (1.1, Exited(0, -2)), (1.8, Exited(1, 1))]
    policy, out = replay(history, kill_timeout=2.0)
    assert decisions(out) == [(1.0, Forward(signal.SIGINT)), (1.8, FinishAgents(0.5))]
    assert not any(s.killed for s in policy.procs)
    assert policy.exit_status() == 130


def test_a_second_ctrl_c_kills_at_once() -> None:
    history = [*started(), (1.0, SignalReceived(signal.SIGINT)), (1.2, SignalReceived(signal.SIGINT))]
    policy, out = replay(history, kill_timeout=2.0)
    assert decisions(out) == [(1.0, Forward(signal.SIGINT)), (1.2, Abort(0))]
    assert (1.2, HardStop(signal.SIGINT)) in out
    assert policy.phase == states.ABORTING


@pytest.mark.parametrize(
    "sig, then",
    [(signal.SIGINT, Abort(2.0)), (signal.SIGHUP, Abort(2.0)), (signal.SIGTERM, Abort(0)), (signal.SIGABRT, Abort(0))],
)
def test_ranks_that_outlive_a_stop_signals_grace_are_stopped(sig: int, then: Abort) -> None:
    """A closed terminal (SIGHUP) or one Ctrl-C never leaves ranks that ignore it running: after
    --kill-timeout they get SIGTERM, then SIGKILL (SIGKILL at once where SIGTERM was the signal
    sent); the notice says so as the signal goes out."""
    sent = signal.SIGTERM if sig == signal.SIGABRT else sig
    policy, out = replay([*started(), (1.0, SignalReceived(sig)), (2.9, TICK)], kill_timeout=2.0)
    assert decisions(out) == [(1.0, Forward(sent))]
    assert (1.0, StopNotice(sig, sent, 2.0, then.grace > 0)) in out
    assert policy.next_deadline() == pytest.approx(3.0)
    policy.clock.now = 3.0  # type: ignore[attr-defined]
    policy.tick()
    assert decisions(out)[-1] == (3.0, then) and all(s.killed for s in policy.procs)
    policy.handle(Exited(0, -signal.SIGTERM))
    policy.handle(Exited(1, -signal.SIGKILL))
    assert policy.first_failure is None and policy.exit_status() == 128 + sig


@pytest.mark.parametrize("first, second", [(signal.SIGHUP, signal.SIGTERM), (signal.SIGINT, signal.SIGTERM)])
def test_any_stop_signal_after_a_first_one_kills_at_once(first: int, second: int) -> None:
    """`kill -HUP` then `kill -TERM` (the terminal is gone: nobody sends the same signal twice)."""
    history = [*started(), (1.0, SignalReceived(first)), (1.2, SignalReceived(second))]
    policy, out = replay(history, kill_timeout=2.0)
    assert decisions(out) == [(1.0, Forward(first)), (1.2, Abort(0))]
    policy.handle(Exited(0, -signal.SIGKILL))
    assert (1.2, HardStop(second)) in out and policy.exit_status() == 128 + first


def test_a_second_abort_with_grace_is_not_sent_again_but_a_kill_now_is() -> None:
    history = [*started(3), (1.0, Exited(2, 1)), (1.1, PmiError(1, "broken")), (1.2, SignalReceived(2))]
    history += [(1.3, SignalReceived(2))]
    _policy, out = replay(history, ranks=3, kill_timeout=2.0)
    assert [e for _, e in decisions(out)] == [Abort(2.0), Forward(2), Abort(0)]


def test_usr1_is_forwarded_and_is_no_stop_signal() -> None:
    history = [*started(), (1.0, SignalReceived(signal.SIGUSR1)), (1.1, Exited(0, -signal.SIGUSR1))]
    policy, out = replay(history, kill_timeout=2.0)
    assert [e for _, e in decisions(out)] == [Forward(signal.SIGUSR1), Abort(2.0)]
    assert policy.stop_signal is None and policy.exit_status() == 128 + signal.SIGUSR1


def test_the_timeout_kills_every_rank_and_gives_124() -> None:
    history = [*started(), (9.9, TICK), (10.0, TICK), (10.5, Exited(0, -signal.SIGTERM)), (10.6, Exited(1, 1))]
    policy, out = replay(history, timeout=10.0, kill_timeout=2.0)
    assert decisions(out) == [(10.0, Abort(2.0)), (10.6, FinishAgents(0.5))]
    assert (10.0, TimedOut(10.0)) in out
    assert policy.exit_status() == 124 and policy.first_failure is None  # the timeout's effects are not causes


def test_mpi_abort_ends_the_job_with_its_code() -> None:
    policy, out = replay([*started(), (1.0, PmiAbort(0, 7, "bad input"))], kill_timeout=2.0)
    assert decisions(out) == [(1.0, Abort(2.0))]
    assert (1.0, MpiFailure(0, "called MPI_Abort with code 7: bad input")) in out
    assert policy.exit_status() == 7
    policy.handle(Exited(0, 0, "init"))
    policy.handle(Exited(1, -signal.SIGTERM))
    assert policy.exit_status() == 7  # the code, not the rank's own exit


@pytest.mark.parametrize(("code", "status"), [(256, 1), (257, 1), (0, 1), (-1, 255)])
def test_mpi_abort_codes_become_a_nonzero_low_byte(code: int, status: int) -> None:
    policy, _ = replay([*started(), (1.0, PmiAbort(0, code, ""))])
    assert policy.exit_status() == status


def test_a_rank_that_exits_0_without_finalize_while_others_run_fails_the_job() -> None:
    policy, out = replay([*started(), (1.0, Exited(0, 0, "init"))], kill_timeout=2.0)
    assert decisions(out) == [(1.0, Abort(2.0))]
    assert policy.procs[0].reason == "exited without MPI_Finalize while other ranks run"
    assert policy.exit_status() == 1


def test_the_last_rank_may_exit_without_finalize() -> None:
    policy, out = replay([*started(), (1.0, Exited(0, 0, "finalized")), (1.1, Exited(1, 0, "init"))])
    assert decisions(out) == [(1.1, FinishAgents(0.5))] and policy.exit_status() == 0


def test_a_lost_agent_loses_its_ranks_and_aborts_the_others() -> None:
    history = [*started(4), (1.0, HostLost(1, "node2", "no word from it for 30 s"))]
    policy, out = replay(history, ranks=4, hosts=2, kill_timeout=2.0)
    assert (1.0, AgentLost(1, "no word from it for 30 s", (2, 3))) in out
    assert decisions(out) == [(1.0, Abort(2.0))]
    assert policy.procs[2].status == -signal.SIGKILL and policy.procs[2].reason == "agent of host node2 lost"
    assert policy.exit_status() == 128 + signal.SIGKILL
    assert policy.procs[0].state == states.STOPPING


def test_a_host_lost_to_silence_leaves_its_ranks_unconfirmed_not_killed() -> None:
    """Given up after the heartbeat, a host may still run its ranks (a frozen agent): they end
    with no status and a reason that says so, none counts as killed, the others are aborted."""
    history = [*started(4), (1.0, HostLost(1, "node2", "no word from it for 30 s", confirmed=False))]
    policy, out = replay(history, ranks=4, hosts=2, kill_timeout=2.0)
    assert (1.0, AgentLost(1, "no word from it for 30 s", (2, 3), confirmed=False)) in out
    assert decisions(out) == [(1.0, Abort(2.0))]
    for lost in policy.procs[2:]:
        assert lost.state == states.FAILED and lost.status is None and not lost.killed
        assert lost.reason == "host node2 lost; its ranks could not be confirmed ended"
    assert policy.first_failure is policy.procs[2] and policy.exit_status() == 1
    assert policy.procs[0].state == states.STOPPING and policy.procs[0].killed


def test_a_rank_that_cannot_start_is_reported_and_fails_the_job() -> None:
    history = [(0.0, Started(0, 100)), (0.0, Failed(1, "nope: No such file or directory", 127))]
    policy, out = replay(history, kill_timeout=2.0)
    assert (0.0, RankNotStarted(1, "nope: No such file or directory")) in out
    assert decisions(out) == [(0.0, Abort(2.0))]
    assert policy.exit_status() == 127 and policy.ending


def test_each_rank_end_is_published_once() -> None:
    _policy, out = replay([*started(), (1.0, Exited(1, 3)), (1.1, Exited(1, 3)), (1.2, Exited(0, 0))])
    assert [e for _, e in out if isinstance(e, RankEnded)] == [RankEnded(1), RankEnded(0)]


def test_a_rank_killed_before_it_said_it_started_keeps_its_pid_and_state() -> None:
    policy, _out = replay([(0.0, Started(0, 100)), (0.5, Exited(0, 2)), (0.6, Started(1, 101))], kill_timeout=1.0)
    assert policy.procs[1].state == states.STOPPING and policy.procs[1].pid == 101


def test_moves_the_state_machine_does_not_allow_are_refused() -> None:
    state = states.RankState(0, 1, Rank(0, 0, 0, 0, 1, 0))
    state.move(states.RUNNING)
    state.move(states.EXITED)
    with pytest.raises(states.StateError):
        state.move(states.RUNNING)
    assert states.moved(states.RUNNING, states.INTERRUPTED, states.RUN_MOVES) == states.INTERRUPTED
    with pytest.raises(states.StateError):
        states.moved(states.FINISHING, states.ABORTING, states.RUN_MOVES)


# -- stacks (issue 30): SIGQUIT, --timeout with --get-stack-traces, --hang-timeout -----------------
def test_sigquit_asks_for_stacks_and_the_run_goes_on() -> None:
    history = [*started(), (1.0, SignalReceived(signal.SIGQUIT)), (3.0, SignalReceived(signal.SIGQUIT))]
    policy, out = replay(history)
    asked = [(when, e) for when, e in out if isinstance(e, WantStacks)]
    assert asked == [(1.0, WantStacks("SIGQUIT")), (3.0, WantStacks("SIGQUIT"))]
    assert decisions(out) == [] and policy.stop_signal is None and policy.phase == states.RUNNING


def test_a_second_sigquit_within_a_second_stops_the_run_as_ctrl_c() -> None:
    history = [*started(), (1.0, SignalReceived(signal.SIGQUIT)), (1.8, SignalReceived(signal.SIGQUIT))]
    policy, out = replay(history)
    assert decisions(out) == [(1.8, Forward(signal.SIGINT))]
    assert policy.stop_signal == signal.SIGQUIT and policy.phase == states.INTERRUPTED
    policy.handle(Exited(0, -signal.SIGINT))
    policy.handle(Exited(1, -signal.SIGINT))
    assert policy.exit_status() == 128 + signal.SIGQUIT
    # a third asks for stacks again; a fourth right behind it kills at once, as a second Ctrl-C
    for when, event in [(5.0, SignalReceived(signal.SIGQUIT)), (5.5, SignalReceived(signal.SIGQUIT))]:
        policy.clock.now = when  # type: ignore[attr-defined]
        policy.handle(event)
    assert [e for _, e in out if isinstance(e, (WantStacks, HardStop))][-2:] == [
        WantStacks("SIGQUIT"),
        HardStop(signal.SIGQUIT),
    ]


def test_the_timeout_with_stacks_kills_once_they_are_printed() -> None:
    history = [*started(), (10.0, TICK), (10.4, StacksTaken("timeout")), (11.0, Exited(0, -15)), (11.0, Exited(1, -15))]
    policy, out = replay(history, timeout=10.0, kill_timeout=2.0, get_stack_traces=True)
    assert [e for _, e in out if isinstance(e, (TimedOut, WantStacks))] == [
        TimedOut(10.0, stacks=True),
        WantStacks("timeout"),
    ]
    assert decisions(out) == [(10.4, Abort(2.0)), (11.0, FinishAgents(0.5))]
    assert policy.exit_status() == 124 and policy.timed_out_by == "--timeout"


def test_a_kill_that_waits_for_stacks_that_never_come_goes_on() -> None:
    history = [*started(), (10.0, TICK), (10.0 + STACKS_WAIT, TICK)]
    _policy, out = replay(history, timeout=10.0, kill_timeout=2.0, get_stack_traces=True)
    assert decisions(out) == [(10.0 + STACKS_WAIT, Abort(2.0))]


def test_silence_asks_for_stacks_and_with_kill_ends_the_job_as_a_timeout() -> None:
    history = [*started(), (2.0, Silent(2.0)), (4.0, Silent(2.0))]
    policy, out = replay(history, hang_timeout=2.0)
    assert [e for _, e in out if isinstance(e, WantStacks)] == [WantStacks("hang")] * 2 and decisions(out) == []
    history = [*started(), (2.0, Silent(2.0)), (2.5, StacksTaken("hang"))]
    policy, out = replay(history, hang_timeout=2.0, hang_action="kill", kill_timeout=1.0)
    assert [e for _, e in out if isinstance(e, (TimedOut, WantStacks))] == [
        TimedOut(2.0, hang=True, stacks=True),
        WantStacks("hang"),
    ]
    assert decisions(out) == [(2.5, Abort(1.0))]
    assert policy.exit_status() == 124 and policy.timed_out_by == "--hang-timeout"


TORCH = TorchRun(nproc_per_node=2)
EXITS = [
    ([(1.0, Exited(1, 3)), (1.5, Exited(0, -signal.SIGTERM))], 3),
    ([(1.0, Exited(1, -signal.SIGSEGV)), (1.5, Exited(0, -signal.SIGTERM))], 128 + signal.SIGSEGV),
    ([(1.0, SignalReceived(signal.SIGTERM)), (1.1, Exited(0, 0)), (1.2, Exited(1, 0))], 0),
    ([(1.0, SignalReceived(signal.SIGHUP)), (1.1, Exited(0, -signal.SIGHUP)), (1.2, Exited(1, 0))], 128 + 1),
    ([(1.0, Exited(0, 0)), (1.1, Exited(1, 0))], 0),
    ([(10.0, TICK), (10.1, Exited(0, -signal.SIGTERM)), (10.2, Exited(1, 1))], 124),
]


@pytest.mark.parametrize("history, mpiruns", EXITS)
def test_under_torchruns_words_a_failure_or_a_stop_signal_is_status_1(history: list, mpiruns: int) -> None:
    """torchrun 2.13 exits 1 for any failed worker and when it was stopped by a signal, even if its
    workers then exited 0; --timeout stays 124, a run that ended well 0."""
    assert replay([*started(), *history], timeout=10.0)[0].exit_status() == mpiruns
    stopped = any(isinstance(event, SignalReceived) for _, event in history)
    torchruns = 124 if mpiruns == 124 else 1 if mpiruns or stopped else 0
    assert replay([*started(), *history], timeout=10.0, torch=TORCH)[0].exit_status() == torchruns


def test_with_a_signal_grace_the_ranks_left_after_a_stop_signal_are_killed_then() -> None:
    """torchrun's --shutdown-timeout: the signal goes to the ranks, SIGKILL to those left S seconds later."""
    history = [*started(), (1.0, SignalReceived(signal.SIGTERM)), (1.5, Exited(0, 0)), (3.9, TICK)]
    policy, out = replay(history, kill_timeout=30.0, signal_grace=3.0)
    assert decisions(out) == [(1.0, Forward(signal.SIGTERM))] and policy.next_deadline() == pytest.approx(4.0)
    policy.clock.now = 4.0  # type: ignore[attr-defined]
    policy.tick()
    assert decisions(out)[-1] == (4.0, Abort(0)) and policy.procs[1].killed and not policy.procs[0].killed
    policy, out = replay([*started(), (1.0, SignalReceived(signal.SIGTERM)), (9.0, TICK)], kill_timeout=30.0)
    assert decisions(out) == [(1.0, Forward(signal.SIGTERM))]  # the ranks have --kill-timeout to end on their own


def test_a_late_node_stops_ranks_that_all_run_well_and_their_ends_are_no_failure() -> None:
    """torchrun's elastic scale-up: the ranks get SIGTERM, SIGKILL after the grace, to start again
    with the late node; a rank that dies of it is no failure, and the attempt's status is 0."""
    history = [*started(), (1.0, NodesRegroup("node at n3 joined late")), (1.2, Exited(0, -15)), (1.3, Exited(1, 1))]
    policy, out = replay(history, kill_timeout=2.0, torch=TORCH)
    assert decisions(out) == [(1.0, Abort(2.0)), (1.3, FinishAgents(0.5))]
    assert policy.regroup == "node at n3 joined late"
    assert policy.first_failure is None and policy.exit_status() == 0


def test_a_late_node_restarts_nothing_once_a_rank_failed() -> None:
    """torchrun looks for waiting nodes only while its workers are healthy: a failure is restarted
    as a failure (counted), and takes the late node in then."""
    history = [*started(), (1.0, Exited(1, 3)), (1.1, NodesRegroup("node at n3 joined late"))]
    policy, out = replay(history, kill_timeout=2.0, torch=TORCH)
    assert policy.regroup is None and decisions(out) == [(1.0, Abort(2.0))]
    assert policy.first_failure is policy.procs[1] and policy.exit_status() == 1
