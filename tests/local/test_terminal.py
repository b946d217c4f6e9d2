"""The launcher in a real terminal (tmux): a closed window or one Ctrl-C never leaves the job
running (issue "Never silent, never wrong")."""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher, tagged_pids
from tests.terminal import Terminal

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (Debian: tmux)")

# Ranks that ignore SIGHUP and SIGINT, and say when they are ready.
STUBBORN = "trap '' HUP INT; echo ready$RANK; sleep 300"


def wait_gone(tag: str, timeout: float) -> float:
    """Seconds until no process carries the tag; AssertionError naming them if some outlive timeout."""
    start = time.monotonic()
    while tagged_pids(tag):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"still running {timeout} s after: {tagged_pids(tag)}")
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_closed_terminal_ends_the_job(launcher: Launcher, tmp_path: Path) -> None:
    """The window is closed (tmux kill-session): SIGHUP reaches the launcher; ranks that ignore it
    get SIGTERM after --kill-timeout, and nothing of the job is left, as under mpirun and hydra."""
    with Terminal(tmp_path, launcher.env) as term:
        term.start(launcher.argv("-n", "2", "sh", "-c", STUBBORN), tmp_path)
        term.wait_for(lambda screen: "ready0" in screen and "ready1" in screen)
        term.close()
        took = wait_gone(launcher.tag, timeout=15.0)
    print(f"[signal] closed terminal: nothing left {took:.2f} s after")


def test_one_ctrl_c_says_what_happens_and_ends_the_job(launcher: Launcher, tmp_path: Path) -> None:
    """One Ctrl-C typed in the terminal: SIGINT goes to the ranks, one line says that those still
    running get SIGTERM after the grace; ranks that ignore SIGINT are ended then, status 130."""
    with Terminal(tmp_path, launcher.env) as term:
        term.start(launcher.argv("-n", "2", "--kill-timeout", "1", "sh", "-c", STUBBORN), tmp_path)
        term.wait_for(lambda screen: "ready0" in screen and "ready1" in screen)
        term.keys("C-c")
        screen = term.wait_for(lambda screen: "SIGINT forwarded" in screen)
        line = next(line for line in screen.splitlines() if "SIGINT forwarded" in line)
        assert line.removeprefix("^C") == (  # the terminal's echo of the key, then the line
            "mpilaunch: SIGINT forwarded to every rank; ranks still running in 1 s get SIGTERM, then SIGKILL"
            " (Ctrl-C again kills them now)"
        )
        wait_gone(launcher.tag, timeout=15.0)
        assert term.exit_status() == 130, term.screen()
        assert "stopped by SIGINT" in term.screen()


def test_a_second_ctrl_c_kills_at_once(launcher: Launcher, tmp_path: Path) -> None:
    with Terminal(tmp_path, launcher.env) as term:
        term.start(launcher.argv("-n", "2", "--kill-timeout", "60", "sh", "-c", STUBBORN), tmp_path)
        term.wait_for(lambda screen: "ready0" in screen and "ready1" in screen)
        term.keys("C-c")
        term.wait_for(lambda screen: "SIGINT forwarded" in screen)
        term.keys("C-c")
        term.wait_for(lambda screen: "SIGINT again: killing every rank" in screen)
        wait_gone(launcher.tag, timeout=10.0)  # not the 60 s grace


def test_a_job_at_a_terminal_ends_with_one_line_of_what_it_used(launcher: Launcher, tmp_path: Path) -> None:
    """Ranks, wall time and the largest memory, when stderr is a terminal; -q leaves it out, and
    so does a stderr that is no terminal."""
    grow = "import os; x = bytearray((int(os.environ['RANK']) + 1) * 40_000_000); print('done', flush=True)"
    with Terminal(tmp_path, launcher.env) as term:
        term.start(launcher.argv("-n", "2", sys.executable, "-c", grow), tmp_path)
        assert term.exit_status() == 0
        lines = [line for line in term.screen().splitlines() if line.startswith("mpilaunch: ")]
    assert len(lines) == 1 and re.fullmatch(
        r"mpilaunch: 2 ranks, \d+\.\d s; largest memory \d+(\.\d)? MiB \(rank 1 on localhost\)", lines[0]
    ), lines
    with Terminal(tmp_path, launcher.env) as term:
        term.start(launcher.argv("-q", "-n", "2", "true"), tmp_path)
        assert term.exit_status() == 0 and "mpilaunch" not in term.screen()
    piped = launcher.run("-n", "2", "true")
    assert piped.returncode == 0 and piped.stderr == b""
