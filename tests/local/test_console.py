"""A console that does not read never stops the launcher (issue "No process left, ever", part 2).

The launcher's stdout is the write end of a pipe that the test never reads (`... | less`, left
paused): signals, failures and timeouts are still acted on at once, the log files still get
every byte, and the console gets one notice. A console that reads slowly loses nothing: the
ranks wait for it, as they would writing to it themselves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, tagged_pids

PY = sys.executable
WRITER = str(ROOT / "tests" / "ranks" / "writer.py")
FLOOD = "100000000"  # lines: far more than a test waits for
LINE = re.compile(rb"rank (\d{4}) line (\d{8}) x{44}")


def _stalled_run(launcher: Launcher, *args: str) -> tuple[subprocess.Popen, int]:
    """The launcher with stdout on a pipe nobody reads (its read end held open by the test)."""
    read_end, write_end = os.pipe()
    proc = launcher.popen(*args, stdout=write_end)
    os.close(write_end)
    return proc, read_end


def _wait_for_lines(logs: list[Path], lines: int, within: float = 60) -> None:
    """Until each log holds `lines` lines of tests/ranks/writer.py's (69 bytes each)."""
    deadline = time.monotonic() + within
    while not all(log.exists() and log.stat().st_size > lines * 69 for log in logs):
        assert time.monotonic() < deadline, [log.stat().st_size if log.exists() else None for log in logs]
        time.sleep(0.05)


def _lines_in_order(path: Path, rank: int) -> int:
    """Every line of a rank's log whole and in order (a cut last line allowed: the rank was
    killed mid-write); the number of whole lines."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    for i, line in enumerate(lines[:-1]):
        match = LINE.fullmatch(line)
        assert match and int(match.group(1)) == rank and int(match.group(2)) == i, (i, line[:80])
    return len(lines) - 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_acted_on_while_the_console_does_not_read(launcher: Launcher, tmp_path: Path, sig: int) -> None:
    proc, read_end = _stalled_run(launcher, "-n", "2", "--output-filename", "out", PY, WRITER, FLOOD)
    try:
        logs = [tmp_path / "out" / "1" / f"rank.{rank}" / "stdout" for rank in range(2)]
        _wait_for_lines(logs, 100_001)  # far past the pipe (64 KiB) and the 4 MiB backlog
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        os.close(read_end)
    assert proc.returncode == 128 + sig, err.decode()
    assert took < 2.0, f"the launcher took {took:.2f} s to act on the signal"
    text = err.decode()
    assert text.count("the console is not reading") == 1, text
    assert "mpilaunch/" not in text  # no traceback of the launcher's (a Python rank's SIGINT may print one)
    for rank in range(2):  # the log files got every line the rank wrote, whole and in order
        assert _lines_in_order(tmp_path / "out" / "1" / f"rank.{rank}" / "stdout", rank) > 100_000


def _ranks_gone(launcher: Launcher, launcher_pid: int, within: float) -> float:
    """Seconds until no process of the test's tag is left but the launcher itself (its ranks
    and its agent ended), at most `within`."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if not [pid for pid in tagged_pids(launcher.tag) if pid != launcher_pid]:
            return time.monotonic() - started
        time.sleep(0.02)
    return within


def _drain(read_end: int) -> bytes:
    data = bytearray()
    while chunk := os.read(read_end, 1 << 16):
        data += chunk
    os.close(read_end)
    return bytes(data)


@pytest.mark.parametrize("end", ["failure", "timeout"])
def test_a_failure_or_a_timeout_is_acted_on_while_the_console_does_not_read(
    launcher: Launcher, tmp_path: Path, end: str
) -> None:
    """The ranks are killed on time although the console has not read for a while; the launcher
    then waits for the console, as any program's last write does, and when it reads, it gets
    whole lines and the exit status says what happened."""
    if end == "failure":
        fail = "import sys, time; time.sleep(1.5); sys.exit(3)"
        args = ("--kill-timeout", "0.5", "-n", "1", PY, WRITER, FLOOD, ":", "-n", "1", PY, "-c", fail)
    else:
        args = ("--timeout", "1.5", "--kill-timeout", "0.5", "-n", "1", PY, WRITER, FLOOD)
    proc, read_end = _stalled_run(launcher, *args)
    try:
        took = _ranks_gone(launcher, proc.pid, within=10.0)
        assert took < 3.5, f"the ranks ended {took:.2f} s after start ({end} at 1.5 s)"
        console = _drain(read_end)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    text = err.decode()
    if end == "failure":
        assert proc.returncode == 3, text
    else:
        assert proc.returncode != 0 and "exceeded --timeout 1.5 s" in text, text
    for line in console.split(b"\n")[:-1]:  # rank 0's lines, one cut short where the console's copy was dropped
        assert LINE.fullmatch(line) or (line.count(b"rank ") <= 1 and len(line) < 70), line[:80]


def test_a_slow_console_loses_nothing(launcher: Launcher, tmp_path: Path) -> None:
    """8 MB of output (twice the backlog limit) read at about 3 MB/s: every line on the console,
    in order, and no notice; the ranks waited for the reader."""
    lines = 120_000  # 8.4 MB
    proc = launcher.popen("-n", "1", PY, WRITER, str(lines))
    got = bytearray()

    def read_slowly() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(1 << 16):  # type: ignore[attr-defined]
            got.extend(chunk)
            time.sleep(0.02)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.wait(timeout=120)
    reader.join(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"not reading" not in err
    seen = got.split(b"\n")
    assert seen[-1] == b"" and len(seen) - 1 == lines
    for i, line in enumerate(seen[:-1]):
        match = LINE.fullmatch(line)
        assert match and int(match.group(2)) == i, (i, line[:80])
