"""`mpilaunch top` of a job on two hosts of the ssh bed, in a real terminal: every host's ranks,
measured by their own agents, and a remote rank's stacks."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.local.test_top import WORK, stop_job
from tests.sshbed import SshBed, bed_available
from tests.terminal import Terminal

available, why = bed_available()
pytestmark = [
    pytest.mark.skipif(not available, reason=why),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (Debian: tmux)"),
]
bed, clean_hosts = sshbed_fixtures("topbed", 2)


def test_top_shows_the_ranks_of_every_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(tmp_path, "work.py", WORK)
    job = launcher.popen("--ssh-config", str(bed.config), "-H", "node1:2,node2:1", "-n", "3", sys.executable, script)
    assert job.stdout is not None
    assert all(job.stdout.readline().startswith(b"up") for _ in range(3))
    try:
        with Terminal(tmp_path, launcher.env) as term:
            term.start(launcher.argv("top", str(job.pid), "--stuck-after", "2"), tmp_path)
            screen = term.wait_for(lambda s: "stuck?" in s, timeout=30)
            rows = {
                line.split()[0]: line.split() for line in screen.splitlines() if re.match(r"^\s*\d+\s+node\d", line)
            }
            assert {r: row[1] for r, row in rows.items()} == {"0": "node1", "1": "node1", "2": "node2"}, screen
            assert rows["1"][3] == "stuck?" and int(rows["2"][4]) > 10 and "MiB" in rows["2"][6], screen
            term.keys("j", "j")  # rank 2, on node2
            term.keys("s")
            screen = term.wait_for(lambda s: "work.py:" in s, timeout=60)
            assert "rank 2" in screen, screen
            term.keys("q")
            assert term.exit_status() == 0
    finally:
        stop_job(job)
