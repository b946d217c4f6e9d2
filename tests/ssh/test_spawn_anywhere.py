"""MPI_Comm_spawn onto a granted host where no rank of job 1 runs: an agent is started there by
the run's transport, checked as job 1's were, and the new ranks run there, for both MPI
families; a spawn that cannot be served fails at once for the client (issue "Drop-in II")."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = [pytest.mark.skipif(not available, reason=why), pytest.mark.mpi]
pytest.importorskip("mpi4py")
FAMILIES = {"mpich": sys.executable, "openmpi": "/usr/bin/python3"}  # the mpich wheel's, Debian's on Open MPI
bed, clean_hosts = sshbed_fixtures("spawnbed", 2)

# mpi4py.futures' canonical multi-host pattern: one client rank, a pool of workers spawned.
POOL = """\
import os, socket
from mpi4py.futures import MPIPoolExecutor


def where(_):
    connection = os.environ.get("SSH_CONNECTION")
    return connection.split()[2] if connection else "launcher's machine"


if __name__ == "__main__":
    with MPIPoolExecutor(max_workers=3) as pool:
        print("hosts", sorted(set(pool.map(where, range(30)))), flush=True)
"""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_pool_spawned_onto_a_host_with_no_rank_runs_there(
    launcher: Launcher, bed: SshBed, tmp_path: Path, family: str
) -> None:
    python = FAMILIES[family]
    if not os.path.exists(python):
        pytest.skip(f"needs {python}")
    script = write_script(tmp_path, "fut.py", POOL)
    report = tmp_path / "run.json"
    done = launcher.run(
        "--ssh-config", str(bed.config), "-H", "node1:1,node2:3", "-n", "1", "--report-json", str(report),
        python, script, timeout=120,
    )  # fmt: skip
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, out + err
    assert f"hosts ['{bed.address('node2')}']\n" in out, out + err
    ranks = json.loads(report.read_text())["ranks"]
    assert sorted((r["job"], r["host"]) for r in ranks) == [(1, "node1"), (2, "node2"), (2, "node2"), (2, "node2")]


SPAWN_FAILS = """\
import sys
from mpi4py import MPI

try:
    MPI.COMM_SELF.Spawn(sys.executable, ["-c", "pass"], maxprocs=2)
except MPI.Exception as exc:
    print("refused:", exc.Get_error_class() != MPI.SUCCESS, flush=True)
else:
    print("spawned", flush=True)
"""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_spawn_onto_a_host_that_cannot_be_reached_fails_at_once(
    launcher: Launcher, bed: SshBed, tmp_path: Path, family: str
) -> None:
    """node9 resolves to nothing: the agent cannot start there, and the client's MPI_Comm_spawn
    returns an error instead of waiting for ever; the launcher names the host."""
    python = FAMILIES[family]
    if not os.path.exists(python):
        pytest.skip(f"needs {python}")
    script = write_script(tmp_path, "fails.py", SPAWN_FAILS)
    done = launcher.run(
        "--ssh-config", str(bed.config), "-H", "node1:1,node9.invalid:2", "-n", "1", python, script, timeout=90
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert "refused: True" in out, out + err
    assert "MPI_Comm_spawn from rank 0 refused: node9.invalid:" in err, err
