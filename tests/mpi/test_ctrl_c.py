"""One Ctrl-C, typed in a real terminal (tmux), to a job whose ranks are blocked inside MPI,
where a forwarded SIGINT changes nothing (the interpreter sees it only once MPI returns): the
ranks are ended after the grace, for both MPI families (issue "Never silent, never wrong")."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher, tagged_pids, write_script
from tests.mpi.conftest import FAMILIES, family_python
from tests.terminal import Terminal

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (Debian: tmux)")
# Rank 0 waits for a message nobody sends, the others in a barrier rank 0 never reaches.
STUCK = """\
from mpi4py import MPI
c = MPI.COMM_WORLD
print(f"in MPI {c.Get_rank()}", flush=True)
if c.Get_rank() == 0:
    c.recv(source=1)
else:
    c.Barrier()
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_one_ctrl_c_ends_ranks_stuck_in_mpi(launcher: Launcher, tmp_path: Path, family: str) -> None:
    python = family_python(family)
    script = write_script(tmp_path, "stuck.py", STUCK)
    argv = launcher.argv("--bind-to", "none", "--oversubscribe", "-n", "3", "--kill-timeout", "1", python, script)
    with Terminal(tmp_path, launcher.env) as term:
        term.start(argv, tmp_path)
        term.wait_for(lambda screen: all(f"in MPI {r}" in screen for r in range(3)), timeout=60)
        term.keys("C-c")
        start = time.monotonic()
        term.wait_for(lambda screen: "SIGINT forwarded to every rank" in screen)
        while tagged_pids(launcher.tag):
            assert time.monotonic() - start < 20, f"still running: {tagged_pids(launcher.tag)}\n{term.screen()}"
            time.sleep(0.05)
        screen = term.wait_for(lambda screen: "stopped by SIGINT" in screen)
    assert "ranks 0-2 ended" in screen, screen
