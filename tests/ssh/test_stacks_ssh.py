"""Stacks over the sshd bed (issue 30): each host's agent, shipped over SSH and run from memory,
takes its own ranks' stacks, and the launcher groups them across hosts: two ranks in a barrier
on node1, one in `stuck_here` on node2. With py-spy beside the interpreter, and with a launcher
whose interpreter has none (the hosts' eu-stack reads native frames then)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.sshbed import SshBed, bed_available
from tests.stackjob import MPI4PY_RANK, Running, python_without_py_spy, release, snapshot, two_groups

available, why = bed_available()
PY = sys.executable
pytestmark = [
    pytest.mark.skipif(not available, reason=why),
    pytest.mark.skipif(not os.access(os.path.join(os.path.dirname(PY), "py-spy"), os.X_OK), reason="no py-spy"),
]
bed, clean_hosts = sshbed_fixtures("stacksbed", 2)


def run_job(launcher: Launcher, bed: SshBed, tmp_path: Path, env: dict | None = None) -> tuple[int, str]:
    script = write_script(tmp_path, "rank.py", MPI4PY_RANK)
    flag = tmp_path / "flag"
    hosts = ["--ssh-config", str(bed.config), "-H", "node1:2,node2:1"]
    proc = launcher.popen(*hosts, "-n", "3", PY, script, str(flag), env=env)
    job = Running(proc)
    assert sorted(job.wait_out(3)) == ["up 0\n", "up 1\n", "up 2\n"], job.err()
    time.sleep(0.3)
    job.proc.send_signal(signal.SIGQUIT)
    job.wait_err(r"^  rank 2, whole:$")
    release(flag)
    status = job.finish()
    assert sorted(job.out_lines)[:3] == ["done 0\n", "done 1\n", "done 2\n"], job.err()
    return status, job.err()


def test_sigquit_groups_the_stacks_of_two_hosts(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    status, err = run_job(launcher, bed, tmp_path)
    assert status == 0, err[-4000:]
    two_groups(snapshot(err))


def test_without_py_spy_the_hosts_read_native_stacks(launcher: Launcher, tmp_path: Path) -> None:
    """py-spy hidden on the hosts: the launcher's interpreter (which the agents run) has none beside
    it, and a HOME without ~/.bashrc keeps pyenv's shims off the sessions' PATH."""
    python = python_without_py_spy(tmp_path / "venv")
    launcher.argv = lambda *args: [python, "-m", "mpilaunch", *args]  # type: ignore[method-assign]
    home = tmp_path / "home"
    home.mkdir()
    with SshBed(tmp_path / "bed", 2, setenv={"HOME": str(home)}) as plain:
        try:
            status, err = run_job(launcher, plain, tmp_path, env={"PATH": "/usr/bin:/bin"})
        finally:
            left = plain.wait_clean(5.0)
            plain.kill_leftovers()
        assert not left, f"processes of the job survived on the hosts: {left}"
    assert status == 0, err[-4000:]
    notes = [line.split(" has no py-spy: ")[0] for line in err.splitlines() if " has no py-spy: " in line]
    assert notes == ["mpilaunch: host node1", "mpilaunch: host node2"], err  # one line per host
    lines = snapshot(err)
    assert lines[0].startswith("mpilaunch: stacks of 3 of 3 running ranks (SIGQUIT)"), lines
    sleeper = [line for line in lines if line.startswith("  rank 2 (1): ")]
    assert sleeper and "nanosleep" in sleeper[0], lines
