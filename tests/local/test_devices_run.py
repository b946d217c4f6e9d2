"""--devices-per-rank, OMP_NUM_THREADS and --rank-table end to end: real ranks report their variables;
and what a host says of its GPUs, from the nvidia-smi it runs (here a script in its place)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mpilaunch.host import hostinfo
from tests.conftest import ROOT, SEED_IPS, Launcher, fake_smi, write_script

DUMP = str(ROOT / "tests" / "ranks" / "dump_env.py")
PY = sys.executable
CPUS = len(os.sched_getaffinity(0))
LISTS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS")


@pytest.fixture
def bare(launcher: Launcher) -> Launcher:
    """A launcher whose environment sets no device list and no OMP_NUM_THREADS."""
    for name in LISTS:
        launcher.env.pop(name, None)
    return launcher


def envs(launcher: Launcher, tmp_path: Path, np: int, *args: str, env: dict | None = None) -> list[dict]:
    out = tmp_path / "env"
    out.mkdir(exist_ok=True)
    proc = launcher.run("-n", str(np), "--oversubscribe", *args, PY, DUMP, str(out), env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads((out / f"{r}.json").read_text())["env"] for r in range(np)]


def pick(records: list[dict], *names: str) -> list[tuple]:
    return [tuple(env.get(n) for n in names) for env in records]


def test_cuda_visible_devices_2_3_gives_rank_0_device_2_and_rank_1_device_3(bare: Launcher, tmp_path: Path) -> None:
    records = envs(bare, tmp_path, 2, "--devices-per-rank", "1", env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert pick(records, "RANK", "CUDA_VISIBLE_DEVICES", "DEVICE_ID", "LOCAL_RANK") == [
        ("0", "2", "0", "0"),
        ("1", "3", "0", "1"),
    ]


def test_counted_gpus_are_sliced_and_too_few_is_status_2(bare: Launcher, tmp_path: Path) -> None:
    listing = "".join(f"echo 'GPU {i}: NVIDIA T4 (UUID: GPU-{i})'; " for i in range(4))
    path = f"{fake_smi(tmp_path, listing)}:{bare.env['PATH']}"
    records = envs(bare, tmp_path, 2, "--devices-per-rank", "2", env={"PATH": path})
    assert pick(records, "CUDA_VISIBLE_DEVICES", "DEVICE_ID") == [("0,1", "0"), ("2,3", "0")]
    proc = bare.run("-n", "3", "--oversubscribe", "--devices-per-rank", "2", "echo", "started", env={"PATH": path})
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode() == (
        "mpilaunch: --devices-per-rank 2: localhost runs 3 ranks of the job, which need 6 devices; "
        "nvidia-smi -L on localhost counts 4\n"
    )


def test_without_a_list_or_nvidia_smi_devices_are_0_to_n_minus_1(bare: Launcher, tmp_path: Path) -> None:
    records = envs(bare, tmp_path, 3, "--devices-per-rank", "1", env={"PATH": "/usr/bin:/bin"})
    assert pick(records, "CUDA_VISIBLE_DEVICES", "DEVICE_ID") == [("0", "0"), ("1", "0"), ("2", "0")]


def test_the_list_the_user_set_is_the_one_narrowed(bare: Launcher, tmp_path: Path) -> None:
    records = envs(bare, tmp_path, 2, "--devices-per-rank", "2", env={"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"})
    assert pick(records, "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") == [("4,5", None), ("6,7", None)]
    records = envs(bare, tmp_path, 2, "--devices-per-rank", "1", "-x", "HIP_VISIBLE_DEVICES=1,0")
    assert pick(records, "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") == [("1", None), ("0", None)]


def test_without_devices_per_rank_device_id_is_the_local_rank_and_lists_pass_unchanged(
    bare: Launcher, tmp_path: Path
) -> None:
    records = envs(bare, tmp_path, 2, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert pick(records, "CUDA_VISIBLE_DEVICES", "DEVICE_ID") == [("2,3", "0"), ("2,3", "1")]


def test_omp_num_threads_defaults_to_cpus_per_local_rank_and_is_said_once(bare: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    proc = bare.run("-n", "4", "--oversubscribe", PY, DUMP, str(out))
    assert proc.returncode == 0, proc.stderr
    for rank in range(4):
        assert json.loads((out / f"{rank}.json").read_text())["env"]["OMP_NUM_THREADS"] == str(max(1, CPUS // 4))
    notes = [line for line in proc.stderr.decode().splitlines() if "OMP_NUM_THREADS" in line]
    assert notes == [
        f"mpilaunch: OMP_NUM_THREADS={max(1, CPUS // 4)} per rank ({CPUS} CPUs, 4 ranks); set it to choose"
    ]
    proc = bare.run("-n", "2", "--oversubscribe", "sh", "-c", "echo $OMP_NUM_THREADS", env={"OMP_NUM_THREADS": "3"})
    assert proc.stdout.decode().split() == ["3", "3"] and b"OMP_NUM_THREADS" not in proc.stderr
    proc = bare.run("-n", "1", "sh", "-c", "echo $OMP_NUM_THREADS")
    assert proc.stdout.decode().split() == [str(CPUS)] and proc.stderr == b""  # one rank: set, nothing to say


READ_TABLE = """import json, os
table = json.load(open(os.environ["RANK_TABLE_FILE"]))
mine = [(s["server_id"], d) for s in table["server_list"] for d in s["device"] if d["rank_id"] == os.environ["RANK"]]
print(os.environ["RANK"], table["server_count"], mine[0][1]["device_id"], mine[0][1]["device_ip"], flush=True)
"""


def test_rank_table_is_written_printed_and_read_by_every_rank(bare: Launcher, tmp_path: Path) -> None:
    conf = tmp_path / "hccn.conf"
    conf.write_text("".join(f"address_{i}={ip}\nnetmask_{i}=255.255.255.0\n" for i, ip in enumerate(SEED_IPS)))
    script = write_script(tmp_path, "read_table.py", READ_TABLE)
    proc = bare.run(
        "-n", "4", "--oversubscribe", "--rank-table", "tables/rank_table_4pcs.json", "--devices-per-rank", "1",
        PY, script, env={"MPILAUNCH_HCCN_CONF": str(conf), "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    path = tmp_path / "tables" / "rank_table_4pcs.json"
    assert f"mpilaunch: rank table (1 server, 4 devices) written to {path}\n" in proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == [f"{r} 1 {4 + r} {SEED_IPS[4 + r]}" for r in range(4)]
    table = json.loads(path.read_text())
    assert table["version"] == "1.0" and table["status"] == "completed" and table["server_count"] == "1"
    (server,) = table["server_list"]
    assert server["host_nic_ip"] == "reserve" and server["server_id"].count(".") == 3
    assert [d["rank_id"] for d in server["device"]] == ["0", "1", "2", "3"]
    assert path.read_text().count("\n") == 12 + 4  # one line per device, as in MindSpore's samples


def test_rank_table_without_hccn_conf_says_device_ip_is_empty(bare: Launcher, tmp_path: Path) -> None:
    missing = tmp_path / "no-hccn.conf"
    proc = bare.run("-n", "2", "--rank-table", "rt.json", "sh", "-c", "echo $RANK_TABLE_FILE",
                    env={"MPILAUNCH_HCCN_CONF": str(missing)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().split() == [str(tmp_path / "rt.json")] * 2
    assert (
        f"mpilaunch: rank table: localhost: cannot read {missing}: No such file or directory; device_ip left empty"
        in proc.stderr.decode()
    )
    devices = json.loads((tmp_path / "rt.json").read_text())["server_list"][0]["device"]
    assert devices == [{"device_id": str(i), "device_ip": "", "rank_id": str(i)} for i in range(2)]


def test_rank_table_in_a_dry_run_is_shown_not_written(bare: Launcher, tmp_path: Path) -> None:
    proc = bare.run("--dry-run", "-H", "node1:2,node2:2", "--rank-table", "rt.json", "true")
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    assert f"  RANK_TABLE_FILE={tmp_path / 'rt.json'}" in out
    text = out.split(f"rank table for {tmp_path / 'rt.json'} (not written in a dry run):\n", 1)[1]
    table = json.loads(text)
    assert [s["server_id"] for s in table["server_list"]] == ["node1", "node2"] and table["server_count"] == "2"
    assert not (tmp_path / "rt.json").exists()


def test_an_unwritable_rank_table_is_status_2_before_any_rank_starts(bare: Launcher, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = bare.run("-n", "1", "--rank-table", "file/rt.json", "echo", "started")
    assert proc.returncode == 2 and proc.stdout == b""
    assert f"mpilaunch: --rank-table: cannot write {tmp_path / 'file' / 'rt.json'}: File exists" in proc.stderr.decode()


# -- what a host says about itself (hostinfo: stdlib, also run by remote agents) -----------------
def test_gpus_are_counted_by_nvidia_smi_l(tmp_path: Path) -> None:
    listing = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\\n"
        "  MIG 1g.5gb     Device  0: (UUID: MIG-1)\\n"
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\\n"
        "GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-3)\\n"
    )
    path = fake_smi(tmp_path, f'[ "$1" = -L ] && printf "{listing}"')
    assert hostinfo.count_gpus(path) == {"count": 3}
    assert hostinfo.count_gpus(str(tmp_path / "none")) == {"count": None}
    broken = fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it could not communicate' >&2; exit 9")
    assert hostinfo.count_gpus(broken) == {
        "count": None,
        "error": "nvidia-smi -L failed: NVIDIA-SMI has failed because it could not communicate",
    }


def test_probe_answers_only_what_is_asked(tmp_path: Path) -> None:
    assert hostinfo.probe(False, None, "") == {"cpus": len(os.sched_getaffinity(0))}
    got = hostinfo.probe(True, str(tmp_path / "none"), fake_smi(tmp_path, "echo 'GPU 0: X'"))
    assert got["gpus"] == {"count": 1} and "error" in got["hccn"]
