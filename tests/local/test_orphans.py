"""No process left, ever: ranks leave trees that try to escape (daemons in sessions of their own
that ignore SIGTERM, chains of them, children in the rank's group; tests/ranks/escape.py), and
the job ends every way it can (the ranks exit, one fails, the timeout, SIGTERM or kill -9 of the
launcher, early or late). What is left is counted by the test's environment tag, which every
process of the tree carries: 0 within --kill-timeout + 1 s of the end, with the job's cgroup
with the subreaper sweep alone (the default) and with the job's cgroup (MPILAUNCH_CGROUP=1)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, tagged_pids

PY = sys.executable
ESCAPE = str(ROOT / "tests" / "ranks" / "escape.py")
KILL_TIMEOUT = 1.0
CGROUPS = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified").is_dir() else Path("/sys/fs/cgroup")
SHAPES = ["worker", "chain", "group", "quiet"]
TREE_SIZE = {"worker": 2, "chain": 5, "group": 1, "quiet": 2}  # processes each tree marks in DIR
MOMENTS = ["ranks_exit", "abort", "timeout", "sigterm", "kill9", "kill9_at_start"]


def tree_size(records: Path) -> int:
    return len(list(records.iterdir()))


def wait_for_tree(records: Path, size: int) -> None:
    """Until `size` processes of the trees marked themselves in records."""
    deadline = time.monotonic() + 20
    while tree_size(records) < size and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tree_size(records) >= size, "the ranks never made their trees"


def told_the_guardian(agent: int) -> set[int]:
    """The pids the agent's guardian would kill if the agent died: its table, a nameless file on
    the guardian's descriptor 4 (agent/reaper.Guardian: records of "pid start-time")."""
    from tests.procs import parent_pid

    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if parent_pid(int(entry)) == agent and b"mpilaunch-guardian" in Path(f"/proc/{entry}/cmdline").read_bytes():
                table = Path(f"/proc/{entry}/fd/4").read_bytes()
                return {int(record.split()[0]) for record in table.splitlines() if record.strip()}
        except (OSError, ValueError):
            continue
    return set()


def run_until(launcher: Launcher, tmp_path: Path, shape: str, moment: str, env: dict) -> tuple[int, float]:
    """Run 2 ranks that each leave a tree, end the job at `moment`; return the launcher's status
    and when the job ended (monotonic)."""
    records = tmp_path / "tree"
    records.mkdir()
    actions = {"ranks_exit": ("0", "0"), "abort": ("3", "sleep")}.get(moment, ("sleep", "sleep"))
    options = ["--kill-timeout", str(KILL_TIMEOUT), "--oversubscribe", "-n", "1"]
    if moment == "timeout":
        options = ["--timeout", "2", *options]
    argv = [*options, PY, ESCAPE, shape, actions[0], str(records), ":", "-n", "1", PY, ESCAPE, shape, actions[1]]
    proc = launcher.popen(*argv, env=env)
    if moment == "kill9_at_start":  # once the first process of rank 0's tree is up: the trees are being made
        wait_for_tree(records, 1)
    elif moment in ("sigterm", "kill9"):
        wait_for_tree(records, TREE_SIZE[shape])  # rank 0's whole tree
    if moment == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif moment.startswith("kill9"):
        proc.kill()
    proc.communicate(timeout=60)
    return proc.returncode, time.monotonic()


def left_after(launcher: Launcher, ended: float) -> tuple[list[int], float]:
    """Wait up to --kill-timeout + 1 s after the end for the tree to go; what is left then."""
    left = tagged_pids(launcher.tag)
    while left and time.monotonic() - ended < KILL_TIMEOUT + 1.0:
        time.sleep(0.02)
        left = tagged_pids(launcher.tag)
    return left, time.monotonic() - ended


EXPECTED = {"ranks_exit": 0, "abort": 3, "timeout": 124, "sigterm": 143, "kill9": -9, "kill9_at_start": -9}


@pytest.mark.parametrize("cgroup", ["cgroup", "sweep"])
@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_nothing_started_under_a_rank_survives_the_job(
    launcher: Launcher, tmp_path: Path, shape: str, moment: str, cgroup: str
) -> None:
    if cgroup == "cgroup" and shape in ("group", "quiet"):
        pytest.skip("the cgroup is tried on the two shapes that leave every group")
    env = {"MPILAUNCH_CGROUP": "1" if cgroup == "cgroup" else "0"}
    started = time.monotonic()
    status, ended = run_until(launcher, tmp_path, shape, moment, env)
    assert status == EXPECTED[moment]
    if moment == "ranks_exit":  # the ranks exited 0: the job ends once their trees are killed
        assert ended - started < 10
    left, waited = left_after(launcher, ended)
    assert not left, f"{len(left)} processes left {waited:.2f} s after the job ended: {left}"
    assert not list(CGROUPS.glob("mpilaunch-*")), "a cgroup of the job was left"


@pytest.mark.parametrize("cgroup", ["cgroup", "sweep"])
@pytest.mark.parametrize("shape", ["worker", "chain", "group"])
def test_the_guardian_ends_the_trees_when_the_agent_is_killed(
    launcher: Launcher, tmp_path: Path, shape: str, cgroup: str
) -> None:
    """kill -9 of the local agent once both ranks' trees stand and the agent has looked below
    its ranks: its guardian kills the ranks' groups and the processes it was told about (the
    orphans in sessions of their own), and the cgroup where there is one; the launcher names
    the lost agent."""
    from tests.procs import parent_pid

    if cgroup == "cgroup" and shape == "group":
        pytest.skip("the cgroup is tried on the shapes that leave every group")
    records = tmp_path / "tree"
    records.mkdir()
    options = ["--oversubscribe", "-n", "2", PY, ESCAPE, shape, "sleep", str(records)]
    proc = launcher.popen(*options, env={"MPILAUNCH_CGROUP": "1" if cgroup == "cgroup" else "0"})
    wait_for_tree(records, 2 * TREE_SIZE[shape])
    assert tree_size(records) == 2 * TREE_SIZE[shape], "the ranks made more than their trees"
    agent = [p for p in tagged_pids(launcher.tag) if parent_pid(p) == proc.pid]
    assert len(agent) == 1, agent
    trees = {int(name) for name in os.listdir(records)}
    deadline = time.monotonic() + 20  # the agent tells its guardian what is below its ranks twice a second
    while not trees <= told_the_guardian(agent[0]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert trees <= told_the_guardian(agent[0]), "the agent never told its guardian of the trees"
    os.kill(agent[0], signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and b"lost the agent of host localhost" in err, err.decode()[-2000:]
    left, waited = left_after(launcher, killed)
    assert not left, f"{len(left)} processes left {waited:.2f} s after the agent was killed: {left}"
    assert not list(CGROUPS.glob("mpilaunch-*")), "a cgroup of the job was left"
