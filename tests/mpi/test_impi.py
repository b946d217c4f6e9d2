"""Real Intel MPI ranks (the `impi-rt` wheel, through its built-in PMI-1 client) under mpilaunch.

Intel MPI and MPICH share libmpi.so.12, so a launcher that serves one serves the other; these
tests hold that to be true with Intel's own library, in a venv of its own (mpi4py there loads the
venv's <prefix>/lib/libmpi.so first), built once and kept between runs (tests/venvs.py:
.cache/mpilaunch-tests/impi). Without PyPI they skip, saying why.

impi-rt 2021.19 needs the `libfabric` wheel, which this project's package index does not have;
2021.18.1 bundles its libfabric, so it is pinned, with the impi-devel (headers) of the same version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, tagged_pids
from tests.venvs import IMPI_VERSION, venv_or_skip

CHECKS = str(ROOT / "tests" / "ranks" / "impi_checks.py")
LIBRARY = f"Intel(R) MPI Library {IMPI_VERSION}"

HELLO_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    int rank, size, sum, len;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Get_library_version(version, &len);
    char *end = strstr(version, " for ");
    if (end) *end = 0;
    printf("c rank %d of %d sum %d %s\n", rank, size, sum, version);
    MPI_Finalize();
    return 0;
}
"""


@dataclass(frozen=True)
class Impi:
    prefix: Path  # the venv: bin/python, bin/mpiexec, lib/libmpi.so.12, include/mpi.h

    @property
    def python(self) -> str:
        return str(self.prefix / "bin" / "python")


@pytest.fixture(scope="module")
def impi() -> Impi:
    return Impi(venv_or_skip("impi").parent.parent)


@pytest.fixture(scope="module")
def hello_c(impi: Impi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A C program built with gcc against Intel's mpi.h and libmpi.so.12 (found through RUNPATH)."""
    gcc = shutil.which("gcc")
    if gcc is None or not (impi.prefix / "include" / "mpi.h").exists():
        pytest.skip("no gcc, or no mpi.h in the Intel MPI venv (impi-devel)")
    folder = tmp_path_factory.mktemp("impi_c")
    (folder / "hello.c").write_text(HELLO_C)
    lib = impi.prefix / "lib"
    argv = [gcc, "-O2", f"-I{impi.prefix / 'include'}", str(folder / "hello.c"), f"-L{lib}", "-lmpi"]
    proc = subprocess.run([*argv, f"-Wl,-rpath,{lib}", "-o", str(folder / "hello")], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    yield str(folder / "hello")


def lines(proc: subprocess.CompletedProcess) -> list[str]:
    return sorted(proc.stdout.decode().splitlines())


@pytest.mark.parametrize("np", [1, 2, 4, 8])
def test_collectives_see_the_whole_job(launcher: Launcher, impi: Impi, np: int) -> None:
    proc = launcher.run("--oversubscribe", "-n", str(np), impi.python, CHECKS, "collectives", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert lines(proc) == sorted(f"rank {r} of {np} app 0 tag - lib {LIBRARY}" for r in range(np))


def test_abort_ends_the_job_with_its_code(launcher: Launcher, impi: Impi) -> None:
    start = time.monotonic()
    proc = launcher.run("--oversubscribe", "-n", "3", impi.python, CHECKS, "abort", timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 7, err
    assert time.monotonic() - start < 15
    assert "rank 1 called MPI_Abort with code 7" in err and "Rank:      1" in err
    assert "Killed by mpilaunch: ranks 0,2" in err
    assert not tagged_pids(launcher.tag)


def test_mpmd_ranks_get_their_appnum(launcher: Launcher, impi: Impi) -> None:
    app = [impi.python, CHECKS, "collectives"]
    proc = launcher.run("--oversubscribe", "-n", "1", *app, "a", ":", "-n", "2", *app, "b", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    expected = [f"rank 0 of 3 app 0 tag a lib {LIBRARY}"]
    expected += [f"rank {r} of 3 app 1 tag b lib {LIBRARY}" for r in (1, 2)]
    assert lines(proc) == expected


def test_publish_and_lookup_name(launcher: Launcher, impi: Impi) -> None:
    proc = launcher.run("-n", "2", impi.python, CHECKS, "names", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert lines(proc) == ["0 port-0-impi", "1 port-0-impi"]


def test_c_program_linked_with_intel_mpi(launcher: Launcher, hello_c: str) -> None:
    proc = launcher.run("--oversubscribe", "-n", "4", hello_c, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert lines(proc) == [f"c rank {r} of 4 sum 6 {LIBRARY}" for r in range(4)]


AFFINITY = """import os
from mpi4py import MPI
c = MPI.COMM_WORLD
c.Barrier()
cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
print(c.rank, cpus, os.environ.get("I_MPI_WAIT_MODE"), flush=True)
"""
SAID = "mpilaunch: Intel MPI ranks are pinned as Intel's mpiexec pins them"


def _affinity(launcher: Launcher, python: str, tmp_path: Path, *args: str) -> tuple[dict[str, tuple[str, str]], str]:
    script = tmp_path / "affinity.py"
    script.write_text(AFFINITY)
    proc = launcher.run("--oversubscribe", *args, python, str(script), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    rows = {rank: (cpus, mode) for rank, cpus, mode in (line.split() for line in proc.stdout.decode().splitlines())}
    return rows, proc.stderr.decode()


def test_intel_ranks_are_pinned_and_yield_as_under_intels_mpiexec(
    launcher: Launcher, impi: Impi, tmp_path: Path
) -> None:
    """Detected from the venv's libmpi.so.12 (Intel's exports I_MPI_Check_image_status): each
    rank pinned to its share of the CPUs; on a host with more ranks than CPUs, I_MPI_WAIT_MODE=1
    (ringtest at 4 ranks on 2 CPUs: 15 ms a loop spinning, 16 µs yielding; bench/impi.py)."""
    every = sorted(os.sched_getaffinity(0))
    rows, err = _affinity(launcher, impi.python, tmp_path, "-n", "2")
    if len(every) >= 2:
        assert {cpus for cpus, _ in rows.values()} == {str(every[0]), str(every[1])}, rows  # one CPU each
        assert SAID in err
    assert {mode for _, mode in rows.values()} == {"None"}  # not crowded: no yield
    crowded = len(every) + 1
    rows, err = _affinity(launcher, impi.python, tmp_path, "-n", str(crowded))
    assert {mode for _, mode in rows.values()} == {"1"} and "I_MPI_WAIT_MODE=1" in err
    assert all(len(cpus.split(",")) == 1 for cpus, _ in rows.values())  # round-robin, one CPU each


@pytest.mark.parametrize(
    "user", [["--bind-to", "none"], ["-x", "I_MPI_PIN=0"], ["-x", "I_MPI_WAIT_MODE=0"]], ids=["bind", "pin", "wait"]
)
def test_a_users_own_setting_wins(launcher: Launcher, impi: Impi, tmp_path: Path, user: list) -> None:
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    rows, err = _affinity(launcher, impi.python, tmp_path, *user, "-n", str(len(every.split(",")) + 1))
    modes = {mode for _, mode in rows.values()}
    if user[-1] == "I_MPI_WAIT_MODE=0":
        assert modes == {"0"} and "I_MPI_WAIT_MODE=1" not in err
    else:
        assert {cpus for cpus, _ in rows.values()} == {every} and SAID not in err  # not pinned
        assert modes == {"1"}


def test_mpich_ranks_are_not_pinned(launcher: Launcher, tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    rows, err = _affinity(launcher, sys.executable, tmp_path, "-n", "2")
    assert {cpus for cpus, _ in rows.values()} == {every} and "Intel MPI" not in err


SLURM_PMI2 = "/usr/lib/x86_64-linux-gnu/libpmi2.so.0"


@pytest.mark.skipif(not os.path.exists(SLURM_PMI2), reason="needs Slurm's PMI-2 client (Debian's libpmi2-0)")
@pytest.mark.parametrize("check", ["collectives", "names"])
def test_intel_mpi_over_slurms_pmi2_client(launcher: Launcher, impi: Impi, check: str) -> None:
    """I_MPI_PMI=pmi2 with Slurm's libpmi2.so.0: the name lookup reads `value` (issue "Every MPI
    at full speed": before, `Lookup failed for service name`)."""
    pmi2 = ("-x", "I_MPI_PMI=pmi2", "-x", f"I_MPI_PMI_LIBRARY={SLURM_PMI2}")
    proc = launcher.run("--oversubscribe", *pmi2, "-n", "3", impi.python, CHECKS, check, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    if check == "names":
        assert lines(proc) == ["0 port-0-impi", "1 port-0-impi", "2 port-0-impi"]
    else:
        assert lines(proc) == sorted(f"rank {r} of 3 app 0 tag - lib {LIBRARY}" for r in range(3))


def test_intel_mpi_is_told_from_mpich_before_launch(impi: Impi, hello_c: str) -> None:
    """Both load libmpi.so.12; Intel's exports I_MPI_Check_image_status (host/mpi_family)."""
    from mpilaunch.host.mpi_family import is_intel_mpi
    from mpilaunch.host.programs import program_family

    assert is_intel_mpi(str(impi.prefix / "lib" / "libmpi.so.12"))
    assert program_family(hello_c, "/", os.defpath) == ("impi", "libmpi.so.12")
    assert program_family(impi.python, "/", os.defpath) == ("impi", "mpi4py:libmpi.so.12")
    assert program_family(sys.executable, "/", os.defpath) == ("mpich", "mpi4py:libmpi.so.12")
