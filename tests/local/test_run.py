"""End-to-end runs of the mpilaunch command: variables, logs, console, MPMD, arguments, stdin."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, write_script

RANKS = ROOT / "tests" / "ranks"
PY = sys.executable


def load(outdir: Path, np: int) -> list[dict]:
    return [json.loads((outdir / f"{r}.json").read_text()) for r in range(np)]


def test_variables_of_every_rank(launcher: Launcher, tmp_path: Path) -> None:
    """localhost and 127.0.0.1 are the same machine: one node, local ranks 0..3, one device each."""
    out = tmp_path / "env"
    out.mkdir()
    proc = launcher.run("-H", "localhost:2,127.0.0.1:2", "-np", "4", PY, str(RANKS / "dump_env.py"), str(out))
    assert proc.returncode == 0, proc.stderr
    records = load(out, 4)
    ports = {r["env"]["MASTER_PORT"] for r in records}
    jobs = {r["env"]["MPILAUNCH_JOB_ID"] for r in records}
    assert len(ports) == 1 and ports.pop().isdigit()
    assert len(jobs) == 1 and jobs.pop()
    for rank, rec in enumerate(records):
        env = rec["env"]
        expected = {
            "OMPI_COMM_WORLD_RANK": rank,
            "OMPI_COMM_WORLD_SIZE": 4,
            "OMPI_COMM_WORLD_LOCAL_RANK": rank,
            "OMPI_COMM_WORLD_LOCAL_SIZE": 4,
            "OMPI_COMM_WORLD_NODE_RANK": rank,
            "OMPI_UNIVERSE_SIZE": 4,
            "OMPI_NUM_APP_CTX": 1,
            "OMPI_APP_CTX_NUM_PROCS": 4,
            "OMPI_FIRST_RANKS": 0,
            "OMPI_MCA_orte_app_num": 0,
            "PMI_RANK": rank,
            "PMI_SIZE": 4,
            "RANK": rank,
            "WORLD_SIZE": 4,
            "LOCAL_RANK": rank,
            "LOCAL_WORLD_SIZE": 4,
            "NODE_RANK": 0,
            "GROUP_RANK": 0,
            "RANK_ID": rank,
            "RANK_SIZE": 4,
            "DEVICE_ID": rank,
            "MASTER_ADDR": "127.0.0.1",
            "PYTHONUNBUFFERED": 1,
        }
        assert {k: env.get(k) for k in expected} == {k: str(v) for k, v in expected.items()}


def test_variables_across_hosts_in_a_dry_run(launcher: Launcher) -> None:
    proc = launcher.run("--dry-run", "-H", "a:2,b:2", "-np", "4", "--map-by", "node", "true")
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.decode().split("\nrank ")[1:]
    got = []
    for block in blocks:
        env = dict(line.strip().split("=", 1) for line in block.splitlines()[1:])
        host = block.split(" on ", 1)[1].split(":", 1)[0]
        keys = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "DEVICE_ID", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
        got.append((host, *(env[k] for k in keys)))
    assert got == [
        ("a", "0", "0", "0", "0", "0", "2", "a"),
        ("b", "1", "0", "1", "1", "0", "2", "a"),
        ("a", "2", "1", "0", "0", "1", "2", "a"),
        ("b", "3", "1", "1", "1", "1", "2", "a"),
    ]


def test_default_np_is_every_slot(launcher: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    proc = launcher.run(PY, str(RANKS / "dump_env.py"), str(out))
    assert proc.returncode == 0, proc.stderr
    cores = os.cpu_count()
    assert sorted(p.name for p in out.iterdir()) == [f"{r}.json" for r in range(cores)]
    assert load(out, cores)[0]["env"]["OMPI_COMM_WORLD_SIZE"] == str(cores)


def test_user_values_win_and_outer_launcher_variables_do_not_leak(launcher: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    outer = {
        "MASTER_PORT": "23456",
        "MASTER_ADDR": "10.1.2.3",
        "PYTHONUNBUFFERED": "0",
        "PMI_FD": "7",
        "PMI_RANK": "99",
        "PMIX_NAMESPACE": "outer",
        "PMIX_RANK": "3",
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_FOO": "x",
        "OMPI_MCA_orte_hnp_uri": "outer",
        "CUDA_VISIBLE_DEVICES": "2,3",
    }
    proc = launcher.run(
        "-n", "2", "-x", "DEVICE_ID=7", "-x", "FROM_X=a=b", "-x", "CUDA_VISIBLE_DEVICES",
        "-mca", "btl", "self,tcp",
        PY, str(RANKS / "dump_env.py"), str(out),
        env=outer,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for rank, rec in enumerate(load(out, 2)):
        env = rec["env"]
        assert env["MASTER_PORT"] == "23456" and env["MASTER_ADDR"] == "10.1.2.3"
        assert env["PYTHONUNBUFFERED"] == "0"
        assert env["DEVICE_ID"] == "7" and env["FROM_X"] == "a=b"
        assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
        assert env["OMPI_MCA_btl"] == "self,tcp"
        assert env["PMI_RANK"] == str(rank) and env["OMPI_COMM_WORLD_RANK"] == str(rank)
        leaked = [k for k in env if k.startswith("PMIX_") or k in ("OMPI_COMM_WORLD_FOO", "OMPI_MCA_orte_hnp_uri")]
        assert leaked == []
        assert env["PMI_FD"] != "7"  # its own PMI socket, not the outer launcher's


def test_log_tree_of_ten_ranks_is_byte_exact(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "bytes.py",
        "import os, sys\n"
        "r = int(os.environ['RANK'])\n"
        "sys.stdout.buffer.write(b'out %d\\n' % r + bytes(range(256)) + b'\\r\\nno newline at end')\n"
        "sys.stderr.buffer.write(b'err %d\\n' % r * 3)\n",
    )
    proc = launcher.run("-n", "10", "--oversubscribe", "--output-filename", "log_output", PY, script)
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "log_output" / "1"
    assert str(root) in proc.stderr.decode()
    assert sorted(p.name for p in root.iterdir()) == [f"rank.{r:02d}" for r in range(10)]
    for r in range(10):
        rank_dir = root / f"rank.{r:02d}"
        assert sorted(p.name for p in rank_dir.iterdir()) == ["stderr", "stdout"]
        assert (rank_dir / "stdout").read_bytes() == b"out %d\n" % r + bytes(range(256)) + b"\r\nno newline at end"
        assert (rank_dir / "stderr").read_bytes() == b"err %d\n" % r * 3
    assert b"no newline at end" in proc.stdout


def test_merged_streams_write_only_stdout(launcher: Launcher, tmp_path: Path) -> None:
    proc = launcher.run(
        "-np", "2", "--output-filename", "logs", "--merge-stderr-to-stdout",
        "sh", "-c", "echo out $RANK; echo err $RANK >&2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        rank_dir = tmp_path / "logs" / "1" / f"rank.{r}"
        assert [p.name for p in rank_dir.iterdir()] == ["stdout"]
        assert (rank_dir / "stdout").read_text() == f"out {r}\nerr {r}\n"


def test_tag_and_timestamp_prefixes(launcher: Launcher) -> None:
    proc = launcher.run("-np", "2", "--tag-output", "sh", "-c", "echo a$RANK; echo b$RANK >&2")
    assert proc.returncode == 0
    assert sorted(proc.stdout.decode().splitlines()) == ["[1,0]<stdout>:a0", "[1,1]<stdout>:a1"]
    assert sorted(proc.stderr.decode().splitlines()) == ["[1,0]<stderr>:b0", "[1,1]<stderr>:b1"]
    proc = launcher.run("-np", "1", "--timestamp-output", "--tag-output", "echo", "hi")
    line = proc.stdout.decode().strip()
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[1,0\]<stdout>:hi", line), line


def test_console_never_mixes_two_ranks_in_a_line(launcher: Launcher, tmp_path: Path) -> None:
    lines = 20000
    proc = launcher.run(
        "-np", "4", "--oversubscribe", "--output-filename", "out", PY, str(RANKS / "writer.py"), str(lines),
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pattern = re.compile(rb"rank (\d{4}) line (\d{8}) x{44}")
    seen: dict[int, int] = {r: 0 for r in range(4)}
    bad = 0
    for line in proc.stdout.split(b"\n")[:-1]:
        match = pattern.fullmatch(line)
        if not match:
            bad += 1
            continue
        rank, index = int(match.group(1)), int(match.group(2))
        assert index == seen[rank], "a rank's lines arrived out of order"
        seen[rank] += 1
    assert bad == 0
    assert seen == {r: lines for r in range(4)}
    for r in range(4):
        data = (tmp_path / "out" / "1" / f"rank.{r}" / "stdout").read_bytes()
        assert data.count(b"\n") == lines and data.startswith(b"rank %04d line 00000000 " % r)


def test_partial_lines_are_flushed_after_a_short_idle(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "partial.py",
        "import os, sys, time\n"
        "r = os.environ['RANK']\n"
        "if r == '0':\n"
        "    sys.stdout.write('prompt> '); sys.stdout.flush(); time.sleep(1.5); print('answer')\n"
        "else:\n"
        "    time.sleep(0.8); print('other rank line')\n",
    )
    proc = launcher.popen("-np", "2", PY, script)
    start = time.monotonic()
    assert proc.stdout is not None
    first = os.read(proc.stdout.fileno(), 100)
    assert first == b"prompt> " and time.monotonic() - start < 1.2
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert (first + rest).decode().splitlines() == ["prompt> ", "other rank line", "answer"]


def test_mpmd_app_contexts(launcher: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    dump = str(RANKS / "dump_env.py")
    proc = launcher.run(
        "--oversubscribe", "-np", "1", PY, dump, str(out), "server", ":", "-np", "2", "-x", "ROLE=worker",
        PY, dump, str(out), "worker",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = load(out, 3)
    assert [r["argv"] for r in records] == [["server"], ["worker"], ["worker"]]
    assert [r["env"].get("ROLE") for r in records] == [None, "worker", "worker"]  # -x after ' : ': that program's
    for rec in records:
        env = rec["env"]
        assert env["OMPI_NUM_APP_CTX"] == "2"
        assert env["OMPI_APP_CTX_NUM_PROCS"] == "1 2"
        assert env["OMPI_FIRST_RANKS"] == "0 1"
        assert env["OMPI_COMM_WORLD_SIZE"] == "3"


def test_arguments_after_the_program_belong_to_it(launcher: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    args = ["-n", "5", "--lr", "0.1", "", "a b", "$(id)", "'\"", ";", "-x", "--output-filename", "x"]
    proc = launcher.run("-n", "2", PY, str(RANKS / "dump_env.py"), str(out), *args)
    assert proc.returncode == 0, proc.stderr
    assert [r["argv"] for r in load(out, 2)] == [args, args]
    assert not (tmp_path / "x").exists()


def test_working_directory(launcher: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    work = tmp_path / "work dir"
    work.mkdir()
    proc = launcher.run("-n", "1", "--wdir", str(work), PY, str(RANKS / "dump_env.py"), str(out))
    assert proc.returncode == 0, proc.stderr
    assert load(out, 1)[0]["cwd"] == str(work)
    proc = launcher.run("-n", "1", "-wdir", str(tmp_path / "missing"), "true")
    assert proc.returncode == 2 and b"does not exist" in proc.stderr


def test_stdin_goes_to_rank_zero_by_default(launcher: Launcher) -> None:
    cmd = ["-np", "2", "sh", "-c", 'echo "$RANK:$(cat)"']
    proc = launcher.run(*cmd, input=b"hello\nworld", stdin=None)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().splitlines()) == ["0:hello", "1:", "world"]
    proc = launcher.run("--stdin", "all", *cmd, input=b"x", stdin=None)
    assert sorted(proc.stdout.decode().splitlines()) == ["0:x", "1:x"]
    proc = launcher.run("--stdin", "1", *cmd, input=b"y", stdin=None)
    assert sorted(proc.stdout.decode().splitlines()) == ["0:", "1:y"]
    proc = launcher.run("--stdin", "none", *cmd, input=b"z", stdin=None)
    assert sorted(proc.stdout.decode().splitlines()) == ["0:", "1:"]


def test_stdin_from_a_file_and_a_rank_that_never_reads(launcher: Launcher, tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"z" * (8 << 20))
    with big.open("rb") as handle:
        proc = launcher.run("-np", "1", "sh", "-c", "wc -c", stdin=handle)
    assert proc.stdout.decode().split() == [str(8 << 20)]
    with big.open("rb") as handle:
        proc = launcher.run("-np", "1", "sh", "-c", "sleep 0.5; echo done", stdin=handle)
    assert proc.returncode == 0 and proc.stdout == b"done\n"


def test_dry_run_prints_map_and_variables_and_starts_nothing(launcher: Launcher, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    proc = launcher.run(
        "--dry-run", "-H", "a:2,b:2", "-np", "3", "--map-by", "node", "-x", "API_TOKEN=hunter2",
        "touch", str(marker),
    )  # fmt: skip
    text = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert "Data for node: a" in text and "Data for node: b" in text
    assert re.search(r"rank 0 on a:.*?OMPI_COMM_WORLD_RANK=0", text, re.S)
    assert re.search(r"rank 1 on b:", text) and re.search(r"rank 2 on a:", text)
    assert "API_TOKEN=****" in text and "hunter2" not in text


def test_display_map_then_runs(launcher: Launcher) -> None:
    proc = launcher.run("--display-map", "-np", "2", "echo", "ran")
    text = proc.stdout.decode()
    assert proc.returncode == 0
    assert "JOB MAP" in text and text.count("ran\n") == 2


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["-np", "3", "-H", "localhost:2", "true"],
            "There are not enough slots available in the system to satisfy the 3 slots",
        ),
        (["-np", "2", "no-such-program-xyz"], "not found"),
        (["--bogus", "true"], "No such option"),
        (["-np"], "requires an argument"),
        (["-np", "0", "true"], "-np"),
        (["--map-by", "diagonal", "true"], "--map-by"),
        (["--bind-to", "planet", "true"], "--bind-to"),
        (["--stdin", "five", "true"], "--stdin"),
        (["-x", "1BAD=2", "true"], "not a variable name"),
        (["-np", "2", "--stdin", "4", "true"], "--stdin 4"),
        ([], "no program given"),
        (["-n", "1", "true", ":", "-n", "1"], "no program given in app context 2"),
        (["--hostfile", "/nonexistent/hosts", "true"], "/nonexistent/hosts"),
        (["--output-filename", "/proc/forbidden", "-n", "1", "true"], "--output-filename"),
        (["-H", "remote-host:2", "-n", "1", "true"], "remote-host: ssh: Could not resolve hostname remote-host"),
    ],
)
def test_bad_input_is_one_line_and_status_2(launcher: Launcher, args: list[str], words: str) -> None:
    proc = launcher.run(*args)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert words in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check only applies to root")
def test_root_needs_no_flag_and_the_flag_stays_accepted(launcher: Launcher) -> None:
    """As root (containers, CI), a job runs as hydra's and torchrun's do: no --allow-run-as-root;
    Open MPI's flag and variables are still taken."""
    env = {k: v for k, v in launcher.env.items() if not k.startswith("OMPI_ALLOW")}
    for flags in ([], ["--allow-run-as-root"], ["-allow-run-as-root"]):
        proc = subprocess.run(launcher.argv(*flags, "-n", "1", "true"), capture_output=True, env=env, timeout=30)
        assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
    proc = subprocess.run(launcher.argv("-n", "1", "true"), capture_output=True, env=launcher.env, timeout=30)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr


def test_version_and_help() -> None:
    proc = subprocess.run([PY, "-m", "mpilaunch", "--version"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and re.fullmatch(r"mpilaunch \d+\.\d+\.\d+\n", proc.stdout)
    proc = subprocess.run([PY, "-m", "mpilaunch", "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    for word in ("--hostfile", "--map-by", "--output-filename", "Examples:", "mpilaunch -n 8 python net.py"):
        assert word in proc.stdout


def test_bind_to_core_sets_affinity(launcher: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    proc = launcher.run("-n", "2", "--bind-to", "core", "--report-bindings", PY, str(RANKS / "dump_env.py"), str(out))
    assert proc.returncode == 0, proc.stderr
    sets = [r["affinity"] for r in load(out, 2)]
    assert all(sets) and not set(sets[0]) & set(sets[1])
    assert b"MCW rank 0 bound to socket 0[core " in proc.stderr and b"MCW rank 1 bound to socket 0[core " in proc.stderr
    proc = launcher.run("-n", "2", "-bind-to", "none", PY, str(RANKS / "dump_env.py"), str(out))
    assert [r["affinity"] for r in load(out, 2)] == [sorted(os.sched_getaffinity(0))] * 2


def test_output_filename_nocopy_keeps_the_console_quiet(launcher: Launcher, tmp_path: Path) -> None:
    proc = launcher.run("-np", "2", "--output-filename", "quiet:nocopy", "sh", "-c", "echo out $RANK; echo err >&2")
    assert proc.returncode == 0 and proc.stdout == b""
    assert b"err" not in proc.stderr
    assert (tmp_path / "quiet" / "1" / "rank.1" / "stdout").read_bytes() == b"out 1\n"


def test_dry_run_into_a_closed_pipe_is_quiet(launcher: Launcher) -> None:
    cmd = " ".join(launcher.argv("--dry-run", "--oversubscribe", "-np", "64", "true"))
    proc = subprocess.run(["bash", "-c", f"{cmd} | head -1"], capture_output=True, env=launcher.env, timeout=60)
    assert proc.stdout.count(b"\n") == 1 and b"Traceback" not in proc.stderr
