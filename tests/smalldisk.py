"""Small file systems of a test's own, and odd things where a file is expected: a tmpfs mounted
for one test (a full disk in a few KiB; device nodes without a private /dev), a file that fills
it, and a directory, a FIFO or a link to /dev/zero in a file's place. Mounting needs root: where
it is refused, the test is skipped saying why."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of size (mount's words: "64k", "1m") at where, made here; mounted in this
    namespace, so that the launcher's agents and the sshd bed's hosts see it too."""
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(path: Path) -> None:
    """Write zeros to path until its file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    finally:
        os.close(fd)


NOT_A_FILE = {"empty-directory": "a directory", "fifo": "a FIFO", "link-to-dev-zero": "a character device"}


def put_not_a_file(path: Path, shape: str) -> str:
    """Put at path what shape (a key of NOT_A_FILE) names; returns what a reader that looks
    before it opens finds there."""
    if shape == "empty-directory":
        path.mkdir()
    elif shape == "fifo":
        os.mkfifo(path)
    elif shape == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        raise ValueError(f"not a shape of NOT_A_FILE: {shape!r}")
    return NOT_A_FILE[shape]
