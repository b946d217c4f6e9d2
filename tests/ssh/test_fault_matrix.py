"""The fault-injection matrix of "No process left, ever", over the real sshd bed.

One rank on each of node1 and node2 leaves a tree that tries to escape (tests/ranks/escape.py:
a daemon in a session of its own below a parent that ignores SIGTERM, a 5-level chain of them,
a child in the rank's group that ignores SIGTERM, the daemon with every stream on /dev/null);
the launcher is then killed (SIGKILL) or stopped (SIGTERM) at start-up, while the ranks run,
or while an abort is killing them (a rank exited 3; its peer's tree ignores SIGTERM, so the
--kill-timeout is running); and SIGTERM with a console that does not read while ranks flood it.
What is left is counted on the hosts (every descendant of a host's sshd, every process with the
bed's tag) and here (the test's tag): 0 within --kill-timeout + 1 s, in every case.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, tagged_pids
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
PY = sys.executable
ESCAPE = str(ROOT / "tests" / "ranks" / "escape.py")
WRITER = str(ROOT / "tests" / "ranks" / "writer.py")
KILL_TIMEOUT = 1.0
SHAPES = ["worker", "chain", "group", "quiet"]
TREE_SIZE = {"worker": 2, "chain": 5, "group": 1, "quiet": 2}  # processes each tree records
# moment -> (signal to the launcher, what rank 0 does, what rank 1 does)
MOMENTS = {
    "start-up kill -9": (signal.SIGKILL, "sleep", "sleep"),
    "start-up SIGTERM": (signal.SIGTERM, "sleep", "sleep"),
    "running kill -9": (signal.SIGKILL, "sleep", "sleep"),
    "running SIGTERM": (signal.SIGTERM, "sleep", "sleep"),
    "during abort kill -9": (signal.SIGKILL, "3", "sleep"),
}
COUNTS: dict[str, int] = {}  # case -> processes left, for the summary printed with -s


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBed]:
    home = tmp_path_factory.mktemp("empty-home")  # no ~/.bashrc to run per connection
    with SshBed(tmp_path_factory.mktemp("matrixbed"), 2, setenv={"HOME": str(home)}) as started:
        yield started
    if COUNTS:
        left = sum(COUNTS.values())
        print(f"\n[fault matrix] {len(COUNTS)} cases, {left} processes left", file=sys.__stdout__)


def _left(launcher: Launcher, bed: SshBed, since: float) -> list[int]:
    """What is left on the hosts and here, --kill-timeout + 1 s after `since` at the latest."""
    deadline = since + KILL_TIMEOUT + 1.0
    while True:
        left = sorted(set(bed.leftover_pids()) | set(tagged_pids(launcher.tag)))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def _kill_what_is_left(bed: SshBed, launcher: Launcher, left: list[int]) -> None:
    bed.kill_leftovers()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _records(where: Path) -> int:
    return len(list(where.iterdir()))


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("shape", SHAPES)
def test_nothing_is_left_on_any_host(launcher: Launcher, bed: SshBed, tmp_path: Path, shape: str, moment: str) -> None:
    sig, first, second = MOMENTS[moment]
    records = tmp_path / "tree"  # the hosts are this machine: the trees record here
    records.mkdir()
    hosts = ["--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "--kill-timeout", str(KILL_TIMEOUT)]
    argv = [*hosts, "-n", "1", PY, ESCAPE, shape, first, str(records), ":", "-n", "1", PY, ESCAPE, shape, second]
    proc = launcher.popen(*argv)
    if moment.startswith("start-up"):
        time.sleep(0.3)  # connections made or being made, agents starting, ranks starting
    else:
        deadline = time.monotonic() + 30
        while _records(records) < TREE_SIZE[shape] and time.monotonic() < deadline:  # rank 0's whole tree
            time.sleep(0.02)
        assert _records(records) >= TREE_SIZE[shape], "rank 0 never made its tree"
        if moment.startswith("during abort"):
            time.sleep(0.3)  # rank 0 exited 3: the abort's SIGTERM went out, its SIGKILL is 1 s away
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    signalled = time.monotonic()
    if sig == signal.SIGTERM:  # (a SIGTERM before the interpreter reached mpilaunch's code ends it as a C program)
        assert proc.returncode == 143 or (moment.startswith("start-up") and proc.returncode == -signal.SIGTERM)
    left = _left(launcher, bed, signalled)
    COUNTS[f"{shape} {moment}"] = len(left)
    if left:
        _kill_what_is_left(bed, launcher, left)
    assert not left, f"{len(left)} processes left {KILL_TIMEOUT + 1:g} s after {moment}: {left}"


def test_sigterm_with_a_console_that_does_not_read(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """Ranks on both hosts flood a console nobody reads; SIGTERM ends the job at once (status
    143) and leaves nothing on any host."""
    read_end, write_end = os.pipe()
    hosts = ["--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "--kill-timeout", str(KILL_TIMEOUT)]
    proc = launcher.popen(*hosts, "-n", "2", PY, WRITER, "100000000", stdout=write_end)
    os.close(write_end)
    try:
        time.sleep(3.0)  # the pipe filled long ago, the console's backlog too
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        os.close(read_end)
    assert proc.returncode == 143, err.decode()[-2000:]
    assert took < 2.0, f"the launcher took {took:.2f} s to act on SIGTERM"
    left = _left(launcher, bed, sent)
    COUNTS["stalled console SIGTERM"] = len(left)
    if left:
        _kill_what_is_left(bed, launcher, left)
    assert not left, f"{len(left)} processes left after SIGTERM: {left}"


def test_a_closed_stdout_over_ssh(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """The launcher started with stdout closed (`>&-`) for a job on 2 hosts: as with /dev/null
    (the first SSH connection must not take descriptor 1); every line in the log files."""
    hosts = ["--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "--output-filename", "logs"]
    proc = subprocess.run(
        launcher.argv(*hosts, "-n", "2", PY, WRITER, "50000"),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=launcher.env,
        cwd=tmp_path,
        timeout=120,
        preexec_fn=lambda: os.close(1),  # the closing is what is tested
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    for rank in range(2):
        assert (tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout").read_bytes().count(b"\n") == 50000


MPICH_ABORT = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
with open(f"/proc/self/maps") as maps:
    mine = sorted({line.split()[-1] for line in maps if "/dev/shm/mpich_shm_" in line})
with open(sys.argv[1] + f".{comm.rank}", "w") as out:
    out.write("\\n".join(mine))
time.sleep(0.6)
if comm.rank == 1:
    comm.Abort(3)
time.sleep(30)
"""


def test_a_remote_hosts_mpich_segment_is_removed_after_an_abort(
    launcher: Launcher, bed: SshBed, tmp_path: Path
) -> None:
    """2 MPICH ranks on node1 (one node: they share a /dev/shm segment), rank 1 aborts: node1's
    agent removes the segment hydra would leave."""
    pytest.importorskip("mpi4py")
    script = tmp_path / "abort.py"
    script.write_text(MPICH_ABORT)
    hosts = ["--ssh-config", str(bed.config), "-H", "node1:2", "--kill-timeout", "0.5"]
    proc = launcher.run(*hosts, "-n", "2", PY, str(script), str(tmp_path / "maps"), timeout=120)
    assert proc.returncode == 3, proc.stderr.decode()[-2000:]
    segments = {line for name in tmp_path.glob("maps.*") for line in name.read_text().split("\n") if line}
    assert segments, "the ranks mapped no mpich_shm segment: nothing was tested"
    assert not [path for path in segments if os.path.exists(path)]
