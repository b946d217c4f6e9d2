"""torchrun's launchers per node meeting (launcher/meeting/rendezvous.py), over real loopback sockets
to mpilaunch's own TCPStore server (host/tcpstore.py): each node's NodeRendezvous in a thread of
this process (where a launcher is killed, in a child process: tests/local/test_rendezvous_killed.py).

Each node's controller loop is stood in for by `Loop`: a selector turned as the controller's
is, each ready key's callback called with its descriptor."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mpilaunch.errors import LaunchError
from mpilaunch.host import tcpstore
from mpilaunch.launcher.meeting import late_nodes
from mpilaunch.launcher.meeting.rendezvous import NodeRendezvous
from mpilaunch.plan.spec import TorchRun

HANG = 30.0  # a guard against a hang, never a measure
HOST = "127.0.0.1"


def free_port() -> int:
    sock = tcpstore.listening_socket("", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def node(rank: int, nodes: int, port: int, timeout: float = HANG, attempt: int = 0) -> NodeRendezvous:
    torch = TorchRun(nproc_per_node=1, nnodes=nodes, node_rank=rank, endpoint=(HOST, port))
    return NodeRendezvous(torch, attempt, timeout)


def numbered(
    nodes: int,
    port: int,
    fewest: int = 0,
    last_call: float = 30.0,
    timeout: float = HANG,
    attempt: int | None = 0,
    said: list[str] | None = None,
) -> NodeRendezvous:
    """A launcher under c10d without --node-rank: the meeting numbers it (attempt None: its first
    meeting, the store's round); what it says goes to `said`."""
    torch = TorchRun(nproc_per_node=1, nnodes=nodes, endpoint=(HOST, port), min_nodes=fewest, last_call=last_call)
    return NodeRendezvous(torch, attempt, timeout, said.append if said is not None else None)


def meet_numbered(sides: list[NodeRendezvous]) -> tuple[NodeRendezvous, Loop]:
    """Every launcher joins; the one that serves the store then serves it from its loop, as its
    controller's does (the others read the nodes' order from it)."""
    joining = [Background(side.join) for side in sides]
    loop = Loop()
    loop.turn_until(lambda: any(j.done() and side.server is not None for j, side in zip(joining, sides)))
    server = next(side for side in sides if side.server is not None)
    server.watch_from(loop.sel, loop.lost)
    loop.turn_until(lambda: all(j.done() for j in joining))
    for j in joining:
        j.value()
    return server, loop


class Background:
    """A call in a thread: its result or its exception, once it returned."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self.result = call()
        except BaseException as exc:  # handed to the test
            self.error = exc

    def done(self) -> bool:
        return not self.thread.is_alive()

    def value(self) -> object:
        self.thread.join(HANG)
        assert self.done(), "the call never returned"
        if self.error is not None:
            raise self.error
        return self.result


class Loop:
    """A node's controller loop: the selector that watch_from registers with, and what `lost` heard."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.heard: list[str] = []
        self.regrouped: list[str] = []  # the lines that restart the ranks for a late node

    def lost(self, why: str) -> None:
        self.heard.append(why)

    def regroup(self, line: str) -> None:
        self.regrouped.append(line)

    def turn_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + HANG
        while not done() and time.monotonic() < deadline:
            for key, _ in self.sel.select(0.02):
                key.data(key.fd)
        assert done(), "the loop never got there"

    def quiet(self) -> bool:
        """Nothing registered is ready: the loop would sleep, not spin."""
        return not self.sel.select(0)


def meet(zero: NodeRendezvous, others: list[NodeRendezvous], loop: Loop) -> None:
    """Every node joins; node 0's loop then serves the store, as its controller's does from the
    start of the ranks: a node whose last word came after node 0 saw all keys is answered then."""
    joining = [Background(other.join) for other in others]
    zero.join()
    zero.watch_from(loop.sel, loop.lost)
    loop.turn_until(lambda: all(j.done() for j in joining))
    for j in joining:
        j.value()


@pytest.fixture
def meeting() -> Iterator[tuple[NodeRendezvous, NodeRendezvous, Loop, Loop]]:
    """Two nodes that met and watch each other, each with its loop."""
    port = free_port()
    zero, one = node(0, 2, port), node(1, 2, port)
    loops = Loop(), Loop()
    meet(zero, [one], loops[0])
    watching = Background(lambda: one.watch_from(loops[1].sel, loops[1].lost))  # connects to node 0's store
    loops[0].turn_until(watching.done)
    watching.value()
    yield zero, one, *loops
    for side in (zero, one):
        side.close()
    for loop in loops:
        loop.sel.close()


def test_two_nodes_join_and_finish_well(meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop]) -> None:
    zero, one, loop0, loop1 = meeting
    assert zero.server is not None
    hostname = os.uname().nodename.encode()
    assert zero.server.get("mpilaunch/0/joined/0") == zero.server.get("mpilaunch/0/joined/1") == hostname
    assert zero.server.get("mpilaunch/0/running") == b"1"
    finishing = Background(lambda: zero.finish(0))  # node 0 keeps the store up until node 1 said so
    assert one.finish(0) is False
    assert finishing.value() is False
    assert loop0.heard == loop1.heard == []
    assert zero.server is None and one.client is None and one.watcher is None  # all closed


def test_each_attempt_meets_under_its_own_keys() -> None:
    port = free_port()
    zero, one = node(0, 2, port, attempt=3), node(1, 2, port, attempt=3)
    loop = Loop()
    try:
        meet(zero, [one], loop)
        assert zero.server is not None
        assert sorted(zero.server.keys()) == [
            "mpilaunch/3/joined/0",
            "mpilaunch/3/joined/1",
            "mpilaunch/3/running",
            "mpilaunch/3/serves",
        ]
    finally:
        zero.close()
        one.close()
        loop.sel.close()


def test_node_zero_alone_names_the_node_that_did_not_join() -> None:
    port = free_port()
    alone = node(0, 2, port, timeout=0.3)
    with pytest.raises(LaunchError) as caught:
        alone.join()
    assert str(caught.value) == f"node 0: nodes 1 of 2 did not join at {HOST}:{port} within 0.3 s"
    assert alone.server is None  # closed: the port is free again
    tcpstore.listening_socket("", port).close()


def test_a_node_that_waits_names_the_missing_ones() -> None:
    port = free_port()
    zero, one = node(0, 4, port, timeout=1.5), node(1, 4, port, timeout=0.5)
    waiting = Background(zero.join)
    with pytest.raises(LaunchError) as caught:
        one.join()
    assert str(caught.value) == f"node 1: nodes 2, 3 of 4 did not join at {HOST}:{port} within 0.5 s"
    with pytest.raises(LaunchError) as caught:
        waiting.value()
    assert str(caught.value).startswith("node 0: nodes ") and "3 of 4 did not join" in str(caught.value)


def test_no_node_zero_at_all_is_said() -> None:
    port = free_port()
    with pytest.raises(LaunchError) as caught:
        node(1, 2, port, timeout=0.3).join()
    assert (
        str(caught.value) == f"cannot connect to the rendezvous store at {HOST}:{port} within 0.3 s: connection refused"
    )
    assert caught.value.status == 1  # torchrun's, for a rendezvous that failed


def test_the_port_in_use_is_one_line() -> None:
    taken = tcpstore.listening_socket("", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError) as caught:
            node(0, 2, port).join()
        assert str(caught.value) == f"node 0 cannot serve the rendezvous on port {port}: Address already in use"
    finally:
        taken.close()


def test_node_one_failing_stops_node_zero(meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop]) -> None:
    zero, one, loop0, loop1 = meeting
    failing = Background(lambda: one.finish(3))  # then waits to hear whether node 0's was the last
    loop0.turn_until(lambda: bool(loop0.heard))  # node 0's loop serves the store meanwhile
    assert loop0.heard == ["node 1's job ended with status 3"]
    assert zero.finish(143) is False  # its ranks stopped; no node said it is the last
    assert failing.value() is False  # both may start another attempt
    assert loop0.heard == ["node 1's job ended with status 3"] and loop1.heard == []


def test_node_one_failing_hears_that_node_zeros_end_is_the_last(
    meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop],
) -> None:
    """Node 1 fails; node 0 then stops on a user's signal (or its time limit): node 1 must not
    start an attempt that node 0 will never join."""
    zero, one, loop0, _loop1 = meeting
    failing = Background(lambda: one.finish(1))
    loop0.turn_until(lambda: bool(loop0.heard))
    guard = time.monotonic() + 1.0  # time for node 1 to decide alone, were it to
    loop0.turn_until(lambda: failing.done() or time.monotonic() > guard)
    assert zero.finish(130, last=True) is True
    assert failing.value() is True


def test_node_zero_keeps_its_store_until_node_one_hung_up(
    meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop],
) -> None:
    """Node 1's done reaches node 0 before its question (was any node the last?): node 0 must
    still be there to answer it."""
    zero, one, _loop0, _loop1 = meeting
    assert one.client is not None
    finishing = Background(lambda: zero.finish(0))
    one.client.set("mpilaunch/0/done/1", "0")
    finishing.thread.join(1.0)  # time for node 0 to go away, were it to
    assert one.client.check(["mpilaunch/0/final"]) is False
    one.close()
    assert finishing.value() is False


def test_node_zero_failing_stops_node_one(meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop]) -> None:
    zero, one, loop0, loop1 = meeting
    failing = Background(lambda: zero.finish(2))  # serves until node 1 is done too
    loop1.turn_until(lambda: bool(loop1.heard))
    assert loop1.heard == ["node 0's job ended with status 2"]
    assert loop1.quiet()  # the watcher said it, once
    assert one.finish(143) is False
    assert failing.value() is False
    assert loop0.heard == []


def test_node_zero_going_away_is_told_to_node_one(
    meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop],
) -> None:
    zero, one, _loop0, loop1 = meeting
    zero.close()  # its launcher gone: the store with it
    loop1.turn_until(lambda: bool(loop1.heard))
    assert len(loop1.heard) == 1  # how the connection ended (closed, reset) is the kernel's to say
    assert loop1.heard[0].startswith(f"the rendezvous store at {HOST}:{zero.port} went away with node 0's launcher (")
    assert loop1.quiet()  # told once: the closed connection is not looked at again (the loop would spin)
    assert one.finish(143) is True  # nobody to meet again: no other attempt


def test_the_store_gone_before_a_node_whose_ranks_ended_well_heard_the_end_fails_its_job(
    meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop],
) -> None:
    zero, one, _loop0, _loop1 = meeting
    zero.close()
    assert one.finish(0) is True
    assert one.elsewhere.startswith(f"the rendezvous store at {HOST}:{zero.port} went away before every node's job")


def test_node_ones_client_closing_without_done_is_its_launcher_gone(
    meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop],
) -> None:
    _zero, one, loop0, _loop1 = meeting
    assert one.client is not None
    one.client.close()  # the connection that said node 1 joined
    loop0.turn_until(lambda: bool(loop0.heard))
    assert loop0.heard == ["node 1's launcher went away"]


def test_last_on_one_node_is_last_on_every_node(meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop]) -> None:
    """A user's signal or the time limit on one node: no node starts another attempt."""
    zero, one, _loop0, loop1 = meeting
    finishing = Background(lambda: zero.finish(130, last=True))
    loop1.turn_until(lambda: bool(loop1.heard))
    assert one.finish(143) is True
    assert finishing.value() is True


def test_last_from_node_one_reaches_node_zero(meeting: tuple[NodeRendezvous, NodeRendezvous, Loop, Loop]) -> None:
    zero, one, loop0, _loop1 = meeting
    finishing = Background(lambda: one.finish(130, last=True))
    loop0.turn_until(lambda: bool(loop0.heard))
    assert zero.finish(143) is True
    assert finishing.value() is True


def test_c10d_without_node_ranks_numbers_the_nodes_and_one_serves_the_store() -> None:
    """The first to bind the endpoint's port serves; every launcher learns its node rank (torch's
    order: host, then pid, here the arrival) and which node serves; then they run as numbered."""
    port = free_port()
    sides = [numbered(3, port) for _ in range(3)]
    server, loop = meet_numbered(sides)
    servers = [side for side in sides if side.server is not None]
    assert servers == [server]
    assert sorted(side.node for side in sides) == [0, 1, 2]  # type: ignore[type-var]
    assert {side.host_rank for side in sides} == {server.node}
    assert all(side.nodes == 3 and side.slots == sides[0].slots for side in sides)
    others = [side for side in sides if side.server is None]
    failing = Background(lambda: others[0].finish(3))
    loop.turn_until(lambda: bool(loop.heard))
    assert loop.heard == [f"node {others[0].node}'s job ended with status 3"]
    ending = [failing, Background(lambda: others[1].finish(143))]
    assert servers[0].finish(143) is False
    assert [e.value() for e in ending] == [False, False]
    loop.sel.close()


def test_min_max_closes_with_max_at_once_and_with_min_after_the_last_call() -> None:
    port = free_port()
    sides = [numbered(2, port, fewest=1, last_call=HANG) for _ in range(2)]
    started = time.monotonic()
    _server, loop = meet_numbered(sides)
    assert time.monotonic() - started < HANG / 2 and sorted(side.node for side in sides) == [0, 1]  # type: ignore[type-var]
    for side in sides:
        side.close()
    loop.sel.close()
    alone = numbered(2, port, fewest=1, last_call=0.3)
    started = time.monotonic()
    alone.join()
    assert time.monotonic() - started >= 0.3
    assert (alone.node, alone.nodes, alone.host_rank) == (0, 1, 0)
    alone.close()


def test_fewer_than_min_nodes_is_said_by_every_launcher() -> None:
    port = free_port()  # 2 s: both must have joined by then on a busy machine
    sides = [numbered(4, port, fewest=3, timeout=2.0) for _ in range(2)]
    joining = [Background(side.join) for side in sides]
    said = []
    for j in joining:
        with pytest.raises(LaunchError) as caught:
            j.value()
        said.append(str(caught.value))
    assert f"2 of at least 3 nodes joined at {HOST}:{port} within 2 s" in said
    # the other: its own 2 s, or the store's end, if the store's launcher gave up first (a busy machine)
    other = (
        f"the nodes' meeting at {HOST}:{port} did not close within 2 s",
        f"the rendezvous store at {HOST}:{port} went away while the nodes met",
    )
    assert any(s.startswith(other) for s in said), said


def test_a_launcher_of_the_next_attempt_waits_for_the_store_of_the_one_before_to_go() -> None:
    """Attempt 0's store stays up until every node hung up: node 1, already at attempt 1, must
    not join there (the store would go under it), but meet at attempt 1's once that is up."""
    port = free_port()
    before = tcpstore.StoreServer(host=HOST, port=port)
    before.set("mpilaunch/0/serves", "1")
    one = node(1, 2, port, attempt=1)
    joining = Background(one.join)
    deadline = time.monotonic() + HANG
    looked = lambda: before.connections >= 2 and not before.peers  # noqa: E731  # it looked, left, came again
    before.run(
        lambda: looked() or any(k.startswith("mpilaunch/1/") for k in before.keys()) or time.monotonic() > deadline
    )
    assert not any(key.startswith("mpilaunch/1/") for key in before.keys()) and looked()
    before.close()
    zero = node(0, 2, port, attempt=1)
    loop = Loop()
    try:
        meet(zero, [], loop)
        loop.turn_until(joining.done)
        joining.value()
        assert zero.server is not None and zero.server.get("mpilaunch/1/joined/1") is not None
    finally:
        zero.close()
        one.close()
        loop.sel.close()


def test_a_store_that_refuses_is_waited_for_said_once_and_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpilaunch.launcher.meeting import store_reach

    monkeypatch.setattr(store_reach, "NOTICE_AFTER", 0.2)
    port = free_port()
    said: list[str] = []
    with pytest.raises(LaunchError) as caught:
        store_reach.reach(HOST, port, 0, time.monotonic() + 1.0, said.append, timeout=1.0)
    assert said == [
        f"waiting for the rendezvous store at {HOST}:{port} (connection refused): its launcher may start later; "
        "1 s at most"
    ]
    assert (
        str(caught.value) == f"cannot connect to the rendezvous store at {HOST}:{port} within 1 s: connection refused"
    )
    assert caught.value.status == 1


def test_an_endpoint_that_does_not_resolve_is_said_at_once_by_every_launcher() -> None:
    for rank in (0, 1):
        torch = TorchRun(nproc_per_node=1, nnodes=2, node_rank=rank, endpoint=("nosuchhost.invalid", 29400))
        with pytest.raises(LaunchError) as caught:
            NodeRendezvous(torch, 0, 10.0).join()
        assert str(caught.value).startswith(
            "cannot reach the rendezvous store at nosuchhost.invalid:29400: no such host"
        )
        assert caught.value.status == 1


# -- a node that comes after the meeting closed (torchrun's elastic scale-up) ---------------------------
def meet_and_watch(sides: list[NodeRendezvous], joining: list[Background] | None = None) -> list[Loop]:
    """Every launcher joins (or is joining); each then watches from a loop of its own, as its
    controller's does, told of a late node's regroup too (the store's launcher serves the store
    from its loop)."""
    joining = joining or [Background(side.join) for side in sides]
    loops = [Loop() for _ in sides]
    loops[0].turn_until(lambda: any(j.done() and side.server is not None for j, side in zip(joining, sides)))
    first = next(k for k, side in enumerate(sides) if side.server is not None)
    order = [first, *(k for k in range(len(sides)) if k != first)]
    for k in order:
        sides[k].watch_from(loops[k].sel, loops[k].lost, loops[k].regroup)
        loops[first].turn_until(lambda: all(j.done() for j in joining))
    for j in joining:
        j.value()
    return loops


@contextlib.contextmanager
def serving(loop: Loop) -> Iterator[None]:
    """The store's launcher's loop turned in a thread meanwhile, as in its own process: another
    node's loop asks its store what a wake-up was about."""
    stop = threading.Event()

    def turn() -> None:
        while not stop.is_set():
            for key, _ in loop.sel.select(0.02):
                key.data(key.fd)

    thread = threading.Thread(target=turn, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(HANG)


def end_all(sides: list[NodeRendezvous], loops: list[Loop]) -> None:
    for side in sides:
        side.close()
    for loop in loops:
        loop.sel.close()


def test_where_a_late_node_waits_and_when_the_nodes_meet_again() -> None:
    assert late_nodes.late_place(2, 3) == late_nodes.WAITING  # room: the nodes restart to take it in
    assert late_nodes.late_place(3, 3) == late_nodes.SPARE  # MAX: torch's redundancy list
    assert late_nodes.regroup_now(1, ended=False)
    assert not late_nodes.regroup_now(0, ended=False)
    assert not late_nodes.regroup_now(1, ended=True)  # a node's ranks failed or ended: no restart for it
    # a late node's restart is no failure: torch 2.13 does not count it, even at --max-restarts 0
    assert late_nodes.meets_again(regroup=True, failed=False, final=True)
    assert late_nodes.meets_again(regroup=False, failed=True, final=False)  # a failure's, which takes it in too
    assert not late_nodes.meets_again(regroup=True, failed=True, final=True)
    assert not late_nodes.meets_again(regroup=False, failed=False, final=False)  # the job is over
    assert late_nodes.regroup_words(["n3"], 3) == "node at n3 joined late: restarting the ranks with 3 nodes"
    assert late_nodes.regroup_words(["n3", "n4"], 4).startswith("nodes at n3, n4 joined late: restarting")


def test_a_late_node_waits_and_the_running_nodes_restart_their_ranks_to_take_it_in() -> None:
    """--nnodes 2:3, two nodes run (round 2 of the store); a third launcher comes: it meets in the
    store's round, finds the meeting closed and waits; the store's launcher sees it as its loop
    serves the store, and every node hears the regroup; the nodes end their round well and meet
    again, a round later, with it."""
    port = free_port()
    sides = [numbered(3, port, fewest=2, last_call=0.2, attempt=2) for _ in range(2)]
    loops = meet_and_watch(sides)
    first = next(k for k, side in enumerate(sides) if side.server is not None)
    said: list[str] = []
    late = numbered(3, port, fewest=2, last_call=HANG, attempt=None, said=said)  # the next meeting: MAX, at once
    waiting = Background(late.join)
    again: list[NodeRendezvous] = []  # the nodes as they meet again
    try:
        loops[first].turn_until(lambda: bool(loops[first].regrouped))
        with serving(loops[first]):
            loops[1 - first].turn_until(lambda: bool(loops[1 - first].regrouped))
        line = f"node at {socket.gethostname()} joined late: restarting the ranks with 3 nodes"
        assert [loop.regrouped for loop in loops] == [[line], [line]]
        deadline = time.monotonic() + 10  # the late node says it on its own thread, maybe after the regroup
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        assert said == [
            f"the nodes' meeting at {HOST}:{port} closed with 2 nodes before this one came: "
            "it waits to be taken in at their next restart"
        ]
        assert [loop.heard for loop in loops] == [[], []]  # no node failed
        ending = [Background(lambda side=side: side.finish(0, last=True)) for side in sides]  # --max-restarts 0
        assert [e.value() for e in ending] == [True, True]
        assert [side.regroup for side in sides] == [True, True]  # they meet again all the same: not counted
        again += [numbered(3, port, fewest=2, last_call=HANG, attempt=3) for _ in range(2)]
        loops += meet_and_watch([*again, late], [*(Background(side.join) for side in again), waiting])
        assert late.attempt == 3 and [late.nodes, *(side.nodes for side in again)] == [3, 3, 3]
        assert sorted([late.node, *(side.node for side in again)]) == [0, 1, 2]  # type: ignore[type-var]
    finally:
        end_all([*sides, late, *again], loops)


def test_a_node_beyond_max_waits_as_a_spare_and_ends_with_the_job_in_one_line() -> None:
    """--nnodes 1:2 and two nodes run: a third is a spare (torch's redundancy list), which nothing
    restarts for; it ends with torchrun's status 1 when the job ends."""
    port = free_port()
    sides = [numbered(2, port, fewest=1, last_call=HANG) for _ in range(2)]
    loops = meet_and_watch(sides)
    first = next(k for k, side in enumerate(sides) if side.server is not None)
    said: list[str] = []
    spare = Background(numbered(2, port, fewest=1, attempt=None, said=said).join)
    try:
        loops[first].turn_until(lambda: bool(said))  # the store served all the spare wrote before it said so
        assert said == [
            f"the nodes' meeting at {HOST}:{port} closed with 2 of at most 2 nodes before this one came: "
            "it waits as a spare, taken in only if a later meeting has room"
        ]
        assert [loop.regrouped for loop in loops] == [[], []]
        ending = [Background(lambda side=side: side.finish(0)) for side in sides]
        assert [e.value() for e in ending] == [False, False]
        assert [side.regroup for side in sides] == [False, False]
        with pytest.raises(LaunchError) as caught:
            spare.value()
        assert str(caught.value) == f"the job at {HOST}:{port} ended before this node was taken in"
        assert caught.value.status == 1
    finally:
        end_all(sides, loops)


def test_a_late_node_is_taken_in_by_the_restart_after_a_failure_which_counts() -> None:
    """A node's ranks failed: no restart for the late node (torchrun's agents look for waiting
    nodes only while their workers are healthy), but the failure's restart takes it in."""
    port = free_port()
    sides = [numbered(3, port, fewest=2, last_call=0.2) for _ in range(2)]
    loops = meet_and_watch(sides)
    first = next(k for k, side in enumerate(sides) if side.server is not None)
    other = 1 - first
    failing = Background(lambda: sides[other].finish(1))
    loops[first].turn_until(lambda: bool(loops[first].heard))
    said: list[str] = []
    late = numbered(3, port, fewest=2, last_call=HANG, attempt=None, said=said)
    waiting = Background(late.join)
    again: list[NodeRendezvous] = []  # the nodes as they meet again
    try:
        loops[first].turn_until(lambda: bool(said))
        assert [loop.regrouped for loop in loops] == [[], []]
        assert sides[first].finish(143) is False and failing.value() is False  # another attempt, counted
        assert [side.regroup for side in sides] == [False, False]
        again += [numbered(3, port, fewest=2, last_call=HANG, attempt=1) for _ in range(2)]
        loops += meet_and_watch([*again, late], [*(Background(side.join) for side in again), waiting])
        assert [late.nodes, *(side.nodes for side in again)] == [3, 3, 3]
    finally:
        end_all([*sides, late, *again], loops)
