"""What the tests' throw-away clusters (tests/slurmbed.py, tests/sgebed.py) share: daemons run in
the foreground and stopped by pid, ports chosen free (and chosen again when a daemon loses one),
client commands run with the bed's environment, and a test module's pair of fixtures.

A bed subclasses `DaemonBed` and says what differs: how its daemons start (`_start`), the order
they stop in (`STOP_ORDER`, the controller last), how its clients see the cluster
(`client_env`), how its jobs are listed and removed (`job_ids`, `remove_jobs`) and where a
daemon's words are (`_daemon_output`). Stdlib only, no pytest outside `bed_fixtures`.
"""

from __future__ import annotations

import argparse
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tests.procs import Leftovers, kill_and_wait, pid_alive, signal_quietly

Bed = TypeVar("Bed", bound="DaemonBed")


class PortClash(RuntimeError):
    """A daemon could not bind its port: someone took it between our check and its bind."""


def can_bind(port: int) -> bool:
    """Whether the TCP port is free on every address, the way the daemons bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_ports() -> tuple[int, int]:
    """Two distinct free ports below the kernel's ephemeral range (the clients' own ports come from there)."""
    ports: list[int] = []
    for _ in range(400):
        port = random.randint(20000, 32000)
        if port not in ports and can_bind(port):
            ports.append(port)
            if len(ports) == 2:
                return ports[0], ports[1]
    raise RuntimeError("no two free ports in 20000..32000")


class DaemonBed(Leftovers):
    """The life cycle of a one-host cluster: `start()` (or `with`) and `close()`, which removes the
    bed's jobs, kills by pid whatever job process is left, stops the daemons by pid in
    `STOP_ORDER` (SIGTERM, SIGKILL after `GRACE` s) and checks that none is left."""

    NAME = "bed"
    CONTROLLER = ""  # the daemon that knows the jobs: while it runs, close() removes them through it
    STOP_ORDER: tuple[str, ...] = ()
    BIND_ERRORS: tuple[str, ...] = ("Address already in use",)
    NEVER_CLASHES: frozenset[str] = frozenset()  # daemons without a TCP port
    GRACE = 3.0  # seconds from SIGTERM to SIGKILL for a daemon at close()

    def __init__(self, base: str | Path, workdir: str = ".") -> None:
        self.base = Path(base).resolve()
        self.workdir = workdir  # the clients' working directory, below base
        self.env: dict[str, str] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._every_pid: set[int] = set()  # daemons of earlier tries (a port clash) too
        self._started = False
        self.start_seconds = 0.0
        self.close_seconds = 0.0

    # -- what a bed says ----------------------------------------------------------------------

    def available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def _start(self, timeout: float) -> None:
        """Write the bed's files and start its daemons; returns once they take jobs."""
        raise NotImplementedError

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        raise NotImplementedError

    def job_ids(self) -> list[str]:
        raise NotImplementedError

    def remove_jobs(self) -> None:
        raise NotImplementedError

    def job_settle(self) -> float:
        """Seconds a removed job's processes may take to end."""
        return 10.0

    def _daemon_output(self, name: str) -> str:
        raise NotImplementedError

    def recorded_pids(self) -> list[int]:
        """Every daemon pid this bed ever started (alive or not), to check after close()."""
        return sorted(self._every_pid)

    # -- life cycle ---------------------------------------------------------------------------

    def __enter__(self: Bed) -> Bed:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def start(self: Bed, timeout: float = 60.0) -> Bed:
        ok, reason = self.available()
        if not ok:
            raise RuntimeError(f"{type(self).__name__} cannot run here: {reason}")
        began = time.monotonic()
        self._started = True
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def close(self, grace: float | None = None) -> None:
        if not self._started:
            return
        began = time.monotonic()
        try:
            if self.is_running(self.CONTROLLER):
                self.remove_jobs()
                left = self.wait_clean(self.job_settle())
            else:
                left = self.leftover_pids()
            kill_and_wait(left)
        finally:
            self._stop(self.STOP_ORDER, self.GRACE if grace is None else grace)
            kill_and_wait(self.leftover_pids())
            self._started = False
            self.close_seconds = time.monotonic() - began
        alive = [pid for pid in self.recorded_pids() if pid_alive(pid)]
        if alive:
            raise RuntimeError(f"{type(self).__name__} daemons still alive after close: {alive}")

    # -- what tests use -----------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command against the bed; text output captured."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("capture_output", "stdout" not in kw and "stderr" not in kw)
        kw.setdefault("text", True)
        kw.setdefault("cwd", self.base / self.workdir)
        return subprocess.run(list(argv), timeout=timeout, env=self.client_env(env), **kw)

    def popen(self, argv: Sequence[str], *, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
        """Start a client command against the bed without waiting (to cancel later)."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        kw.setdefault("cwd", self.base / self.workdir)
        return subprocess.Popen(list(argv), env=self.client_env(env), **kw)

    def wait_no_jobs(self, timeout: float = 10.0) -> list[str]:
        """Poll until the controller lists no job (a finished one lingers a moment); those left."""
        deadline = time.monotonic() + timeout
        ids = self.job_ids()
        while ids and time.monotonic() < deadline:
            time.sleep(0.1)
            ids = self.job_ids()
        return ids

    def daemon_pids(self) -> dict[str, int]:
        """The running daemons by name."""
        return {name: proc.pid for name, proc in self._procs.items() if proc.poll() is None}

    def is_running(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    # -- for the beds -------------------------------------------------------------------------

    def _record(self, name: str, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self._procs[name] = proc
        self._every_pid.add(proc.pid)
        return proc

    def _on_free_ports(self, begin: Callable[[int, int], None], stop: Sequence[str], what: str) -> None:
        """`begin(port, port)` with two free ports; again with others when a daemon lost one."""
        for attempt in range(6):
            try:
                begin(*free_ports())
                return
            except PortClash:
                self._stop(stop)
                if attempt == 5:
                    raise RuntimeError(f"no free {what} after 6 tries") from None

    def _wait(self, name: str, proc: subprocess.Popen[bytes], timeout: float, ready: Callable[[], bool]) -> None:
        """Poll `ready()` until true; a daemon that exits first fails the start (a port clash: retry)."""
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                text = self._daemon_output(name)
                if name not in self.NEVER_CLASHES and any(err in text for err in self.BIND_ERRORS):
                    raise PortClash(text)
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{text}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready within {timeout}s:\n{self._daemon_output(name)}")
            time.sleep(self.POLL)

    def _stop(self, names: Sequence[str], grace: float = 3.0) -> None:
        """SIGTERM the daemons by pid in this order, SIGKILL what is left at the deadline, reap."""
        for name in names:
            proc = self._procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                signal_quietly(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                signal_quietly(proc.pid, signal.SIGKILL)
                proc.wait()


def bed_fixtures(make: Callable[[Path], DaemonBed], fixture: str, folder: str, settle: float):  # type: ignore[no-untyped-def]
    """A test module's bed fixture (started once for the module, skipped where it cannot run)
    and its autouse `clean_<fixture>`: a test fails if a job or a job's process is still there
    `settle` seconds after it, and what was left is removed and killed by pid."""
    import pytest

    @pytest.fixture(scope="module", name=fixture)
    def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonBed]:
        made = make(tmp_path_factory.mktemp(folder))
        ok, reason = made.available()
        if not ok:
            pytest.skip(reason)
        with made:
            yield made

    @pytest.fixture(autouse=True, name=f"clean_{fixture}")
    def clean(request: pytest.FixtureRequest) -> Iterator[None]:
        made: DaemonBed = request.getfixturevalue(fixture)
        yield
        jobs = made.wait_no_jobs(settle)
        left = made.wait_clean(settle)
        if jobs:
            made.remove_jobs()
            left = sorted(set(left) | set(made.wait_clean(made.job_settle())))
        made.kill_leftovers()
        assert not left and not jobs, f"left by the test: processes {left}, jobs {jobs}"

    return bed, clean


def time_by_hand(
    argv: Sequence[str] | None, make: Callable[[Path], DaemonBed], job: Callable[[Any], list[str]], what: str
) -> int:
    """A bed's `python -m tests.X`: start one, run `job(bed)` through it, close it and print the times."""
    parser = argparse.ArgumentParser(description=f"Time a {what}'s start-up and shutdown, and run one job through it.")
    parser.add_argument("--dir", help="bed directory (kept); default: a temporary one")
    parser.add_argument("--keep", action="store_true", help="print the env and wait for Enter before closing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bed-") as tmp:
        bed = make(Path(args.dir or tmp))
        ok, reason = bed.available()
        if not ok:
            print(f"unavailable: {reason}")
            return 2
        bed.start()
        ready = time.monotonic()
        try:
            out = bed.run(job(bed), timeout=60)
            first_job = time.monotonic() - ready
            print(out.stdout.strip(), out.stderr.strip())
            if args.keep:
                print(" ".join(f"{k}={v}" for k, v in bed.env.items()))
                input("Enter to close ")
        finally:
            bed.close()
    print(f"{what}: start {bed.start_seconds:.2f}s, first job {first_job:.2f}s, close {bed.close_seconds:.2f}s")
    return out.returncode
