"""The examples/ directory, run as a user would from a copy of it: net.py with per-rank logs, the
two run_mpirun_*.sh scripts (-H and --hostfile) and job.yaml, on this machine or as dry runs."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher

EXAMPLES = ROOT / "examples"


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A copy of examples/, like the sample_code directory of the MindSpore document."""
    directory = tmp_path / "sample"
    shutil.copytree(EXAMPLES, directory)
    return directory


def run_script(launcher: Launcher, sample: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """bash SCRIPT ARGS with `python` and `mpilaunch` meaning this interpreter and this checkout."""
    python_dir = str(Path(sys.executable).parent)
    extra = {"MPILAUNCH": f"{sys.executable} -m mpilaunch", "PATH": f"{python_dir}:{launcher.env['PATH']}", **env}
    return subprocess.run(
        ["bash", *args],
        cwd=sample,
        env={**launcher.env, **extra},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def check_logs(sample: Path, np: int) -> None:
    """log_output/1/rank.N/stdout only (stderr merged), each with its rank's identity and losses."""
    tree = sample / "log_output" / "1"
    width = len(str(np - 1))
    assert sorted(p.name for p in tree.iterdir()) == [f"rank.{r:0{width}d}" for r in range(np)]
    for rank in range(np):
        files = sorted(p.name for p in (tree / f"rank.{rank:0{width}d}").iterdir())
        assert files == ["stdout"]
        text = (tree / f"rank.{rank:0{width}d}" / "stdout").read_text()
        lines = text.splitlines()
        assert lines[0].startswith(f"rank {rank} of {np}: RANK={rank} LOCAL_RANK={rank} DEVICE_ID={rank} ")
        assert "[WARNING] DATA_PATH='./MNIST_Data/train/' is not a directory" in lines[1]  # stderr, merged
        assert re.fullmatch(r"epoch: 0, step: 0, loss is \d+\.\d{7}", lines[2])
        assert lines[-1].startswith(f"rank {rank} done: w=")


def test_net_py_with_per_rank_logs(launcher: Launcher, sample: Path) -> None:
    proc = launcher.run(
        "-n", "4", "--oversubscribe", "-x", "DATA_PATH=./MNIST_Data/train/",
        "--output-filename", "log_output", "--merge-stderr-to-stdout", sys.executable, "net.py",
        cwd=sample,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.decode() == f"mpilaunch: rank output goes to {sample}/log_output/1/rank.N\n"
    check_logs(sample, 4)
    # the console got the same lines, one rank's lines never mixed into another's
    console = proc.stdout.decode().splitlines()
    files = [(sample / f"log_output/1/rank.{r}/stdout").read_text().splitlines() for r in range(4)]
    assert sorted(console) == sorted(line for lines in files for line in lines)


def test_run_mpirun_1_with_hosts_on_this_machine(launcher: Launcher, sample: Path) -> None:
    proc = run_script(launcher, sample, "run_mpirun_1.sh", HOSTS="localhost:2,127.0.0.1:2", NP="4")
    assert proc.returncode == 0, proc.stderr
    check_logs(sample, 4)
    assert "MASTER_ADDR=127.0.0.1" in (sample / "log_output/1/rank.3/stdout").read_text()


def test_run_mpirun_1_as_written_is_two_machines_of_8(launcher: Launcher, sample: Path) -> None:
    proc = run_script(launcher, sample, "run_mpirun_1.sh", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    nodes = re.findall(r"Data for node: (\S+)\tNum slots: (\d+)\tMax slots: 0\tNum procs: (\d+)", proc.stdout)
    assert nodes == [("DEVICE1_IP", "8", "8"), ("DEVICE2_IP", "8", "8")]
    assert "rank 15 on DEVICE2_IP:" in proc.stdout
    assert "  DATA_PATH=./MNIST_Data/train/" in proc.stdout


def test_run_mpirun_2_with_the_sample_hostfile(launcher: Launcher, sample: Path) -> None:
    proc = run_script(launcher, sample, "run_mpirun_2.sh", "./hostfile", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert " hosts from: hostfile ./hostfile; 16 slots" in proc.stdout
    nodes = re.findall(r"Data for node: (\S+)\tNum slots: (\d+)\tMax slots: 0\tNum procs: (\d+)", proc.stdout)
    assert nodes == [("DEVICE1", "8", "8"), ("192.168.0.1", "8", "8")]


def test_run_mpirun_2_with_a_local_hostfile(launcher: Launcher, sample: Path) -> None:
    (sample / "hostfile_local").write_text("localhost slots=2\n127.0.0.1 slots=1\n")
    proc = run_script(launcher, sample, "run_mpirun_2.sh", "./hostfile_local", NP="3")
    assert proc.returncode == 0, proc.stderr
    check_logs(sample, 3)


def test_run_mpirun_2_without_a_hostfile(launcher: Launcher, sample: Path) -> None:
    proc = run_script(launcher, sample, "run_mpirun_2.sh")
    assert proc.returncode == 2
    assert proc.stderr == "usage: bash run_mpirun_2.sh HOSTFILE [mpilaunch options]\n"


def test_job_yaml(launcher: Launcher, sample: Path) -> None:
    proc = launcher.run("--config", "job.yaml", "--dry-run", cwd=sample)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert " hosts from: hostfile hostfile; 16 slots" in out
    assert "App: 0 (python net.py --epochs 2)" in out
    assert "  OMPI_MCA_orte_abort_on_non_zero_status=1" in out
    # the command line wins: this machine instead of the hostfile, 4 ranks, this interpreter
    proc = launcher.run("--config", "job.yaml", "-H", "localhost:4", "-n", "4", sys.executable, "net.py", cwd=sample)
    assert proc.returncode == 0, proc.stderr
    check_logs(sample, 4)


def test_the_sample_hostfile_where_nobody_answers(launcher: Launcher, sample: Path) -> None:
    """Hosts that cannot be reached: one line per host, status 2, no traceback
    (paramiko logs a failed handshake with its traceback unless told not to)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]

    def drop() -> None:  # accept, then close before the SSH banner
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            client.close()

    threading.Thread(target=drop, daemon=True).start()
    (sample / "hostfile_down").write_text(f"DEVICE1.invalid slots=8\n127.0.0.1 port={port} slots=8\n")
    try:
        proc = run_script(launcher, sample, "run_mpirun_2.sh", "./hostfile_down")
    finally:
        listener.close()
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[-2].startswith("mpilaunch: DEVICE1.invalid: ssh: Could not resolve hostname devic"), proc.stderr
    assert lines[-1].startswith("mpilaunch: 127.0.0.1: "), proc.stderr  # ssh's words for a closed connection
