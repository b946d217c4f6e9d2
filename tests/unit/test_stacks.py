"""Stacks read and grouped (issue 30): what py-spy, eu-stack and gdb printed for one Python
process of this machine (tests/data/stacks, two threads: the main one in `stuck_here`, the
other in `other`), read as threads of frames; equal stacks grouped, largest first, as STAT does."""

from __future__ import annotations

import pytest

from mpilaunch.launcher.stacks.stack_groups import frame_lines, group, one_line, rank_words, snapshot_lines
from mpilaunch.launcher.stacks.stack_text import MAIN, Thread, threads_of
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "stacks"


def sample(tool: str) -> str:
    return (DATA / f"{tool}.txt").read_text()


def test_py_spy_every_thread_outermost_first_without_ids() -> None:
    threads, why = threads_of("py-spy", sample("py-spy"))
    assert why == ""
    assert threads == (
        Thread("MainThread", ("sq.py:7 in <module>", "sq.py:3 in stuck_here")),
        Thread(
            "Thread-1 (other)",
            (
                "threading.py:1002 in Thread._bootstrap",
                "threading.py:1045 in Thread._bootstrap_inner",
                "threading.py:982 in Thread.run",
                "sq.py:5 in other",
            ),
        ),
    )


@pytest.mark.parametrize("tool", ["eu-stack", "gdb"])
def test_native_tools_give_the_main_thread_first_with_lines_where_known(tool: str) -> None:
    threads, why = threads_of(tool, sample(tool))
    assert why == "" and len(threads) == 2
    main, other = threads
    assert main.name == MAIN and other.name != MAIN and other.name.isdigit()
    innermost = {"eu-stack": "clock_nanosleep", "gdb": "__GI___clock_nanosleep"}[tool]  # a symbol, a function
    assert main.frames[-1] == f"clock_nanosleep.c:48 in {innermost}"
    assert main.frames[0].startswith("_start") and "libc-start.c:360 in __libc_start_main" in main.frames[1]
    assert any(f.startswith("timemodule.c:") and f.endswith("in time_sleep") for f in main.frames)
    assert not any("0x" in f for f in main.frames if not f.startswith("??"))  # no addresses, no arguments
    assert "start_thread" in " ".join(other.frames)


def test_two_dumps_of_one_stack_in_other_processes_are_equal() -> None:
    """Ids, addresses and argument values differ from process to process; the frames do not."""
    for tool in ("py-spy", "eu-stack", "gdb"):
        text = sample(tool)
        other = text.replace("19469", "4242").replace("19471", "4343").replace("0x7f", "0x6e")
        assert threads_of(tool, text) == threads_of(tool, other), tool


@pytest.mark.parametrize(
    ("tool", "text", "why"),
    [
        (
            "py-spy",
            "Error: Failed to find python version from target process\n\nStack backtrace:\n  10: main\n",
            "py-spy: Error: Failed to find python version from target process",
        ),
        ("eu-stack", "eu-stack: dwfl_linux_proc_attach pid 7: Operation not permitted\n", "eu-stack: eu-stack: dwfl"),
        ("gdb", "", "gdb printed no stack"),
    ],
)
def test_a_dump_without_frames_says_why(tool: str, text: str, why: str) -> None:
    threads, said = threads_of(tool, text)
    assert threads == () and said.startswith(why)


MAIN_WAIT = (Thread("MainThread", ("train.py:20 in <module>", "train.py:88 in step", "dist.py:9 in all_reduce")),)
STUCK = (Thread("MainThread", ("train.py:20 in <module>", "data.py:40 in next_batch", "data.py:7 in stuck_here")),)


def test_equal_stacks_make_one_group_and_the_largest_comes_first() -> None:
    stacks = {(1, r): MAIN_WAIT for r in (*range(7), *range(8, 16))}
    stacks[(1, 7)] = STUCK
    groups = group(stacks)
    assert [(len(g.ranks), g.threads) for g in groups] == [(15, MAIN_WAIT), (1, STUCK)]
    assert rank_words(groups[0].ranks) == "ranks 0-6,8-15" and rank_words(groups[1].ranks) == "rank 7"
    lines = snapshot_lines(groups, [((1, 16), "py-spy gave no stack within 5 s"), ((2, 0), "gone")])
    assert lines == [
        "  ranks 0-6,8-15 (15): train.py:20 in <module> > step > all_reduce",
        "  rank 7 (1): train.py:20 in <module> > next_batch > stuck_here",
        "  rank 7, whole:",
        "    train.py:20 in <module>",
        "    data.py:40 in next_batch",
        "    data.py:7 in stuck_here",
        "  rank 16: no stack: py-spy gave no stack within 5 s",
        "  job 2 rank 0: no stack: gone",
    ]


def test_groups_of_one_size_are_in_rank_order_and_a_lone_group_is_shown_whole() -> None:
    assert [g.ranks for g in group({(1, 3): STUCK, (1, 1): MAIN_WAIT})] == [((1, 1),), ((1, 3),)]
    lines = snapshot_lines(group({(1, 0): STUCK, (1, 1): STUCK}), [])
    assert lines[0] == "  ranks 0-1 (2): train.py:20 in <module> > next_batch > stuck_here" and len(lines) == 5


def test_a_deep_stack_shows_its_innermost_frames_on_its_line() -> None:
    deep = (Thread(MAIN, tuple(f"f.c:{n} in f{n}" for n in range(10))),)
    assert one_line(deep) == "... > f.c:6 in f6 > f7 > f8 > f9"
    assert one_line((Thread(MAIN, ("poll (libc.so.6)", "?? (libmpi.so.40)")),)) == "poll (libc.so.6) > ??"


def test_several_threads_are_named_in_the_lines() -> None:
    threads = (Thread("MainThread", ("a.py:1 in <module>",)), Thread("loader", ("b.py:2 in run",)))
    assert frame_lines(threads) == ["thread MainThread:", "  a.py:1 in <module>", "thread loader:", "  b.py:2 in run"]
