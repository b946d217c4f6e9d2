"""How a failed rank died, named in the summary and in --report-json: the kernel's out-of-memory
killer (a rank that moves itself into a memory cgroup of 100 MiB, made here, and allocates
500 MiB), the core file a crashing rank left, and the Python exception a rank raised."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpilaunch.agent.death import cgroup_dir, cgroup_mounts, core_place, memory_cgroup
from tests.conftest import Launcher, write_script

PY = sys.executable
MIB = 1 << 20
RULE = "-" * 74


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def make_memory_cgroup(name: str, limit: int) -> tuple[str, int] | str:
    """A memory cgroup below this process's own, limited to `limit` bytes with no swap:
    (its directory, cgroup version), or why none can be made here."""
    found = memory_cgroup(_read("/proc/self/cgroup"))
    mount = cgroup_mounts(_read("/proc/self/mountinfo")).get(found[0]) if found else None
    parent = cgroup_dir(mount, found[1]) if found and mount else None
    if parent is None:
        return "no memory cgroup controller is mounted here (neither v1's nor v2's)"
    path = os.path.join(parent, name)
    try:
        os.mkdir(path)
    except OSError as exc:
        return f"cannot make a cgroup below {parent}: {exc.strerror}"
    version = found[0]  # type: ignore[index]
    files = (
        ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"] if version == 1 else ["memory.max", "memory.swap.max"]
    )
    try:
        _write(os.path.join(path, files[0]), str(limit))
        swap = os.path.join(path, files[1])
        if os.path.exists(swap):  # v1 memsw: limit + swap, the same: no swap; v2: swap alone
            _write(swap, str(limit) if version == 1 else "0")
    except OSError as exc:
        os.rmdir(path)
        why = "no memory controller in it (v2: not in the parent's cgroup.subtree_control)"
        return f"cannot limit the memory of {path}: {why if exc.errno == 2 else exc.strerror}"
    return path, version


@pytest.fixture
def memory_limited() -> Iterator[str]:
    """A 100 MiB memory cgroup made for the test and removed after it (its processes, only the
    test's own, killed by pid first)."""
    made = make_memory_cgroup(f"mpilaunch-test-{uuid.uuid4().hex[:12]}", 100 * MIB)
    if isinstance(made, str):
        pytest.skip(made)
    path = made[0]
    yield path
    procs = os.path.join(path, "cgroup.procs")
    deadline = time.monotonic() + 5
    while True:
        for pid in _read(procs).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:
            assert time.monotonic() < deadline, f"the cgroup {path} could not be removed"
            time.sleep(0.05)


HOG = """
import os, sys, time
if os.environ["RANK"] == "1":
    with open(sys.argv[1], "w") as procs:  # into the cgroup after the start, as cgexec would
        procs.write(str(os.getpid()))
    block = bytearray(500 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    print("500 MiB and still alive")
else:
    time.sleep(60)
"""


def test_the_out_of_memory_killer_is_named_with_the_limit(
    launcher: Launcher, tmp_path: Path, memory_limited: str
) -> None:
    script = write_script(tmp_path, "hog.py", HOG)
    procs = os.path.join(memory_limited, "cgroup.procs")
    proc = launcher.run("-n", "2", "--report-json", "r.json", PY, script, procs)
    err = proc.stderr.decode()
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert b"still alive" not in proc.stdout
    summary = err[err.index(RULE) :].splitlines()
    oom = r"killed by the out-of-memory killer \(cgroup limit 100 MiB / host memory [\d.]+ GiB; peak RSS [\d.]+ MiB\)"
    assert re.fullmatch(rf"rank 1 on \S+ was {oom}", summary[1]), summary[:3]
    assert "  Signal:    SIGKILL (9)" in summary
    assert any(re.fullmatch(rf"  Killed by: {oom[len('killed by ') :]}", line) for line in summary), summary
    assert "Killed by mpilaunch: rank 0" in summary
    report = json.loads((tmp_path / "r.json").read_text())
    death = report["first_failure"]["death"]
    assert death == {"oom": True, "limit_bytes": 100 * MIB, "peak_rss": death["peak_rss"], "core": None}
    assert death["peak_rss"] > 50 * MIB
    assert report["ranks"][1]["death"] == death and "death" not in report["ranks"][0]  # rank 0: killed by mpilaunch
    assert report["exit_status"] == 137 and report["first_failure"]["signal"] == "SIGKILL"


ABORT = """
import os, resource, time
if os.environ["RANK"] == "1":
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))  # the soft limit is often 0
    os.abort()
time.sleep(60)
"""


def test_a_core_file_is_named_with_its_path(launcher: Launcher, tmp_path: Path) -> None:
    """Where core_pattern here is a file pattern (this machine's is `core`), the core's path;
    where it is a pipe (systemd-coredump, apport), the program it went to, without a path.
    core_pattern is the system's: the test reads it and never changes it."""
    if resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
        pytest.skip("the hard core size limit is 0: no rank may dump core")
    pattern = _read("/proc/sys/kernel/core_pattern").strip()
    uses_pid = _read("/proc/sys/kernel/core_uses_pid").strip() == "1"
    script = write_script(tmp_path, "abort.py", ABORT)
    proc = launcher.run("-n", "2", "--report-json", "r.json", PY, script)
    err = proc.stderr.decode()
    assert proc.returncode == 128 + signal.SIGABRT, err
    summary = err[err.index(RULE) :].splitlines()
    assert "  Signal:    SIGABRT (6)" in summary
    death = json.loads((tmp_path / "r.json").read_text())["first_failure"]["death"]
    pid = json.loads((tmp_path / "r.json").read_text())["first_failure"]["pid"]
    kind, place = core_place(pattern, uses_pid, pid=pid, sig=6, uid=os.getuid(), gid=os.getgid(), host=os.uname()[1])
    if kind == "pipe":
        name = os.path.basename(place)
        assert any(line.startswith(f"  Core file: dumped to {name}") for line in summary), summary
        assert death["core"] is None
        return
    core = death["core"]
    assert core is not None, (pattern, summary)
    try:
        assert f"  Core file: {core}" in summary
        assert Path(core).match(place if place.startswith("/") else str(tmp_path / place))
        assert Path(core).stat().st_size > 0
    finally:
        Path(core).unlink(missing_ok=True)
    assert death == {"oom": False, "limit_bytes": None, "peak_rss": death["peak_rss"], "core": core}


def test_a_python_exception_is_shown_first(launcher: Launcher, tmp_path: Path) -> None:
    """The last line of the traceback at the end of the failed rank's stderr leads the summary."""
    script = write_script(
        tmp_path, "lr.py", "import os, time\nif os.environ['RANK'] == '1':\n    raise KeyError('lr')\ntime.sleep(60)\n"
    )
    proc = launcher.run("-n", "2", PY, script)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    summary = err[err.index(RULE) :].splitlines()
    assert summary[1] == "rank 1 on localhost raised KeyError: 'lr'", summary[:3]
    assert "  Error:     KeyError: 'lr'  (from its stderr)" in summary
    assert "    KeyError: 'lr'" in summary  # in the last stderr lines too
