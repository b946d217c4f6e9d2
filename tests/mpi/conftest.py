"""After every MPI test: nothing of Open MPI's or of a PMIx server left in /dev/shm. And the
Pythons whose mpi4py is each MPI family's, for the tests run with every family."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.procs import left_in_dev_shm

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, whose python3-mpi4py is built for Open MPI 4.1
FAMILIES = ["mpich", "openmpi"]  # the mpich wheel's mpi4py (the tests' own Python), Debian's on Open MPI


@functools.cache
def _has_mpi4py(python: str) -> bool:
    if not os.path.exists(python):
        return False
    return subprocess.run([python, "-c", "import mpi4py.MPI"], capture_output=True).returncode == 0


def family_python(family: str) -> str:
    """A Python whose mpi4py uses that MPI: MPICH (the tests' own, with the mpich wheel), Debian's
    Open MPI 4.1, or the Open MPI 5.0 wheel (`openmpi5`, in a venv of its own); the test is
    skipped, saying why, where there is none."""
    if family == "mpich":
        pytest.importorskip("mpi4py")
        return sys.executable
    if family == "openmpi":
        if not _has_mpi4py(SYSTEM_PYTHON):
            pytest.skip("needs Debian's python3-mpi4py")
        return SYSTEM_PYTHON
    from tests.venvs import venv_or_skip

    return str(venv_or_skip("ompi5"))


OPEN_MPI_SHM = ("mpilaunch-pmix-", "vader", "sm_segment", "pmix")


@pytest.fixture(autouse=True)
def nothing_left_in_dev_shm() -> Iterator[None]:
    before = set(os.listdir("/dev/shm"))
    yield
    left = left_in_dev_shm(before, OPEN_MPI_SHM)
    assert not left, f"left in /dev/shm: {left}"
