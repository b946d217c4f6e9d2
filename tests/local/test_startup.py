"""Start-up cost: a local run must not import what only remote hosts or job files need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HOST_SOURCES, Launcher, parent_pid, stat_fields, tagged_pids, write_script


def test_local_run_imports_no_heavy_modules(tmp_path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith(HOST_SOURCES)}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mpilaunch", "-n", "1", "true"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "mpilaunch.launcher.loop.controller" in imported
    for heavy in ("paramiko", "yaml", "mpilaunch.cli.jobfile", "psutil", "asyncio", "mpi4py", "numpy"):
        assert heavy not in imported
    # Rooms a plain local job does not enter (issue 15's start-up): SSH options, allocations and
    # hostfiles in the launcher; tree relays, the cgroup and the PMI parsers (no rank speaks PMI)
    # in the agent.
    for room in (
        "mpilaunch.transport.sshcommon",
        "mpilaunch.plan.hostsources",
        "mpilaunch.plan.textfiles",
        "mpilaunch.agent.relay",
        "mpilaunch.host.cgroup",
        "mpilaunch.agent.services.pmi1_serve",
        "mpilaunch.agent.services.pmi2_serve",
        "mpilaunch.agent.services.pmix",
        "mpilaunch.agent.services.pmix_lib",
        # Issue "House III": an mpirun-style line reads no other launcher's words (nor the help,
        # nor click's command), and no report or rendezvous code.
        "mpilaunch.cli.hydra_words",
        "mpilaunch.cli.torchrun_words",
        "mpilaunch.cli.helptext",
        "mpilaunch.cli.command",
        "mpilaunch.launcher.report.json_report",
        "mpilaunch.launcher.meeting.rendezvous",
        "mpilaunch.launcher.meeting",
        "mpilaunch.launcher.report.root_cause",
        # The stacks' snapshot code and `mpilaunch top`'s measurements: loaded when first asked for
        # (launcher/stacks/watch.py), the job's socket opened all the same.
        "mpilaunch.launcher.stacks.snapshots",
        "mpilaunch.launcher.stacks.stack_text",
        "mpilaunch.launcher.stacks.stack_groups",
        "mpilaunch.launcher.stacks.usage",
        # The MPI rooms, made by the first message an agent sends them (launcher/loop/controller.py),
        # and the greeting of remote agents.
        "mpilaunch.launcher.mpi",
        "mpilaunch.launcher.mpi.jobwide_pmi",
        "mpilaunch.launcher.mpi.spawns",
        "mpilaunch.launcher.start.greeting",
    ):
        assert room not in imported, room
    # What the run path was trimmed of (issue 5): click (the command line is scanned by argscan),
    # dataclasses and inspect, subprocess and shutil, and what only reports or rank tables need.
    # Counted after start-up: a site hook (a .pth file) may import some of them for itself.
    bare = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, env=env, timeout=60
    )
    at_start = {line.split("|")[-1].strip() for line in bare.stderr.splitlines() if line.startswith("import time:")}
    for trimmed in (
        "click",
        "dataclasses",
        "inspect",
        "subprocess",
        "shutil",
        "mpilaunch.launcher.report.report_text",
        "mpilaunch.plan.ranktable",
        "mpilaunch.launcher.output.treelock",  # a run without a log tree
        "mpilaunch.launcher.output.pattern_files",  # a run without hydra's -outfile-pattern
        "random",  # a retry's wait only
    ):
        assert trimmed in at_start or trimmed not in imported, trimmed


@pytest.mark.parametrize(
    "args",
    [
        ["--bogus", "true"],  # click's error
        ["-n", "0", "true"],
        ["-n", "3", "-H", "localhost:1", "true"],  # not enough slots
        ["-n", "1", "no-such-program-here"],
        ["-n", "1", "--wdir", "/no/such/dir", "true"],
    ],
)
def test_a_refused_job_leaves_no_early_agent(launcher: Launcher, args: list[str]) -> None:
    """The local agent is forked before the command line is read; when the job is refused it is
    ended before the launcher exits, not left to notice on its own."""
    proc = launcher.run(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.decode().count("\n") == 1, proc.stderr  # one line, no traceback
    assert tagged_pids(launcher.tag) == []  # at once: no grace


def test_every_rank_is_a_child_of_one_local_agent(launcher: Launcher, tmp_path: Path) -> None:
    """One local agent, the launcher's own child, runs every rank (the one forked at start-up)."""
    body = "import os, time\nprint(os.getppid(), flush=True)\ntime.sleep(2)\n"
    script = write_script(tmp_path, "parent.py", body)
    proc = launcher.popen("-n", "4", "--oversubscribe", sys.executable, script)
    agents = {int(proc.stdout.readline()) for _ in range(4)}  # type: ignore[union-attr]
    assert len(agents) == 1
    assert parent_pid(agents.pop()) == proc.pid
    proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_output_is_flushed_before_the_quick_exit(launcher: Launcher) -> None:
    """The launcher leaves with os._exit: what it printed must be out first, even through a pipe."""
    proc = launcher.run("--display-map", "-n", "3", "--oversubscribe", "true")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().count("rank") >= 3


def test_paramiko_is_imported_without_invoke() -> None:
    """import_paramiko keeps invoke out (paramiko imports it for `Match exec` only); paramiko
    still knows its real version, and no stand-in is left in sys.modules for code that imports
    invoke later."""
    code = (
        "import sys\n"
        "from mpilaunch.transport.ssh import import_paramiko\n"
        "paramiko = import_paramiko()\n"
        "print(paramiko.__version__, 'invoke' in sys.modules)\n"
        "import importlib.metadata\n"
        "print(importlib.metadata.version('paramiko'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    version, has_invoke = first.split()
    assert has_invoke == "False"
    assert second == version


def test_the_launcher_process_imports_neither_typing_nor_socket(tmp_path) -> None:
    """Records instead of typing.NamedTuple and the C `_socket` instead of `socket`: about 5 and
    3 ms of every start. Checked in the launcher's own process (its forked agent imports socket
    for itself); a site hook may have imported them before mpilaunch, so only new ones count."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from mpilaunch import entry\n"
        "sys.argv = ['mpilaunch', '-n', '2', '--oversubscribe', 'true']\n"
        "try:\n"
        "    entry.main(quick_exit=False)\n"
        "except SystemExit as done:\n"
        "    status = done.code\n"
        "new = {'typing', 'socket'} & (set(sys.modules) - before)\n"
        "print(status, 'mpilaunch.launcher.loop.controller' in sys.modules, sorted(new))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == "0 True []", proc.stdout


def _session_members(session: int) -> list[str]:
    """Processes (zombies included) whose session is `session`: pid and state."""
    found = []
    for name in os.listdir("/proc"):
        fields = stat_fields(name) if name.isdigit() else []
        if fields and int(fields[3]) == session:
            found.append(f"{name} {fields[0].decode()}")
    return found


def test_nothing_of_the_local_agent_is_left_when_the_launcher_returns(launcher: Launcher, tmp_path: Path) -> None:
    """The agent runs in a session of its own, with a forked guardian in another (a batch
    system's kill of the agent's group must not reach it). It reaps the guardian before it
    leaves, so when the launcher returns nothing of either session is left, not even a zombie
    for init to collect."""
    body = (
        "import os\n"
        "agent = os.getppid()\n"
        "def guardian(pid):\n"
        "    try:\n"
        "        with open(f'/proc/{pid}/stat') as f, open(f'/proc/{pid}/cmdline', 'rb') as g:\n"
        "            ppid = int(f.read().rsplit(')', 1)[1].split()[1])\n"
        "            return ppid == agent and b'mpilaunch-guardian' in g.read()\n"
        "    except OSError:\n"
        "        return False\n"
        "found = [int(p) for p in os.listdir('/proc') if p.isdigit() and guardian(p)]\n"
        "print(os.getsid(agent), *(os.getsid(p) for p in found), flush=True)\n"
    )
    script = write_script(tmp_path, "session.py", body)
    for _ in range(8):
        proc = launcher.run("-n", "1", sys.executable, script)
        assert proc.returncode == 0, proc.stderr
        session, guardian = (int(word) for word in proc.stdout.split())
        assert guardian != session
        assert _session_members(session) == [] and _session_members(guardian) == []
