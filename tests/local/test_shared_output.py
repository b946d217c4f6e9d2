"""Streams that resolve to one file ("Never silent, never wrong"): every byte is kept, in whole
lines per rank and stream as the console keeps them, or the job is refused before it starts in one
line (status 2).

hydra's -outfile-pattern/-errfile-pattern naming one file (`out.%h`, no %r, the same file under
two names) keep everything; a pattern that is a file of the log tree, the launcher's own stdout or
a file another job is writing is refused. torchrun's launchers of one job's nodes share one
--log-dir; two jobs in one log tree are refused (tests/local/test_hostile_files.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from tests.conftest import Launcher, write_script
from tests.smalldisk import small_tmpfs

PY = sys.executable
HANG = 120

# Whole lines per write, each under PIPE_BUF: the rank's pipe never holds a line cut in two, so
# no line waits for its end long enough to be let go by itself (what the console does with a
# line that stays partial IDLE_FLUSH seconds), and every line must come out whole.
LINES = """
import os, sys
rank, count = os.environ["RANK"], int(sys.argv[1])
lines = [f"{rank} {k}\\n" for k in range(count)]
for at in range(0, count, 50):
    os.write(1, "".join(lines[at : at + 50]).encode())
"""


def wait_for(path: Path, text: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + HANG
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline and (proc is None or proc.poll() is None), f"{text!r} never in {path}"
        time.sleep(0.02)


def per_rank(text: str) -> dict[str, list[int]]:
    """Each line `RANK K` by rank, in file order; any other line fails."""
    seen: dict[str, list[int]] = defaultdict(list)
    for line in text.splitlines():
        rank, number = line.split(" ")
        seen[rank].append(int(number))
    return seen


def test_four_ranks_in_one_pattern_file_keep_every_line_whole(launcher: Launcher, tmp_path: Path) -> None:
    """`-outfile-pattern out.%h`: four ranks on one host, one file. It held 3,000 of 12,000 lines
    (each rank wrote it from offset 0); now every line of every rank, in each rank's order."""
    script = write_script(tmp_path, "lines.py", LINES)
    proc = launcher.run("-n", "4", "-outfile-pattern", "out.%h", PY, script, "3000", timeout=HANG)
    assert proc.returncode == 0 and proc.stdout == b"", proc.stderr.decode()
    (out,) = tmp_path.glob("out.*")
    text = out.read_text()
    assert text.endswith("\n") and per_rank(text) == {str(r): list(range(3000)) for r in range(4)}


def test_two_ranks_in_one_named_file_are_both_kept(launcher: Launcher, tmp_path: Path) -> None:
    """`-n 2 -outfile-pattern same.out`: rank 1's output was gone."""
    script = write_script(tmp_path, "lines.py", LINES)
    proc = launcher.run("-n", "2", "-outfile-pattern", "same.out", PY, script, "500", timeout=HANG)
    assert proc.returncode == 0, proc.stderr.decode()
    assert per_rank((tmp_path / "same.out").read_text()) == {"0": list(range(500)), "1": list(range(500))}


SPEAKER = """
import os, sys, time
rank = os.environ["RANK"]

def wait(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(name) and time.monotonic() < deadline:
        time.sleep(0.01)

os.write(1, f"partial {rank}, ".encode())   # held, then let go while the rank waits
wait(f"go1.{rank}")
os.write(2, f"err {rank}\\n".encode())      # another stream: its own line
wait(f"go2.{rank}")
os.write(1, f"end {rank}\\n".encode())
"""


def test_stdout_and_stderr_patterns_naming_one_file_by_two_names(launcher: Launcher, tmp_path: Path) -> None:
    """One file as `out.%r`, `./out.%r` and a link to it: one descriptor, each stream's lines
    whole. A partial line that waits is written (the console's idle flush), and the other
    stream's line starts on a line of its own. Before: three descriptors overwrote each other."""
    script = write_script(tmp_path, "speaker.py", SPEAKER)
    for rank in (0, 1):
        (tmp_path / f"link.{rank}").symlink_to(f"out.{rank}")
    for err_pattern in ("./out.%r", "link.%r"):
        words = ("-n", "2", "-outfile-pattern", "out.%r", "-errfile-pattern", err_pattern, PY, script)
        proc = launcher.popen(*words)
        try:
            for rank in (0, 1):
                out = tmp_path / f"out.{rank}"
                wait_for(out, f"partial {rank}, ", proc)
                (tmp_path / f"go1.{rank}").touch()
                wait_for(out, f"err {rank}\n", proc)
                (tmp_path / f"go2.{rank}").touch()
            _, err = proc.communicate(timeout=HANG)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err.decode()
        for rank in (0, 1):
            assert (tmp_path / f"out.{rank}").read_text() == f"partial {rank}, \nerr {rank}\nend {rank}\n"
            for name in (f"go1.{rank}", f"go2.{rank}", f"out.{rank}"):  # the next round waits for its own
                (tmp_path / name).unlink()


def test_partial_last_lines_of_ranks_sharing_a_file_are_kept(launcher: Launcher, tmp_path: Path) -> None:
    """Ranks that end on a line without its newline: each one's is kept, on a line of its own."""
    words = ("-n", "3", "-outfile-pattern", "shared.out", "sh", "-c", 'echo "whole $RANK"; printf "tail $RANK"')
    proc = launcher.run(*words)
    assert proc.returncode == 0, proc.stderr.decode()
    text = (tmp_path / "shared.out").read_text()
    assert sorted(text.split("\n")) == sorted(f"{kind} {r}" for kind in ("whole", "tail") for r in range(3)), text
    for rank in range(3):
        assert text.index(f"whole {rank}") < text.index(f"tail {rank}")


def test_a_pattern_naming_a_log_tree_file_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    """-outfile-pattern logs/1/rank.%r/stdout with --output-filename logs: two descriptors on one
    file (and rank 1's lines in rank 0's file, without %r). Refused, before the tree is emptied."""
    first = launcher.run("-n", "2", "--output-filename", "logs", "sh", "-c", "echo before $RANK")
    assert first.returncode == 0, first.stderr.decode()
    for pattern in ("logs/1/rank.%r/stdout", "logs/1/rank.0/stdout"):
        proc = launcher.run("-q", "-n", "2", "--output-filename", "logs", "-outfile-pattern", pattern, "touch", "ran")
        tree = tmp_path / "logs" / "1" / "rank.0" / "stdout"
        assert proc.returncode == 2 and not (tmp_path / "ran").exists()
        assert proc.stderr.decode() == (
            f"mpilaunch: -outfile-pattern {pattern}: logs/1/rank.0/stdout is the same file as {tree} of "
            "--output-filename logs; two writers of one file overwrite each other's lines: name another file\n"
        )
        assert tree.read_text() == "before 0\n"


def test_a_pattern_naming_the_launchers_own_stdout_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    """`mpiexec -outfile-pattern run.log ... > run.log`: the ranks' lines and the launcher's
    would overwrite each other."""
    with open(tmp_path / "run.log", "wb") as stdout:
        words = launcher.argv("-n", "1", "-outfile-pattern", "./run.log", "touch", "ran")
        proc = subprocess.run(
            words, stdout=stdout, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=tmp_path, env=launcher.env
        )
    assert proc.returncode == 2 and not (tmp_path / "ran").exists()
    assert proc.stderr.decode() == (
        "mpilaunch: -outfile-pattern ./run.log: ./run.log is the same file as this launcher's own stdout; "
        "two writers of one file overwrite each other's lines: name another file\n"
    )


def test_a_second_job_on_a_pattern_file_is_refused_naming_the_first(launcher: Launcher, tmp_path: Path) -> None:
    """Two jobs with the same -outfile-pattern at once: the second emptied the first's file and
    both wrote it from their own offsets. The second is refused in one line naming the first."""
    script = write_script(tmp_path, "speaker.py", SPEAKER)
    first = launcher.popen("-n", "1", "-outfile-pattern", "same.out", PY, script)
    try:
        wait_for(tmp_path / "same.out", "partial 0, ", first)
        proc = launcher.run("-n", "1", "-outfile-pattern", str(tmp_path / "same.out"), "touch", "ran")
        assert proc.returncode == 2 and not (tmp_path / "ran").exists()
        assert proc.stderr.decode() == (
            f"mpilaunch: -outfile-pattern {tmp_path / 'same.out'}: {tmp_path / 'same.out'} is being written by "
            f"another job (pid {first.pid}); two jobs in one file lose lines: wait for it to end, or name another "
            "file\n"
        )
        (tmp_path / "go1.0").touch()
        (tmp_path / "go2.0").touch()
        _, err = first.communicate(timeout=HANG)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err.decode()
    assert (tmp_path / "same.out").read_text() == "partial 0, end 0\n"
    again = launcher.run("-n", "1", "-outfile-pattern", "same.out", "echo", "next")  # the lock went with its job
    assert again.returncode == 0 and (tmp_path / "same.out").read_text() == "next\n", again.stderr.decode()


def test_a_hard_link_inside_the_log_tree_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    """rank.1/stdout planted as a hard link to rank.0/stdout: two ranks' descriptors on one file."""
    rank0, rank1 = (tmp_path / "logs" / "1" / f"rank.{r}" for r in (0, 1))
    rank0.mkdir(parents=True)
    rank1.mkdir()
    (rank0 / "stdout").write_text("kept\n")
    os.link(rank0 / "stdout", rank1 / "stdout")
    proc = launcher.run("-n", "2", "--output-filename", "logs", "touch", "ran")
    assert proc.returncode == 2 and not (tmp_path / "ran").exists()
    assert proc.stderr.decode() == (
        f"mpilaunch: --output-filename logs: {rank1 / 'stdout'} is the same file as {rank0 / 'stdout'} of "
        "--output-filename logs; two writers of one file overwrite each other's lines: name another file\n"
    )
    assert (rank0 / "stdout").read_text() == "kept\n"


def test_a_full_disk_under_a_shared_pattern_file_is_said_once(launcher: Launcher, tmp_path: Path) -> None:
    """A pattern file that fills its disk: one line naming it, the status stays the ranks'. Before:
    the rest of the output was lost without a word."""
    script = write_script(tmp_path, "lines.py", LINES)
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        proc = launcher.run("-n", "2", "-outfile-pattern", "disk/out", PY, script, "20000", timeout=HANG)
        full = os.statvfs(disk).f_bfree == 0
    said = "mpilaunch: cannot write disk/out: No space left on device; the rest of that output is not kept\n"
    assert proc.returncode == 0 and full and proc.stderr.decode().count(said) == 1, proc.stderr.decode()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_torchruns_node_launchers_share_one_log_dir(launcher: Launcher, tmp_path: Path) -> None:
    """torchrun's way on a shared file system: one launcher per node, one --log-dir (and -r 3: the
    output in the files only). Each writes its own ranks' directories, so both run (the second was
    refused as a second job); a job whose ranks are theirs is still refused while they run."""
    script = write_script(tmp_path, "lines.py", LINES)
    hold = write_script(tmp_path, "hold.py", "import os, time\nwhile not os.path.exists('go'): time.sleep(0.01)\n")
    port = str(_free_port())
    nodes = [
        launcher.popen(
            *("--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port),
            *("--nproc-per-node", "2", "--log-dir", "logs", "-r", "3", "--no-python", "sh", "-c"),
            f"{PY} {script} 1000 && {PY} {hold}",
        )
        for node in (0, 1)
    ]
    try:
        for rank in range(4):
            wait_for(tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout", f"{rank} 999\n", nodes[rank // 2])
        other = launcher.run("-n", "1", "--output-filename", "logs", "touch", "ran")
        assert other.returncode == 2 and not (tmp_path / "ran").exists()
        assert "--output-filename logs: job " in other.stderr.decode(), other.stderr.decode()
        (tmp_path / "go").touch()
        outs = [node.communicate(timeout=HANG) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    for node, (out, err) in zip(nodes, outs):
        assert node.returncode == 0 and out == b"", err.decode()[-3000:]  # -r 3: the files only
    for rank in range(4):
        kept = per_rank((tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout").read_text())
        assert kept == {str(rank): list(range(1000))}
    assert os.listdir(tmp_path / "logs") == ["1"]  # the last node's launcher removed the lock's file
