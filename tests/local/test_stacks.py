"""Every rank's stack, without touching the program (issue 30): Ctrl-\\ (SIGQUIT to the launcher),
`mpilaunch stacks` from another process, `--timeout S --get-stack-traces` and `--hang-timeout S`.
Real ranks (mpi4py, MPICH), real tools: py-spy where installed, else eu-stack or gdb, else one line
that says how to get them; the launcher's interpreter is a venv without py-spy and PATH leaves
out what the test hides."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from mpilaunch.picture.page import render
from tests.conftest import Launcher, write_script
from tests.stackjob import MPI4PY_RANK, Running, python_without_py_spy, release, snapshot, two_groups

PY = sys.executable
PY_SPY = os.path.join(os.path.dirname(PY), "py-spy")
pytestmark = pytest.mark.skipif(not os.access(PY_SPY, os.X_OK), reason="py-spy is not installed (the test extra)")
NATIVE_TOOLS = "/usr/bin"  # eu-stack (elfutils) and gdb; a PATH without it hides them


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An interpreter whose bin directory has no py-spy: the launcher (and its local agent) run with it."""
    return python_without_py_spy(tmp_path_factory.mktemp("venv") / "v")


def start(launcher: Launcher, tmp_path: Path, *options: str, env: dict | None = None) -> tuple[Running, Path]:
    script = write_script(tmp_path, "rank.py", MPI4PY_RANK)
    flag = tmp_path / "flag"
    proc = launcher.popen(*options, "-n", "3", PY, script, str(flag), env=env)
    job = Running(proc)
    assert sorted(job.wait_out(3)) == ["up 0\n", "up 1\n", "up 2\n"], job.err()
    time.sleep(0.3)  # ranks 0 and 1 in the barrier, rank 2 in stuck_here
    return job, flag


def ended_well(job: Running, flag: Path) -> str:
    release(flag)
    status = job.finish()
    err = job.err()
    assert status == 0, err[-4000:]
    assert sorted(job.out_lines) == ["done 0\n", "done 1\n", "done 2\n", "up 0\n", "up 1\n", "up 2\n"], err
    return err


def test_sigquit_prints_two_groups_and_the_job_goes_on(launcher: Launcher, tmp_path: Path) -> None:
    logs, report = tmp_path / "logs", tmp_path / "run.json"
    job, flag = start(launcher, tmp_path, "--output-filename", str(logs), "--report-json", str(report))
    job.proc.send_signal(signal.SIGQUIT)
    sent = time.monotonic()
    first = snapshot(job.wait_err(r"^  rank 2, whole:$"))
    time.sleep(max(0.0, sent + 1.5 - time.monotonic()))
    job.proc.send_signal(signal.SIGQUIT)  # more than a second after the first: stacks again, no stop
    job.wait_err(r"^  rank 2, whole:$", count=2)
    err = ended_well(job, flag)
    two_groups(first)
    two_groups(snapshot(err, 2))
    assert f"each rank's in {logs}/1/rank.N/stack.1" in first[0]
    assert err.count("mpilaunch: SIGQUIT: taking every rank's stack (again within 1 s: stop the job)") == 2
    for rank in range(3):  # the whole text of each snapshot, per rank
        for number in (1, 2):
            text = (logs / "1" / f"rank.{rank}" / f"stack.{number}").read_text()
            assert text.startswith("Process ") and ("stuck_here" in text) == (rank == 2), text
    document = json.loads(report.read_text())
    assert document["outcome"] == "success" and document["exit_status"] == 0
    assert [s["why"] for s in document["stacks"]] == ["SIGQUIT", "SIGQUIT"]
    snap = document["stacks"][0]
    assert [g["ranks"] for g in snap["groups"]] == [[[1, 0], [1, 1]], [[1, 2]]] and snap["missing"] == []
    assert snap["groups"][1]["frames"][-1].endswith("in stuck_here") and snap["taken"] > document["started"]
    page = render(document)  # `mpilaunch report` draws the snapshots
    stacks = page.split('<section id="stacks">', 1)[1].split("</section>", 1)[0]
    assert stacks.count("ranks 0-1 (2)") == 2 and stacks.count("rank 2 (1)") == 2 and "in stuck_here" in stacks


def test_without_py_spy_the_stacks_are_native(launcher: Launcher, tmp_path: Path, venv_python: str) -> None:
    """py-spy hidden (neither beside the interpreter nor on PATH): eu-stack reads the ranks,
    native frames, and one line says how to get their Python frames."""
    launcher.argv = lambda *args: [venv_python, "-m", "mpilaunch", *args]  # type: ignore[method-assign]
    job, flag = start(launcher, tmp_path, env={"PATH": NATIVE_TOOLS})
    job.proc.send_signal(signal.SIGQUIT)
    text = job.wait_err(r"^mpilaunch: stacks of ")
    err = ended_well(job, flag)
    said = "mpilaunch: host localhost has no py-spy: its Python ranks' stacks are native frames "
    assert said + "(pip install 'mpilaunch[debug]' for their Python frames)\n" in text
    lines = snapshot(err)
    assert lines[0].startswith("mpilaunch: stacks of 3 of 3 running ranks (SIGQUIT)"), lines
    sleeper = [line for line in lines if line.startswith("  rank 2 (1): ")]
    assert sleeper and "nanosleep" in sleeper[0], lines  # time.sleep, as the C library does it


def test_with_no_tool_one_line_says_how_to_get_them(launcher: Launcher, tmp_path: Path, venv_python: str) -> None:
    launcher.argv = lambda *args: [venv_python, "-m", "mpilaunch", *args]  # type: ignore[method-assign]
    job, flag = start(launcher, tmp_path, env={"PATH": str(tmp_path / "nothing")})
    job.proc.send_signal(signal.SIGQUIT)
    job.wait_err(r"^  ranks 0-2: no stack")
    err = ended_well(job, flag)
    notes = [line for line in err.splitlines() if "has no py-spy, eu-stack or gdb" in line]
    assert notes == [
        "mpilaunch: host localhost has no py-spy, eu-stack or gdb: no stacks taken there "
        "(pip install 'mpilaunch[debug]' gives py-spy; elfutils gives eu-stack)"
    ], err
    assert snapshot(err) == [
        "mpilaunch: no stack of the 3 running ranks could be taken (SIGQUIT)",
        "  ranks 0-2: no stack: no py-spy, eu-stack or gdb (host localhost)",
    ]


def test_a_tool_that_never_answers_is_killed_at_the_limit(launcher: Launcher, tmp_path: Path, venv_python: str) -> None:
    """An eu-stack that hangs: each rank is listed without a stack after 5 s, the tool is killed
    (the launcher fixture finds no process left), the ranks go on and the job ends well."""
    tools = tmp_path / "tools"
    tools.mkdir()
    write_script(tools, "eu-stack", "#!/bin/sh\nexec /bin/sleep 60\n")
    (tools / "eu-stack").chmod(0o755)
    launcher.argv = lambda *args: [venv_python, "-m", "mpilaunch", *args]  # type: ignore[method-assign]
    job, flag = start(launcher, tmp_path, env={"PATH": str(tools)})
    job.proc.send_signal(signal.SIGQUIT)
    job.wait_err(r"^  ranks 0-2: no stack")
    err = ended_well(job, flag)
    assert snapshot(err) == [
        "mpilaunch: no stack of the 3 running ranks could be taken (SIGQUIT)",
        "  ranks 0-2: no stack: eu-stack gave no stack within 5 s (host localhost)",
    ]


def test_native_ranks_and_a_shell_that_runs_python(launcher: Launcher, tmp_path: Path) -> None:
    """A native program's native stack (eu-stack); a rank that is a shell waiting for Python is
    read in that Python."""
    script = write_script(tmp_path, "nap.py", "import time\ndef stuck_here():\n    time.sleep(4)\nstuck_here()\n")
    proc = launcher.popen("-n", "2", "sleep", "4", ":", "-n", "1", "sh", "-c", f"{PY} {script}; true")
    job = Running(proc)
    time.sleep(1.5)
    job.proc.send_signal(signal.SIGQUIT)
    job.wait_err(r"^  rank 2, whole:$")
    assert job.finish() == 0, job.err()
    lines = snapshot(job.err())
    assert lines[0].startswith("mpilaunch: stacks of 3 of 3 running ranks (SIGQUIT): 2 groups"), lines
    assert lines[1].startswith("  ranks 0-1 (2): ") and "nanosleep" in lines[1], lines
    assert lines[2] == "  rank 2 (1): nap.py:4 in <module> > stuck_here", lines


def test_mpilaunch_stacks_from_another_process(launcher: Launcher, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}  # the user's socket folder: this test's own
    job, flag = start(launcher, tmp_path, env=env)
    asked = launcher.run("stacks", env=env)
    assert asked.returncode == 0, asked.stderr.decode()
    two_groups(asked.stdout.decode().splitlines(), "asked by mpilaunch stacks")
    by_pid = launcher.run("stacks", str(job.proc.pid), env=env)
    assert by_pid.returncode == 0, by_pid.stderr.decode()
    two_groups(by_pid.stdout.decode().splitlines(), "asked by mpilaunch stacks")
    other = launcher.popen("-n", "1", "sleep", "30", env=env)
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(runtime / "mpilaunch")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        several = launcher.run("stacks", env=env)
        wrong = launcher.run("stacks", "1", env=env)
    finally:
        other.send_signal(signal.SIGTERM)
        other.communicate(timeout=30)
    assert several.returncode == 2 and several.stdout == b"", several
    said = several.stderr.decode()
    assert said.startswith("mpilaunch stacks: 2 jobs of yours are running; name one by its pid:\n"), said
    assert f"  {job.proc.pid}  " in said and f"  {other.pid}  " in said, said
    assert wrong.returncode == 2 and "no running job of yours has launcher pid 1" in wrong.stderr.decode()
    err = ended_well(job, flag)
    assert err.count("mpilaunch: every rank's stack asked for by `mpilaunch stacks` (pid ") == 2, err
    assert "mpilaunch: stacks of" not in err  # they were printed on the asker's side
    assert os.listdir(runtime / "mpilaunch") == []  # each job removed its socket
    none = launcher.run("stacks", env=env)
    assert none.returncode == 1 and "no mpilaunch job of yours is running" in none.stderr.decode()


def test_a_socket_folder_open_to_others_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    (runtime / "mpilaunch").mkdir(parents=True)
    (runtime / "mpilaunch").chmod(0o755)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    proc = launcher.run("-n", "1", "true", env=env)
    assert proc.returncode == 0
    assert proc.stderr.decode().splitlines()[-1] == (
        f"mpilaunch: `mpilaunch stacks` cannot reach this job: {runtime}/mpilaunch is open to others "
        "(mode 755; 700 expected)"
    )
    assert os.listdir(runtime / "mpilaunch") == []
    asked = launcher.run("stacks", env=env)
    assert asked.returncode == 1 and "is open to others" in asked.stderr.decode(), asked


HUNG = """
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
def stuck_here(seconds):
    time.sleep(seconds)
print("up", comm.rank, flush=True)
if comm.rank == 0:
    stuck_here(float(sys.argv[1]))
comm.Barrier()
print("done", comm.rank, flush=True)
"""


def hung_job_lines(lines: list[str], why: str) -> None:
    assert lines[0].startswith(f"mpilaunch: stacks of 2 of 2 running ranks ({why}): 2 groups"), lines
    assert lines[1].startswith("  rank 0 (1): hung.py:") and lines[1].endswith("in <module> > stuck_here"), lines
    assert lines[2].startswith("  rank 1 (1): hung.py:") and lines[2].endswith("in <module>"), lines


@pytest.mark.parametrize("spelling", ["--get-stack-traces", "-get-stack-traces"])
def test_timeout_with_stack_traces_prints_them_then_exits_as_a_timeout(
    launcher: Launcher, tmp_path: Path, spelling: str
) -> None:
    script = write_script(tmp_path, "hung.py", HUNG)
    report = tmp_path / "run.json"
    proc = launcher.run("--timeout", "3", spelling, "--report-json", str(report), "-n", "2", PY, script, "600")
    err = proc.stderr.decode()
    assert proc.returncode == 124, err
    said = "mpilaunch: the job exceeded --timeout 3 s; taking every rank's stack, then killing every rank\n"
    assert said in err and err.index(said) < err.index("mpilaunch: stacks of"), err
    hung_job_lines(snapshot(err), "--timeout")
    document = json.loads(report.read_text())
    assert document["outcome"] == "timeout" and document["timed_out_by"] == "--timeout"
    assert [s["why"] for s in document["stacks"]] == ["timeout"]


def test_hang_timeout_prints_stacks_and_the_job_goes_on(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "hung.py", HUNG)
    proc = launcher.run("--hang-timeout", "2", "-n", "2", PY, script, "5")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert sorted(proc.stdout.decode().split("\n")) == ["", "done 0", "done 1", "up 0", "up 1"], err
    hung_job_lines(snapshot(err), "no output for 2 s")
    assert "killing" not in err


def test_hang_action_kill_ends_the_job_as_a_timeout(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "hung.py", HUNG)
    report = tmp_path / "run.json"
    proc = launcher.run("--hang-timeout", "2", "--hang-action", "kill", "--report-json", str(report), "-n", "2", PY,
                        script, "600")  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 124, err
    assert (
        "mpilaunch: no rank wrote any output for 2 s (--hang-timeout, --hang-action kill); "
        "taking every rank's stack, then killing every rank\n"
    ) in err
    hung_job_lines(snapshot(err), "no output for 2 s")
    document = json.loads(report.read_text())
    assert document["outcome"] == "timeout" and document["timed_out_by"] == "--hang-timeout"
    assert [s["why"] for s in document["stacks"]] == ["hang"]


def test_sigquit_at_start_up_never_leaves_a_traceback_or_a_process(launcher: Launcher) -> None:
    """Before the run handles it, SIGQUIT ends the launcher as Ctrl-C does (128 + SIGQUIT; by the
    signal while Python starts); once it runs, it takes stacks and the job goes on."""
    seen = set()
    for delay in (0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.5, 2.0):
        proc = launcher.popen("-n", "2", "sleep", "3")
        time.sleep(delay)
        proc.send_signal(signal.SIGQUIT)
        _, err = proc.communicate(timeout=30)
        text = err.decode(errors="replace")
        assert not [line for line in text.splitlines() if line.lstrip().startswith("File ")], text
        assert proc.returncode in (-signal.SIGQUIT, 128 + signal.SIGQUIT, 0), (proc.returncode, text)
        seen.add(proc.returncode)
        if proc.returncode == 0:
            assert "mpilaunch: SIGQUIT: taking every rank's stack" in text, text
    assert 0 in seen, seen
