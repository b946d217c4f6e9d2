"""A rank that leaves processes behind that try to escape the job, then does ACTION.

usage: escape.py SHAPE ACTION [DIR]

SHAPE:
  worker   the daemon of issue 16: fork, setsid, fork a child that ignores SIGTERM and forks
           a worker in a session of its own; the first child exits (the daemon is an orphan)
  chain    five levels, each in a session of its own and ignoring SIGTERM and SIGHUP
  group    a child in the rank's own process group that ignores SIGTERM
  quiet    the worker shape with every standard stream on /dev/null (nothing holds the
           rank's pipes, so only the kill finds them)
ACTION: an exit code, or `sleep` (until killed).
DIR: where each process of the tree writes a file named by its pid, so a test knows them all.
Every process of the tree sleeps 120 s: one left behind outlives any test.
"""

import os
import signal
import sys
import time

shape, action = sys.argv[1], sys.argv[2]
record = sys.argv[3] if len(sys.argv) > 3 else None


def mark() -> None:
    if record:
        open(os.path.join(record, str(os.getpid())), "w").close()


def hold() -> None:
    mark()
    time.sleep(120)
    os._exit(0)


def quiet() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)


def worker_daemon(silent: bool) -> None:
    if os.fork() == 0:
        os.setsid()
        if silent:
            quiet()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if os.fork() == 0:
                os.setsid()
                hold()
            hold()
        os._exit(0)


def chain(levels: int) -> None:
    if levels == 0:
        hold()
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        chain(levels - 1)
        hold()


if shape in ("worker", "quiet"):
    worker_daemon(shape == "quiet")
elif shape == "chain":
    chain(5)
elif shape == "group":
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        hold()
else:
    sys.exit(f"unknown shape {shape}")
time.sleep(0.3)  # the tree is made
print(f"rank {os.environ.get('RANK')} made its {shape} tree", flush=True)
if action == "sleep":
    time.sleep(120)
sys.exit(int(action))
