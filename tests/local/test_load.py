"""Load on one machine: 256 oversubscribed ranks (the launcher's memory and CPU are measured and
printed, never asserted), 4 ranks x 100,000 lines with tags, one agent outliving 300 short
ranks without keeping a descriptor or a zombie of theirs, and 500 short jobs in a row run in
this test process (the controller lives here) without leaking a descriptor, a child, a zombie
or a signal handler.

Run with `-s` to see the numbers; docs/reliability.md records them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mpilaunch.cli.main import main
from tests.conftest import ROOT, TAG_VAR, Launcher, tagged_pids, write_script

PY = sys.executable
WRITER = str(ROOT / "tests" / "ranks" / "writer.py")


def report(what: str, **numbers: float) -> None:
    """One line of measured numbers, shown with `pytest -s` (not asserted: the machine is shared)."""
    print(f"\n[load] {what}: " + ", ".join(f"{k} {v:.3g}" for k, v in numbers.items()), file=sys.__stdout__)


# Runs mpilaunch in this interpreter and writes, whatever way the launcher exits, its own CPU
# time and peak resident set (VmHWM: since the exec; ru_maxrss would also count the memory of
# the process that forked us) and the CPU time and largest peak RSS of what it waited for (the
# agent, and through it the ranks) to a JSON file.
MEASURED = """
import json, resource, sys
from mpilaunch.entry import main
out = sys.argv.pop(1)
sys.argv[0] = "mpilaunch"
try:
    main(quick_exit=False)  # the command as installed, but back here afterwards
finally:
    me = resource.getrusage(resource.RUSAGE_SELF)
    them = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open("/proc/self/status") as status:
        hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    usage = {"cpu": me.ru_utime + me.ru_stime, "peak_rss_mb": hwm / 1024,
             "children_cpu": them.ru_utime + them.ru_stime, "children_peak_rss_mb": them.ru_maxrss / 1024}
    with open(out, "w") as handle:
        json.dump(usage, handle)
"""


def test_256_ranks_on_this_machine(launcher: Launcher, tmp_path: Path) -> None:
    """256 ranks of `echo; sleep 1; echo >&2` on 2 cores: every rank exits 0 and every line is in
    its file and on the console; the controller's peak memory and CPU are reported."""
    usage_file = tmp_path / "usage.json"
    script = 'echo "start $RANK"; sleep 1; echo "end $RANK" >&2'
    argv = [PY, "-c", MEASURED, str(usage_file), "--oversubscribe", "-n", "256", "--output-filename", "logs"]
    started = time.monotonic()
    proc = subprocess.run([*argv, "sh", "-c", script], capture_output=True, cwd=tmp_path, env=launcher.env, timeout=240)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = proc.stdout.decode().splitlines()
    err = [line for line in proc.stderr.decode().splitlines() if not line.startswith("mpilaunch:")]
    assert sorted(out) == sorted(f"start {r}" for r in range(256))
    assert sorted(err) == sorted(f"end {r}" for r in range(256))
    root = tmp_path / "logs" / "1"
    assert len(list(root.iterdir())) == 256
    for r in range(256):
        assert (root / f"rank.{r:03d}" / "stdout").read_text() == f"start {r}\n"
        assert (root / f"rank.{r:03d}" / "stderr").read_text() == f"end {r}\n"
    usage = json.loads(usage_file.read_text())
    report(
        "256 ranks",
        seconds=elapsed,
        controller_cpu_s=usage["cpu"],
        controller_peak_rss_mb=usage["peak_rss_mb"],
        agent_and_ranks_cpu_s=usage["children_cpu"],
        agent_peak_rss_mb=usage["children_peak_rss_mb"],  # the largest process it waited for
    )


def test_4_ranks_100000_lines_each_tagged(launcher: Launcher, tmp_path: Path) -> None:
    """400,000 lines of 70 bytes written in 64 KiB pieces that cut lines anywhere: every line in
    the files, and on the console every line whole, tagged with its own rank, in order."""
    lines = 100_000
    started = time.monotonic()
    proc = launcher.run(
        "-n", "4", "--oversubscribe", "--tag-output", "--output-filename", "out", PY, WRITER, str(lines), timeout=300,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr.decode()
    pattern = re.compile(rb"\[1,(\d)\]<stdout>:rank 000(\d) line (\d{8}) x{44}")
    seen = dict.fromkeys(range(4), 0)
    mangled = 0
    for line in proc.stdout.split(b"\n")[:-1]:
        match = pattern.fullmatch(line)
        if not match or match.group(1) != match.group(2):
            mangled += 1
            continue
        rank = int(match.group(1))
        assert int(match.group(3)) == seen[rank], "a rank's lines arrived out of order"
        seen[rank] += 1
    assert mangled == 0
    assert seen == dict.fromkeys(range(4), lines)
    for r in range(4):
        expected = b"".join(b"rank %04d line %08d " % (r, i) + b"x" * 44 + b"\n" for i in range(lines))
        assert (tmp_path / "out" / "1" / f"rank.{r}" / "stdout").read_bytes() == expected
    report("4 x 100,000 lines", seconds=elapsed, console_mb=len(proc.stdout) / 2**20)


OBSERVER = r"""
import json, os, sys, time

def children(pid):
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(c) for c in handle.read().split()]
    return found

def state(pid):
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()
agent = os.getppid()
launcher = int(state(agent)[1])
deadline = time.time() + 120
while len(children(agent)) > 2:  # this rank and the guardian: every other rank is reaped
    assert time.time() < deadline, "the other ranks never ended"
    time.sleep(0.05)
time.sleep(0.5)  # their exits reported and their pipes closed
print(json.dumps({
    "agent_fds": sorted(os.readlink(f"/proc/{agent}/fd/{fd}").split(":")[0] for fd in os.listdir(f"/proc/{agent}/fd")),
    "launcher_fds": len(os.listdir(f"/proc/{launcher}/fd")),
    "zombies": [c for c in children(agent) if state(c)[0] == "Z"],
}), flush=True)
"""


def normal(names: list[str]) -> list[str]:
    """Descriptor targets without the PMIx server's folder name (it holds its agent's pid)."""
    pmix = "/dev/shm/mpilaunch-pmix-"
    return [os.path.join("PMIX_DIR", os.path.basename(n)) if n.startswith(pmix) else n for n in names]


def test_one_agent_outlives_300_short_ranks_and_keeps_nothing_of_theirs(launcher: Launcher, tmp_path: Path) -> None:
    """Rank 0 watches its own agent while 300 other ranks (each with output pipes, a PMI socket
    and a PMIx client: a shell is served both) start and end: once they are gone, the agent
    holds the same descriptors as in a job of rank 0 and one such rank, has no zombie, and the
    launcher holds no more descriptors either."""
    observer = write_script(tmp_path, "observer.py", OBSERVER)
    alone = launcher.run("-n", "1", PY, observer, ":", "-n", "1", "sh", "-c", "echo $RANK")
    assert alone.returncode == 0, alone.stderr.decode()
    base = json.loads(next(line for line in alone.stdout.decode().splitlines() if line.startswith("{")))
    assert any(name.startswith("/dev/shm/mpilaunch-pmix-") for name in base["agent_fds"])  # the PMIx server's
    crowd = launcher.run(
        "--oversubscribe", "-n", "1", PY, observer, ":", "-n", "300", "sh", "-c", "echo $RANK; echo $RANK >&2",
        timeout=240,
    )  # fmt: skip
    assert crowd.returncode == 0, crowd.stderr.decode()[-3000:]
    lines = crowd.stdout.decode().splitlines()
    after = json.loads(next(line for line in lines if line.startswith("{")))
    assert sorted(int(line) for line in lines if not line.startswith("{")) == list(range(1, 301))
    assert after["zombies"] == []
    assert normal(after["agent_fds"]) == normal(base["agent_fds"])
    assert after["launcher_fds"] == base["launcher_fds"]


def _children_of_self() -> dict[int, str]:
    """This process's children and their states (Z: a zombie nobody reaped)."""
    found = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as handle:
                pids = [int(c) for c in handle.read().split()]
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as handle:
                    found[pid] = handle.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                pass
    return found


JOBS = [
    (["-n", "1", "true"], 0),
    (["-n", "2", "--output-filename", "logs", "sh", "-c", "echo $RANK; echo err >&2"], 0),
    (["-n", "2", "sh", "-c", 'exit "$RANK"'], 1),  # a failure: summary, abort
    (["-n", "1", "--mpi", "none", "--timeout", "30", "echo", "hi"], 0),
    (["-n", "2", "--tag-output", "sh", "-c", "printf partial"], 0),
]


def _open_fds() -> dict[str, str]:
    """This process's descriptors and what each is open on (a reused number is a new one)."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor
            pass
    return fds


def test_500_short_jobs_in_one_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd) -> None:
    """The controller of 500 jobs in a row runs in this process (mpilaunch's main, as the command
    runs it): afterwards this process has no descriptor it did not have, no new child and no zombie,
    the same signal handlers, and no process of any job is left."""
    tag = uuid.uuid4().hex
    monkeypatch.chdir(tmp_path)
    for name, value in {TAG_VAR: tag, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}.items():
        monkeypatch.setenv(name, value)

    def run(args: list[str], expected: int) -> None:
        with pytest.raises(SystemExit) as done:
            main(["--stdin", "none", *args])  # stdin: this process's fd 0 is not the jobs'
        assert done.value.code == expected, capfd.readouterr().err

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)
    for args, expected in JOBS:  # the first jobs open what stays open for good (module imports, caches)
        run(args, expected)
    fds = _open_fds()
    children = _children_of_self()
    handlers = [signal.getsignal(s) for s in handled]
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    started = time.monotonic()
    for i in range(500 - len(JOBS)):
        run(*JOBS[i % len(JOBS)])
        if i % 50 == 0:
            capfd.readouterr()
    elapsed = time.monotonic() - started
    out = capfd.readouterr()
    assert "Traceback" not in out.err
    leaked = {fd: what for fd, what in _open_fds().items() if fds.get(fd) != what}
    assert not leaked  # one the first jobs left open (a garbage-collected socket) may close meanwhile
    now = _children_of_self()
    # a child this process already had is an earlier test's (a Popen not waited for yet), not the jobs'
    assert not [pid for pid, state in now.items() if state == "Z" and pid not in children]
    assert set(now) <= set(children)
    assert [signal.getsignal(s) for s in handled] == handlers
    assert signal.set_wakeup_fd(-1) == wakeup
    signal.set_wakeup_fd(wakeup)
    assert not tagged_pids(tag)
    report("500 jobs in one process", seconds_per_job=elapsed / (500 - len(JOBS)))
