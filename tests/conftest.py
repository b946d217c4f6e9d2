"""Shared fixtures: run the real mpilaunch command, and prove no process of a job survives it."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import parent_pid, process_name, stat_fields  # tests import them from here too

ROOT = Path(__file__).resolve().parent.parent
TAG_VAR = "MPILAUNCH_TEST_TAG"
# An allocation around the test run (Slurm, Grid Engine, PBS, LSF, a platform) would pick the hosts of every job.
HOST_SOURCES = ("MLP_MPI_", "SLURM_", "PE_HOSTFILE", "PBS_", "LSB_", "OMPI_MCA_orte_default_hostfile")


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries this test's tag (launcher, agent, ranks, their children)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        state = stat_fields(name)[:1]
        if state and state != [b"Z"] and needle in environ.split(b"\0"):
            found.append(int(name))
    return found


def environ_text(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def is_remote_agent(pid: int) -> bool:
    """A remote agent runs the loader and is a child of its session's sshd (its guardian is not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"mpilaunch-loader" not in handle.read():
                return False
    except OSError:
        return False
    return process_name(parent_pid(pid)) == "sshd"


def session_sshd(bed, name: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The per-connection sshd processes of one host of an SshBed (children of its listening daemon)."""
    daemon = bed._host(name).proc.pid
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and parent_pid(int(e)) == daemon]


def sshd_of_sessions(bed, name: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Every sshd process that carries one host's sessions (the per-connection ones and their
    privilege-separated children): stopping them all cuts that host off without a reset."""
    sessions = session_sshd(bed, name)
    return [
        p for p in bed.leftover_pids() if p in sessions or (parent_pid(p) in sessions and process_name(p) == "sshd")
    ]


class Launcher:
    """Runs `python -m mpilaunch` with a tagged environment."""

    def __init__(self, tag: str, tmp_path: Path) -> None:
        self.tag = tag
        self.tmp_path = tmp_path
        self.env = dict(os.environ)
        self.env.update({TAG_VAR: tag, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        # Chosen, so the launcher does not add its OMP_NUM_THREADS line to the stderr tests compare
        # (test_devices_run.py removes it to test that line), and a small machine's ranks do not
        # each start a thread per core.
        self.env.setdefault("OMP_NUM_THREADS", "1")
        for name in list(self.env):
            if name.startswith(("PMI_", "PMIX_", "OMPI_COMM_WORLD_", "MASTER_")) or name.startswith(HOST_SOURCES):
                del self.env[name]

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mpilaunch", *args]

    def run(self, *args: str, timeout: float = 60, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("cwd", self.tmp_path)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(
            self.argv(*args), capture_output=True, timeout=timeout, env={**self.env, **(env or {})}, **kw
        )

    def popen(self, *args: str, env: dict | None = None, argv: list[str] | None = None, **kw) -> subprocess.Popen:
        """argv: a whole command line instead of `python -m mpilaunch` and args."""
        kw.setdefault("cwd", self.tmp_path)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(argv or self.argv(*args), env={**self.env, **(env or {})}, **kw)


FOLDER_MARKS = {
    "unit": "unit",
    "local": "local",
    "ssh": "sshbed",
    "mpi": "mpi",
    "slurm": "slurm",
    "sge": "sge",
    "tools": "tools",
}
BED_FIXTURES = {"bed", "clean_hosts", "clean_bed"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks by folder, and `sshbed` on every test that uses an sshd bed wherever it lives."""
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in FOLDER_MARKS:
            item.add_marker(FOLDER_MARKS[folder])
        if BED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("sshbed")


def partial_cache_files() -> set[str]:
    """Files left beside the user's kept files (`agent-KEY.bin.PID...`, `hwloc-...xml.PID...`) by
    writers that are gone: a cache write that failed or was cut short."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(home, "mpilaunch")
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    left = set()
    for name in names:
        found = re.fullmatch(r"(?:agent-\w+\.bin|hwloc-.+\.xml)\.(\d+)\D?.*", name)
        if found and not os.path.exists(f"/proc/{found.group(1)}"):
            left.add(name)
    return left


@pytest.fixture(scope="session", autouse=True)
def own_home() -> Iterator[str]:
    """The whole run has a HOME of its own, removed at the end, and no XDG_* folder of the user's:
    no test reads or writes the user's ~/.cache (the launchers' kept agent code and machine
    descriptions go to this one) or ~/.ssh for the paramiko client. OpenSSH's `ssh` finds ~ in the
    passwd entry, not in HOME: every test gives it a config with -F (--ssh-config), and the sshd
    bed's sessions have a HOME of their own (tests/sshbed.py)."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="mpl-home-")
    names = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
    before = {name: os.environ.get(name) for name in names}
    for name in names[1:]:
        os.environ.pop(name, None)
    os.environ["HOME"] = folder
    yield folder
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def own_socket_folder() -> Iterator[str]:
    """The launchers' `mpilaunch stacks` sockets go to a folder of the run's own
    (XDG_RUNTIME_DIR), removed at the end: a launcher a test kills with kill -9 leaves its
    socket, as a user's would, and it is not left in the machine's /tmp/mpilaunch-UID."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="mpl-run-")  # short: a socket's path has a limit
    before = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = folder
    yield folder
    if before is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_partial_cache_file_is_left(own_home: str) -> Iterator[None]:
    """After the whole run of the tests, no cache file is left half written (issue 27): none that
    was not there before it, in the run's own HOME."""
    before = partial_cache_files()
    yield
    left = partial_cache_files() - before
    assert not left, f"partial cache files left: {sorted(left)}"


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    tag = uuid.uuid4().hex
    yield Launcher(tag, tmp_path)
    deadline = time.monotonic() + 3.0
    left = tagged_pids(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = tagged_pids(tag)
    for pid in left:  # kill what the test left, by recorded pid, then fail it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes of the job survived the test: {left}"


def write_script(directory: Path, name: str, body: str) -> str:
    path = directory / name
    path.write_text(body)
    return str(path)


@pytest.fixture
def py() -> str:
    return sys.executable


def sshbed_fixtures(name: str, hosts: int, settle: float = 3.0):  # type: ignore[no-untyped-def]
    """A test module's `bed` (hosts sshd servers, started once for the module) and its autouse
    `clean_hosts`: a test fails if a process of its job is still on a host `settle` seconds
    after it, and what was left is killed by pid. Use: `bed, clean_hosts = sshbed_fixtures(...)`."""
    from tests.sshbed import SshBed

    @pytest.fixture(scope="module")
    def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBed]:
        with SshBed(tmp_path_factory.mktemp(name), hosts) as started:
            yield started

    @pytest.fixture(autouse=True)
    def clean_hosts(bed: SshBed) -> Iterator[None]:
        yield
        left = bed.wait_clean(settle)
        if left:
            bed.kill_leftovers()
        assert not left, f"processes of the job survived on the hosts: {left}"

    return bed, clean_hosts


def kill_launcher_expecting_clean_hosts(proc: subprocess.Popen, bed: object, within: float) -> None:
    """kill -9 of the launcher: every process of the job must be gone from the bed's hosts
    within `within` seconds."""
    proc.kill()
    proc.wait()
    killed = time.monotonic()
    left = bed.wait_clean(within)  # type: ignore[attr-defined]
    assert not left, f"still running {within:g} s after kill -9 of the launcher: {left}"
    assert time.monotonic() - killed <= within


# The device addresses of the seeds' 8-device rank table sample (hccn.conf, one per device).
SEED_IPS = ["192.1.27.6", "192.2.27.6", "192.3.27.6", "192.4.27.6"]
SEED_IPS += ["192.1.27.7", "192.2.27.7", "192.3.27.7", "192.4.27.7"]


def fake_smi(directory: Path, body: str) -> str:
    """A directory whose `nvidia-smi` runs `body` (a shell script): GPU counting without GPUs."""
    path = directory / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(directory)
