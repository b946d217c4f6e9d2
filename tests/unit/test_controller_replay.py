"""Whole runs replayed through the controller's real loop, as honcho's tests replay its manager:
fake agents on socket pairs answer what the controller sends as agents would (a Launch with a
Started per rank, a Kill or a signal with Exited, a Finish with Bye), a script of what happens
when (a rank exits, a host goes silent or is lost, a signal comes) runs on a virtual clock, and
the run's decisions, summary and exit status are checked. No process is started: the agents'
pids are made up, and the fake links say they are remote, so nothing is ever killed by pid."""

from __future__ import annotations

import os
import selectors
import signal
import socket

import pytest

from mpilaunch.launcher.loop.controller import MPI_MESSAGES, Controller
from mpilaunch.launcher.output.sink import OutputSink
from mpilaunch.launcher.start.here import ThisMachine
from mpilaunch.plan.build import build_plan
from mpilaunch.plan.spec import AppContext, JobSpec, Options
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import (
    DOWN,
    Bye,
    Exited,
    Finish,
    Hello,
    Kill,
    Launch,
    Note,
    Ping,
    PmiAbort,
    PmiFence,
    PmiFenceDone,
    Signal,
    Started,
    decode,
    encode,
)
from mpilaunch.transport.base import Link

START = 1000.0
TICK = 0.001  # seconds a turn of the loop with nothing to do takes, at least
PING_EVERY = 5.0  # an agent's heartbeat (the launcher's default timeout is 30 s)


class World:
    """Virtual time, the fake agents and the script of what happens when."""

    def __init__(self) -> None:
        self.now = START
        self.agents: list[FakeAgent] = []
        self.script: list[tuple[float, object]] = []  # (when, callable), kept sorted
        self.log: list[tuple[float, str, object]] = []  # (when, host, message the controller sent)

    def clock(self) -> float:
        return self.now

    def at(self, when: float, action) -> None:  # type: ignore[no-untyped-def]
        self.script.append((START + when, action))
        self.script.sort(key=lambda item: item[0])

    def react(self) -> None:
        for agent in self.agents:
            agent.react()

    def next_ping(self) -> float | None:
        return min((a.next_ping for a in self.agents if a.alive and not a.frozen), default=None)

    def run_due(self) -> None:
        while self.script and self.script[0][0] <= self.now:
            _, action = self.script.pop(0)
            action()


class VirtualSelector(selectors.DefaultSelector):
    """The loop's selector on virtual time: what is ready now is returned at once; else time
    jumps to the loop's own timeout or to the script's next event, whichever comes first."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world

    def select(self, timeout: float | None = None):  # type: ignore[no-untyped-def]
        world = self.world
        world.react()
        ready = super().select(0)
        if ready:
            return ready
        wake = world.now + timeout if timeout is not None else None
        due = [t for t in (world.script[0][0] if world.script else None, world.next_ping()) if t is not None]
        target = min([t for t in (wake, *due) if t is not None], default=None)
        assert target is not None, "the run would wait for ever"
        world.now = max(world.now + TICK, target)  # a real loop's turn takes some time too
        world.run_due()
        world.react()
        return super().select(0.2)


class FakeLink(Link):
    """The controller's end of a fake agent's socket pair."""

    def __init__(self, name: str, sock: socket.socket) -> None:
        super().__init__(name)
        self.sock = sock
        sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self) -> bytes | None:
        try:
            return self.sock.recv(1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def readable(self) -> bool:
        return False

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def close(self) -> None:
        self.sock.close()


class FakeAgent:
    """An agent as the controller sees one: it answers Launch, Kill, Signal and Finish."""

    def __init__(self, world: World, host: str) -> None:
        self.world = world
        self.host = host
        ours, theirs = socket.socketpair()
        self.sock = theirs
        self.link = FakeLink(host, ours)
        self.decoder = wire.Decoder()
        self.running: set[int] = set()
        self.ignores: set[int] = set()  # signals its ranks ignore
        self.alive = True
        self.frozen = False  # stopped (SIGSTOP): says nothing, answers nothing, its link stays open
        self.next_ping = world.now + PING_EVERY
        world.agents.append(self)
        self.say(Hello(host=host, cpus=2, pid=4242, python="3.11.7"))

    def say(self, message) -> None:  # type: ignore[no-untyped-def]
        if not self.alive:
            return
        try:
            self.sock.sendall(encode(message))
        except OSError:  # the controller closed its end: what a real agent's link would see too
            self.alive = False

    def exit(self, proc: int, status: int, mpi: str = "new") -> None:
        if proc in self.running:
            self.running.discard(proc)
            self.say(Exited(proc=proc, status=status, mpi=mpi))

    def lose(self) -> None:
        """The connection is gone (the host crashed): no Bye."""
        self.alive = False
        self.sock.close()

    def react(self) -> None:
        if not self.alive or self.frozen:
            return
        if self.world.now >= self.next_ping:  # its heartbeat, as a real agent's
            self.next_ping = self.world.now + PING_EVERY
            self.say(Ping())
        self.sock.setblocking(False)
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        for kind, value in self.decoder.feed(data):
            if kind != wire.CONTROL:
                continue
            message = decode(value, DOWN)  # type: ignore[arg-type]
            self.world.log.append((self.world.now, self.host, message))
            if isinstance(message, Launch):
                for rank in message.ranks:
                    self.running.add(rank.proc)
                    self.say(Started(proc=rank.proc, pid=900000 + rank.proc))
            elif isinstance(message, Kill):
                for proc in sorted(self.running):
                    self.exit(proc, -signal.SIGTERM if message.grace > 0 else -signal.SIGKILL)
            elif isinstance(message, Signal) and message.sig not in self.ignores:
                if message.sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    for proc in sorted(self.running):
                        self.exit(proc, -message.sig)
            elif isinstance(message, Finish):
                self.say(Bye())
                self.alive = False
                self.sock.close()


class FakeSignals:
    """The launcher's signals as bytes the test writes (SignalPipe's interface)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    def install(self, sel: selectors.BaseSelector) -> None:
        sel.register(self.read_fd, selectors.EVENT_READ, "signal")

    def catch_faults_at(self, when: float) -> None:
        """The real pipe's fault handlers: nothing to catch here."""

    def next_deadline(self) -> None:
        return None

    def tick(self, now: float) -> None:
        pass

    def send(self, sig: int) -> None:
        os.write(self.write_fd, bytes([sig]))

    def drain(self) -> bytes:
        try:
            return os.read(self.read_fd, 512)
        except BlockingIOError:
            return b""

    def restore(self) -> None:
        pass

    def release(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            os.close(fd)


def run(world: World, hosts: str, np: int, signals: FakeSignals | None = None, **options) -> tuple[int, list]:
    """A run of np ranks on the named hosts, through the real Controller; (status, sent)."""
    spec = JobSpec((AppContext(("prog",), np=np),), Options(hosts=(hosts,), **options))
    plan, _ = build_plan(spec, {}, ThisMachine())
    agents = {i: FakeAgent(world, h.name) for i, h in enumerate(plan.hosts)}
    signals = signals or FakeSignals()
    controller = Controller(
        plan,
        OutputSink(None, None, False),
        {i: a.link for i, a in agents.items()},
        agents=lambda: pytest.fail("no local agent is started in a replay"),  # type: ignore[arg-type, return-value]
        clock=world.clock,
        signals=signals,  # type: ignore[arg-type]
        selector=VirtualSelector(world),
    )
    world.controller = controller  # type: ignore[attr-defined]
    status = controller.run()
    for agent in agents.values():
        if agent.alive:
            agent.sock.close()
    return status, world.log


def sent(log: list, kind: type) -> list[tuple[float, str, object]]:
    return [(when - START, host, message) for when, host, message in log if isinstance(message, kind)]


def test_a_run_that_ends_well_finishes_every_agent(capfd: pytest.CaptureFixture[str]) -> None:
    world = World()
    world.at(1.0, lambda: world.agents[0].exit(0, 0))
    world.at(1.5, lambda: world.agents[1].exit(1, 0))
    status, log = run(world, "a:1,b:1", 2)
    assert status == 0
    assert [host for _, host, _ in sent(log, Launch)] == ["a", "b"]
    assert [(when, host) for when, host, _ in sent(log, Finish)] == [(1.5, "a"), (1.5, "b")]
    assert not sent(log, Kill)


def test_the_first_failure_kills_the_rest_and_gives_its_status(capfd: pytest.CaptureFixture[str]) -> None:
    world = World()
    world.at(2.0, lambda: world.agents[1].exit(1, 3))
    status, log = run(world, "a:1,b:1", 2, kill_timeout=2.0)
    assert status == 3
    assert [(when, message) for when, _, message in sent(log, Kill)] == [(2.0, Kill(2.0)), (2.0, Kill(2.0))]
    err = capfd.readouterr().err
    assert "The first process to do so was:" in err and "Exit code: 3" in err and "Killed by mpilaunch: rank 0" in err


def test_with_kill_timeout_0_the_others_are_killed_at_once(capfd: pytest.CaptureFixture[str]) -> None:
    """No grace: every agent is told to SIGKILL at once (Kill(0)), never to SIGTERM first."""
    world = World()
    world.at(1.0, lambda: world.agents[0].exit(0, 5))
    status, log = run(world, "a:1,b:1", 2, kill_timeout=0.0)
    assert status == 5
    kills = sent(log, Kill)
    assert {(when, host) for when, host, _ in kills} == {(1.0, "a"), (1.0, "b")}
    assert {message for _, _, message in kills} == {Kill(0.0)}
    assert [(when, host) for when, host, _ in sent(log, Finish)] == [(1.0, "a"), (1.0, "b")]


def test_a_lost_host_ends_the_run(capfd: pytest.CaptureFixture[str]) -> None:
    world = World()
    world.at(3.0, lambda: world.agents[1].lose())
    status, log = run(world, "a:1,b:1", 2)
    assert status != 0
    assert [(when, host) for when, host, _ in sent(log, Kill)] == [(3.0, "a")]
    err = capfd.readouterr().err
    assert "lost the agent of host b" in err


def test_a_silent_host_is_given_up_after_the_heartbeat(capfd: pytest.CaptureFixture[str]) -> None:
    """Its agent says nothing at all (a network cut with no reset): after the heartbeat timeout
    (30 s of virtual time) it is lost, and its ranks could not be confirmed ended."""
    world = World()

    def freeze() -> None:
        world.agents[1].frozen = True

    world.at(1.0, freeze)
    status, log = run(world, "a:1,b:1", 2)
    assert status == 1
    err = capfd.readouterr().err
    assert "no word from it for 30 s" in err and "could not be confirmed ended" in err
    kills = sent(log, Kill)
    assert kills and 30.0 <= kills[0][0] <= 31.0 and {host for _, host, _ in kills} == {"a"}


def test_a_signal_is_forwarded_and_the_run_stops(capfd: pytest.CaptureFixture[str]) -> None:
    world = World()
    signals = FakeSignals()
    world.at(2.0, lambda: signals.send(signal.SIGUSR1))
    world.at(3.0, lambda: signals.send(signal.SIGTERM))
    status, log = run(world, "a:1,b:1", 2, signals=signals)
    assert status == 128 + signal.SIGTERM
    forwarded = [(when, message.sig) for when, host, message in sent(log, Signal) if host == "a"]
    assert forwarded == [(2.0, signal.SIGUSR1), (3.0, signal.SIGTERM)]
    assert "stopped by SIGTERM" in capfd.readouterr().err


def test_the_time_limit_stops_the_run_with_124(capfd: pytest.CaptureFixture[str]) -> None:
    world = World()
    status, log = run(world, "a:1,b:1", 2, timeout=60.0, kill_timeout=1.0)
    assert status == 124
    assert [(when, host) for when, host, _ in sent(log, Kill)] == [(60.0, "a"), (60.0, "b")]


def test_mpi_abort_ends_the_run_with_its_code(capfd: pytest.CaptureFixture[str]) -> None:
    world = World()

    def abort() -> None:
        world.agents[0].say(PmiAbort(proc=0, code=7, message="bad input"))
        world.agents[0].exit(0, 7)

    world.at(1.0, abort)
    world.at(1.0, lambda: world.agents[0].say(Note(text="mpilaunch: a note from host a")))
    status, _ = run(world, "a:1,b:1", 2)
    assert status == 7
    err = capfd.readouterr().err
    assert "called MPI_Abort with code 7: bad input" in err and "a note from host a" in err


def test_a_pmi_barrier_over_two_hosts_makes_the_mpi_rooms_then_merges_their_puts(
    capfd: pytest.CaptureFixture[str],
) -> None:
    world = World()
    world.at(1.0, lambda: world.agents[0].say(PmiFence(job=1, kvs={"card-0": "a"})))
    world.at(1.2, lambda: world.agents[1].say(PmiFence(job=1, kvs={"card-1": "b"})))
    world.at(2.0, lambda: [world.agents[i].exit(i, 0) for i in (0, 1)])
    status, log = run(world, "a:1,b:1", 2)
    assert status == 0
    done = sent(log, PmiFenceDone)
    assert [(round(when, 3), host) for when, host, _ in done] == [(1.2, "a"), (1.2, "b")]
    assert all(message.kvs == {"card-0": "a", "card-1": "b"} for _, _, message in done)
    controller = world.controller  # type: ignore[attr-defined]
    rows = {kind for kind, handler in controller.handlers.items() if handler != controller.first_mpi_message}
    assert set(MPI_MESSAGES) <= rows  # each of the rooms' messages has its row now: none is made twice


def test_a_job_that_never_calls_mpi_runs_without_the_mpi_rooms(capfd: pytest.CaptureFixture[str]) -> None:
    world = World()
    world.at(1.0, lambda: [world.agents[i].exit(i, 0) for i in (0, 1)])
    assert run(world, "a:1,b:1", 2)[0] == 0
    assert world.controller.pmi is None  # type: ignore[attr-defined]
