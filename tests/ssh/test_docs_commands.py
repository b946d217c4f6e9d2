"""Every shell block the docs mark runnable runs, so a doc that drifts from the code fails.

A block whose fence says `sh runnable` runs on this machine; `sh runnable hosts` runs where the
names node1 and node2 are two hosts of the ssh bed. Each block runs whole under `bash -e -o
pipefail` in a fresh folder holding a copy of `examples/`, with `mpilaunch` and `python` on
PATH as a user has them (this checkout's, this interpreter), and, for the hosts' blocks, an
`ssh` on PATH that reads the bed's configuration, as a user's `~/.ssh/config` would name the
cluster's hosts. A block checks what it shows with its own `grep`s: it fails on a non-zero
status.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, sshbed_fixtures
from tests.sshbed import SshBed, bed_available

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```sh runnable( hosts)?\n(.*?)^```$", re.M | re.S)
available, why = bed_available()
bed, clean_hosts = sshbed_fixtures("docsbed", 2)


def blocks() -> list[tuple[str, bool, str]]:
    """(where, needs hosts, text) of every runnable block, where being FILE:LINE."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", bool(match.group(1)), match.group(2)))
    return found


BLOCKS = blocks()


def test_the_guide_has_runnable_blocks_of_both_kinds() -> None:
    """The test below runs something: the user guide marks blocks of each kind."""
    guide = [(hosts, where) for where, hosts, _ in BLOCKS if where.startswith("docs/user-guide.md")]
    assert sum(1 for hosts, _ in guide if not hosts) >= 10 and sum(1 for hosts, _ in guide if hosts) >= 3, guide


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


@pytest.mark.parametrize("where, hosts, text", BLOCKS, ids=[where for where, _, _ in BLOCKS])
def test_a_runnable_block_runs(launcher: Launcher, request: pytest.FixtureRequest, tmp_path: Path, where: str,
                               hosts: bool, text: str) -> None:  # fmt: skip
    config = None
    if hosts:
        if not available:
            pytest.skip(why)
        config = request.getfixturevalue("bed").config
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    env = {**launcher.env, "PATH": f"{_bin(tmp_path, config)}{os.pathsep}{launcher.env['PATH']}"}
    env.pop("OMP_NUM_THREADS", None)  # as a user's shell has it: the launcher's own choice shows
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", text], cwd=work, env=env, capture_output=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    said = (proc.stdout + proc.stderr).decode(errors="replace")[-3000:]
    assert proc.returncode == 0, f"{where} exited with {proc.returncode}:\n{text}\n---\n{said}"


def test_the_bed_names_node1_and_node2(bed: SshBed) -> None:
    """The hosts' blocks say node1 and node2: the bed has them."""
    assert bed.address("node1") and bed.address("node2")
