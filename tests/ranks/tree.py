"""A rank that leaves a process tree behind, to prove the job's end takes it along.

    tree.py DIR MODE

It forks a plain child (in its process group) and a daemon made the classic way (fork, setsid,
fork, stdio to /dev/null) with a worker of its own, which also leaves for a session of its own
(not with MODE agent: then it stays in the daemon's group). Neither daemon nor worker is in the
rank's process group, and the worker is not even the agent's orphan until the daemon dies. Each
member writes DIR/<RANK>.<member> once it runs; the rank prints `up RANK` when all three do.
MODE: `exit` (exit 0 at once), `fail` (rank 1 exits 3), anything else: sleep.
"""

from __future__ import annotations

import os
import sys
import time

MEMBERS = ("child", "daemon", "worker")


def linger(where: str, rank: str, name: str) -> None:
    """Say we run, then sleep long after any test is over (if nothing kills us)."""
    open(os.path.join(where, f"{rank}.{name}"), "w").close()
    time.sleep(300)
    os._exit(0)


def main() -> None:
    where, mode = sys.argv[1], sys.argv[2]
    rank = os.environ.get("RANK", "0")
    if os.fork() == 0:
        linger(where, rank, "child")
    if os.fork() == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if os.fork() == 0:
            if mode != "agent":  # with the agent killed -9, only the daemon's own group is promised
                os.setsid()
            linger(where, rank, "worker")
        linger(where, rank, "daemon")
    os.wait()  # the daemon's first fork
    deadline = time.time() + 30
    while not all(os.path.exists(os.path.join(where, f"{rank}.{m}")) for m in MEMBERS):
        if time.time() > deadline:
            sys.exit("the tree did not come up")
        time.sleep(0.01)
    print("up", rank, flush=True)
    if mode == "exit":
        sys.exit(0)
    if mode == "fail" and rank == "1":
        sys.exit(3)
    time.sleep(300)


if __name__ == "__main__":
    main()
