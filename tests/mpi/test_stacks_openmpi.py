"""Stacks of Open MPI ranks (issue 30): Python ranks that load Debian's Open MPI 4.1 with ctypes
(as tests/mpi/test_openmpi_ranks.py makes them), served PMIx (`--mpi pmix`): two in MPI_Barrier,
one in `stuck_here`; SIGQUIT prints two groups and the job ends well. And an MPICH job hung in a
barrier, ended by `--timeout 3 --get-stack-traces`: its stacks first, then status 124."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpilaunch.host.pmix_library import LIBRARY_PLACES
from tests.conftest import Launcher, write_script
from tests.stackjob import OPEN_MPI_RANK, Running, release, snapshot, two_groups

PY = sys.executable
HAS_PY_SPY = os.access(os.path.join(os.path.dirname(PY), "py-spy"), os.X_OK)


def _open_mpi_loads() -> bool:
    probe = [PY, "-c", "import ctypes; ctypes.CDLL('libmpi.so.40')"]
    return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0


OPEN_MPI = _open_mpi_loads() and any(os.path.exists(p) for p in LIBRARY_PLACES)
pytestmark = pytest.mark.skipif(not HAS_PY_SPY, reason="py-spy is not installed (the test extra)")


@pytest.mark.skipif(not OPEN_MPI, reason="needs Debian's libopenmpi-dev and libpmix2")
def test_open_mpi_ranks_in_a_barrier_and_one_stuck(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "ompi_rank.py", OPEN_MPI_RANK)
    flag = tmp_path / "flag"
    logs = tmp_path / "logs"
    proc = launcher.popen("--mpi", "pmix", "--output-filename", str(logs), "-n", "3", PY, script, str(flag))
    job = Running(proc)
    assert sorted(job.wait_out(3, timeout=120)) == ["up 0\n", "up 1\n", "up 2\n"], job.err()
    time.sleep(0.3)
    job.proc.send_signal(signal.SIGQUIT)
    job.wait_err(r"^  rank 2, whole:$")
    release(flag)
    status = job.finish(timeout=120)
    err = job.err()
    assert status == 0, err[-4000:]
    assert sorted(job.out_lines) == ["done 0\n", "done 1\n", "done 2\n", "up 0\n", "up 1\n", "up 2\n"], err
    two_groups(snapshot(err), script="ompi_rank.py")
    assert "stuck_here" in (logs / "1" / "rank.2" / "stack.1").read_text()


HUNG = """
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 0:
    comm.recv(source=1)  # never sent: the job hangs
comm.Barrier()
"""


def test_a_hung_mpich_job_prints_its_stacks_then_exits_as_a_timeout(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "hung.py", HUNG)
    report = tmp_path / "run.json"
    proc = launcher.run("--timeout", "3", "--get-stack-traces", "--report-json", str(report), "-n", "2", PY, script)
    err = proc.stderr.decode()
    assert proc.returncode == 124, err
    lines = snapshot(err)
    assert lines[0].startswith("mpilaunch: stacks of 2 of 2 running ranks (--timeout): 2 groups"), lines
    assert lines[1].startswith("  rank 0 (1): hung.py:5 in <module>") and lines[2].startswith("  rank 1 (1): hung.py:6")
    assert err.index("the job exceeded --timeout 3 s") < err.index("mpilaunch: stacks of")
    document = json.loads(report.read_text())
    assert document["outcome"] == "timeout" and [s["why"] for s in document["stacks"]] == ["timeout"]
