"""Every signal whose default action would end the launcher (issue 27, item 9): SIGALRM and
SIGQUIT killed it with no message and no report. Now each one of signal_table.ACTIONS is either
forwarded to every rank (SIGUSR1, SIGUSR2, SIGALRM, as mpirun and hydra do) or stops the run as
SIGTERM does: the row's signal to every rank, `stopped by NAME` on stderr, the report's
`stop_signal`, status 128 + the signal; SIGQUIT takes every rank's stack (issue 30,
tests/local/test_stacks.py) and twice within a second stops the run as Ctrl-C does. A real fault
of the launcher's own still ends it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpilaunch.launcher.decide.signal_table import ACTIONS, FAULTS, FORWARD, STACKS, name_of
from mpilaunch.launcher.loop.signals import FAULTS_AFTER
from tests.conftest import ROOT, Launcher, tagged_pids

PY = sys.executable
# signal(7): the signals whose default action is to terminate the process (Term or Core)
TERMINATE = [
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL", "SIGUSR1", "SIGSEGV",
    "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGSTKFLT", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGIO",
    "SIGPWR", "SIGSYS",
]  # fmt: skip
NOT_CAUGHT = {
    "SIGKILL": "cannot be caught",
    "SIGPIPE": "ignored by Python: a reader that left is an EPIPE",
    "SIGXFSZ": "ignored by Python: a write past the file size limit fails with EFBIG",
}
TRIED = [s for s in TERMINATE if s not in NOT_CAUGHT] + ["SIGRTMIN", "SIGRTMIN+3", "SIGRTMAX"]
assert len(set(TRIED)) == len(TRIED)
RANK = """
import os, signal, time
got = []
def said(signum, frame):
    print(f"rank {os.environ['RANK']} got {signal.Signals(signum).name}", flush=True)
    got.append(signum)
for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
    signal.signal(sig, said)
print("up", flush=True)
end = time.monotonic() + 20
while not got and time.monotonic() < end:  # a forwarded signal ends the rank's wait, and it exits 0
    time.sleep(0.05)
"""


def number(name: str) -> int:
    if name.startswith("SIGRTMIN+"):
        return signal.SIGRTMIN + int(name.split("+")[1])
    return int(getattr(signal, name))


def _defaults(*sigs: int):  # type: ignore[no-untyped-def]
    """As from a terminal: a test run in the background (`cmd &` in a script) would hand its
    children SIGINT and SIGQUIT ignored, and an ignored signal stays so."""

    def reset() -> None:
        for sig in sigs:
            signal.signal(sig, signal.SIG_DFL)

    return reset


def test_every_terminating_signal_has_a_row() -> None:
    """The table covers signal(7)'s list and the real-time signals but SIGKILL, SIGPIPE and SIGXFSZ
    (NOT_CAUGHT says why); the launcher, a Python program, ignores the last two from its start."""
    ignored = subprocess.run(
        [PY, "-c", "import signal as s; print(int(s.getsignal(s.SIGPIPE)), int(s.getsignal(s.SIGXFSZ)))"],
        capture_output=True, text=True, check=True, preexec_fn=_defaults(signal.SIGPIPE, signal.SIGXFSZ),
    )  # fmt: skip
    assert ignored.stdout.split() == [str(int(signal.SIG_IGN))] * 2
    missing = [name for name in TERMINATE if name not in NOT_CAUGHT and number(name) not in ACTIONS]
    assert not missing
    assert all(number(name) not in ACTIONS for name in NOT_CAUGHT)
    assert all(sig in ACTIONS for sig in range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    assert {name_of(sig) for sig, (action, _) in ACTIONS.items() if action == FORWARD} == {
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
    }
    assert ACTIONS[signal.SIGQUIT] == (STACKS, signal.SIGINT)  # stacks; twice within a second: as Ctrl-C


@pytest.mark.parametrize("name", TRIED)
def test_a_signal_to_the_launcher_is_forwarded_or_stops_the_run(launcher: Launcher, tmp_path: Path, name: str) -> None:
    sig = number(name)
    action, sent = ACTIONS[sig]
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    report = tmp_path / "report.json"
    proc = launcher.popen("-n", "2", "--report-json", str(report), PY, str(script), preexec_fn=_defaults(sig))
    assert proc.stdout is not None
    try:
        for _ in range(2):
            assert proc.stdout.readline() == b"up\n"
        if sig in FAULTS:  # caught once the run has gone on that long
            time.sleep(FAULTS_AFTER + 0.1)
        proc.send_signal(sig)
        if action == STACKS:  # the second within a second stops the run
            time.sleep(0.2)
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode()
    assert not [line for line in text.splitlines() if "/mpilaunch/" in line and "File " in line], text
    document = json.loads(report.read_text())
    got = sorted(line for line in out.decode().splitlines() if line.startswith("rank"))
    if action == FORWARD:  # the ranks got it; the run goes on to its end
        assert got == [f"rank {r} got {name}" for r in (0, 1)], text
        assert proc.returncode == 0 and document["outcome"] == "success" and document["stop_signal"] is None
        return
    how = "forwarded to every rank" if sent == sig else f"{name_of(sent)} sent to every rank"
    assert f"mpilaunch: stopped by {name} ({how}); ranks 0-1 ended\n" in text, text
    assert proc.returncode == 128 + sig, text
    assert document["outcome"] == "interrupted" and document["stop_signal"] == name
    assert document["exit_status"] == 128 + sig
    assert [rank["signal"] for rank in document["ranks"]] == [name_of(sent)] * 2 and not got


@pytest.mark.parametrize("name", ["SIGALRM", "SIGTRAP", "SIGSEGV", "SIGXCPU"])
def test_such_a_signal_during_start_up(launcher: Launcher, name: str) -> None:
    """At 20 moments of the start (0 to 0.41 s; a fault signal's last ten FAULTS_AFTER later):
    never a traceback of mpilaunch's, nothing left; ended by the signal only while Python starts
    (and, for a fault signal, until the run catches it), else with 128 + the signal (SIGALRM
    later: forwarded, the ranks die of it)."""
    sig = number(name)
    later = FAULTS_AFTER if sig in FAULTS else 0.0
    outcomes: dict[int, int] = {}
    for attempt in range(20):
        proc = launcher.popen("-n", "2", "sleep", "5", preexec_fn=_defaults(sig))
        time.sleep(attempt * 0.003 if attempt < 10 else later + 0.05 + (attempt - 10) * 0.04)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        text = err.decode(errors="replace")
        ours = [line for line in text.splitlines() if "/mpilaunch/" in line and line.lstrip().startswith("File ")]
        assert not ours, text
        assert proc.returncode in (-sig, 128 + sig), (proc.returncode, text)
        outcomes[proc.returncode] = outcomes.get(proc.returncode, 0) + 1
        deadline = time.monotonic() + 5
        while tagged_pids(launcher.tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not tagged_pids(launcher.tag), f"attempt {attempt}: processes left"
    assert outcomes.get(128 + sig, 0) > 0, outcomes


FAULT = f"""
import ctypes, os, selectors, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from mpilaunch.launcher.loop.signals import SignalPipe
pipe = SignalPipe()
pipe.install(selectors.DefaultSelector())
pipe.catch_faults()
if sys.argv[1] == "sent":
    os.kill(os.getpid(), signal.SIGSEGV)
    print("caught", list(pipe.drain()), flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)  # the handler was reset as it ran: this one ends the process
else:
    ctypes.string_at(0)  # a real invalid read
print("still here", flush=True)
"""


@pytest.mark.parametrize("how", ["sent", "real"])
def test_a_real_fault_still_ends_the_launcher(tmp_path: Path, how: str) -> None:
    """With the run's handlers installed, a SIGSEGV sent is caught (once) and a real invalid read
    ends the process at once, instead of running the faulting instruction again for ever."""
    script = tmp_path / "fault.py"
    script.write_text(FAULT)
    proc = subprocess.run([PY, str(script), how], capture_output=True, timeout=30)
    assert proc.returncode == -signal.SIGSEGV, proc.stderr.decode()
    assert proc.stdout.decode() == (f"caught [{int(signal.SIGSEGV)}]\n" if how == "sent" else "")
