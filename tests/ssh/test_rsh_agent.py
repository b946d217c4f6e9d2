"""Open MPI's remote shell settings reach mpilaunch's own remote start: `plm_rsh_agent` puts
another command in place of ssh (Kubeflow's MPI Operator gives `kubectl exec` this way), and
`plm_rsh_args` adds ssh arguments. Here a wrapper script stands in for `kubectl exec`: called as
`WRAPPER HOST COMMAND...`, it runs the command on that host of the bed (ssh with the bed's
config), stdin passed through, and notes each host it was asked for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
bed, clean_hosts = sshbed_fixtures("rshbed", 2)
PY = sys.executable
WHERE = (
    "import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
    "print('rank', c.rank, 'of', c.size, 'sum', c.allreduce(c.rank + 1), 'host',"
    " os.environ['SSH_CONNECTION'].split()[2], flush=True)\n"
)


def wrapper(bed: SshBed, tmp_path: Path) -> tuple[str, Path]:
    """(the stand-in for `kubectl exec`, the file it notes hosts in)."""
    calls = tmp_path / "calls"
    path = tmp_path / "kubexec"
    path.write_text(
        f'#!/bin/sh\nhost="$1"; shift\necho "$host" >> "{calls}"\nexec ssh -F "{bed.config}" "$host" "$*"\n'
    )
    path.chmod(0o755)
    return str(path), calls


def two_hosts(proc, bed: SshBed) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    lines = sorted(line for line in proc.stdout.decode().splitlines() if line.startswith("rank "))
    assert lines == [
        f"rank 0 of 2 sum 3 host {bed.address('node1')}",
        f"rank 1 of 2 sum 3 host {bed.address('node2')}",
    ], proc.stderr.decode()[-3000:]


@pytest.mark.parametrize("given_as", ["-mca", "OMPI_MCA_plm_rsh_agent"])
def test_plm_rsh_agent_starts_each_host_through_the_wrapper(
    launcher: Launcher, bed: SshBed, tmp_path: Path, given_as: str
) -> None:
    """No --ssh-config: only the wrapper knows how to reach node1 and node2."""
    agent, calls = wrapper(bed, tmp_path)
    script = write_script(tmp_path, "where.py", WHERE)
    job = ["-H", "node1:1,node2:1", "-n", "2", PY, script]
    if given_as == "-mca":
        proc = launcher.run("-mca", "plm_rsh_agent", agent, *job)
    else:
        proc = launcher.run(*job, env={"OMPI_MCA_plm_rsh_agent": agent})
    two_hosts(proc, bed)
    assert sorted(calls.read_text().split()) == ["node1", "node2"]


def test_plm_rsh_args_alone_reach_the_bed(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """`-mca plm_rsh_args "-F CONFIG"` with no --ssh-config: ssh reads the bed's config from it;
    without it node1 is no host ssh knows. (Without, ssh is given an empty config: with none it
    would read the machine's own ~/.ssh/config, where node1 may be a host.)"""
    script = write_script(tmp_path, "where.py", WHERE)
    proc = launcher.run("-mca", "plm_rsh_args", f"-F {bed.config}", "-H", "node1:1,node2:1", "-n", "2", PY, script)
    two_hosts(proc, bed)
    empty = tmp_path / "empty_ssh_config"
    empty.write_text("")
    without = launcher.run("--ssh-config", str(empty), "-H", "node1:1,node2:1", "-n", "2", PY, script)
    assert without.returncode != 0 and "node1" in without.stderr.decode(), without.stderr.decode()[-3000:]
