"""The ranks' store on a remote rank 0's host: its agent reads which torch the ranks import
before launch, and a torch it does not serve has the ranks meet in rank 0's own store."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, sshbed_fixtures, write_script
from tests.local.test_tcpstore_torch import OWN_STORE_RANK, newer_torch_venv
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
bed, clean_hosts = sshbed_fixtures("torchstorebed", 2)


def test_a_remote_rank_0s_torch_the_store_does_not_serve_meets_in_its_own_store(
    launcher: Launcher, bed: SshBed, tmp_path: Path
) -> None:
    python = newer_torch_venv(tmp_path / "venv")
    script = write_script(tmp_path, "own_store.py", OWN_STORE_RANK)
    argv = [str(python), "-m", "mpilaunch", "--ssh-config", str(bed.config), "-H", "node1,node2"]
    argv += ["--nproc-per-node", "1", script]
    env = {**launcher.env, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for line in done.stdout.splitlines() if line[:1].isdigit())
    assert lines == [f"{rank} 3 False 2.99.0+cpu" for rank in range(2)], done.stdout
    assert (
        "mpilaunch: the ranks' torch 2.99.0+cpu on node1 speaks a TCPStore mpilaunch does not serve "
        "(it serves torch 2.0 to 2.14): the ranks meet in rank 0's own store (TORCHELASTIC_USE_AGENT_STORE=False)"
    ) in done.stderr.splitlines(), done.stderr
