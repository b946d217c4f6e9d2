"""Ranks with equal stacks grouped, as LLNL's STAT merges them, and the groups as text.

A thousand ranks waiting in the same all-reduce are one line; the rank stuck elsewhere is a
group of its own, printed whole, and stands out. Pure: stacks in, groups and lines out.
"""

from __future__ import annotations

from mpilaunch.launcher.report.report_text import ranges
from mpilaunch.launcher.stacks.stack_text import Thread
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

SHOWN_FRAMES = 4  # a group's line shows the innermost frames of its main thread, this many


class Group(Record):
    """Ranks, as (job, rank), whose stacks are equal (every thread, frame for frame)."""

    ranks: tuple[tuple[int, int], ...]
    threads: tuple[Thread, ...]


def group(stacks: Mapping[tuple[int, int], Sequence[Thread]]) -> list[Group]:
    """Equal stacks together; the largest group first, then by their lowest rank."""
    by_stack: dict[tuple[Thread, ...], list[tuple[int, int]]] = {}
    for who, threads in sorted(stacks.items()):
        by_stack.setdefault(tuple(threads), []).append(who)
    groups = [Group(tuple(ranks), threads) for threads, ranks in by_stack.items()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks[0]))


def rank_words(ranks: Sequence[tuple[int, int]]) -> str:
    """`rank 2`, `ranks 0-6,8-15`; ranks of spawned jobs by their job: `job 2 ranks 0-1`."""
    by_job: dict[int, list[int]] = {}
    for job, rank in ranks:
        by_job.setdefault(job, []).append(rank)
    parts = []
    for job in sorted(by_job):
        numbers = by_job[job]
        words = f"rank{'s' if len(numbers) > 1 else ''} {ranges(numbers)}"
        parts.append(words if job == 1 else f"job {job} {words}")
    return "; ".join(parts)


def frame_lines(threads: Sequence[Thread]) -> list[str]:
    """A stack as lines, outermost frame first; a thread's name above its frames when there are
    several threads."""
    if len(threads) == 1:
        return list(threads[0].frames)
    lines = []
    for thread in threads:
        lines += [f"thread {thread.name}:", *(f"  {f}" for f in thread.frames)]
    return lines


def one_line(threads: Sequence[Thread]) -> str:
    """The main thread's innermost frames, outermost of them whole, the rest by function:
    `... > train.py:88 in step > all_reduce > wait`."""
    frames = threads[0].frames if threads else ()
    shown = list(frames[-SHOWN_FRAMES:])
    if not shown:
        return "(no frames)"
    words = [shown[0], *(f.split(" in ", 1)[-1] if " in " in f else f.split(" (", 1)[0] for f in shown[1:])]
    return ("... > " if len(frames) > len(shown) else "") + " > ".join(words)


def snapshot_lines(groups: Sequence[Group], missing: Sequence[tuple[tuple[int, int], str]]) -> list[str]:
    """What a person reads: a line per group, largest first; then the stacks of the groups that
    are not the largest, whole (the only group's too); then the ranks without a stack and why."""
    lines = [f"  {rank_words(g.ranks)} ({len(g.ranks)}): {one_line(g.threads)}" for g in groups]
    for g in groups[1:] if len(groups) > 1 else groups:
        lines.append(f"  {rank_words(g.ranks)}, whole:")
        lines += [f"    {line}" for line in frame_lines(g.threads)]
    by_why: dict[str, list[tuple[int, int]]] = {}
    for who, why in missing:
        by_why.setdefault(why, []).append(who)
    for why, ranks in by_why.items():
        lines.append(f"  {rank_words(ranks)}: no stack: {why}")
    return lines
