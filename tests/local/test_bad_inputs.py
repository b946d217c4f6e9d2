"""Bad input, run for real: one line, status 2 (or the job's own status), never a traceback, and
nothing echoed whole that is huge (issue "No process left, ever", part 6)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import Launcher

PY = sys.executable


def one_line(err: bytes) -> str:
    text = err.decode()
    assert "Traceback" not in text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text[:2000]
    return lines[0]


def test_a_5_mb_host_name(launcher: Launcher, tmp_path: Path) -> None:
    """In a hostfile; on the command line 100 KB (one argument can be at most 128 KiB)."""
    name = "a" * 5_000_000
    proc = launcher.run("-H", name[:100_000], "-n", "1", "true")
    assert proc.returncode == 2 and len(one_line(proc.stderr)) < 300
    (tmp_path / "hf").write_text(f"{name} slots=1\n")
    proc = launcher.run("--hostfile", "hf", "-n", "1", "true")
    line = one_line(proc.stderr)
    assert proc.returncode == 2 and "hf:1: invalid host name" in line and len(line) < 300


def test_working_directory_empty_or_not_a_directory(launcher: Launcher) -> None:
    proc = launcher.run("--wdir", "", "-n", "1", "true")
    assert proc.returncode == 2 and one_line(proc.stderr) == "mpilaunch: --wdir: the directory name is empty"
    proc = launcher.run("--wdir", "/etc/passwd", "-n", "1", "true")
    assert proc.returncode == 2
    assert one_line(proc.stderr) == "mpilaunch: working directory '/etc/passwd' is not a directory"


def test_a_2_mb_argv_is_cut_in_the_failure_summary(launcher: Launcher) -> None:
    """1.5 MB of arguments (as much as the kernel lets a command line hold, with the environment)."""
    proc = launcher.run("-n", "1", PY, "-c", "import sys; sys.exit(3)", *["z" * 100_000] * 15)
    err = proc.stderr.decode()
    assert proc.returncode == 3, err[:2000]
    command = next(line for line in err.splitlines() if line.startswith("  Command:"))
    assert len(command) < 500 and "characters)" in command
    assert len(err) < 10_000
