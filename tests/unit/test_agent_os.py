"""The agent's spawn, kill and reap, through its OS seam (agent/host_os.py) with a fake, as
supervisor's process tests run with DummyOptions: what the agent asks of the system and what
it reports up, with no process started. The fake's processes have real pipes (the agent's loop
reads them) and made-up pids; exits are wait statuses the test queues (tests/fakeos.py)."""

from __future__ import annotations

import signal

import pytest

from mpilaunch.agent.ranks import EXIT_REPORT_DELAY
from mpilaunch.protocol.messages import Exited, Failed, Started
from tests.fakeos import Agent


@pytest.fixture
def agent():  # type: ignore[no-untyped-def]
    made = Agent()
    yield made
    made.close()


def test_a_spawn_is_reported_started_and_watched_with_its_cpus(agent: Agent) -> None:
    assert agent.spawn(0, ("python", "t.py"), cpus=[1])
    assert agent.os.started == [(("python", "t.py"), [1])]
    assert agent.sent == [Started(proc=0, pid=5000)] and agent.watched == [5000]


@pytest.mark.parametrize(
    ("error", "code"),
    [(FileNotFoundError(2, "No such file or directory"), 127), (PermissionError(13, "Permission denied"), 126)],
)
def test_a_spawn_that_fails_is_reported_with_its_code(agent: Agent, error: OSError, code: int) -> None:
    agent.os.refuse = error
    assert not agent.spawn(3, ("missing",))
    assert agent.sent == [Failed(proc=3, error=f"missing: {error.strerror}", code=code)]
    assert not agent.ranks.any()


def test_an_exit_is_reported_once_its_pipes_are_closed(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.end(5000, 3 << 8)  # exit status 3
    agent.turns()
    exited = [m for m in agent.sent if isinstance(m, Exited)]
    assert exited == [Exited(proc=0, status=3, mpi="new", cpu=0.75, rss=2048 * 1024)]
    assert agent.ranks.all_done()


def test_an_exit_whose_pipes_stay_open_is_reported_after_the_delay(agent: Agent) -> None:
    """A child of the rank still holds its pipes: the exit goes up EXIT_REPORT_DELAY later."""
    agent.spawn(0)
    agent.os.exits.append((5000, signal.SIGKILL))  # killed, its pipes still open
    agent.turns(1)
    assert not [m for m in agent.sent if isinstance(m, Exited)]
    agent.os.now += EXIT_REPORT_DELAY
    agent.ranks.tick(agent.os.now)
    assert next(m for m in agent.sent if isinstance(m, Exited)).status == -signal.SIGKILL


def test_signals_reach_the_groups_of_live_ranks_only(agent: Agent) -> None:
    agent.spawn(0)
    agent.spawn(1)
    agent.os.end(5000, 0)
    agent.turns()
    agent.ranks.signal_all(signal.SIGUSR1)
    assert agent.os.signals == [("killpg", 5001, signal.SIGUSR1)]


def test_terminate_sends_sigterm_then_sigkill_after_the_grace(agent: Agent) -> None:
    agent.spawn(0)
    agent.reaper.terminate_all(2.0)
    assert ("killpg", 5000, signal.SIGTERM) in agent.os.signals
    assert not [s for s in agent.os.signals if s[2] == signal.SIGKILL]
    agent.os.now += 2.0
    agent.reaper.tick(agent.os.now)
    assert ("killpg", 5000, signal.SIGKILL) in agent.os.signals


def test_an_adopted_orphan_is_killed_with_its_group_but_never_the_agents(agent: Agent) -> None:
    """A rank's daemon re-parented to the agent (its subreaper): its group and itself are
    signalled; a group that is the agent's own is left alone."""
    agent.spawn(0)
    agent.os.kids[0] += [7000, 7001]
    agent.os.groups.update({7000: 7000, 7001: 1})  # 7001 is in the agent's own group
    agent.reaper.kill_all(relayed_too=False)
    signals = agent.os.signals
    assert ("killpg", 5000, signal.SIGKILL) in signals
    assert ("killpg", 7000, signal.SIGKILL) in signals and ("kill", 7000, signal.SIGKILL) in signals
    assert ("kill", 7001, signal.SIGKILL) in signals and ("killpg", 1, signal.SIGKILL) not in signals


def test_what_is_below_the_ranks_is_found_through_their_children(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.kids[5000] = [6000]
    agent.os.kids[6000] = [6001]
    assert sorted(agent.reaper.below_ranks()) == [5000, 6000, 6001]
    agent.reaper.signal_below(signal.SIGTERM)
    assert {("kill", pid, signal.SIGTERM) for pid in (5000, 6000, 6001)} <= set(agent.os.signals)
