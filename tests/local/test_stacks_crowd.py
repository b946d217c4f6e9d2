"""Many `mpilaunch stacks` at once (issue 35, "Never silent, never wrong", item 8): the job's socket
(launcher/stacks/stacks_socket.py) holds a queue of BACKLOG connections, and the client
(cli/stackscli.py) tries again, with a growing pause and for a bounded time, while that queue is
full or while a launcher that runs does not listen yet."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mpilaunch.cli.stackscli import ask, running_jobs
from mpilaunch.launcher.stacks.stacks_socket import BACKLOG, StacksServer, socket_dir
from tests.conftest import Launcher, write_script
from tests.stackjob import Running, release

PY = sys.executable
ASKERS = 40
SLEEPER = """
import os, sys, time
print("up", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def queued(path: str) -> int:
    """Connections waiting in the accept queue of the Unix socket listening at path (`ss`)."""
    out = subprocess.run(["ss", "-xlnH"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == path:
            return int(fields[2])
    return 0


@pytest.mark.skipif(shutil.which("ss") is None, reason="no ss (iproute2) to see the socket's queue")
def test_forty_mpilaunch_stacks_at_once_all_answer(launcher: Launcher, tmp_path: Path) -> None:
    """The launcher is stopped (as a busy turn of its loop would hold it) while 40 askers connect,
    then goes on: every one of them gets the stacks. Before, the socket's queue held 9 and the
    askers that found it full failed at once (`Resource temporarily unavailable`)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    flag = tmp_path / "flag"
    job = Running(launcher.popen("-n", "2", PY, write_script(tmp_path, "sleeper.py", SLEEPER), str(flag), env=env))
    try:
        asked_all_at_once(launcher, job, runtime, env)
        release(flag)
        assert job.finish() == 0, job.err()
    finally:
        if job.proc.poll() is None:  # the test failed: its agent ends the ranks once the launcher is gone
            job.proc.kill()
            job.proc.wait()
    assert job.err().count("mpilaunch: every rank's stack asked for by `mpilaunch stacks` (pid ") == ASKERS


def asked_all_at_once(launcher: Launcher, job: Running, runtime: Path, env: dict[str, str]) -> None:
    askers: list[subprocess.Popen] = []
    try:
        job.wait_out(2)
        path = str(runtime / "mpilaunch" / f"{job.proc.pid}.sock")
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:  # bound once the controller's loop starts
            time.sleep(0.02)
        os.kill(job.proc.pid, signal.SIGSTOP)
        askers = [launcher.popen("stacks", str(job.proc.pid), env=env) for _ in range(ASKERS)]
        # Each asker connects twice (its look at the folder, then its request): all of them
        # wait in the queue, or some have ended (failed), before the launcher goes on.
        deadline = time.monotonic() + 60
        while queued(path) + sum(a.poll() is not None for a in askers) < 2 * ASKERS and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(job.proc.pid, signal.SIGCONT)
        answers = [a.communicate(timeout=120) for a in askers]
    finally:
        os.kill(job.proc.pid, signal.SIGCONT)
        for asker in askers:
            if asker.poll() is None:
                asker.kill()
                asker.wait()
    failed = [(a.returncode, err.decode()) for a, (_, err) in zip(askers, answers) if a.returncode != 0]
    assert not failed, f"{len(failed)} of {ASKERS} failed: {failed[:3]}"
    for out, _ in answers:
        assert "running ranks (asked by mpilaunch stacks)" in out.decode().splitlines()[0], out.decode()


class Pauses:
    """The pauses of a client that tries again, told as they begin."""

    def __init__(self) -> None:
        self.taken: list[float] = []
        self.began = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)
        self.began.set()
        time.sleep(seconds)


def asked_in_thread(path: str, pauses: Pauses) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def run() -> None:
        try:
            result.append(ask(path, os.getpid(), pauses))
        except Exception as exc:  # the test reads it
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_a_full_queue_is_tried_again_until_the_job_takes_the_connection() -> None:
    """The job's own socket server, in this process, with its queue filled and its loop not yet
    turning: the asker pauses, tries again, and gets its answer once the loop takes the queue."""
    sel = selectors.DefaultSelector()
    server = StacksServer(sel, {"stacks": lambda client: client.reply("stacks of this job\n")})
    assert server.open() == ""
    fillers = []
    try:
        while True:  # a queue of BACKLOG, and one more
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(server.path)
            except BlockingIOError:
                sock.close()
                break
            fillers.append(sock)
        assert len(fillers) == BACKLOG + 1
        pauses = Pauses()
        thread, result = asked_in_thread(server.path, pauses)
        assert pauses.began.wait(30), result  # it met the full queue and did not give up
        for sock in fillers:
            sock.close()
        while thread.is_alive():
            for key, _ in sel.select(0.05):
                key.data(key.fd)
        assert result == ["stacks of this job\n"]
        assert pauses.taken[0] == 0.01 and pauses.taken == sorted(pauses.taken), pauses.taken  # growing
    finally:
        server.close()
        sel.close()


def test_a_running_launcher_not_listening_yet_is_waited_for_and_dead_ones_sockets_removed() -> None:
    """A socket bound but not listening refuses connections: its launcher's (here this process,
    older than the socket) is listed and asked again until it listens; a dead launcher's, or one
    whose pid now belongs to a process younger than the socket, is removed. Before, every
    refused socket was removed, also a starting job's."""
    folder = socket_dir()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    starting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.path.join(folder, f"{os.getpid()}.sock")
    starting.bind(path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    younger = subprocess.Popen(["sleep", "60"])
    left = []
    try:
        for pid in (dead.pid, younger.pid):
            leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            leftover.bind(os.path.join(folder, f"{pid}.sock"))
            leftover.close()  # as a launcher killed with kill -9 leaves it: a file nobody listens on
            left.append(os.path.join(folder, f"{pid}.sock"))
        made = time.time() - 30  # the leftover of a launcher long before `sleep` took its pid
        os.utime(left[1], (made, made))
        jobs = running_jobs(folder)
        assert jobs.get(os.getpid()) == path and dead.pid not in jobs and younger.pid not in jobs, jobs
        assert not any(os.path.exists(p) for p in left)
        pauses = Pauses()
        thread, result = asked_in_thread(path, pauses)
        assert pauses.began.wait(30), result
        starting.listen(1)
        conn, _ = starting.accept()
        with conn:
            assert conn.recv(4096).startswith(b'{"op": "stacks"')
            conn.sendall(b"stacks once it listened\n")
        thread.join(30)
        assert result == ["stacks once it listened\n"]
    finally:
        younger.kill()
        younger.wait()
        starting.close()
        for name in [path, *left]:
            if os.path.exists(name):
                os.unlink(name)
