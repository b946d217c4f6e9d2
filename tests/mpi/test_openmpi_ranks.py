"""Ranks that load Open MPI at run time (a Python rank, as mpi4py built against Open MPI would be)
are stopped with a clear message instead of running as singletons of size 1; other ranks are not.

The Open MPI rank is real: Debian's Open MPI 4.1, loaded with ctypes, calls MPI_Init.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpilaunch.agent.services.openmpi_guard import TRAP_VARIABLE
from tests.conftest import Launcher, write_script
from tests.sshbed import SshBed, bed_available

PY = sys.executable


def _open_mpi_loads() -> bool:
    probe = [PY, "-c", "import ctypes; ctypes.CDLL('libmpi.so.40')"]
    return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0


pytestmark = pytest.mark.skipif(not _open_mpi_loads(), reason="Open MPI's libmpi.so.40 is absent (libopenmpi-dev)")

# MPI_Init, then the size of MPI_COMM_WORLD: a singleton prints "of 1".
OPEN_MPI_RANK = """
import ctypes, os, sys, time
lib = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
if sys.argv[1:] == ["load-only"]:   # loaded but not initialised: only /proc/PID/maps can tell
    time.sleep(60)
lib.MPI_Init(None, None)
world = ctypes.c_void_p(ctypes.addressof(ctypes.c_void_p.in_dll(lib, "ompi_mpi_comm_world")))
size = ctypes.c_int()
lib.MPI_Comm_size(world, ctypes.byref(size))
print(f"rank {os.environ['OMPI_COMM_WORLD_RANK']}: MPI_COMM_WORLD of {size.value}", flush=True)
lib.MPI_Finalize()
"""
FLAG = "uses Open MPI"


def _rank(tmp_path: Path) -> str:
    return write_script(tmp_path, "ompi_rank.py", OPEN_MPI_RANK)


@pytest.mark.parametrize("pmi", [[], ["--pmi-tcp"]], ids=["pmi-fd", "pmi-tcp"])
def test_an_open_mpi_python_rank_is_stopped_with_a_message(launcher: Launcher, tmp_path: Path, pmi: list) -> None:
    start = time.monotonic()
    proc = launcher.run(*pmi, "-n", "2", PY, _rank(tmp_path), timeout=120)
    elapsed = time.monotonic() - start
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert proc.stdout == b"", "a rank ran as a singleton"
    lines = [line for line in err.splitlines() if line.startswith("mpilaunch: rank ") and FLAG in line]
    assert len(lines) == 1, err
    line = lines[0]
    served = r"which needs a PMIx server, and this job is served PMI-1"
    assert re.match(r"mpilaunch: rank [01] uses Open MPI \(libmpi\.so\.40[.\d]*\), " + served, line)
    for words in ("PMIx", "singleton of size 1", "--mpi pmix", "MPICH", "--mpi none"):
        assert words in line
    assert "Reason:    uses Open MPI" in err
    assert elapsed < 60


def test_with_mpi_none_open_mpi_ranks_run_as_singletons(launcher: Launcher, tmp_path: Path) -> None:
    proc = launcher.run("--mpi", "none", "-n", "2", PY, _rank(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == ["rank 0: MPI_COMM_WORLD of 1", "rank 1: MPI_COMM_WORLD of 1"]
    assert FLAG not in proc.stderr.decode()


def test_a_child_of_a_rank_that_loads_open_mpi_is_caught(launcher: Launcher, tmp_path: Path) -> None:
    """Served PMI-1 only (--mpi pmi1; by default a shell's job is served PMIx too)."""
    proc = launcher.run("--mpi", "pmi1", "-n", "1", "sh", "-c", f"{PY} {_rank(tmp_path)}; echo after", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "mpilaunch: rank 0 started a process (pid " in err
    assert ") that uses Open MPI (libmpi.so.40" in err
    assert b"MPI_COMM_WORLD" not in proc.stdout


def test_open_mpi_loaded_without_mpi_init_is_found_in_the_maps(launcher: Launcher, tmp_path: Path) -> None:
    """Open MPI 5 has no singleton parameter to stop it; a rank that keeps Open MPI loaded and
    has not spoken PMI is found by its /proc/PID/maps within a few seconds."""
    start = time.monotonic()
    proc = launcher.run("-n", "2", PY, _rank(tmp_path), "load-only", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "uses Open MPI (libmpi.so.40" in err
    assert time.monotonic() - start < 40  # the ranks would sleep 60 s


MPICH_BARRIER = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); print(MPI.COMM_WORLD.Get_size())"


@pytest.mark.parametrize(
    "argv, out",
    [
        (["-c", MPICH_BARRIER], "2\n2\n"),
        (["-c", "print('hello')"], "hello\nhello\n"),
        (["-c", "import time; time.sleep(2.5); print('slept')"], "slept\nslept\n"),  # looked at several times
    ],
    ids=["mpich-mpi4py", "python-print", "python-sleep"],
)
def test_other_ranks_are_not_flagged(launcher: Launcher, argv: list, out: str) -> None:
    if "mpi4py" in argv[-1]:
        pytest.importorskip("mpi4py")
    proc = launcher.run("-n", "2", PY, *argv, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == out
    assert FLAG not in proc.stderr.decode()


def test_the_singleton_variable_is_set_only_with_pmi_and_a_users_value_wins(launcher: Launcher) -> None:
    show = ["-n", "1", PY, "-c", f"import os; print(os.environ.get({TRAP_VARIABLE!r}))"]
    proc = launcher.run(*show, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    value = proc.stdout.decode().strip()
    assert value.startswith("file:/proc/") and "/fd/" in value
    proc = launcher.run("--mpi", "none", *show, timeout=60)
    assert proc.stdout.decode().strip() == "None"
    proc = launcher.run("-mca", "ess_singleton_server", "mine", *show, timeout=60)
    assert proc.stdout.decode().strip() == "mine"


@pytest.mark.skipif(not bed_available()[0], reason=bed_available()[1])
def test_remote_agents_stop_open_mpi_ranks_too(launcher: Launcher, tmp_path: Path) -> None:
    """The agent shipped over SSH (imported from memory) keeps the same watch on its host."""
    with SshBed(tmp_path / "bed", 2) as bed:
        try:
            proc = launcher.run("--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "-n", "2", PY,
                                _rank(tmp_path), timeout=120)  # fmt: skip
            err = proc.stderr.decode()
            assert proc.returncode == 1, err
            assert proc.stdout == b"", "a rank ran as a singleton"
            assert re.search(r"mpilaunch: rank [01] uses Open MPI \(libmpi\.so\.40", err), err
            assert "Host:      node" in err
        finally:
            left = bed.wait_clean(5.0)
            bed.kill_leftovers()
        assert not left, f"processes of the job survived on the hosts: {left}"
