"""Placement against a live Open MPI: mpirun --display-map and mpilaunch agree on every scenario."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TRUTH = json.loads((ROOT / "tests" / "data" / "openmpi41_truth.json").read_text())


OPENMPI = shutil.which("mpirun.openmpi") or "/usr/bin/mpirun.openmpi"


@pytest.mark.skipif(not os.path.exists(OPENMPI), reason="Debian's openmpi-bin is not installed")
@pytest.mark.parametrize("scenario_name", ["bynode_np5_a3b1c2", "byslot_over_np7_a3b1", "mpmd_3_3_over_a2b2"])
def test_live_openmpi(scenario_name: str) -> None:
    """Re-record a few scenarios with the real mpirun now and compare (guards the recorded file)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "data" / "openmpi41_truth.py"), "--only", f"^{scenario_name}$",
         "--mpirun", OPENMPI],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    fresh = json.loads(proc.stdout)["scenarios"]
    assert len(fresh) == 1
    recorded = next(s for s in TRUTH["scenarios"] if s["name"] == scenario_name)
    assert [(r["host"], r["OMPI_COMM_WORLD_LOCAL_RANK"]) for r in fresh[0]["ranks"]] == [
        (r["host"], r["OMPI_COMM_WORLD_LOCAL_RANK"]) for r in recorded["ranks"]
    ]
