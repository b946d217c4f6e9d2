"""Closed standard streams and a full log disk (issue "No process left, ever", parts 3 and 6).

A launcher started with 0, 1 or 2 closed runs as it would with that stream on /dev/null: before
the fix the agent's socket took descriptor 1 and console bytes went down the agent's link
(`frame length 1818848869 out of range`, status 137, 702 of 100,000 lines in the log), and
`<&-` ended in a traceback. A log file that cannot be written is named in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import Launcher
from tests.smalldisk import small_tmpfs

PY = sys.executable
RANK = (
    "import sys\n"
    "print('stdin', len(sys.stdin.read()), flush=True)\n"
    "for i in range(50000):\n"
    "    print('out', i)\n"
    "    print('err', i, file=sys.stderr)\n"
)


def _run_closed(launcher: Launcher, closed: tuple[int, ...], *args: str) -> subprocess.CompletedProcess:
    """`python -m mpilaunch ARGS` with the descriptors `closed` closed, as `<&- >&- 2>&-` do;
    the others are pipes the test reads."""
    keep = [fd for fd in (0, 1, 2) if fd not in closed]

    def close_them() -> None:
        for fd in closed:
            os.close(fd)

    return subprocess.run(
        launcher.argv(*args),
        stdin=subprocess.DEVNULL if 0 in keep else None,
        capture_output=True,
        env=launcher.env,
        cwd=launcher.tmp_path,
        timeout=120,
        preexec_fn=close_them,  # the closing is what is tested
    )


@pytest.mark.parametrize("closed", [(0,), (1,), (2,), (0, 1, 2)], ids=["stdin", "stdout", "stderr", "all"])
def test_a_closed_stream_is_as_if_on_dev_null(launcher: Launcher, tmp_path: Path, closed: tuple[int, ...]) -> None:
    proc = _run_closed(launcher, closed, "-n", "2", "--output-filename", "L", PY, "-c", RANK)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "out of range" not in err
    for rank in range(2):
        out = (tmp_path / "L" / "1" / f"rank.{rank}" / "stdout").read_text().splitlines()
        errs = (tmp_path / "L" / "1" / f"rank.{rank}" / "stderr").read_text().splitlines()
        assert out[0] == "stdin 0"  # a closed stdin is an empty one: each rank reads EOF
        assert out[1:] == [f"out {i}" for i in range(50000)]
        assert errs == [f"err {i}" for i in range(50000)]
    if 1 not in closed:  # the console still shows everything: every byte, lines in any order; a
        # partial line idle 0.25 s (a rank starved of CPU between two blocks) goes out on its own,
        # ended by a newline before the other rank's next line
        shown = Counter(proc.stdout.replace(b"\n", b""))
        assert shown == Counter(b"".join(b"stdin 0" + b"".join(b"out %d" % i for i in range(50000)) for _ in range(2)))


def test_a_full_log_disk_is_named_and_the_job_status_kept(launcher: Launcher, tmp_path: Path) -> None:
    """256 KiB of disk for 2 ranks writing about 0.8 MB each: one line per log file that filled
    up, the console still gets every line, and the status is rank 1's (3), not a crash's."""
    rank = (
        "import os, sys, time\n"
        "for i in range(80000):\n"
        "    print('line', i)\n"
        "if os.environ['OMPI_COMM_WORLD_RANK'] == '1':\n"
        "    sys.stdout.flush(); time.sleep(1); sys.exit(3)\n"
    )
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        proc = launcher.run("-n", "2", "--output-filename", str(disk / "L"), PY, "-c", rank, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 3, err
    assert "Traceback" not in err
    full = [line for line in err.splitlines() if "No space left on device" in line]
    assert full and all(line.startswith("mpilaunch: cannot write ") for line in full), err
    assert len(full) == len(set(full)) <= 2  # each file once
    assert proc.stdout.decode().count("line 79999\n") == 2
