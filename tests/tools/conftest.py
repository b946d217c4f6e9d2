"""What the tests of real tools share: the shims on PATH, the environment a tool runs in, and
the venvs the tools are installed in (built once, kept: tests/venvs.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher
from tests.mpi.conftest import nothing_left_in_dev_shm  # noqa: F401  (Open MPI ranks run here too)
from tests.venvs import built_deepspeed_op, venv_or_skip

# The variables that let Open MPI's mpirun run as root: a tool's job as root needs none of them.
ROOT_FLAGS = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


@pytest.fixture(scope="session")
def shims(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder written by `mpilaunch shims`: mpirun, mpiexec, orterun, mpiexec.hydra, ompi_info."""
    folder = tmp_path_factory.mktemp("shims") / "bin"
    proc = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "shims", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(folder)
    return folder


def tool_env(launcher: Launcher, shims: Path, *front: Path) -> dict[str, str]:
    """The launcher's tagged environment (so every process of the job is found afterwards) with
    the shims first on PATH, then `front` (a venv's bin, as an activated venv has it), and no
    root flag."""
    env = {k: v for k, v in launcher.env.items() if k not in ROOT_FLAGS}
    env["PATH"] = os.pathsep.join([str(shims), *map(str, front), env.get("PATH", os.defpath)])
    return env


def tail(proc: subprocess.CompletedProcess) -> str:
    """A failed run's output, for the assertion's message."""
    out = proc.stdout if isinstance(proc.stdout, str) else proc.stdout.decode(errors="replace")
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
    return f"status {proc.returncode}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}"


@pytest.fixture(scope="session")
def deepspeed_venv() -> Path:
    """The venv's python, with DeepSpeed's CPU op built beside it (tests/venvs.py)."""
    python = venv_or_skip("deepspeed")
    why = built_deepspeed_op(python)
    if why:
        pytest.skip(why)
    return python


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
