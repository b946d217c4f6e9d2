"""`mpilaunch top`: a live view of a running job, from another shell, in a real terminal (tmux):
every rank with its state, CPU share, memory and time since its last output, the silent idle
one marked, and the grouped stacks of the selected ranks (issue "The front door")."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script
from tests.terminal import Terminal

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (Debian: tmux)")
# Ranks 0 and 2 compute and print; rank 1 sleeps and says nothing: it looks stuck.
WORK = """\
import os, time
rank = int(os.environ["RANK"])
print(f"up {rank}", flush=True)
last = time.time()
while True:
    if rank == 1:
        time.sleep(0.2)
        continue
    sum(range(100000))
    if time.time() - last > 0.3:
        print(f"rank {rank} works", flush=True)
        last = time.time()
"""


def start_job(launcher: Launcher, tmp_path: Path, *hosts: str):  # type: ignore[no-untyped-def]
    script = write_script(tmp_path, "work.py", WORK)
    proc = launcher.popen(*hosts, "-n", "3", sys.executable, script)
    assert proc.stdout is not None
    seen = [proc.stdout.readline() for _ in range(3)]
    assert all(line.startswith(b"up") for line in seen), seen
    return proc


def stop_job(proc) -> None:  # type: ignore[no-untyped-def]
    proc.terminate()
    proc.communicate(timeout=30)


def test_top_shows_every_rank_marks_the_silent_one_and_shows_its_stacks(launcher: Launcher, tmp_path: Path) -> None:
    job = start_job(launcher, tmp_path)
    try:
        with Terminal(tmp_path, launcher.env) as term:
            term.start(launcher.argv("top", str(job.pid), "--stuck-after", "2"), tmp_path)
            screen = term.wait_for(lambda s: "1 look stuck" in s and "stuck?" in s, timeout=30)
            rows = {
                line.split()[0]: line.split() for line in screen.splitlines() if re.match(r"^\s*\d+\s+localhost", line)
            }
            assert sorted(rows) == ["0", "1", "2"], screen
            assert rows["1"][3] == "stuck?" and rows["0"][3] == rows["2"][3] == "running", screen
            assert int(rows["0"][4]) > 10 and int(rows["1"][4]) == 0, screen  # CPU%: computing, sleeping
            assert f"job {job.pid}: " in screen and "3 of 3 running" in screen
            term.keys("j")  # the cursor to rank 1
            term.keys("s")
            screen = term.wait_for(lambda s: "work.py:" in s and "stacks" in s, timeout=60)
            assert "rank 1" in screen and "in <module>" in screen, screen
            term.keys("q")
            assert term.exit_status() == 0
    finally:
        stop_job(job)


def test_top_once_prints_one_view_as_text(launcher: Launcher, tmp_path: Path) -> None:
    job = start_job(launcher, tmp_path)
    try:
        time.sleep(0.1)
        done = launcher.run("top", str(job.pid), "--once", "--stuck-after", "0.05")
    finally:
        stop_job(job)
    lines = done.stdout.decode().splitlines()
    assert done.returncode == 0, done.stderr.decode()
    assert lines[1].split() == ["RANK", "HOST", "PID", "STATE", "CPU%", "MEM", "QUIET"]
    states = {line.split()[0]: line.split()[3] for line in lines[2:]}
    assert states == {"0": "running", "1": "stuck?", "2": "running"}


def test_top_without_a_job_says_so(launcher: Launcher, tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    done = launcher.run("top", "--once", env=env)
    assert done.returncode == 1 and done.stderr == b"mpilaunch top: no mpilaunch job of yours is running\n"
    bad = launcher.run("top", "--stuck-after", "x")
    assert bad.returncode == 2 and bad.stderr.decode().strip().count("\n") == 0
    assert os.path.isdir(tmp_path)
