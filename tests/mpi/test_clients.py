"""Real clients: PyTorch DDP (gloo, env://) and data-parallel SGD over mpi4py, on this machine and
across the SSH bed; devices and the rank table on remote hosts, as their agents see them."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, fake_smi, write_script
from tests.sshbed import SshBed, bed_available

PY = sys.executable
DDP = str(ROOT / "examples" / "ddp_cpu.py")
SGD = str(ROOT / "examples" / "sgd_mpi.py")
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install torch==2.13.0)")
BED, WHY_NO_BED = bed_available()
needs_bed = pytest.mark.skipif(not BED, reason=WHY_NO_BED)
# Each rank says where it runs (the address sshd was reached at, or "local"), then runs the example.
WHERE = (
    "import os, runpy, sys; conn = os.environ.get('SSH_CONNECTION'); "
    "print('where', os.environ['RANK'], conn.split()[2] if conn else 'local', os.environ['MASTER_ADDR'], flush=True); "
    "runpy.run_path(sys.argv[1], run_name='__main__')"
)
RESULT = re.compile(r"^rank (\d+) of (\d+)\b.*(?:params|weights) ([0-9a-f]{16})$", re.M)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBed]:
    with SshBed(tmp_path_factory.mktemp("sshbed"), 4) as started:
        yield started


@pytest.fixture
def clean_bed(bed: SshBed) -> Iterator[SshBed]:
    yield bed
    left = bed.wait_clean(3.0)
    if left:
        bed.kill_leftovers()
    assert not left, f"processes of the job survived on the hosts: {left}"


def agreed(out: str, size: int) -> str:
    """Every rank printed its result once, for a job of this size, with the same digest."""
    found = sorted((int(rank), int(of), digest) for rank, of, digest in RESULT.findall(out))
    assert [(rank, of) for rank, of, _ in found] == [(r, size) for r in range(size)], out
    digests = {digest for _, _, digest in found}
    assert len(digests) == 1, out
    return digests.pop()


def ddp_checked(proc, size: int) -> None:  # -> None; proc: CompletedProcess
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, out + err
    agreed(out, size)
    diff = float(re.search(r"largest difference from one process on all the data: (\S+)", out).group(1))  # type: ignore[union-attr]
    assert diff < 1e-4, out  # the gradients of all the shards were averaged, not one shard's used
    losses = [float(v) for v in re.findall(r"step \d+: loss (\S+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0] / 5, out


@needs_torch
def test_pytorch_ddp_four_ranks_on_this_machine(launcher: Launcher) -> None:
    proc = launcher.run("-n", "4", "--oversubscribe", PY, DDP, timeout=240)
    ddp_checked(proc, 4)


def test_sgd_over_mpi4py_ranks_agree(launcher: Launcher) -> None:
    proc = launcher.run("-n", "4", "--oversubscribe", PY, SGD, timeout=120)
    out = proc.stdout.decode()
    assert proc.returncode == 0, out + proc.stderr.decode()
    agreed(out, 4)
    assert float(re.search(r"largest error against the true weights: (\S+)", out).group(1)) < 0.01, out  # type: ignore[union-attr]
    assert all(float(v) < 1e-3 for v in re.findall(r": loss (\S+) weights", out)), out


@needs_torch
@needs_bed
@pytest.mark.parametrize("hosts", ["node1:1,node2:1,node3:1,node4:1", "node3:2,node4:2"], ids=["4x1", "2x2"])
def test_pytorch_ddp_across_the_ssh_bed(launcher: Launcher, clean_bed: SshBed, hosts: str) -> None:
    """MASTER_ADDR is rank 0's host as the launcher reached it; MASTER_PORT a port free there."""
    proc = launcher.run("--ssh-config", str(clean_bed.config), "-H", hosts, "-n", "4",
                        PY, "-c", WHERE, DDP, timeout=300)  # fmt: skip
    ddp_checked(proc, 4)
    where = sorted(line.split()[1:] for line in proc.stdout.decode().splitlines() if line.startswith("where "))
    first = hosts.split(":")[0]
    per_host = 4 // len(hosts.split(","))
    expected = [[str(r), clean_bed.address(f"node{int(first[-1]) + r // per_host}")] for r in range(4)]
    assert [w[:2] for w in where] == expected
    assert {w[2] for w in where} == {clean_bed.address(first)}


READ = """import json, os
table = json.load(open(os.environ["RANK_TABLE_FILE"]))
mine = [(s["server_id"], d) for s in table["server_list"] for d in s["device"] if d["rank_id"] == os.environ["RANK"]]
conn = os.environ.get("SSH_CONNECTION")
print("rank", os.environ["RANK"], conn.split()[2] if conn else "local", mine[0][0], mine[0][1]["device_id"],
      mine[0][1]["device_ip"], os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ["DEVICE_ID"],
      os.environ["OMP_NUM_THREADS"], flush=True)
"""
# A fake nvidia-smi: 4 GPUs, but 2 on node2 (127.0.0.3): remote hosts count their own.
SMI = """case "$SSH_CONNECTION" in *" 127.0.0.3 "*) n=2 ;; *) n=4 ;; esac
i=0; while [ $i -lt $n ]; do echo "GPU $i: NVIDIA T4 (UUID: GPU-$i)"; i=$((i+1)); done"""


@needs_bed
def test_remote_hosts_count_their_devices_and_read_their_hccn_conf(
    launcher: Launcher, clean_bed: SshBed, tmp_path: Path
) -> None:
    """Each agent runs nvidia-smi -L and reads hccn.conf on its host; the rank table it gets is
    written at the same path there; the CPUs for OMP_NUM_THREADS are the host's."""
    path = f"{fake_smi(tmp_path, SMI)}:{launcher.env['PATH']}"
    conf = tmp_path / "hccn.conf"
    conf.write_text("address_0=192.1.27.6\naddress_1=192.2.27.6\naddress_2=192.3.27.6\naddress_3=192.4.27.6\n")
    launcher.env.pop("CUDA_VISIBLE_DEVICES", None)
    launcher.env.pop("OMP_NUM_THREADS", None)
    env = {"PATH": path, "MPILAUNCH_HCCN_CONF": str(conf)}
    script = write_script(tmp_path, "read.py", READ)
    args = ("--ssh-config", str(clean_bed.config), "--rank-table", "rt.json")
    proc = launcher.run(*args, "-H", "localhost:1,node1:2,node2:2", "--devices-per-rank", "1", PY, script, env=env)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err
    n1, n2 = clean_bed.address("node1"), clean_bed.address("node2")
    cpus = str(len(__import__("os").sched_getaffinity(0)))
    half = str(max(1, int(cpus) // 2))
    rows = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("rank "))
    assert [row[1:] for row in rows] == [
        ["local", "127.0.0.1", "0", "192.1.27.6", "0", "0", cpus],
        [n1, n1, "0", "192.1.27.6", "0", "0", half],
        [n1, n1, "1", "192.2.27.6", "1", "0", half],
        [n2, n2, "0", "192.1.27.6", "0", "0", half],
        [n2, n2, "1", "192.2.27.6", "1", "0", half],
    ]
    written = f"mpilaunch: rank table (3 servers, 5 devices) written to {tmp_path / 'rt.json'} (and on node1, node2)"
    assert written in err
    table = json.loads((tmp_path / "rt.json").read_text())
    assert [s["server_id"] for s in table["server_list"]] == ["127.0.0.1", n1, n2]

    proc = launcher.run("--ssh-config", str(clean_bed.config), "-H", "node1:2", "sh", "-c", "echo $OMP_NUM_THREADS",
                        env={"OMP_NUM_THREADS": "3"})  # fmt: skip
    assert proc.stdout.decode().split() == ["3", "3"] and b"OMP_NUM_THREADS" not in proc.stderr  # the user's choice

    proc = launcher.run(*args, "-H", "node1:2,node2:2", "--devices-per-rank", "2", "echo", "started", env=env)
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode().endswith(
        "mpilaunch: --devices-per-rank 2: node2 runs 2 ranks of the job, which need 4 devices; "
        "nvidia-smi -L on node2 counts 2\n"
    )
