"""The hosts' agents start a window at a time (launcher/start/greeting.start_agents): each
host's patience counts from its own start, so hundreds of hosts on a busy machine are slow, not
failed. Through the Transport seam: a transport that records what it was asked to start."""

from __future__ import annotations

from collections.abc import Mapping

from mpilaunch.cli.parse import parse_args
from mpilaunch.launcher.start.greeting import WINDOW, start_agents
from mpilaunch.launcher.start.launch import TREE_WIDTH, tree_width, window
from mpilaunch.launcher.start.window import StartWindow
from mpilaunch.transport.base import HostResult, Transport, TransportError


class Recording(Transport):
    """Starts nothing: every host it is given fails at once (nothing to greet); the calls are kept."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def start(self, hosts: Mapping[int, object]) -> dict[int, HostResult]:  # type: ignore[override]
        self.calls.append(sorted(hosts))
        results = {}
        for index in hosts:
            results[index] = HostResult(index)
            results[index].error = TransportError("connect", "refused")
        return results

    def retry(self, error: TransportError) -> bool:
        return False


def test_hosts_start_a_window_at_a_time_in_host_order() -> None:
    transport = Recording()
    results = start_agents(transport, {i: f"node{i}" for i in range(7)}, lambda index: None, window=3)
    assert transport.calls == [[0, 1, 2], [3, 4, 5], [6]]
    assert sorted(results) == list(range(7)) and all(r.error is not None for r in results.values())


def test_without_a_window_every_host_starts_at_once() -> None:
    transport = Recording()
    start_agents(transport, {i: f"node{i}" for i in range(5)}, lambda index: None)
    assert transport.calls == [[0, 1, 2, 3, 4]]


def test_the_window_is_open_mpis_plm_rsh_num_concurrent_or_ours_else_32() -> None:
    hosts = ["-H", ",".join(f"node{i}" for i in range(100)), "true"]
    flat = ["--ssh-tree-width", "0"]  # above 32 hosts the tree is the default, and its relays bound their own
    assert window(parse_args([*flat, *hosts]).options, 100) == WINDOW == 32
    assert window(parse_args([*flat, "--ssh-concurrent", "8", *hosts]).options, 100) == 8
    assert window(parse_args([*flat, "-mca", "plm_rsh_num_concurrent", "4", *hosts]).options, 100) == 4
    assert window(parse_args(["--ssh-tree-width", "16", *hosts]).options, 100) is None
    assert window(parse_args(["--launcher", "slurm", *flat, *hosts]).options, 100) is None  # one srun starts them all


def test_the_next_host_opens_as_soon_as_one_in_flight_answers() -> None:
    """Not a batch: a slow host holds only its own place in the window."""
    win = StartWindow(range(6), 3, retries=3)
    assert win.take(0.0) == [0, 1, 2] and win.take(0.0) == []
    win.greeted(1)
    assert win.take(1.0) == [3]
    win.failed(2, retryable=False, now=1.0, wait=0.0)
    assert win.take(1.0) == [4]
    assert win.in_flight == {0, 3, 4} and not win.finished


def test_a_dropped_connection_is_opened_again_first_after_its_wait_then_given_up() -> None:
    win = StartWindow(range(4), 2, retries=2)
    assert win.take(0.0) == [0, 1]
    assert win.failed(0, retryable=True, now=0.0, wait=0.5)
    assert win.take(0.1) == [] and win.next_wake(0.1) == 0.4  # it goes first, after its wait
    assert win.take(0.5) == [0] and win.tries[0] == 2
    assert win.failed(0, retryable=True, now=0.5, wait=0.5)
    assert win.take(1.0) == [0] and win.tries[0] == 3
    assert not win.failed(0, retryable=True, now=1.0, wait=0.5)  # 1 + retries starts: its error stands
    assert win.take(1.0) == [2]


def test_every_host_at_once_without_a_window_and_done_when_all_answered() -> None:
    win = StartWindow([4, 7, 9], None, retries=3)
    assert win.take(0.0) == [4, 7, 9]
    for index in (4, 7):
        win.greeted(index)
    assert not win.finished and win.next_wake(0.0) is None
    win.failed(9, retryable=False, now=0.0, wait=0.0)
    assert win.finished
    assert StartWindow([], None, retries=3).finished


def test_tree_spawn_by_default_above_32_hosts_unless_turned_off_an_explicit_width_wins() -> None:
    def width(hosts: int, *words: str) -> int:
        names = ",".join(f"node{i}" for i in range(hosts))
        return tree_width(parse_args([*words, "-H", names, "true"]).options, hosts)

    assert TREE_WIDTH == 32 and width(32) == 0 and width(33) == 32 and width(256) == 32
    assert width(256, "--ssh-tree-width", "0") == 0
    assert width(256, "--ssh-tree-width", "16") == 16 and width(16, "--ssh-tree-width", "16") == 0
    assert window(parse_args(["-H", ",".join(f"n{i}" for i in range(33)), "true"]).options, 33) is None


def test_a_start_that_waits_for_its_connections_is_refilled_a_few_at_a_time() -> None:
    """paramiko's start connects in threads and returns when they are done: one host at a time
    would make the refills a queue of whole connections."""
    win = StartWindow(range(20), 8, retries=3)
    assert win.take(0.0, least=2) == list(range(8))
    win.greeted(0)
    assert win.take(0.0, least=2) == []  # one place free: wait for a second
    win.greeted(1)
    assert win.take(0.0, least=2) == [8, 9]
    tail = StartWindow(range(3), 2, retries=3)
    assert tail.take(0.0, least=2) == [0, 1]
    tail.greeted(0)
    assert tail.take(0.0, least=2) == [2]  # the last host does not wait for a second place


def test_the_tree_is_open_mpis_default_above_32_hosts_and_plm_rsh_no_tree_spawn_turns_it_off(monkeypatch) -> None:
    """Open MPI tree-spawns unless plm_rsh_no_tree_spawn says not to; its users' word for a
    cluster whose hosts cannot reach one another over SSH reaches us too."""
    hosts = ["-H", ",".join(f"node{i}" for i in range(100)), "true"]
    assert tree_width(parse_args(hosts).options, 100) == 32
    assert tree_width(parse_args(hosts).options, 32) == 0
    assert tree_width(parse_args(["-mca", "plm_rsh_no_tree_spawn", "1", *hosts]).options, 100) == 0
    assert tree_width(parse_args(["-mca", "plm_rsh_no_tree_spawn", "0", *hosts]).options, 100) == 32
    assert (
        tree_width(parse_args(["--ssh-tree-width", "8", "-mca", "plm_rsh_no_tree_spawn", "1", *hosts]).options, 100)
        == 8
    )
    monkeypatch.setenv("OMPI_MCA_plm_rsh_no_tree_spawn", "true")
    assert tree_width(parse_args(hosts).options, 100) == 0
