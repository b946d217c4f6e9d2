"""Every transcript the docs mark runnable is run and its output compared, so a doc that drifts
from the code fails.

How a doc marks them (HTML comments: GitHub shows nothing of them):

    <!-- run: local -->              the ```console block below runs on this machine
    <!-- run: sshbed -->             ... where node1 and node2 are two hosts of the ssh bed
    <!-- run: local, any order -->   ... each command's lines may come in any order (ranks)
    <!-- file: train.py -->          the fenced block below is written to train.py first

A console block is a transcript: a line starting with `$ ` is a command (a line ending in `\\`
goes on into the next), the lines after it are what it prints, standard error and output
together as a terminal shows them. The comparison is strict but for two placeholders, used
where the text is variable by nature (process ids, times, paths, host and CPU counts): `...`
inside a line stands for any text on that line; a line that is only `...` stands for any number
of lines. A command's exit status is not compared; a transcript shows it with `$ echo $?`.

The commands of a block run one after another in one `bash`, in a fresh folder holding a copy of
`examples/` and the block's files (a `<!-- file: -->` block anywhere in the same document before
it), with `mpilaunch` and `python` on PATH as a user has them (this checkout's, this
interpreter) and, for the ssh bed's blocks, an `ssh` on PATH that reads the bed's configuration,
as a user's `~/.ssh/config` names the cluster's hosts. Every block is one test case, named
FILE:LINE. The whole file takes about a minute on a 2-core machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, sshbed_fixtures
from tests.sshbed import SshBed, bed_available

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- (run|file): ([^>]*?) -->\n```[^\n]*\n(.*?)^```$", re.M | re.S)
SEPARATOR = "@@ end of a documented command @@"
available, why = bed_available()
bed, _clean_hosts = sshbed_fixtures("docsbed", 2)  # not autouse here: only the bed's blocks start it


@dataclass
class Step:
    command: str
    expected: list[str]


@dataclass
class Block:
    where: str
    on: str
    any_order: bool
    steps: list[Step]
    files: dict[str, str] = field(default_factory=dict)


def transcript(text: str) -> list[Step]:
    """The commands of a console block and the lines each is shown to print."""
    steps: list[Step] = []
    going_on = False
    for line in text.splitlines():
        if going_on:
            steps[-1].command += "\n" + line
        elif line.startswith("$ "):
            steps.append(Step(line[2:], []))
        elif steps:
            steps[-1].expected.append(line)
        else:
            raise ValueError(f"a transcript starts with a command ('$ ...'), not {line!r}")
        going_on = bool(steps) and line.endswith("\\") and (going_on or line.startswith("$ "))
    return steps


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        files: dict[str, str] = {}
        for match in MARK.finditer(text):
            kind, what, body = match.groups()
            if kind == "file":
                files[what.strip()] = body
                continue
            words = [word.strip() for word in what.split(",")]
            assert words[0] in ("local", "sshbed") and set(words[1:]) <= {"any order"}, match.group(0)
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 2}"
            found.append(Block(where, words[0], "any order" in words, transcript(body), dict(files)))
    return found


def line_matches(expected: str, got: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, got) is not None


def lines_match(expected: list[str], got: list[str]) -> bool:
    """In order; a line that is only `...` takes any number of lines."""
    if not expected:
        return not got
    if expected[0] == "...":
        return any(lines_match(expected[1:], got[skip:]) for skip in range(len(got) + 1))
    return bool(got) and line_matches(expected[0], got[0]) and lines_match(expected[1:], got[1:])


def lines_match_any_order(expected: list[str], got: list[str]) -> bool:
    """Each expected line takes one printed line of its own, in any order; `...` takes the rest."""
    left = list(got)
    for want in sorted((line for line in expected if line != "..."), key=lambda line: line.count("...")):
        taken = next((i for i, line in enumerate(left) if line_matches(want, line)), None)
        if taken is None:
            return False
        del left[taken]
    return not left or "..." in expected


def _bin(tmp_path: Path, ssh_config: Path | None) -> Path:
    """mpilaunch and python as a user's PATH has them; ssh reading the bed's config."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "mpilaunch").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mpilaunch "$@"\n')
    (folder / "python").symlink_to(sys.executable)
    (folder / "python3").symlink_to(sys.executable)
    if ssh_config is not None:
        (folder / "ssh").write_text(f'#!/bin/sh\nexec "{shutil.which("ssh")}" -F "{ssh_config}" "$@"\n')
    for program in folder.iterdir():
        program.chmod(0o755)
    return folder


def run(block: Block, tmp_path: Path, env: dict[str, str], ssh_config: Path | None) -> list[list[str]]:
    """What each command of the block printed, line by line."""
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    for name, body in block.files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(body)
    env = {**env, "PATH": f"{_bin(tmp_path, ssh_config)}{os.pathsep}{env['PATH']}"}
    env.pop("OMP_NUM_THREADS", None)  # as a user's shell has it: the launcher's own choice shows
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    after = f"__doc_status=$?; printf '\\n%s\\n' '{SEPARATOR}'; (exit $__doc_status)\n"  # $? stays the command's
    script = "".join(f"{step.command}\n{after}" for step in block.steps)
    proc = subprocess.run(
        ["bash", "-c", script], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    said = proc.stdout.decode(errors="replace").split(f"\n{SEPARATOR}\n")
    assert len(said) == len(block.steps) + 1, f"{block.where}: the block stopped early:\n{said[-1][-3000:]}"
    return [chunk.splitlines() for chunk in said[:-1]]


BLOCKS = blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_a_documented_transcript_prints_what_it_shows(
    launcher: Launcher, request: pytest.FixtureRequest, tmp_path: Path, block: Block
) -> None:
    bed = None
    if block.on == "sshbed":
        if not available:
            pytest.skip(why)
        bed = request.getfixturevalue("bed")
    got = run(block, tmp_path, launcher.env, bed.config if bed else None)
    compare = lines_match_any_order if block.any_order else lines_match
    wrong = [
        f"$ {step.command}\n--- the doc shows:\n" + "\n".join(step.expected) + "\n--- it prints:\n" + "\n".join(lines)
        for step, lines in zip(block.steps, got)
        if not compare(step.expected, lines)
    ]
    if bed is not None:
        left = bed.wait_clean(3.0)
        if left:
            bed.kill_leftovers()
        assert not left, f"processes of the job survived on the hosts: {left}"
    assert not wrong, f"{block.where}:\n" + "\n\n".join(wrong)


def test_the_docs_have_transcripts_of_both_kinds() -> None:
    """The test above runs something: the user guide marks blocks of each kind."""
    guide = [block.on for block in BLOCKS if block.where.startswith("docs/user-guide.md")]
    assert guide.count("local") >= 10 and guide.count("sshbed") >= 3, guide


@pytest.mark.parametrize(
    "expected, got, matches",
    [
        (["a ... c"], ["a b c"], True),
        (["a ... c"], ["a b d"], False),
        (["x", "...", "z"], ["x", "y1", "y2", "z"], True),
        (["x", "z"], ["x", "y", "z"], False),
        (["x"], ["x", "y"], False),
        (["a.b"], ["axb"], False),
    ],
)
def test_the_comparison_is_strict_but_for_its_placeholders(expected: list[str], got: list[str], matches: bool) -> None:
    assert lines_match(expected, got) is matches


def test_any_order_takes_each_line_once() -> None:
    assert lines_match_any_order(["rank 0", "rank 1"], ["rank 1", "rank 0"])
    assert not lines_match_any_order(["rank 0", "rank 0"], ["rank 0", "rank 1"])
    assert not lines_match_any_order(["rank ..."], ["rank 0", "rank 1"])


def test_the_bed_names_node1_and_node2(bed: SshBed) -> None:
    """The bed's blocks say node1 and node2: the bed has them."""
    assert bed.address("node1") and bed.address("node2")
