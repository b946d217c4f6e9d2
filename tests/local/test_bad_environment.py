"""A bad environment around the launcher (issue 35, "Never silent, never wrong", item 7): a
limit on processes or open files, a working directory that was removed. Each is one line naming
what is wrong and status 2, never a traceback; where the job did run, its status and a summary
that is true: a rank that never started is said to be so, with the reason, never a signal.

`ulimit -u` binds a normal user only (root and CAP_SYS_RESOURCE pass it), so those runs are
made as a user id of the test's own that no other process has: the limit then counts the job's
processes and threads alone.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpilaunch.host.shm import AGENTS_FOLDERS
from tests.conftest import Launcher
from tests.procs import left_in_dev_shm

PY = sys.executable
JOB = ("-n", "4", "sh", "-c", "echo hi")
# What a limit may never come out as: a traceback, a repr of the exception, a signal that no one sent.
NEVER = re.compile(r"Traceback|Error\(|Signal:|SIGKILL|local agent failed")


def their_lines(err: str) -> list[str]:
    """The launcher's own lines (the PMIx library, when it cannot start its threads, prints its
    own help text: not ours to word), without the note on ranks sharing the cores."""
    return [line for line in err.splitlines() if line.startswith("mpilaunch") and "take turns" not in line]


class Stranger:
    """A user id no process has, with a home of its own, that runs commands under a limit."""

    def __init__(self, uid: int, home: Path) -> None:
        self.uid = uid
        self.home = home

    def run(self, launcher: Launcher, limit: str, *args: str) -> subprocess.CompletedProcess:
        """`prlimit --LIMIT mpilaunch ARGS` as this user. It may read and search every file (the
        capability dac_read_search, and nothing else), so that it reaches this Python wherever it
        is installed (under /root, say); the kernel still holds it to RLIMIT_NPROC."""
        env = {**launcher.env, "HOME": str(self.home), "XDG_CACHE_HOME": str(self.home / "cache"),
               "XDG_RUNTIME_DIR": str(self.home / "run")}  # fmt: skip
        become = [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        become += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
        argv = ["setpriv", *become, "prlimit", limit, PY, "-m", "mpilaunch", *args]
        return subprocess.run(argv, env=env, cwd=self.home, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def _uids_in_use() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as handle:
                found.add(int(next(line for line in handle if line.startswith("Uid:")).split()[1]))
        except (OSError, ValueError, StopIteration):
            continue
    return found


@pytest.fixture
def stranger() -> Iterator[Stranger]:
    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("prlimit")):
        pytest.skip("needs root, setpriv(1) and prlimit(1) to run as another user under a limit")
    probe = subprocess.run(["setpriv", "--ambient-caps=+dac_read_search", "--inh-caps=+dac_read_search", "true"])
    if probe.returncode != 0:
        pytest.skip("setpriv cannot give an ambient capability here")
    uid = random.choice(sorted(set(range(200_000, 300_000)) - _uids_in_use()))
    home = Path(tempfile.mkdtemp(prefix="mpl-stranger-"))  # in /tmp: a path it can enter without its capability
    try:
        for where in (home, home / "cache", home / "run"):
            where.mkdir(mode=0o700, exist_ok=True)
            os.chown(where, uid, uid)
        yield Stranger(uid, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- ulimit -u ------------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_limit_on_processes_is_named_never_a_traceback(launcher: Launcher, stranger: Stranger, limit: int) -> None:
    """`ulimit -u N` as a normal user: before, per N, a BlockingIOError traceback (the agent's
    fork), `local agent failed: RuntimeError(...)` and ranks summarised as killed by SIGKILL,
    or a "can't start new thread" traceback (the console's writer). Now the launcher says which
    limit in its own words and exits 2, or the job runs and ends 0."""
    proc = stranger.run(launcher, f"--nproc={limit}", *JOB)
    err = proc.stderr.decode()
    assert not NEVER.search(err), err
    lines = their_lines(err)
    if proc.returncode == 0:
        assert proc.stdout == b"hi\n" * 4 and not lines, err
        return
    assert proc.returncode == 2, err
    named = [line for line in lines if line.endswith(f"too many processes (ulimit -u {limit})")]
    assert named, err
    if limit == 1:  # the launcher's own fork of this machine's agent: the only line
        assert lines == ["mpilaunch: cannot start this machine's agent: too many processes (ulimit -u 1)"]


def test_ranks_that_could_not_start_are_summarised_as_not_started(launcher: Launcher, stranger: Stranger) -> None:
    """The limit between "no rank starts" and "every rank starts": some ran, the others could not
    be started. The summary names the first that could not, as not started and why; the ranks
    it names as killed are ones that ran; the status is 2, the launcher's trouble."""
    partial, tried, limit = [], [], 4
    # The job's own threads count against the limit too, and how many are alive when the ranks
    # are forked varies from run to run (7 to 16 tasks here): the limit walks up while no rank
    # starts and down while all do, so it stays where a partial start can happen.
    while not partial and len(tried) < 40:
        proc = stranger.run(launcher, f"--nproc={limit}", *JOB)
        err = proc.stderr.decode()
        assert not NEVER.search(err), err
        tried.append(f"{limit}:{proc.returncode}")
        if "Status:    not started" in err:
            partial.append((limit, proc, err))
        limit += -1 if proc.returncode == 0 else 1
        limit = max(limit, 2)
    assert partial, f"no limit between none and all of the ranks started (limit:status {' '.join(tried)})"
    for limit, proc, err in partial:
        assert proc.returncode == 2
        summary = err[err.index("mpilaunch could not start one or more processes") :]
        assert f"  Reason:    too many processes (ulimit -u {limit})\n" in summary and "  PID:       -\n" in summary
        failed = re.search(r"  Rank:      (\d+)", summary).group(1)  # type: ignore[union-attr]
        not_started = {int(n) for n in re.findall(r"mpilaunch: rank (\d+) could not start: too many processes", err)}
        assert int(failed) == min(not_started)
        killed = re.search(r"Killed by mpilaunch: ranks? ([\d,-]+)", summary)
        if killed is not None:  # a range like 0-2: none of them is one that could not start
            shown = {int(n) for part in killed.group(1).split(",") for n in _span(part)}
            assert not shown & not_started, err


def _span(part: str) -> range:
    low, _, high = part.partition("-")
    return range(int(low), int(high or low) + 1)


# -- ulimit -n ------------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [5, 7, 9, 11, 16, 20, 24, 28, 32, 36])
def test_a_limit_on_open_files_is_named_never_a_repr(launcher: Launcher, limit: int) -> None:
    """`ulimit -n N`: before, `local agent failed: OSError(24, 'Too many open files')`, a
    traceback of the launcher's own pipe, and ranks that never started summarised as `Signal:
    SIGKILL (9)`. Now: the limit in words, status 2; or the job runs."""
    argv = ["prlimit", f"--nofile={limit}", *launcher.argv(*JOB)]
    before = set(os.listdir("/dev/shm"))  # the agents' folders: their PMIx servers', torch's error files
    proc = subprocess.run(argv, env=launcher.env, cwd=launcher.tmp_path, capture_output=True, timeout=60)
    err = proc.stderr.decode()
    assert not NEVER.search(err), err
    assert not left_in_dev_shm(before, (AGENTS_FOLDERS,), within=5.0)  # its own, or its guardian's, removed it
    lines = their_lines(err)
    if proc.returncode == 0:
        assert proc.stdout == b"hi\n" * 4 and not lines, err
        return
    assert proc.returncode == 2, err
    said = "\n".join(lines)
    if "the agent of host localhost ended before starting its ranks" in said and limit in (11, 12, 13):
        return  # the PMIx library's event loop found no descriptor and ended the agent itself ([err] above)
    assert f"too many open files (ulimit -n {limit})" in said, err


def test_a_rank_that_could_not_start_for_open_files_is_not_a_signal(launcher: Launcher) -> None:
    """Between too few descriptors for any rank and enough for all: the summary of the first
    rank that could not start says so, and why."""
    partial = []
    for limit in range(24, 50, 2):
        argv = ["prlimit", f"--nofile={limit}", *launcher.argv(*JOB)]
        proc = subprocess.run(argv, env=launcher.env, cwd=launcher.tmp_path, capture_output=True, timeout=60)
        err = proc.stderr.decode()
        assert not NEVER.search(err), err
        if "Status:    not started" in err:
            partial.append((limit, proc.returncode, err))
    assert partial, "no limit between none and all of the ranks started"
    for limit, status, err in partial:
        assert status == 2 and f"  Reason:    too many open files (ulimit -n {limit})\n" in err, err


# -- the working directory ------------------------------------------------------------------------
def run_in_removed_directory(launcher: Launcher, *args: str) -> subprocess.CompletedProcess:
    """mpilaunch ARGS started by a shell that stands in a directory it has just removed."""
    gone = launcher.tmp_path / "gone"
    gone.mkdir()
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    return subprocess.run(
        ["sh", "-c", script, "sh", str(gone), PY, "-m", "mpilaunch", *args],
        env=launcher.env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


COMMANDS = [JOB, ("--dry-run", *JOB), ("--wdir", "/tmp", *JOB), ("check",), ("allrun", "true"), ("shims", "bin"),
            ("report", "run.json", "-o", "run.html")]  # fmt: skip


def test_a_removed_working_directory_is_one_line(launcher: Launcher) -> None:
    """`cd d; rm -r ../d; mpilaunch ...` was a FileNotFoundError traceback from os.getcwd (in the
    planner, in `check`, in `shims`). Now one line, status 2, nothing started; --version and
    --help, which need no directory, still answer."""
    said = "mpilaunch: the current directory no longer exists (it was removed): cd to one that does\n"
    for args in COMMANDS:
        proc = run_in_removed_directory(launcher, *args)
        assert proc.returncode == 2 and proc.stdout == b"", (args, proc.stderr.decode())
        assert proc.stderr.decode() == said, args
    for word, first in (("--version", b"mpilaunch "), ("--help", b"Usage")):
        proc = run_in_removed_directory(launcher, word)
        assert proc.returncode == 0 and proc.stdout.startswith(first), proc
