"""`mpilaunch top [PID]`: a live view of a running job of this user's, from another shell.

Every second the job is asked, over its socket (as `mpilaunch stacks` asks it), what each rank
on each host uses; the view shows each rank's state, CPU share, memory and time since its last
output, and marks the ranks that look stuck (top_view.py). Keys: up/down (or k/j) move, space
selects, `s` shows the grouped stacks of the selected ranks (or of the one under the cursor),
Esc hides them, `q` leaves. `--once` prints one view as text (two looks a second apart, for the
CPU shares) and leaves; so does a run whose output is not a terminal. The terminal is drawn
with rich, imported only here.
"""

from __future__ import annotations

import json
import os
import sys
import time

from mpilaunch.cli import top_view
from mpilaunch.cli.stackscli import ask, pick_job
from mpilaunch.errors import LaunchError

USAGE = (
    "usage: mpilaunch top [PID] [--once] [--stuck-after S]  (a live view of a running job of yours;"
    " PID: its launcher's)"
)
REFRESH = 1.0  # seconds between looks


def run_top(args: list[str]) -> int:
    if args in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    pid, once, stuck_after = _read_args(args)
    found = pick_job("top", pid)
    if isinstance(found, int):
        return found
    pid, path = found
    if once or not sys.stdout.isatty() or not sys.stdin.isatty():
        first = look(path, pid)
        time.sleep(REFRESH)
        doc = look(path, pid)
        sys.stdout.write(top_view.plain(pid, doc, top_view.rank_rows(doc, first, stuck_after)))
        return 0
    from mpilaunch.cli.top_screen import Screen  # rich: only for the live view

    return Screen(pid, path, stuck_after, look, stacks_of, REFRESH).run()


def _read_args(args: list[str]) -> tuple[int | None, bool, float]:
    pid, once, stuck_after = None, False, top_view.STUCK_AFTER
    words = iter(args)
    for word in words:
        if word == "--once":
            once = True
        elif word == "--stuck-after":
            value = next(words, "")
            try:
                stuck_after = float(value)
            except ValueError:
                raise LaunchError(f"top: --stuck-after takes a number of seconds, got {value!r}") from None
            if not 0 < stuck_after < float("inf"):
                raise LaunchError(f"top: --stuck-after takes a number of seconds above 0, got {value!r}")
        elif word.isdigit() and pid is None:
            pid = int(word)
        else:
            raise LaunchError(USAGE)
    return pid, once, stuck_after


def look(path: str, pid: int) -> dict:
    """One answer of the job: what every rank uses now."""
    text = ask(path, pid, request={"op": "top", "pid": os.getpid()})
    try:
        doc = json.loads(text)
    except ValueError:
        raise LaunchError(f"top: the job (launcher pid {pid}) gave no usage: {text.strip()[:200]}") from None
    if not isinstance(doc, dict) or doc.get("schema") != 1:
        raise LaunchError(f"top: the job (launcher pid {pid}) answered in a form this mpilaunch does not read")
    return doc


def stacks_of(path: str, pid: int, ranks: list[tuple[int, int]]) -> str:
    """The grouped stacks of these ranks (every rank's is taken, these are shown)."""
    return ask(path, pid, request={"op": "stacks", "pid": os.getpid(), "ranks": [list(r) for r in ranks]})
