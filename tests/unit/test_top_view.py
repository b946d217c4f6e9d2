"""`mpilaunch top`'s view, from two answers of a job (launcher/stacks/usage.py's document)."""

from __future__ import annotations

from mpilaunch.cli import top_view


def answer(taken: float, *ranks: tuple[int, str, float | None, int | None, float]) -> dict:
    return {
        "schema": 1, "taken": taken, "elapsed": 90.0, "command": ["python", "train.py"], "hosts": [],
        "unanswered": [],
        "ranks": [
            {"job": 1, "rank": r, "host": "node1", "pid": 100 + r, "state": state, "status": None, "cpu": cpu,
             "rss": rss, "quiet": quiet, "wrote": True}
            for r, state, cpu, rss, quiet in ranks
        ],
    }  # fmt: skip


def test_cpu_shares_come_from_two_answers_and_silent_idle_ranks_look_stuck() -> None:
    first = answer(100.0, (0, "running", 10.0, 1 << 20, 0.5), (1, "running", 5.0, 2 << 20, 70.0))
    second = answer(102.0, (0, "running", 11.8, 1 << 20, 0.1), (1, "running", 5.0, 2 << 20, 72.0))
    rows = top_view.rank_rows(second, first, stuck_after=60)
    assert [(r.key, round(r.cpu or 0), r.stuck) for r in rows] == [((1, 0), 90, False), ((1, 1), 0, True)]
    assert top_view.rank_rows(second, None)[1].cpu is None and not top_view.rank_rows(second, None)[1].stuck
    assert not top_view.rank_rows(second, first, stuck_after=100)[1].stuck  # not silent long enough


def test_ended_ranks_never_look_stuck_and_the_text_view_names_them() -> None:
    first = answer(1.0, (0, "exited", 3.0, None, 80.0), (1, "running", 1.0, 4096, 80.0))
    second = answer(2.0, (0, "exited", 3.0, None, 81.0), (1, "running", 1.5, 4096, 81.0))
    rows = top_view.rank_rows(second, first, stuck_after=60)
    assert [r.stuck for r in rows] == [False, False]  # rank 1 used half a core
    text = top_view.plain(42, second, rows)
    assert text.splitlines()[0] == "job 42: python train.py | 1m30s | 1 of 2 running"
    assert text.splitlines()[1].split() == list(top_view.COLUMNS)
    assert text.splitlines()[2].split() == ["0", "node1", "100", "exited", "-", "-", "1m21s"]
    assert text.splitlines()[3].split() == ["1", "node1", "101", "running", "50", "4", "KiB", "1m21s"]


def test_the_command_gives_way_so_the_line_fits_its_terminal() -> None:
    first = answer(1.0, (0, "running", 1.0, None, 0.1), (1, "running", 1.0, None, 0.1), (2, "running", 1.0, None, 89.0))
    long = answer(2.0, (0, "running", 2.0, None, 0.1), (1, "running", 2.0, None, 0.1), (2, "running", 1.0, None, 90.0))
    long["command"] = ["/root/.pyenv/versions/3.11.7/bin/python", "/tmp/pytest-of-root/pytest-698/job.py"]
    rows = top_view.rank_rows(long, first, stuck_after=60)
    for pid in (448, 4194303):
        line = top_view.summary(pid, long, rows, width=80)
        assert len(line) == 80 and line.endswith(" | 1m30s | 3 of 3 running | 1 look stuck"), line
        assert line.startswith(f"job {pid}: /root/.pyenv/versions/"), line
    assert top_view.summary(448, long, rows).startswith("job 448: " + " ".join(long["command"])[:60] + " | ")


def test_a_rank_is_measured_with_the_processes_below_it_from_proc() -> None:
    """agent/usage.py on this very process: no process is started to test it."""
    import os

    from mpilaunch.agent.usage import measure, rank_usage

    mine = rank_usage(7, os.getpid())
    assert mine is not None and mine.proc == 7 and mine.state == "R" and mine.cpu > 0 and mine.rss > 1 << 20
    assert mine.processes >= 1
    found = measure([(7, os.getpid()), (8, 2**22 + 1)])  # a pid above the kernel's limit: gone, left out
    assert [u.proc for u in found] == [7]


def test_keys_typed_together_are_each_read() -> None:
    from mpilaunch.cli.top_screen import keys

    assert keys("jj\x1b[Ak s") == ["j", "j", "\x1b[A", "k", " ", "s"]
    assert keys("\x1b") == ["\x1b"]  # Esc alone
