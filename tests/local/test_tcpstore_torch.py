"""Real torch 2.13 against mpilaunch's TCPStore server (mpilaunch/host/tcpstore.py).

torch.distributed.TCPStore clients of both flavours (use_libuv=True, the default, and False)
get from it the answers torch's own server gives them, request for request; a wait is held
until another client's set and ends at its timeout with the connection still usable; a rank
killed while waiting is forgotten and its owner told; and 4 gloo ranks started as torchrun
starts them (TORCHELASTIC_USE_AGENT_STORE=True, only clients) form their process groups on it,
then 4 more on the same server after its owner cleared the first job's keys, as a restarted job;
and ranks whose torch says it is a release the store does not serve meet in rank 0's own store.
torch's clients hold the GIL in some calls (list_keys), so a server they talk to from this
process runs in another one (`python -m mpilaunch.host.tcpstore`); the in-process server is
driven by this thread while its clients are other processes.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mpilaunch.host.tcpstore import Peer, StoreServer
from tests.conftest import ROOT, Launcher

HANG = 120.0  # a guard against a hang, never a measure
FLAVOURS = pytest.mark.parametrize("libuv", [True, False], ids=["use_libuv", "legacy"])


def environment(launcher: Launcher, **extra: str) -> dict[str, str]:
    """The test's tagged environment (no process of it may outlive the test) on this tree."""
    return {**launcher.env, "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture
def python_store(launcher: Launcher) -> Iterator[int]:
    """The port of `python -m mpilaunch.host.tcpstore` on loopback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpilaunch.host.tcpstore", "--host", "127.0.0.1"],
        env=environment(launcher),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield int(proc.stdout.readline())  # type: ignore[union-attr]
        assert proc.poll() is None, "the server died during the test"
    finally:
        proc.terminate()
        proc.wait(HANG)
        proc.stdout.close()  # type: ignore[union-attr]


def tcp_store(*args: object, **named: object) -> Any:
    """torch.distributed.TCPStore, imported when a test first needs it (torch takes seconds)."""
    import torch.distributed

    return torch.distributed.TCPStore(*args, **named)


def client(port: int, libuv: bool, seconds: float = HANG) -> Any:
    return tcp_store("127.0.0.1", port, is_master=False, use_libuv=libuv, timeout=datetime.timedelta(seconds=seconds))


def outcome(call: Callable[[], object]) -> object:
    """What a call returned, or the name of what it raised."""
    try:
        return call()
    except Exception as exc:  # the exception's type is the result compared
        return type(exc).__name__


def scenario(store: Any) -> list:
    """Every request a torch client can make, and what it got back."""
    seen: list = []
    store.set("a", "1")
    seen.append(store.get("a"))
    seen += [store.add("n", 5), store.add("n", -7), store.get("n")]
    seen += [store.check(["a", "n"]), store.check(["a", "nothing"])]
    seen += [store.compare_set("a", "1", "2"), store.compare_set("a", "1", "3")]
    seen += [store.compare_set("new", "", "v"), store.compare_set("gone", "x", "y")]
    seen += [store.num_keys(), store.delete_key("new"), store.delete_key("new"), store.num_keys()]
    store.append("ap", "x")
    store.append("ap", "y")
    seen.append(store.get("ap"))
    store.multi_set(["m1", "m2"], ["v1", "v2"])
    seen.append(store.multi_get(["m1", "m2", "a"]))
    seen.append(outcome(lambda: store.wait(["never"], datetime.timedelta(seconds=0.3))))
    store.set("after", "the timeout")  # the connection is still in step after a cancelled wait
    seen.append(store.get("after"))
    seen.append(outcome(lambda: store.queue_push("q", "one")))  # NotImplementedError in the legacy flavour
    seen.append(outcome(lambda: store.queue_push("q", "two")))
    seen.append(outcome(lambda: store.queue_len("q")))
    seen.append(outcome(lambda: store.check(["q"])))
    seen.append(outcome(lambda: store.queue_pop("q")))
    seen.append(outcome(lambda: store.queue_pop("q", block=False)))
    seen.append(outcome(lambda: store.queue_pop("q", block=False)))
    seen.append(outcome(lambda: store.barrier("gate", 1)))
    seen.append(store.get("gate"))
    seen.append(sorted(store.list_keys()))
    seen.append(store.num_keys())
    return seen


@FLAVOURS
def test_torch_clients_get_the_answers_torchs_own_server_gives(python_store: int, libuv: bool) -> None:
    torchs = tcp_store("127.0.0.1", 0, is_master=True, use_libuv=libuv, wait_for_workers=False)
    expected = scenario(client(torchs.port, libuv))
    ours = scenario(client(python_store, libuv))
    assert ours == expected
    assert ours[:4] == [b"1", 5, -2, b"-2"] and "DistStoreError" in ours  # the scenario did run


@FLAVOURS
def test_waits_are_held_until_another_client_sets_their_keys(python_store: int, libuv: bool) -> None:
    waiters = [client(python_store, libuv) for _ in range(3)]
    results: dict[int, object] = {}

    def wait(index: int) -> None:
        if index == 0:
            results[index] = waiters[0].get("late")  # get waits for its key too
        else:
            results[index] = outcome(lambda: waiters[index].wait(["late"], datetime.timedelta(seconds=HANG)))

    threads = [threading.Thread(target=wait, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # let the waits reach the server
    assert all(thread.is_alive() for thread in threads), results  # nothing released them yet
    client(python_store, libuv).set("late", "here")
    for thread in threads:
        thread.join(HANG)
    assert results == {0: b"here", 1: None, 2: None}


def serve_until(server: StoreServer, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HANG
    server.run(until=lambda: done() or time.monotonic() > deadline, poll=0.05)
    assert done(), "the server loop never got there"


WAITS_FOREVER = """
import datetime, sys, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=600))
store.set("mine", "here")
store.wait(["never"])
"""


def test_a_rank_killed_while_waiting_is_forgotten_and_its_owner_told(launcher: Launcher) -> None:
    closed: list[Peer] = []
    server = StoreServer(host="127.0.0.1", on_close=closed.append)
    try:
        proc = subprocess.Popen([sys.executable, "-c", WAITS_FOREVER, str(server.port)], env=environment(launcher))
        serve_until(server, lambda: "/never" in server.data.waiting)
        proc.kill()
        proc.wait()
        serve_until(server, lambda: bool(closed))
        assert closed[0].wrote == {"/mine"}
        assert server.data.waiting == {} and server.peers == {}
        assert server.get("/mine") == b"here"  # what it set stays
    finally:
        server.close()


GLOO_RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
evens = dist.new_group([0, 2])
part = torch.tensor([float(rank + 1)])
if rank % 2 == 0:
    dist.all_reduce(part, group=evens)
dist.barrier()
print(rank, int(total.item()), int(part.item()), os.environ["TORCHELASTIC_USE_AGENT_STORE"], flush=True)
dist.destroy_process_group()
"""


def gloo_job(server: StoreServer, launcher: Launcher) -> list[str]:
    """4 ranks as torchrun starts them, served by this thread until they all exit."""
    ranks = []
    for rank in range(4):
        env = environment(
            launcher,
            TORCHELASTIC_USE_AGENT_STORE="True",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="4",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(server.port),
            GLOO_SOCKET_IFNAME="lo",
        )
        ranks.append(subprocess.Popen([sys.executable, "-c", GLOO_RANK], env=env, stdout=subprocess.PIPE, text=True))
    try:
        serve_until(server, lambda: all(proc.poll() is not None for proc in ranks))
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = []
    for proc in ranks:
        lines.append(proc.stdout.read().strip())  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]
        assert proc.returncode == 0, lines
    return lines


def test_four_gloo_ranks_meet_on_it_twice_as_a_restarted_job(launcher: Launcher) -> None:
    closed: list[Peer] = []
    server = StoreServer(host="127.0.0.1", on_close=closed.append)
    expected = ["0 10 4 True", "1 10 2 True", "2 10 4 True", "3 10 4 True"]
    try:
        for attempt in range(2):
            assert gloo_job(server, launcher) == expected, f"attempt {attempt}"
            # every rank connected, wrote its address under the default group, and went away
            assert server.peers == {} and len(closed) == server.connections == 4 * (attempt + 1)
            addresses = {key for peer in closed[-4:] for key in peer.wrote if key.startswith("/default_pg/")}
            assert len(addresses) >= 4
            assert server.clear() > 0  # the next attempt's ranks must not find these addresses
    finally:
        server.close()


OWN_STORE_RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print(dist.get_rank(), int(total.item()), os.environ["TORCHELASTIC_USE_AGENT_STORE"], torch.__version__, flush=True)
dist.destroy_process_group()
"""


def newer_torch_venv(venv: Path) -> Path:
    """An interpreter whose torch says it is 2.99: a venv over this one whose `torch` is the
    installed 2.13 file for file (links) but for its version.py, a release after those served."""
    import torch

    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    package = venv / "lib" / minor / "site-packages" / "torch"
    package.mkdir()
    real = Path(torch.__file__).parent
    for entry in real.iterdir():
        if entry.name != "version.py":
            (package / entry.name).symlink_to(entry)
    text = (real / "version.py").read_text()
    (package / "version.py").write_text(text.replace(f"'{torch.__version__}'", "'2.99.0+cpu'"))
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def newer_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return newer_torch_venv(tmp_path_factory.mktemp("torch299"))


def test_a_torch_the_store_does_not_serve_meets_in_rank_0s_own_store(launcher: Launcher, newer_torch: Path) -> None:
    """A torch after the served range on rank 0's host: said in one line before the ranks
    start, and the ranks meet in rank 0's own TCPStore (TORCHELASTIC_USE_AGENT_STORE=False),
    as torch alone would have them; every rank runs that torch and the job ends 0."""
    script = launcher.tmp_path / "own_store.py"
    script.write_text(OWN_STORE_RANK)
    argv = [str(newer_torch), "-m", "mpilaunch", "--nproc-per-node", "3", str(script)]
    done = subprocess.run(argv, env=environment(launcher), capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line[:1].isdigit())
    assert lines == [f"{rank} 6 False 2.99.0+cpu" for rank in range(3)], done.stdout
    said = [line for line in done.stderr.splitlines() if "does not serve" in line]
    assert said == [
        "mpilaunch: the ranks' torch 2.99.0+cpu on localhost speaks a TCPStore mpilaunch does not serve "
        "(it serves torch 2.0 to 2.14): the ranks meet in rank 0's own store (TORCHELASTIC_USE_AGENT_STORE=False)"
    ], done.stderr
