"""The log tree's lock, in this process (its locks belong to open file descriptions, so two of them
here conflict as two launchers do): the ranks of one job's nodes share a tree, overlapping ranks
and a whole run do not, and the last holder removes the lock's file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.output.treelock import LOCK_NAME, TreeLock


def refusal(base: Path, holder: str) -> str:
    return (
        f"--output-filename {base}: job {holder} (mpilaunch, pid {os.getpid()}) is writing its rank output there; "
        "two jobs in one log tree lose lines: wait for it to end, or give another directory"
    )


def test_nodes_of_one_job_share_a_tree_and_others_are_refused_naming_the_holder(tmp_path: Path) -> None:
    node0 = TreeLock(str(tmp_path), "aaaa", (0, 2))
    node1 = TreeLock(str(tmp_path), "bbbb", (2, 2))  # disjoint: both hold the tree
    lines = (tmp_path / LOCK_NAME).read_text().splitlines()
    assert lines == [f"{os.getpid()} aaaa 0 2", f"{os.getpid()} bbbb 2 2"]
    with pytest.raises(LaunchError) as overlap:
        TreeLock(str(tmp_path), "cccc", (3, 2))
    assert str(overlap.value) == refusal(tmp_path, "bbbb")
    with pytest.raises(LaunchError) as whole:
        TreeLock(str(tmp_path), "dddd")  # a whole run: every rank of every job
    assert str(whole.value) in (refusal(tmp_path, "aaaa"), refusal(tmp_path, "bbbb"))
    node0.release()
    assert (tmp_path / LOCK_NAME).exists()  # node 1 still holds its ranks
    node1.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_whole_run_keeps_every_range_out(tmp_path: Path) -> None:
    run = TreeLock(str(tmp_path), "eeee")
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()} eeee\n"
    for ranks in ((0, 1), (7, 3)):
        with pytest.raises(LaunchError) as refused:
            TreeLock(str(tmp_path), "ffff", ranks)
        assert str(refused.value) == refusal(tmp_path, "eeee")
    run.release()
    again = TreeLock(str(tmp_path), "gggg", (7, 3))
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()} gggg 7 3\n"  # alone: the old lines are gone
    again.release()
    assert not (tmp_path / LOCK_NAME).exists()
