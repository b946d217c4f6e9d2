"""Start-up cost: a local run must not import what only remote hosts or job files need."""

from __future__ import annotations

import os
import subprocess
import sys


def test_local_run_imports_no_heavy_modules(tmp_path) -> None:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mpilaunch", "-n", "1", "true"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "mpilaunch.controller" in imported
    for heavy in ("paramiko", "yaml", "mpilaunch.jobfile", "psutil", "asyncio", "mpi4py", "numpy"):
        assert heavy not in imported
