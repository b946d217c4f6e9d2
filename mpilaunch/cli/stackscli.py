"""`mpilaunch stacks [PID]`: every rank's stack of a running job of this user's, printed here.

The job is found by its socket (launcher/stacks/stacks_socket.py: DIR/PID.sock, DIR the user's own);
with several jobs running and no PID, they are listed and nothing is asked (status 2). The job
says on its own stderr who asked; the stacks come back here.

Many may ask at once (a script that asks every job, a user who presses again): a job whose
queue of connections is full (EAGAIN), or whose launcher runs but does not listen yet
(ECONNREFUSED), is asked again after a pause that grows, for CONNECT_PATIENCE seconds at most.
No connection here waits on a job: a stopped or busy launcher is not a hung `mpilaunch stacks`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from mpilaunch.errors import LaunchError
from mpilaunch.host.procfs import started_at
from mpilaunch.launcher.stacks.stacks_socket import SUFFIX, dir_problem, socket_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

USAGE = "usage: mpilaunch stacks [PID]  (every rank's stack of a running job of yours; PID: its launcher's)"
ANSWER_WAIT = 120.0  # seconds: the job answers once every host did, or gave up on it
CONNECT_PATIENCE = 10.0  # seconds of trying again while the job's queue is full or it does not listen yet
FIRST_PAUSE = 0.01  # seconds before the second try; doubled each time, up to LAST_PAUSE
LAST_PAUSE = 0.5


def run_stacks(args: list[str]) -> int:
    if args in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    if len(args) > 1 or (args and not args[0].isdigit()):
        raise LaunchError(USAGE)
    found = pick_job("stacks", int(args[0]) if args else None)
    if isinstance(found, int):
        return found
    pid, path = found
    sys.stdout.write(ask(path, pid))
    sys.stdout.flush()
    return 0


def pick_job(word: str, pid: int | None) -> tuple[int, str] | int:
    """(launcher pid, socket) of the running job of this user's that `mpilaunch WORD [PID]`
    means; else the status to leave with, said on stderr: 1 when none runs, 2 when several do
    and no pid chose one."""
    folder = socket_dir()
    problem = dir_problem(folder, create=False)
    jobs = running_jobs(folder) if not problem else {}
    if not jobs:
        why = f" ({problem})" if problem and os.path.lexists(folder) else ""
        print(f"mpilaunch {word}: no mpilaunch job of yours is running{why}", file=sys.stderr)
        return 1
    if pid is not None:
        if pid not in jobs:
            running = ", ".join(map(str, sorted(jobs)))
            raise LaunchError(f"{word}: no running job of yours has launcher pid {pid}; running: {running}")
    elif len(jobs) > 1:
        print(f"mpilaunch {word}: {len(jobs)} jobs of yours are running; name one by its pid:", file=sys.stderr)
        for pid in sorted(jobs):
            print(f"  {pid}  {command_of(pid)}", file=sys.stderr)
        return 2
    else:
        (pid,) = jobs
    return pid, jobs[pid]


def running_jobs(folder: str) -> dict[int, str]:
    """launcher pid -> its socket, for every socket that answers; those of dead jobs removed."""
    jobs = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    for name in names:
        stem = name[: -len(SUFFIX)]
        if not name.endswith(SUFFIX) or not stem.isdigit():
            continue
        path = os.path.join(folder, name)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.setblocking(False)  # a job whose queue is full is not waited for here
        try:
            probe.connect(path)
        except BlockingIOError:
            pass  # it listens; many are asking at once
        except ConnectionRefusedError:
            if not job_running(int(stem), path):  # else it is starting: bound, not listening yet
                remove(path)  # a launcher killed with kill -9 left it
                continue
        except OSError:
            continue
        finally:
            probe.close()
        jobs[int(stem)] = path
    return jobs


def job_running(pid: int, path: str) -> bool:
    """The launcher that made the socket at path still runs: its pid is there and started before
    the socket was made (after a `kill -9`, the pid may be another process's by now)."""
    started = started_at(pid)
    try:
        made = os.lstat(path).st_mtime
    except OSError:
        return False
    return started is not None and started <= made + 1.0  # the boot time /proc gives is whole seconds


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return "?"
    return " ".join(w for w in words if w)[:200]


def connect(path: str, pid: int, pause: Callable[[float], None] = time.sleep) -> socket.socket:
    """A connection to the job's socket, tried again while its queue is full (EAGAIN) or its
    launcher runs but does not listen (ECONNREFUSED), CONNECT_PATIENCE seconds at most."""
    give_up = time.monotonic() + CONNECT_PATIENCE
    wait = FIRST_PAUSE
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.setblocking(False)  # a Unix socket's connect is whole at once, or EAGAIN
        try:
            conn.connect(path)
            return conn
        except (BlockingIOError, ConnectionRefusedError) as exc:
            conn.close()
            full = isinstance(exc, BlockingIOError)
            if not full and not job_running(pid, path):
                raise LaunchError(f"stacks: the job (launcher pid {pid}) ended before it answered") from None
            if time.monotonic() + wait > give_up:
                why = "its queue of connections stayed full" if full else "it did not listen"
                said = f"stacks: the job at {path} took no connection in {CONNECT_PATIENCE:g} s ({why})"
                raise LaunchError(said) from None
        except OSError as exc:
            conn.close()
            raise LaunchError(f"stacks: cannot reach the job at {path}: {exc.strerror or exc}") from None
        pause(wait)
        wait = min(wait * 2, LAST_PAUSE)


def ask(path: str, pid: int, pause: Callable[[float], None] = time.sleep, request: dict | None = None) -> str:
    """The job's answer to request (every rank's stacks by default), whole."""
    conn = connect(path, pid, pause)
    conn.settimeout(ANSWER_WAIT)
    try:
        conn.sendall(json.dumps(request or {"op": "stacks", "pid": os.getpid()}).encode() + b"\n")
        chunks = []
        while True:
            data = conn.recv(1 << 16)
            if not data:
                break
            chunks.append(data)
    except socket.timeout:
        raise LaunchError(f"stacks: the job did not answer within {ANSWER_WAIT:g} s") from None
    except OSError as exc:
        raise LaunchError(f"stacks: cannot reach the job at {path}: {exc.strerror or exc}") from None
    finally:
        conn.close()
    if not chunks:
        raise LaunchError("stacks: the job ended before it answered")
    return b"".join(chunks).decode("utf-8", "replace")
