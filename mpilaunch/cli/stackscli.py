"""`mpilaunch stacks [PID]`: every rank's stack of a running job of this user's, printed here.

The job is found by its socket (launcher/stacks_socket.py: DIR/PID.sock, DIR the user's own);
with several jobs running and no PID, they are listed and nothing is asked (status 2). The job
says on its own stderr who asked; the stacks come back here.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.stacks_socket import SUFFIX, dir_problem, socket_dir

USAGE = "usage: mpilaunch stacks [PID]  (every rank's stack of a running job of yours; PID: its launcher's)"
ANSWER_WAIT = 120.0  # seconds: the job answers once every host did, or gave up on it


def run_stacks(args: list[str]) -> int:
    if args in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    if len(args) > 1 or (args and not args[0].isdigit()):
        raise LaunchError(USAGE)
    folder = socket_dir()
    problem = dir_problem(folder, create=False)
    jobs = running_jobs(folder) if not problem else {}
    if not jobs:
        why = f" ({problem})" if problem and os.path.lexists(folder) else ""
        print(f"mpilaunch stacks: no mpilaunch job of yours is running{why}", file=sys.stderr)
        return 1
    if args:
        pid = int(args[0])
        if pid not in jobs:
            raise LaunchError(f"stacks: no running job of yours has launcher pid {pid}; running: {listing(jobs)}")
    elif len(jobs) > 1:
        print(f"mpilaunch stacks: {len(jobs)} jobs of yours are running; name one by its pid:", file=sys.stderr)
        for pid in sorted(jobs):
            print(f"  {pid}  {command_of(pid)}", file=sys.stderr)
        return 2
    else:
        (pid,) = jobs
    sys.stdout.write(ask(jobs[pid]))
    sys.stdout.flush()
    return 0


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
        try:
            probe.connect(path)
            jobs[int(stem)] = path
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                os.unlink(path)  # a launcher killed with kill -9 left it
            except OSError:
                pass
        except OSError:
            pass
        finally:
            probe.close()
    return jobs


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return "?"
    return " ".join(w for w in words if w)[:200]


def listing(jobs: dict[int, str]) -> str:
    return ", ".join(str(pid) for pid in sorted(jobs))


def ask(path: str) -> str:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(ANSWER_WAIT)
    try:
        conn.connect(path)
        conn.sendall(json.dumps({"op": "stacks", "pid": os.getpid()}).encode() + b"\n")
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
