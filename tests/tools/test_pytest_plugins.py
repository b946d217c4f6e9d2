"""The two pytest plugins for MPI tests, each in a venv of its own (both install the module
`pytest_mpi`) with mpi4py and the `mpich` wheel:

- pytest-mpi: the user starts the ranks, `mpilaunch -n 2 python -m pytest --with-mpi`;
- mpi-pytest: pytest starts them, running `mpiexec -n 1 -genv _PYTEST_MPI_CHILD_PROCESS 1 ... :
  -n 2 ...` for a test marked `parallel(nprocs=3)`: the shim named mpiexec, first on PATH, as
  root on a machine of 2 cores, with no flag for either.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script
from tests.tools.conftest import ROOT_FLAGS, tail, tool_env
from tests.venvs import venv_or_skip

WITH_MPI = """
import os
import pytest

@pytest.mark.mpi(min_size=2)
def test_world_of_two():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    assert comm.size == 2
    assert comm.allreduce(comm.rank + 1) == 3
    by = "mpilaunch" if os.environ.get("MPILAUNCH_JOB_ID") else "another launcher"
    print(f"rank {comm.rank} of {comm.size} by {by}")
"""

PARALLEL = """
import os
import pytest
from mpi4py import MPI

@pytest.mark.parallel(nprocs=3)
def test_three():
    comm = MPI.COMM_WORLD
    assert comm.size == 3
    assert comm.allreduce(comm.rank + 1) == 6
    job = comm.bcast(os.environ.get("MPILAUNCH_JOB_ID"), root=0)
    assert job and job == os.environ.get("MPILAUNCH_JOB_ID")  # one job, mpilaunch's
    print(f"rank {comm.rank} of {comm.size} child {os.environ.get('_PYTEST_MPI_CHILD_PROCESS')} by mpilaunch")
"""


@pytest.fixture(scope="module")
def pytest_mpi() -> Path:
    return venv_or_skip("pytest-mpi")


@pytest.fixture(scope="module")
def mpi_pytest() -> Path:
    return venv_or_skip("mpi-pytest")


def test_pytest_mpi_with_mpi_runs_the_marked_test_at_two_ranks(
    launcher: Launcher, pytest_mpi: Path, tmp_path: Path
) -> None:
    """Without --with-mpi the marked test is skipped; with it, each of the two ranks runs it."""
    write_script(tmp_path, "test_world.py", WITH_MPI)
    pytest_args = ["-m", "pytest", "-q", "-s", "-rs", "-p", "no:cacheprovider", "test_world.py"]
    alone = launcher.run("-n", "2", str(pytest_mpi), *pytest_args, timeout=180)
    assert alone.returncode == 0, tail(alone)
    assert alone.stdout.decode().count("1 skipped") == 2, tail(alone)
    proc = launcher.run("-n", "2", str(pytest_mpi), *pytest_args, "--with-mpi", timeout=180)
    assert proc.returncode == 0, tail(proc)
    out = proc.stdout.decode()
    assert out.count("1 passed") == 2 and "skipped" not in out, tail(proc)
    assert sorted(line for line in out.splitlines() if line.startswith("rank ")) == [
        "rank 0 of 2 by mpilaunch",
        "rank 1 of 2 by mpilaunch",
    ], tail(proc)


def test_mpi_pytest_forks_three_ranks_through_the_mpiexec_shim_as_root_with_no_flag(
    launcher: Launcher, shims: Path, mpi_pytest: Path, tmp_path: Path
) -> None:
    """The venv's own bin (where the mpich wheel put hydra's mpiexec) comes after the shims, as
    after `export PATH="$(mpilaunch shims DIR):$PATH"` in an activated venv. No root flag is in
    the environment, and 3 ranks on this machine need no --oversubscribe."""
    write_script(tmp_path, "test_par.py", PARALLEL)
    env = tool_env(launcher, shims, mpi_pytest.parent)
    assert not set(ROOT_FLAGS) & set(env)
    command = [str(mpi_pytest), "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_par.py"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, tail(proc)
    ranks = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert ranks == [f"rank {r} of 3 child 1 by mpilaunch" for r in range(3)], tail(proc)
    assert proc.stdout.rstrip().splitlines()[-1].startswith("1 passed"), tail(proc)
