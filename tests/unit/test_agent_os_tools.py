"""A relay's ssh clients, the stack tools and the guardian, through the agent's OS seam with a
fake (tests/fakeos.py): what they start, signal and wait for, and what they read of /proc,
with no process started. Pipes are real: the test plays the child's or the tool's end."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from mpilaunch.agent.reaper import ADOPTION_SCAN, GUARD_SCRIPT, RECORD, SWEEP_LIMIT, Guardian
from mpilaunch.agent.relay import Relay
from mpilaunch.agent.stacks import NO_TOOL, StackTaker
from mpilaunch.host.shm import SERVER_FOLDER, server_base
from mpilaunch.host.sshcmd import KEX
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import (
    UP,
    Gone,
    Hello,
    Note,
    RankStack,
    RelayHost,
    RelayHosts,
    SshSpec,
    Stacks,
    TakeStacks,
    decode,
    encode,
)
from tests.fakeos import Agent

PAYLOAD = b"the agent's code"
NODE2 = RelayHost(2, "node2", None, None, ())
HOSTS = (RelayHost(1, "node1", None, None, (NODE2,)), RelayHost(3, "node3", "u", 22, ()))


@pytest.fixture
def agent():  # type: ignore[no-untyped-def]
    made = Agent()
    yield made
    made.close()


@pytest.fixture
def make_tree(agent: Agent):  # type: ignore[no-untyped-def]
    """Makes the relay once the test has set the fake up; its ends of the children's pipes are closed after."""
    made: list[Tree] = []

    def make() -> Tree:
        made.append(Tree(agent))
        return made[-1]

    yield make
    for relay in (tree.relay for tree in made):
        relay.close_all()
        for child in relay.children.values():
            relay._unwatch(child, "stdout")
            relay._unwatch(child, "stderr")


class Tree:
    """A relay over the fake, its frames up kept."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.up: list[bytes] = []
        self.relay = Relay(PAYLOAD, self.up.append, agent.loop, agent.os)
        agent.reaper.relay = self.relay
        self.pids = self.relay.start(RelayHosts(ssh=SshSpec(), command="AGENT", hosts=HOSTS), {"PATH": "/usr/bin"})

    def said(self) -> list[tuple[int, object]]:
        """What went up: (host, message) for each routed control frame, (None, message) for a plain one."""
        found: list[tuple[int, object]] = []
        for kind, value in wire.Decoder().feed(b"".join(self.up)):
            host, inner = value if kind == wire.ROUTED else (None, None)  # type: ignore[misc]
            if inner is not None:
                kind, value = wire.decode_frame(inner)  # type: ignore[arg-type]
            found.append((host, decode(value, UP)))  # type: ignore[arg-type]
        return found

    def child_says(self, pid: int, data: bytes, stream: int = 0) -> None:
        os.write(self.agent.os.ends[pid][stream], data)
        self.agent.turns(1)


def test_a_relay_starts_an_ssh_client_per_child_and_gives_each_the_agents_code(
    agent: Agent, make_tree: Callable[[], Tree]
) -> None:
    tree = make_tree()
    assert tree.pids == [5000, 5001]
    argvs = [argv for argv, _ in agent.os.started]
    assert argvs[0][-3:] == ("--", "node1", "AGENT")
    assert argvs[1][-7:] == ("-l", "u", "-p", "22", "--", "node3", "AGENT")
    assert agent.os.ssh_asked == ["ssh"] and all(KEX in argv for argv in argvs)  # OpenSSH 9 takes the key exchange
    assert [os.read(agent.os.stdins[pid], 100) for pid in tree.pids] == [PAYLOAD, PAYLOAD]


def test_an_old_ssh_client_is_not_given_the_key_exchange_option(agent: Agent, make_tree: Callable[[], Tree]) -> None:
    agent.os.ssh = (7, 4)
    make_tree()
    assert all(KEX not in argv for argv, _ in agent.os.started)


def test_a_child_that_cannot_be_started_is_gone_at_once(agent: Agent, make_tree: Callable[[], Tree]) -> None:
    agent.os.refuse = FileNotFoundError(2, "No such file or directory")
    tree = make_tree()
    assert tree.pids == [5000]
    assert tree.said()[0] == (None, Gone(host=1, why="cannot run ssh: No such file or directory"))


def test_a_childs_frames_go_up_routed_and_its_subtrees_as_they_are(agent: Agent, make_tree: Callable[[], Tree]) -> None:
    tree = make_tree()
    hello = Hello(host="node1", cpus=2, pid=1, python="3.12")
    below = Hello(host="node2", cpus=2, pid=2, python="3.12")
    tree.child_says(5000, b"motd\n" + wire.MARKER + encode(hello) + wire.routed(2, encode(below)))
    assert tree.said() == [(1, hello), (2, below)]


def test_a_child_speaking_for_a_host_it_does_not_relay_to_is_cut_off(
    agent: Agent, make_tree: Callable[[], Tree]
) -> None:
    tree = make_tree()
    tree.child_says(5001, wire.MARKER + wire.routed(2, encode(Hello(host="node2", cpus=2, pid=2, python="3.12"))))
    why = "it sent a frame in the name of a host it does not relay to"
    assert tree.said() == [(None, Gone(host=3, why=why))]
    assert ("killpg", 5001, signal.SIGTERM) in agent.os.signals


def test_ssh_that_never_started_the_agent_is_gone_with_its_last_words_and_ended(
    agent: Agent, make_tree: Callable[[], Tree]
) -> None:
    tree = make_tree()
    tree.child_says(5000, b"node1: Permission denied (publickey).\n", stream=1)
    os.close(agent.os.ends[5000].pop(0))  # its stdout ends
    agent.turns(1)
    assert tree.said() == [(None, Gone(host=1, why="node1: Permission denied (publickey)."))]
    assert agent.os.signals == [("killpg", 5000, signal.SIGTERM)]


def test_a_greeted_childs_stderr_goes_up_as_notes_with_its_name(agent: Agent, make_tree: Callable[[], Tree]) -> None:
    tree = make_tree()
    tree.child_says(5000, wire.MARKER)
    tree.child_says(5000, b"warning: disk\npartial", stream=1)
    assert tree.said() == [(None, Note(text="mpilaunch: agent on node1: warning: disk"))]


def test_a_kill_of_everything_ends_the_ssh_clients_not_reaped_yet(agent: Agent, make_tree: Callable[[], Tree]) -> None:
    tree = make_tree()
    agent.os.end(5001, 255 << 8)
    agent.reaper.reap()
    assert tree.relay.by_pid[5001].status == 255 << 8 and tree.relay.running()
    agent.reaper.kill_all(relayed_too=True)
    assert ("killpg", 5000, signal.SIGKILL) in agent.os.signals
    assert ("killpg", 5001, signal.SIGKILL) not in agent.os.signals  # reaped: its pid may be anyone's


# -- the stack taker ------------------------------------------------------------------------------
def taker(agent: Agent, tools: tuple[str, ...]) -> tuple[StackTaker, list[object]]:
    agent.os.installed = {f"/opt/tools/{tool}" for tool in tools}
    sent: list[object] = []
    return StackTaker(agent.loop, sent.append, agent.ranks, agent.reaper.watch, {"PATH": "/opt/tools"}), sent


def tool_says(agent: Agent, pid: int, text: bytes) -> None:
    fd = agent.os.ends[pid].pop()
    os.write(fd, text)
    os.close(fd)


def test_stacks_stop_the_ranks_read_each_with_its_tool_then_resume_them(agent: Agent) -> None:
    agent.spawn(0)
    agent.spawn(1)
    agent.os.programs.update({5000: "python3.12", 5001: "solver"})
    stacks, sent = taker(agent, ("py-spy", "eu-stack"))
    stacks.handle(TakeStacks(snap=7))
    assert agent.os.signals == [("killpg", 5000, signal.SIGSTOP), ("killpg", 5001, signal.SIGSTOP)]
    assert agent.os.tools == [
        ("/opt/tools/py-spy", "dump", "--nonblocking", "--pid", "5000"),
        ("/opt/tools/eu-stack", "-m", "-s", "-p", "5001"),
    ]
    tool_says(agent, 5002, b"Thread 1: main (t.py:3)\n")
    tool_says(agent, 5003, b"#0 solve\n")
    agent.turns(2)
    assert agent.os.signals[2:] == [("killpg", 5000, signal.SIGCONT), ("killpg", 5001, signal.SIGCONT)]
    taken = (
        RankStack(proc=0, text="Thread 1: main (t.py:3)\n", tool="py-spy"),
        RankStack(proc=1, text="#0 solve\n", tool="eu-stack"),
    )
    assert sent == [Stacks(snap=7, stacks=taken)]


def test_a_shell_rank_is_read_through_the_one_program_it_runs(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.programs.update({5000: "sh", 6000: "myapp"})
    agent.os.kids[5000] = [6000]
    agent.os.memory_maps[6000] = b"7f00-7f10 r-xp 0 08:01 1 /usr/lib/libpython3.12.so.1.0\n"  # an embedded Python
    stacks, _ = taker(agent, ("py-spy", "gdb"))
    stacks.handle(TakeStacks(snap=1))
    assert agent.os.tools == [("/opt/tools/py-spy", "dump", "--nonblocking", "--pid", "6000")]


def test_a_tool_that_outstays_the_limit_is_killed_with_its_group(agent: Agent) -> None:
    agent.spawn(0)
    stacks, sent = taker(agent, ("gdb",))
    stacks.handle(TakeStacks(snap=2, limit=3.0))
    assert agent.os.tools[0][:3] == ("/opt/tools/gdb", "-p", "5000")
    agent.os.now += 3.0
    agent.turns(1)
    assert ("killpg", 5001, signal.SIGKILL) in agent.os.signals
    assert sent == [Stacks(snap=2, stacks=(RankStack(proc=0, tool="gdb", why="gdb gave no stack within 3 s"),))]


def test_a_host_without_tools_says_so_and_starts_none(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.programs[5000] = "python3"
    stacks, sent = taker(agent, ())
    stacks.handle(TakeStacks(snap=3))
    assert agent.os.tools == []
    assert sent == [Stacks(snap=3, stacks=(RankStack(proc=0, why=NO_TOOL),), lacks="tools")]


# -- the guardian ---------------------------------------------------------------------------------
def record(guardian: Guardian, place: int) -> bytes:
    return os.pread(guardian.table, RECORD, place * RECORD)


def test_the_guardian_gets_its_pipe_and_table_and_leaves_on_a_line(agent: Agent) -> None:
    guardian = Guardian(agent.os)
    assert agent.os.guardian is not None
    argv, pipe, table = agent.os.guardian
    assert argv == ("sh", "-c", GUARD_SCRIPT, "mpilaunch-guardian", str(os.getpid()), server_base(), "")
    assert table == guardian.table and guardian.pid == 5000
    guardian.watch(6000)
    guardian.watch(6001, b"4242")
    assert record(guardian, 0) == b"%10d %20s\n" % (6000, b"-")
    assert record(guardian, 1) == b"%10d %20s\n" % (6001, b"4242")
    guardian.forget(6000)
    assert record(guardian, 0) == b" " * (RECORD - 1) + b"\n"
    guardian.watch(6002)  # into the place taken back
    assert record(guardian, 0) == b"%10d %20s\n" % (6002, b"-")
    guardian.release()
    assert os.read(pipe, 10) == b"\n" and agent.os.waited == [5000]


def test_a_folder_the_agent_could_not_remove_is_left_to_the_guardian(agent: Agent) -> None:
    """The agent removes its PMIx and torch folders before it lets the guardian go; one still
    there (no descriptor left to list it under a low `ulimit -n`) keeps the line back, so the
    guardian's cleanup (rm -rf of the agent's folders) runs."""
    guardian = Guardian(agent.os)
    _, pipe, _ = agent.os.guardian
    folder = os.path.join(server_base(), SERVER_FOLDER.format(pid=os.getpid()) + "unit")
    os.mkdir(folder)
    try:
        guardian.release()
    finally:
        os.rmdir(folder)
    assert os.read(pipe, 10) == b"" and agent.os.waited == [5000]  # the pipe's end, no line


def test_what_is_below_the_ranks_is_told_to_the_guardian_with_its_start_time(agent: Agent) -> None:
    agent.reaper.guardian = guardian = Guardian(agent.os)
    agent.spawn(0)  # pid 5001
    agent.reaper.tick(agent.os.now)  # the first look: the ranks were just let through their gates
    agent.os.kids[5001] = [7000]
    agent.os.start_times[7000] = b"123456"
    agent.os.now += ADOPTION_SCAN
    agent.reaper.tick(agent.os.now)
    assert record(guardian, 0) == b"%10d %20s\n" % (7000, b"123456")  # the rank itself was told at its spawn
    agent.os.kids[5001] = []
    agent.os.now += ADOPTION_SCAN
    agent.reaper.tick(agent.os.now)
    assert record(guardian, 0) == b" " * (RECORD - 1) + b"\n"


def test_the_last_sweep_kills_in_rounds_for_its_limit_at_most(agent: Agent) -> None:
    """A rank that does not die (stuck in the kernel): SIGKILL again every round, then give up."""
    agent.spawn(0)
    started = agent.os.now
    agent.reaper.sweep()
    assert started + SWEEP_LIMIT <= agent.os.now < started + SWEEP_LIMIT + 0.1
    assert agent.os.signals.count(("killpg", 5000, signal.SIGKILL)) > 100
