"""The agent's spawn, kill and reap, through its OS seam (agent/host_os.py) with a fake, as
supervisor's process tests run with DummyOptions: what the agent asks of the system and what
it reports up, with no process started. The fake's processes have real pipes (the agent's loop
reads them) and made-up pids; exits are wait statuses the test queues."""

from __future__ import annotations

import fnmatch
import os
import signal

import pytest

from mpilaunch.agent.loop import Loop
from mpilaunch.agent.ranks import EXIT_REPORT_DELAY, Ranks
from mpilaunch.agent.reaper import Reaper
from mpilaunch.host import spawn
from mpilaunch.protocol.messages import Exited, Failed, RankSpec, Started

WALL = 1795000000.0  # the fake's wall clock is its monotonic clock plus this


class Usage:
    ru_utime, ru_stime, ru_maxrss = 0.25, 0.5, 2048


class FakeOS:
    """Processes that exist only here: each start gets the next pid and real pipes; what the
    agent asks (starts, signals) is recorded; reap() gives back the exits queued by the test."""

    def __init__(self) -> None:
        self.now = 100.0
        self.next_pid = 5000
        self.started: list[tuple[tuple[str, ...], list[int] | None]] = []
        self.signals: list[tuple[str, int, int]] = []  # ("killpg" | "kill", target, signal)
        self.exits: list[tuple[int, int]] = []  # (pid, wait status) to reap
        self.kids: dict[int, list[int]] = {}  # pid -> its children (0: the agent's)
        self.groups: dict[int, int] = {}  # pid -> process group
        self.ends: dict[int, list[int]] = {}  # pid -> the test's ends of its stdout/stderr pipes
        self.refuse: OSError | None = None  # the next start fails so
        # what agent/death.py reads
        self.files: dict[str, str] = {}  # path -> text (/proc files, cgroup files)
        self.kmsg: list[str] | None = None  # the kernel log's records (None: not readable)
        self.on_disk: dict[str, float] = {}  # path -> modification time (core files)
        self.zombies: dict[int, str] = {}  # pid -> its /proc/PID/cgroup while a zombie

    def start(self, argv, env, wdir, *, stdin, merge, pass_fds, gate, cpus=None, found=None):  # type: ignore[no-untyped-def]
        if self.refuse is not None:
            error, self.refuse = self.refuse, None
            raise error
        pid = self.next_pid
        self.next_pid += 1
        out_r, out_w = os.pipe()
        err_r, err_w = (None, None) if merge else os.pipe()
        self.ends[pid] = [fd for fd in (out_w, err_w) if fd is not None]
        self.started.append((tuple(argv), cpus))
        self.kids.setdefault(0, []).append(pid)
        self.groups[pid] = pid  # a session, hence a group, of its own
        return spawn.Started(pid, None, out_r, err_r)

    def killpg(self, group: int, sig: int) -> None:
        self.signals.append(("killpg", group, sig))

    def kill(self, pid: int, sig: int) -> None:
        self.signals.append(("kill", pid, sig))

    def getpgid(self, pid: int) -> int:
        return self.groups[pid]

    def getpgrp(self) -> int:
        return 1

    def reap(self):  # type: ignore[no-untyped-def]
        if not self.kids.get(0) and not self.exits:
            raise ChildProcessError
        if not self.exits:
            return None
        pid, status = self.exits.pop(0)
        self.kids[0].remove(pid)
        return pid, status, Usage()

    def children(self, pid=None):  # type: ignore[no-untyped-def]
        return list(self.kids.get(0 if pid is None else pid, []))

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL + self.now

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)

    def cwd_of(self, pid: int | None) -> str | None:
        return "/work" if pid is None else self.files.get(f"/proc/{pid}/cwd")

    def kernel_log(self) -> list[str] | None:
        return self.kmsg

    def matches(self, pattern: str) -> list[tuple[str, float]]:
        return [(path, mtime) for path, mtime in self.on_disk.items() if fnmatch.fnmatchcase(path, pattern)]

    def identity(self) -> tuple[int, int, str]:
        return 1000, 1000, "node1"

    def zombie_cgroup(self, pid: int) -> str | None:
        return self.zombies.get(pid)

    def end(self, pid: int, status: int) -> None:
        """The process ends: its pipes close, its wait status is there to reap."""
        for fd in self.ends.pop(pid, []):
            os.close(fd)
        self.exits.append((pid, status))


class Agent:
    """Ranks and a Reaper over the fake, and what they sent up."""

    def __init__(self) -> None:
        self.os = FakeOS()
        self.loop = Loop(self.os.clock)
        self.sent: list[object] = []
        self.watched: list[int] = []
        self.ranks = Ranks(self.loop, self.sent.append, lambda frame: None, self.watched.append, self.os)
        self.reaper = Reaper(self.ranks)
        self.loop.add_timer(self.reaper)
        self.loop.add_timer(self.ranks)
        self.loop.add_timer(self.ranks.death)

    def spawn(self, proc: int, argv: tuple[str, ...] = ("prog",), cpus: list[int] | None = None) -> bool:
        spec = RankSpec(proc=proc, rank=proc, local_rank=proc, app=0, argv=argv, wdir="/", env={})
        return self.ranks.spawn(1, spec, {}, False, cpus, spawn.Gate(), [])

    def turns(self, count: int = 3) -> None:
        for _ in range(count):
            self.loop.turn()

    def close(self) -> None:
        for fds in self.os.ends.values():
            for fd in fds:
                os.close(fd)
        self.loop.close()


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


PR_GET_CHILD_SUBREAPER = 37


def _subreaper_in_child(drop_call_function: bool) -> int:
    """In a forked child: become_subreaper(), then the flag as the kernel reports it (1 or 0)."""
    import ctypes

    from mpilaunch.agent.reaper import become_subreaper

    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            if drop_call_function:  # an interpreter whose _ctypes lacks it: the ctypes way
                import _ctypes

                del _ctypes.call_function
            become_subreaper()
            flag = ctypes.c_int(-1)
            ctypes.CDLL(None).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
            code = flag.value
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("drop_call_function", [False, True], ids=["_ctypes", "ctypes"])
def test_the_agent_becomes_a_child_subreaper(drop_call_function: bool) -> None:
    assert _subreaper_in_child(drop_call_function) == 1
