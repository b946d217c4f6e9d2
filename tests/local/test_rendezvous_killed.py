"""torchrun's launchers per node meeting (launcher/meeting/rendezvous.py) where one launcher is
killed: that one in a child process killed by its pid, the others' NodeRendezvous in threads of
this process, over real loopback sockets (the rest of the meeting: tests/unit/test_rendezvous.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mpilaunch.errors import LaunchError
from mpilaunch.host import tcpstore
from tests.unit.test_rendezvous import HANG, HOST, Background, Loop, free_port, node

NODE = textwrap.dedent(
    """\
    import selectors, sys, time
    from mpilaunch.launcher.meeting.rendezvous import NodeRendezvous
    from mpilaunch.plan.spec import TorchRun

    rank, nodes, port, timeout = map(int, sys.argv[1:5])
    torch = TorchRun(nproc_per_node=1, nnodes=nodes, node_rank=rank, endpoint=("127.0.0.1", port))
    here = NodeRendezvous(torch, 0, timeout)
    here.join()
    sel = selectors.DefaultSelector()
    here.watch_from(sel, lambda why: None)
    while True:
        for key, _ in sel.select(1.0):
            key.data(key.fd)
    """
)


def start_node(rank: int, nodes: int, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", NODE, str(rank), str(nodes), str(port), str(int(HANG))],
        stdin=subprocess.DEVNULL,
    )


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(HANG)


def test_node_ones_launcher_killed_while_running_is_told_to_node_zero() -> None:
    port = free_port()
    zero = node(0, 2, port)
    child = start_node(1, 2, port)
    try:
        zero.join()
        loop = Loop()
        zero.watch_from(loop.sel, loop.lost)
        loop.turn_until(lambda: zero.server is not None and len(zero.server.peers) == 2)  # its watcher too
        os.kill(child.pid, signal.SIGKILL)
        loop.turn_until(lambda: bool(loop.heard))
        assert loop.heard == ["node 1's launcher went away"]
    finally:
        kill(child)
        zero.close()


def test_a_node_killed_before_the_others_joined_has_not_joined() -> None:
    """Node 1 joins, then its launcher is killed while node 2's is still on its way: the others
    wait for node 1 again, naming it, rather than start ranks that would never meet its; a
    node 1 started again joins them."""
    port = free_port()
    zero = node(0, 3, port)
    waiting = Background(zero.join)
    child = start_node(1, 3, port)
    try:
        with tcpstore.StoreClient(HOST, port, HANG) as look:
            look.wait(["mpilaunch/0/joined/1"])
            kill(child)
            deadline = time.monotonic() + HANG
            while look.check(["mpilaunch/0/joined/1"]) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not look.check(["mpilaunch/0/joined/1"]), "node 1's launcher is gone, its key stayed"
        with pytest.raises(LaunchError) as caught:
            node(2, 3, port, timeout=0.5).join()
        assert str(caught.value) == f"node 2: nodes 1 of 3 did not join at {HOST}:{port} within 0.5 s"
        assert not waiting.done()
        again, two = node(1, 3, port), node(2, 3, port)
        joining = [Background(again.join), Background(two.join)]
        waiting.value()  # node 0 met them
        loop = Loop()
        zero.watch_from(loop.sel, loop.lost)
        loop.turn_until(lambda: all(j.done() for j in joining))
        for j in joining:
            j.value()
        for side in (again, two):
            side.close()
        loop.sel.close()
    finally:
        kill(child)
        zero.close()


def test_the_store_killed_while_the_nodes_meet_ends_a_joined_launchers_meeting_at_once() -> None:
    """Node 0 serves, node 1 joined, node 2 is still on its way: node 0's launcher is killed.
    Node 1 says so at once, with torchrun's status, rather than wait for a store to come back."""
    port = free_port()
    child = start_node(0, 3, port)
    one = node(1, 3, port, timeout=10.0)
    try:
        joining = Background(one.join)
        with tcpstore.StoreClient(HOST, port, HANG) as look:
            look.wait(["mpilaunch/0/joined/1"])
        kill(child)
        with pytest.raises(LaunchError) as caught:
            joining.value()
        assert str(caught.value).startswith(f"the rendezvous store at {HOST}:{port} went away while the nodes met (")
        assert caught.value.status == 1
    finally:
        kill(child)
        one.close()
