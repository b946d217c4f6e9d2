"""Restarts over two hosts (issue 29): torchrun's words with -H, a failure on node2 in the first
attempt, the whole job started again on both hosts, nothing left on either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
bed, clean_hosts = sshbed_fixtures("restartbed", 2)
FLAKY = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
where = os.environ["SSH_CONNECTION"].split()[2]
print("attempt", attempt, "rank", dist.get_rank(), "of", dist.get_world_size(), "on", where, flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(3 if attempt == 0 and os.environ["GROUP_RANK"] == "1" else 0)
"""


def test_a_two_host_torch_job_restarts_on_both_hosts(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(tmp_path, "flaky.py", FLAKY)
    proc = launcher.run(
        "--ssh-config",
        str(bed.config),
        "-H",
        "node1,node2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "1",
        "--restart-delay",
        "0",
        "--report-json",
        "r.json",
        script,
        timeout=240,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert "attempt 0 ended with status 1: the job starts again" in err  # torchrun's status
    said = sorted(proc.stdout.decode().splitlines())
    node1, node2 = bed.address("node1"), bed.address("node2")
    assert said == sorted(f"attempt {a} rank {r} of 2 on {(node1, node2)[r]}" for a in (0, 1) for r in (0, 1)), err
    report = json.loads((tmp_path / "r.json").read_text())
    assert [a["exit_status"] for a in report["attempts"]] == [1, 0]
    assert sorted({(r["attempt"], r["host"]) for r in report["ranks"]}) == [
        (0, "node1"),
        (0, "node2"),
        (1, "node1"),
        (1, "node2"),
    ]


TRAIN = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
names = "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"
print(*(os.environ[n] for n in names), dist.get_rank(), dist.get_world_size(), os.environ["SSH_CONNECTION"].split()[2])
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("hosts", ["-H", "--hostfile", "--nnodes", "-hosts"])
def test_the_guides_torchrun_line_runs_nproc_per_node_on_each_host(
    launcher: Launcher, bed: SshBed, tmp_path: Path, hosts: str
) -> None:
    """The user guide's `mpilaunch -H node1,node2 --nproc-per-node 2 train.py` (and a hostfile of
    `slots=1` lines, with `--nnodes 2`, or hydra's `-hosts`): torchrun has no slots, so 2 ranks on
    each host, one torch job of 4 (before, issue "Drop-in II": refused, -H's one slot per host
    capping torchrun's ranks per node; with --nnodes 2, read as a launcher per node with no
    --node-rank; with -hosts, one rank per host)."""
    script = write_script(tmp_path, "train.py", TRAIN)
    (tmp_path / "hosts").write_text("node1 slots=1\nnode2 slots=1\n")
    where = {"--hostfile": ["--hostfile", "hosts"], "-hosts": ["-hosts", "node1,node2"]}.get(
        hosts, ["-H", "node1,node2"]
    )
    where += ["--nnodes", "2"] if hosts == "--nnodes" else []  # torchrun's node count: the hosts'
    proc = launcher.run("--ssh-config", str(bed.config), *where, "--nproc-per-node", "2", script, timeout=240)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    node1, node2 = bed.address("node1"), bed.address("node2")
    assert sorted(proc.stdout.decode().splitlines()) == [
        f"{r} {r % 2} 4 2 {r // 2} {r} 4 {(node1, node2)[r // 2]}" for r in range(4)
    ], err
