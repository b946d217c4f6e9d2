"""torchrun's elastic scale-up (--nnodes MIN:MAX), under the real torchrun 2.13 and under
mpilaunch, the same scenario on the same words: two nodes' launchers run, a third comes after
their meeting closed. With room (2:3) the running nodes restart their ranks to take it in, and
the job goes on with 3 nodes, no restart counted (TORCHELASTIC_RESTART_COUNT stays 0, with
--max-restarts 0); at MAX (1:2) it waits as a spare, nothing restarts, and it ends with status 1
with the job. Each rank writes what it was given; what the ranks saw and how each launcher
ended are compared.

torch 2.13's own scale-up stalls here unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with its
shared TCPStore the late agent waits for a MASTER_ADDR key of the new round that rank 0's agent
(which built its store info in the first round) never writes, and every agent fails after 60 s.
Both launchers are run with it set, so the scenario is torchrun's as it works.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script

HANG = 120.0  # a guard against a hang, never a measure
HOST = "127.0.0.1"

RANK = """
import json, os, pathlib, sys, time
folder, want = pathlib.Path(sys.argv[1]), int(sys.argv[2])
seen = {k: os.environ[k] for k in ("WORLD_SIZE", "RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")}
seen["pid"] = str(os.getpid())
(folder / f".seen.{os.getpid()}").write_text(json.dumps(seen))
os.rename(folder / f".seen.{os.getpid()}", folder / f"seen.{os.getpid()}")  # whole when the test reads it
if int(seen["WORLD_SIZE"]) < want:  # until the late node is taken in, or the test says so
    while not (folder / "stop").exists():
        time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for(done: Callable[[], bool], what: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + HANG
    while not done():
        assert time.monotonic() < deadline, what
        assert all(p.poll() is None for p in procs), f"{what}: a launcher ended first"
        time.sleep(0.05)


class Scenario:
    """Two nodes' launchers, then a third once both nodes' ranks run, under one launcher."""

    def __init__(self, launcher: Launcher, who: str, nnodes: str, want: int) -> None:
        self.launcher, self.who = launcher, who
        self.folder = launcher.tmp_path / who
        self.folder.mkdir()
        script = write_script(launcher.tmp_path, "rank.py", RANK)
        front = [sys.executable, "-m", "torch.distributed.run"] if who == "torchrun" else launcher.argv()
        self.endpoint = f"{HOST}:{free_port()}"
        self.argv = [
            *front,
            *("--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d"),
            *("--rdzv-endpoint", self.endpoint, "--rdzv-conf", "last_call_timeout=1", "--max-restarts", "0"),
            *("--log-dir", str(launcher.tmp_path / f"{who}-logs")),
            *(script, str(self.folder), str(want)),
        ]
        self.procs: list[subprocess.Popen] = []

    def start(self, extra: dict[str, str] | None = None) -> None:
        n = len(self.procs)
        env = {**self.launcher.env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(extra or {})}
        with open(self.err(n), "wb") as err:
            self.procs.append(
                subprocess.Popen(
                    self.argv, cwd=self.launcher.tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err
                )
            )

    def err(self, n: int) -> Path:
        return self.folder.parent / f"{self.who}.{n}.log"

    def said(self, n: int) -> str:
        return self.err(n).read_text(errors="replace")

    def seen(self) -> list[dict[str, str]]:
        return [json.loads(path.read_text()) for path in sorted(self.folder.glob("seen.*"))]

    def first_round(self) -> None:
        """Both nodes' ranks run: their meeting closed."""
        self.start()
        self.start()
        wait_for(lambda: len(self.seen()) == 2, "the first two nodes' ranks never ran", self.procs)

    def ends(self) -> list[int]:
        for proc in self.procs:
            proc.wait(HANG)
        return [proc.returncode for proc in self.procs]

    def end(self) -> None:
        """Whatever a failed test left, by recorded pid: each launcher (SIGTERM first: torchrun's
        agent then stops its ranks), then each rank it may have left."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(HANG / 4)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(HANG)
        for seen in self.seen():
            try:
                os.kill(int(seen["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def outcome(scenario: Scenario) -> tuple[list[int], list[int], set[str], list[int]]:
    """World sizes the ranks saw (sorted), the node counts they saw, their restart counts, and
    each launcher's exit status (the late one last)."""
    statuses = scenario.ends()
    seen = scenario.seen()
    return (
        sorted(int(s["WORLD_SIZE"]) for s in seen),
        sorted(int(s["GROUP_WORLD_SIZE"]) for s in seen),
        {s["TORCHELASTIC_RESTART_COUNT"] for s in seen},
        statuses,
    )


def scale_up(launcher: Launcher, who: str) -> tuple[tuple[list[int], list[int], set[str], list[int]], Scenario]:
    scenario = Scenario(launcher, who, "2:3", want=3)
    try:
        scenario.first_round()
        scenario.start()  # the late node: its ranks, once in, end the job for every rank
        return outcome(scenario), scenario
    finally:
        scenario.end()


def test_a_late_node_is_taken_in_at_a_restart_not_counted_as_torchrun_takes_it(launcher: Launcher) -> None:
    theirs, _ = scale_up(launcher, "torchrun")
    ours, scenario = scale_up(launcher, "mpilaunch")
    assert ours == theirs == ([2, 2, 3, 3, 3], [2, 2, 3, 3, 3], {"0"}, [0, 0, 0])
    line = f"mpilaunch: node at {socket.gethostname()} joined late: restarting the ranks with 3 nodes"
    for n in (0, 1):
        said = [text for text in scenario.said(n).splitlines() if "rank output goes to" not in text]
        assert said == [line], scenario.said(n)
    assert [text for text in scenario.said(2).splitlines() if "rank output goes to" not in text] == [
        f"mpilaunch: the nodes' meeting at {scenario.endpoint} closed with 2 nodes before this one came: "
        "it waits to be taken in at their next restart"
    ]
    logs = launcher.tmp_path / "mpilaunch-logs"  # each start's tree, the late node's ranks beside the others'
    assert sorted(str(p.relative_to(logs)) for p in logs.glob("**/stdout")) == [
        *(f"1/rank.{r}/stdout" for r in range(2)),
        *(f"attempt.1/1/rank.{r}/stdout" for r in range(3)),
    ]


def torch_spares(endpoint: str) -> int:
    """The agents torch's rendezvous lists as spares (its redundancy list), read from its store
    as its agents read the rendezvous's state."""
    import base64
    import pickle
    from datetime import timedelta

    import torch.distributed as dist

    host, port = endpoint.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=HANG))
    state = pickle.loads(base64.b64decode(store.get("torch.rendezvous.none")))  # torch's own state
    return len(state.redundancy_list)


@pytest.mark.parametrize("who", ["torchrun", "mpilaunch"])
def test_a_node_beyond_max_waits_as_a_spare_and_fails_when_the_job_ends(launcher: Launcher, who: str) -> None:
    scenario = Scenario(launcher, who, "1:2", want=99)

    def spare() -> bool:
        if who == "torchrun":
            return torch_spares(scenario.endpoint) == 1
        return "it waits as a spare" in scenario.said(2)

    try:
        scenario.first_round()
        scenario.start()
        wait_for(spare, "the third launcher never waited", scenario.procs)
        (scenario.folder / "stop").touch()  # the two nodes' ranks end well
        assert outcome(scenario) == ([2, 2], [2, 2], {"0"}, [0, 0, 1])  # the same under both: nothing restarted
    finally:
        scenario.end()
    if who == "mpilaunch":
        assert scenario.said(2).splitlines()[-1] == (
            f"mpilaunch: the job at {scenario.endpoint} ended before this node was taken in"
        )
