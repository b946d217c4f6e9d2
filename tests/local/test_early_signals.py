"""Ctrl-C at any moment of the start (issue "No process left, ever", part 6): before the run's
own signal handling starts, a SIGINT ends the launcher quietly (killed by it, as a C program
would be), after it the run stops its ranks (status 130); never a traceback of mpilaunch's, and
nothing left. (A SIGINT while Python itself starts, in `site`, `runpy` or its standard streams, is
Python's to report, or to lose: met in code that drops what it raises, such as an import a `.pth`
file makes, it is gone before mpilaunch's first line runs, and the job runs.)"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher, tagged_pids

ROOT = Path(__file__).resolve().parents[2]


def _default_sigint() -> None:
    """As from a terminal: a test run in the background (`cmd &` in a script) would hand its
    children SIGINT ignored, and Python keeps it so until mpilaunch's first line runs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for sig now (SigCgt in /proc/PID/status); False once
    it has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (sig - 1) & 1)


SCRIPT = Path(sys.executable).parent / "mpilaunch"  # the console script pip wrote


@pytest.mark.parametrize("how", ["python -m", "console script"])
def test_sigint_during_start_up_is_never_a_traceback(launcher: Launcher, how: str) -> None:
    if how == "console script" and not SCRIPT.exists():
        pytest.skip(f"no console script at {SCRIPT}")
    outcomes: dict[int, int] = {}
    for attempt in range(40):
        if how == "python -m":
            proc = launcher.popen("-n", "2", "sleep", "5", preexec_fn=_default_sigint)
        else:
            argv = [str(SCRIPT), "-n", "2", "sleep", "5"]
            proc = launcher.popen(preexec_fn=_default_sigint, argv=argv)
        # 0 to 57 ms: the interpreter, imports, plan, launch; the last ones later, for a loaded machine
        time.sleep((attempt % 20) * 0.003 if attempt < 34 else 0.1 * (attempt - 33))
        proc.send_signal(signal.SIGINT)
        before_ours = not catches(proc.pid, signal.SIGTERM)  # entry.main catches it with SIGINT
        _, err = proc.communicate(timeout=30)
        text = err.decode(errors="replace")
        ours = [line for line in text.splitlines() if "/mpilaunch/" in line and line.lstrip().startswith("File ")]
        # ... but for Python's entry into the package's first modules (their RESUME, line 0), which
        # may meet a signal that came while Python prepared them, before their first line runs
        ours = [line for line in ours if not re.search(r'mpilaunch/__(init|main)__\.py", line [01],', line)]
        assert not ours, text
        # Python's own start (site, runpy, the console script, its standard streams), before any of our code
        python_start = "<frozen " in text or "Fatal Python error" in text or "Could not import runpy module" in text
        python_start = python_start or f'File "{SCRIPT}"' in text
        assert (
            proc.returncode in (-signal.SIGINT, 130)
            or (proc.returncode == 1 and python_start)
            or (proc.returncode == 0 and before_ours)  # lost by Python before mpilaunch's first line
        ), (proc.returncode, text)
        outcomes[proc.returncode] = outcomes.get(proc.returncode, 0) + 1
        deadline = time.monotonic() + 5
        while tagged_pids(launcher.tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not tagged_pids(launcher.tag), f"attempt {attempt}: processes left"
    assert outcomes.get(130, 0) > 0  # the later moments reached the run's own handling


def test_sigterm_during_start_up_closes_what_is_open(launcher: Launcher) -> None:
    """A SIGTERM before the controller's handling (imports, plan, agents and ranks launched)
    ends the launcher with 143, as later in the run, after closing what it opened."""
    outcomes: dict[int, int] = {}
    for attempt in range(50):
        proc = launcher.popen("-n", "2", "sleep", "5")
        # 0 to 57 ms after the start, twice; then 0.1 to 1 s, where a busy machine is still starting Python
        time.sleep((attempt % 20) * 0.003 if attempt < 40 else (attempt - 39) * 0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        text = err.decode(errors="replace")
        assert "Traceback" not in text, text
        assert proc.returncode in (-signal.SIGTERM, 143), (proc.returncode, text)
        outcomes[proc.returncode] = outcomes.get(proc.returncode, 0) + 1
        deadline = time.monotonic() + 5
        while tagged_pids(launcher.tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not tagged_pids(launcher.tag), f"attempt {attempt}: processes left"
    assert outcomes.get(143, 0) > 0, outcomes  # by the signal only while Python starts and entry is imported


# The launcher as the command runs it, with a Ctrl-C at the moment job 1's ranks are launched,
# before the controller that runs them exists: the signal is caught from then on.
AT_LAUNCH = """
import os, signal, sys
sys.path.insert(0, {root!r})
from mpilaunch.launcher.start import launch

def encode(record, _encode=launch.encode):
    data = _encode(record)
    if type(record).__name__ == "Launch":
        os.kill(os.getpid(), signal.SIGINT)
    return data

launch.encode = encode
sys.argv[0] = "mpilaunch"
from mpilaunch.entry import main
main()
"""


def test_sigint_as_the_ranks_are_launched_is_the_runs(launcher: Launcher, tmp_path: Path) -> None:
    """Job 1's ranks are launched while the controller's modules are still imported: a Ctrl-C
    then is the run's (forwarded to the ranks, the grace, the summary), not the start-up's (the
    launcher gone at once, its ranks killed by their agents without a word). Before, a test
    that waited for its ranks to run and then sent SIGINT saw the launcher end in 4 ms."""
    script = tmp_path / "at_launch.py"
    script.write_text(AT_LAUNCH.format(root=str(ROOT)))
    proc = subprocess.run(
        [sys.executable, str(script), "-n", "2", "sleep", "30"],
        env=launcher.env, cwd=tmp_path, capture_output=True, timeout=60, preexec_fn=_default_sigint,
    )  # fmt: skip
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 130, err
    assert "SIGINT forwarded to every rank" in err, err
    assert "stopped by SIGINT (forwarded to every rank)" in err, err
    assert "Traceback" not in err, err
    assert not tagged_pids(launcher.tag)
