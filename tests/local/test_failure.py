"""Abort on failure, exit codes, signals, timeout, and no process outliving the launcher."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, parent_pid, tagged_pids, write_script

PY = sys.executable
RANKS = ROOT / "tests" / "ranks"


def wait_for(paths: list[Path], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"ranks never got ready: {paths}"
        time.sleep(0.02)


def test_rank_exiting_3_aborts_the_job_within_a_second(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "fail.py",
        "import os, sys, time\n"
        "r = int(os.environ['RANK'])\n"
        "if r == 2:\n"
        "    time.sleep(0.5); print('bad input on rank 2', file=sys.stderr); sys.exit(3)\n"
        "time.sleep(60)\n",
    )
    start = time.monotonic()
    proc = launcher.run("-np", "4", "--oversubscribe", "--output-filename", "logs", PY, script)
    elapsed = time.monotonic() - start
    err = proc.stderr.decode()
    assert proc.returncode == 3, err
    assert elapsed < 0.5 + 1.0 + 1.0, elapsed  # the failure, then under a second (plus start-up)
    assert "The first process to do so was" in err
    assert "Rank:      2" in err and "Exit code: 3" in err and "bad input on rank 2" in err
    assert "Killed by mpilaunch: ranks 0-1,3" in err
    assert (tmp_path / "logs" / "1" / "rank.2" / "stderr").read_text() == "bad input on rank 2\n"
    assert not tagged_pids(launcher.tag)


@pytest.mark.parametrize(
    ("sig", "name"), [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV"), (signal.SIGABRT, "SIGABRT")]
)
def test_rank_killed_by_a_signal(launcher: Launcher, sig: int, name: str) -> None:
    proc = launcher.run(
        "-np", "2", "sh", "-c", f'if [ "$RANK" = 1 ]; then kill -{int(sig)} $$; fi; sleep 60'
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 128 + sig, err
    assert f"Signal:    {name} ({int(sig)})" in err and "Killed by mpilaunch: rank 0\n" in err


def test_abort_disabled_lets_the_others_finish_but_still_fails(launcher: Launcher, tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.mkdir()
    proc = launcher.run(
        "-np", "3", "--oversubscribe", "-mca", "orte_abort_on_non_zero_status", "0",
        "sh", "-c", f'if [ "$RANK" = 1 ]; then exit 5; fi; sleep 1; touch {done}/$RANK',
    )  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    assert sorted(p.name for p in done.iterdir()) == ["0", "2"]
    assert b"abort on failure was off" in proc.stderr


def test_missing_program_at_spawn_fails_the_job(launcher: Launcher, tmp_path: Path) -> None:
    """A program that vanishes between the check and the spawn still gives a clear failure, not a hang."""
    script = tmp_path / "vanish.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)  # not executable: the pre-check refuses it
    proc = launcher.run("-np", "1", str(script))
    assert proc.returncode == 2 and b"not executable" in proc.stderr


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"])
def test_signals_reach_every_rank(launcher: Launcher, tmp_path: Path, signame: str) -> None:
    ready = tmp_path / "ready"
    proc = launcher.popen("-np", "2", PY, str(RANKS / "signals.py"), signame, str(ready))
    wait_for([Path(f"{ready}.0"), Path(f"{ready}.1")])
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(out.decode().splitlines()) == [f"rank 0 got {signame}", f"rank 1 got {signame}"]


def test_second_ctrl_c_kills(launcher: Launcher, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = write_script(
        tmp_path,
        "stubborn.py",
        "import os, signal, time\n"
        "signal.signal(signal.SIGINT, lambda *a: print('ignoring INT', flush=True))\n"
        f"open('{ready}.' + os.environ['RANK'], 'w').close()\n"
        "time.sleep(60)\n",
    )
    proc = launcher.popen("-np", "2", PY, script)
    wait_for([Path(f"{ready}.0"), Path(f"{ready}.1")])
    proc.send_signal(signal.SIGINT)
    assert proc.stdout is not None
    said = proc.stdout.readline() + proc.stdout.readline()  # both ranks had the one Ctrl-C
    assert said == b"ignoring INT\n" * 2
    time.sleep(0.5)  # what is tested: half a second after it, the job still runs
    assert proc.poll() is None, "one Ctrl-C must only be forwarded"
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - start < 2
    assert (said + out).decode().count("ignoring INT") == 2
    assert proc.returncode == 128 + signal.SIGINT, err  # the user's interrupt, not the kill it led to
    assert b"SIGINT again: killing every rank" in err and b"stopped by SIGINT" in err


def test_timeout_ends_the_job(launcher: Launcher) -> None:
    start = time.monotonic()
    proc = launcher.run("--timeout", "1", "-np", "2", "sleep", "60")
    assert time.monotonic() - start < 5
    assert proc.returncode == 124
    assert b"exceeded --timeout 1 s" in proc.stderr
    proc = launcher.run("-np", "1", "sleep", "60", env={"MPIEXEC_TIMEOUT": "1"})
    assert proc.returncode == 124


def test_kill_timeout_escalates_to_sigkill(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "deaf.py",
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(0.3); sys.exit(4)\n"
        "time.sleep(60)\n",
    )
    start = time.monotonic()
    proc = launcher.run("-np", "2", "--kill-timeout", "0.5", PY, script)
    assert proc.returncode == 4
    assert time.monotonic() - start < 4


def test_kill_9_of_the_launcher_leaves_nothing(launcher: Launcher, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = write_script(
        tmp_path,
        "tree.sh",
        f"sleep 60 & (setsid sleep 60 &) ; touch {ready}.$RANK; sleep 60\n",
    )
    proc = launcher.popen("-np", "2", "sh", script)
    wait_for([Path(f"{ready}.0"), Path(f"{ready}.1")])
    assert len(tagged_pids(launcher.tag)) >= 2 + 1 + 2 * 3
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 2.0
    while tagged_pids(launcher.tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tagged_pids(launcher.tag) == []


def test_children_of_ranks_die_with_the_job(launcher: Launcher) -> None:
    proc = launcher.run("-np", "2", "sh", "-c", "sleep 60 & echo started")
    assert proc.returncode == 0
    assert proc.stdout == b"started\nstarted\n"
    assert tagged_pids(launcher.tag) == []


def test_closed_console_pipe_loses_no_file_output(launcher: Launcher, tmp_path: Path) -> None:
    command = " ".join(launcher.argv("-np", "2", "--output-filename", "logs", PY, str(RANKS / "writer.py"), "50000"))
    shell = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -1; echo status=${{PIPESTATUS[0]}}"],
        capture_output=True,
        cwd=tmp_path,
        env=launcher.env,
        timeout=120,
    )
    lines = shell.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[0].startswith("rank 000") and lines[1] == "status=0", shell.stderr
    for r in range(2):
        data = (tmp_path / "logs" / "1" / f"rank.{r}" / "stdout").read_bytes()
        assert data.count(b"\n") == 50000


def test_a_console_closed_after_the_first_note_stops_nothing(launcher: Launcher, tmp_path: Path) -> None:
    """`mpilaunch -n 5 ... 2>&1 | grep -q 'take turns'`: the reader leaves after the launcher's first
    note; the next note met a closed pipe and the job was never started (status 141). Now the job
    runs, its files get every line, and the status is the ranks' (found by the user guide's test)."""
    env = {k: v for k, v in launcher.env.items() if k != "OMP_NUM_THREADS"}  # a second note follows the first
    command = shlex.join(launcher.argv("-np", "5", "--output-filename", "logs", "sh", "-c", "echo rank $RANK"))
    shell = subprocess.run(
        ["bash", "-c", f"{command} 2>&1 | head -1; echo status=${{PIPESTATUS[0]}}"],
        capture_output=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    lines = shell.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[0].startswith("mpilaunch: ") and lines[1] == "status=0", shell.stderr
    for r in range(5):
        assert (tmp_path / "logs" / "1" / f"rank.{r}" / "stdout").read_text() == f"rank {r}\n"


def test_agent_killed_aborts_the_job(launcher: Launcher, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = launcher.popen("-np", "2", "sh", "-c", f"touch {ready}.$RANK; sleep 60")
    wait_for([Path(f"{ready}.0"), Path(f"{ready}.1")])
    agent = [p for p in tagged_pids(launcher.tag) if parent_pid(p) == proc.pid]
    assert len(agent) == 1
    os.kill(agent[0], signal.SIGKILL)
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode != 0
    assert b"lost the agent of host localhost" in err


def test_ctrl_c_interrupts_plain_python_ranks(launcher: Launcher, tmp_path: Path) -> None:
    """No handler installed: the forwarded SIGINT raises KeyboardInterrupt in every rank."""
    ready = tmp_path / "ready"
    script = write_script(
        tmp_path,
        "plain.py",
        f"import os, time\nopen('{ready}.' + os.environ['RANK'], 'w').close()\ntime.sleep(60)\n",
    )
    proc = launcher.popen("-np", "2", PY, script)
    wait_for([Path(f"{ready}.0"), Path(f"{ready}.1")])
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    text = err.decode()
    assert proc.returncode == 130, text
    assert text.count("KeyboardInterrupt") == 2
    assert "stopped by SIGINT (forwarded to every rank); ranks 0-1 ended" in text
    assert "The first process to do so was" not in text


def _ctrl_c_with_rank1(
    launcher: Launcher, tmp_path: Path, rank1_setup: str, kill_timeout: str
) -> tuple[subprocess.Popen, bytes, bytes, float]:
    """Two Python ranks that sleep; rank 1 first runs rank1_setup (its SIGINT handling). One
    SIGINT to the launcher once both run: the launcher, its output, and the seconds it took."""
    ready = tmp_path / "ready"
    setup = "".join(f"    {line}\n" for line in rank1_setup.splitlines())
    body = (
        f"import os, signal, sys, time\nif os.environ['RANK'] == '1':\n{setup}"
        f"open('{ready}.' + os.environ['RANK'], 'w').close()\ntime.sleep(60)\n"
    )
    script = write_script(tmp_path, "interrupted.py", body)
    proc = launcher.popen("-np", "2", "--kill-timeout", kill_timeout, PY, script)
    wait_for([Path(f"{ready}.0"), Path(f"{ready}.1")])
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    return proc, out, err, time.monotonic() - start


def test_after_ctrl_c_a_rank_still_acting_on_it_is_not_killed_when_a_peer_exits(
    launcher: Launcher, tmp_path: Path
) -> None:
    """The job ends as the ranks decide: rank 0 dies of the SIGINT at once, rank 1 spends 0.8 s
    on it (a checkpoint) and then exits 1. A peer's exit after the user's signal must not
    SIGTERM rank 1 before the grace (--kill-timeout, 5 s here) is over."""
    saving = (
        "def saving(*_):\n"
        "    time.sleep(0.8)\n"
        "    print('checkpoint written', flush=True)\n"
        "    sys.exit(1)\n"
        "signal.signal(signal.SIGINT, saving)"
    )
    proc, out, err, _ = _ctrl_c_with_rank1(launcher, tmp_path, saving, "5")
    assert proc.returncode == 130, err
    assert out.count(b"checkpoint written") == 1, (out, err)
    assert err.count(b"KeyboardInterrupt") == 1, err


def test_after_ctrl_c_a_rank_that_ignores_it_is_killed_once_the_grace_is_over(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Rank 1 ignores SIGINT (stuck, say, in a collective with a dead peer): once rank 0 has
    died of the signal, rank 1 gets --kill-timeout (1 s) and is then stopped; one Ctrl-C is
    enough to end such a job."""
    proc, _, err, took = _ctrl_c_with_rank1(launcher, tmp_path, "signal.signal(signal.SIGINT, signal.SIG_IGN)", "1")
    assert proc.returncode == 130, err
    assert 0.9 < took < 10, took  # the grace, then SIGTERM (which the rank does not ignore)
    assert tagged_pids(launcher.tag) == []


def test_a_failure_before_the_timeout_is_still_reported(launcher: Launcher) -> None:
    proc = launcher.run(
        "--timeout", "1.5", "-np", "2", "-mca", "orte_abort_on_non_zero_status", "0",
        "sh", "-c", 'if [ "$RANK" = 1 ]; then echo broke >&2; exit 6; fi; sleep 60',
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 124, err
    assert "exceeded --timeout 1.5 s" in err
    assert "Rank:      1" in err and "Exit code: 6" in err and "broke" in err


def test_abort_setting_from_the_environment(launcher: Launcher, tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.mkdir()
    proc = launcher.run(
        "-np", "2", "sh", "-c", f'if [ "$RANK" = 1 ]; then exit 5; fi; sleep 1; touch {done}/ok',
        env={"OMPI_MCA_orte_abort_on_non_zero_status": "0"},
    )  # fmt: skip
    assert proc.returncode == 5 and (done / "ok").exists()
