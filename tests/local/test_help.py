"""`mpilaunch --help` on one screen, and each other launcher's words listed apart, all written
from the one options table (issue "The front door", item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpilaunch.cli import cliopts
from tests.conftest import Launcher, tagged_pids, write_script


def help_of(*words: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "mpilaunch", *words], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def spellings(text: str) -> set[str]:
    """The options a help text lists: the words with a dash in the first column of a line that
    starts with one (not a help that goes on under it)."""
    found = set()
    for line in (line.strip() for line in text.splitlines() if len(line) - len(line.lstrip()) <= 4):
        left = line.split("  ")[0].split(": ")[0] if line.startswith("-") else ""
        found |= {word.strip(",") for word in left.split() if word.startswith("-")}
    return found


def test_help_fits_a_screen() -> None:
    """What mpilaunch is, its subcommands, then its own options by group: at most 80 lines, no
    other launcher's words, nothing that means nothing here."""
    text = help_of("--help")
    assert len(text.splitlines()) <= 80, len(text.splitlines())
    for word in (*cliopts.SUBCOMMANDS, "--help mpirun", "--help-all", "Examples:"):
        assert word in text, word
    for title in ("Ranks and hosts:", "Placement and binding:", "Environment:", "Output and logs:",
                  "Failure, restarts and time limits:", "Debugging and reports:", "MPI:"):  # fmt: skip
        assert title in text, title
    shown = spellings(text)
    for opt in cliopts.all_rows():
        assert (opt.flags[0] in shown) == (cliopts.OWN in opt.whose), opt.flags[0]
    assert "means nothing here" not in text and "RANGE" not in text


@pytest.mark.parametrize("topic", ["mpirun", "hydra", "torchrun"])
def test_help_topic_lists_that_launchers_words_and_variables(topic: str) -> None:
    """`--help mpirun|hydra|torchrun`: every word of that launcher's with every spelling, its
    variables, and no word of the others."""
    launcher = cliopts.HELP_TOPICS[topic]
    text = help_of("--help", topic)
    shown = spellings(text)
    for opt in cliopts.all_rows():
        assert (opt.flags[0] in shown) == (launcher in opt.whose), opt.flags[0]
        if launcher in opt.whose and cliopts.IGNORED not in opt.roles:
            assert set(opt.flags) <= shown, opt.flags
    for name, _ in cliopts.load(launcher).ENVIRONMENT:
        assert name in text


def test_help_all_lists_every_spelling() -> None:
    shown = spellings(help_of("--help-all"))
    for opt in cliopts.all_rows():
        assert (set(opt.flags) if cliopts.IGNORED not in opt.roles else {opt.flags[0]}) <= shown, opt.flags


def test_a_mistyped_subcommand_is_named(launcher: Launcher) -> None:
    """`mpilaunch chek`, with no program of that name here: one line naming the subcommand it
    likely means, status 2, and no agent left (before: the launch said that chek was not found)."""
    proc = launcher.run("chek")
    assert (proc.returncode, proc.stdout) == (2, b""), proc.stderr
    assert proc.stderr == b"mpilaunch: no program 'chek'; did you mean the subcommand 'check'?\n"
    assert tagged_pids(launcher.tag) == []


def test_a_program_one_letter_off_a_subcommand_still_runs(launcher: Launcher, tmp_path: Path) -> None:
    """The hint is only for a word that is no program: `stack` on PATH runs as it always did."""
    folder = tmp_path / "bin"
    folder.mkdir()
    os.chmod(write_script(folder, "stack", '#!/bin/sh\necho ran "$@"\n'), 0o755)
    proc = launcher.run("stack", "x", env={"PATH": f"{folder}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.splitlines()) == {b"ran x"}  # once a slot
