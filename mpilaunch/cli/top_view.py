"""What `mpilaunch top` shows, from the job's answers (launcher/stacks/usage.py), apart from any
terminal: one row per rank with its CPU share over the last interval, its memory, the time since
its last output line, and whether it looks stuck (no CPU and no output for a while).
"""

from __future__ import annotations

from typing import NamedTuple

from mpilaunch.launcher.report.report_text import size

STUCK_AFTER = 60.0  # seconds without output and without CPU after which a running rank looks stuck
IDLE_CPU = 1.0  # percent of a core below which a rank counts as using no CPU


class RankRow(NamedTuple):
    key: tuple[int, int]  # (job, rank)
    host: str
    pid: int | None
    state: str  # running, exited, failed, stopping, planned
    cpu: float | None  # percent of one core over the last interval; None before a second look
    rss: int | None
    quiet: float  # seconds since its last output (since its start, if it wrote none)
    stuck: bool


def rank_rows(doc: dict, before: dict | None, stuck_after: float = STUCK_AFTER) -> list[RankRow]:
    """Every rank of the document; before: the previous answer, for the CPU shares."""
    earlier = {(r["job"], r["rank"]): r for r in before["ranks"]} if before else {}
    interval = doc["taken"] - before["taken"] if before else 0.0
    rows = []
    for rank in doc["ranks"]:
        key = (rank["job"], rank["rank"])
        cpu = None
        was = earlier.get(key)
        running = rank["state"] == "running"
        alive = running or rank["state"] == "stopping"
        if alive and interval > 0 and was is not None and rank["cpu"] is not None and was["cpu"] is not None:
            cpu = max(0.0, (rank["cpu"] - was["cpu"]) / interval * 100)
        stuck = running and cpu is not None and cpu < IDLE_CPU and rank["quiet"] >= stuck_after
        rows.append(RankRow(key, rank["host"], rank["pid"], rank["state"], cpu, rank["rss"], rank["quiet"], stuck))
    return rows


def label(key: tuple[int, int]) -> str:
    job, rank = key
    return str(rank) if job == 1 else f"{rank}/j{job}"


def duration(seconds: float) -> str:
    """4.2s, 3m07s, 2h05m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def cells(row: RankRow) -> list[str]:
    """RANK HOST PID STATE CPU% MEM QUIET, as text."""
    state = "stuck?" if row.stuck else row.state
    cpu = "-" if row.cpu is None else f"{row.cpu:.0f}"
    return [label(row.key), row.host, str(row.pid or "-"), state, cpu, size(row.rss) if row.rss else "-",
            duration(row.quiet)]  # fmt: skip


COLUMNS = ("RANK", "HOST", "PID", "STATE", "CPU%", "MEM", "QUIET")


def summary(pid: int, doc: dict, rows: list[RankRow], width: int | None = None) -> str:
    """The line above the table: the job, how long it has run, what its ranks do. The command
    gives way (to 60 characters, or to what a terminal width columns wide leaves), so that a
    screen's line does not wrap in the middle of the counts."""
    running = sum(1 for r in rows if r.state == "running")
    stuck = sum(1 for r in rows if r.stuck)
    head = f"job {pid}: "
    tail = f" | {duration(doc['elapsed'])} | {running} of {len(rows)} running"
    if stuck:
        tail += f" | {stuck} look stuck"
    if doc.get("unanswered"):
        tail += f" | no answer from {', '.join(doc['unanswered'])}"
    room = 60 if width is None else min(60, max(8, width - len(head) - len(tail)))
    return head + " ".join(doc["command"])[:room] + tail


def plain(pid: int, doc: dict, rows: list[RankRow]) -> str:
    """The view as plain text (--once, or no terminal)."""
    table = [list(COLUMNS), *(cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    return "\n".join([summary(pid, doc, rows), *lines]) + "\n"
