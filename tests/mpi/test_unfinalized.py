"""An MPI rank that exits 0 after MPI_Init without MPI_Finalize while the others run (issue 27):
the job ends with status 1, as before, and its summary says the rank ended before finalizing
with the exit code it really had (it said `Exit code: 1`), for both MPI families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script
from tests.mpi.conftest import FAMILIES, family_python

pytest.importorskip("mpi4py")
LEAVES = "import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\nif c.Get_rank() == 1:\n    os._exit(0)\nc.Barrier()\n"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_rank_that_leaves_without_finalize_is_said_to_have_ended_before_finalizing(
    launcher: Launcher, tmp_path: Path, family: str
) -> None:
    python = family_python(family)
    script = write_script(tmp_path, "leaves.py", LEAVES)
    report = tmp_path / "report.json"
    proc = launcher.run(
        "--bind-to", "none", "--oversubscribe", "-n", "3", "--report-json", str(report), python, script, timeout=120
    )
    err = proc.stderr.decode()
    assert proc.returncode == 1, err[-3000:]
    assert "  Rank:      1\n" in err
    assert "  Exit code: 0, but it ended before finalizing (no MPI_Finalize)\n" in err and "Exit code: 1" not in err
    assert "  Reason:    exited without MPI_Finalize while other ranks run\n" in err
    assert "Killed by mpilaunch: ranks 0,2\n" in err
    first = json.loads(report.read_text())["first_failure"]
    assert (first["rank"], first["exit_code"], first["abort_code"]) == (1, 0, 1)
