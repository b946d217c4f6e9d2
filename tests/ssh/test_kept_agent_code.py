"""The agent's code as kept in the user's cache (transport/bootstrap.py; issue 27, items 6 and 7),
on the real sshd bed.

A cache file cut short made every SSH job fail after 20 s with `node1: no answer in 20 s`,
blaming the hosts; a full disk left a partial file of 271 KB per job. What is read from the cache
is now checked (its key, the payload's digest, its frame) before it is sent; a damaged file is
built and kept again in the same run, said once; a cache that cannot be written leaves nothing
and fails nothing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures
from tests.smalldisk import NOT_A_FILE, fill, put_not_a_file, small_tmpfs
from tests.sshbed import bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
bed, clean_hosts = sshbed_fixtures("keptbed", 2)


def _job(launcher: Launcher, bed, cache: Path, *client: str) -> list[str]:  # type: ignore[no-untyped-def]
    """A job on both hosts with this cache; the launcher's lines about the kept agent code."""
    proc = launcher.run(
        "--ssh-config", str(bed.config), *client, "-H", "node1:1,node2:1", "-n", "2", "sh", "-c", "echo rank $RANK",
        env={"XDG_CACHE_HOME": str(cache)}, timeout=120,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert sorted(proc.stdout.decode().splitlines()) == ["rank 0", "rank 1"]
    return [line for line in err.splitlines() if "kept agent code" in line]


def _damage(path: Path, shape: str) -> str:
    """Damage the kept file; the words of the note."""
    data = path.read_bytes()
    path.unlink()
    if shape == "cut-short":
        path.write_bytes(data[: len(data) // 2])
    elif shape == "one-byte-changed":
        at = len(data) * 3 // 4
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :])
    elif shape == "digest-garbled":
        path.write_bytes(data[:40] + b"z" * 40 + data[80:])
    elif shape == "empty":
        path.write_bytes(b"")
    elif shape == "another-key":
        path.write_bytes(b"0" * 40 + data[40:])
        return "not this code's"
    elif shape in NOT_A_FILE:
        return f"{put_not_a_file(path, shape)}, not a file"
    return "cut short or damaged"


SHAPES = ["cut-short", "one-byte-changed", "digest-garbled", "empty", "another-key", "empty-directory", "fifo",
          "link-to-dev-zero"]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_damaged_agent_code_is_built_and_kept_again(launcher: Launcher, bed, tmp_path: Path, shape: str) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "cache"
    assert _job(launcher, bed, cache) == []  # builds and keeps it
    (kept,) = (cache / "mpilaunch").glob("agent-*.bin")
    good = kept.read_bytes()
    said = _damage(kept, shape)
    assert _job(launcher, bed, cache) == [f"mpilaunch: the kept agent code {kept} was {said}: built and kept again"]
    assert kept.is_file() and not kept.is_symlink() and kept.read_bytes() == good
    assert [n for n in os.listdir(cache / "mpilaunch") if n.startswith("agent-")] == [kept.name]  # (and hwloc's)
    assert _job(launcher, bed, cache, "--ssh-client", "openssh") == []


def test_the_openssh_client_is_healed_too(launcher: Launcher, bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "cache"
    assert _job(launcher, bed, cache, "--ssh-client", "openssh") == []
    (kept,) = (cache / "mpilaunch").glob("agent-*.bin")
    said = _damage(kept, "cut-short")
    notes = _job(launcher, bed, cache, "--ssh-client", "openssh")
    assert notes == [f"mpilaunch: the kept agent code {kept} was {said}: built and kept again"]


def test_a_cache_that_cannot_be_written_leaves_nothing(launcher: Launcher, bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A full disk (a filled 64 KiB tmpfs) and a directory holding files in the file's place:
    every job runs, nothing partial is left, and a partial file of a writer that died (an older
    launcher's `NAME.PID`) is removed by the next write. The directory is removed by the first
    job, which keeps the code there, and the next says nothing (before, issue 35: every job said
    it was "built and kept again", and the directory stayed)."""
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        (disk / "mpilaunch").mkdir()
        fill(disk / "filler")
        for _ in range(3):
            assert _job(launcher, bed, disk) == []
            assert os.listdir(disk / "mpilaunch") == []
    cache = tmp_path / "cache"
    assert _job(launcher, bed, cache) == []
    (kept,) = (cache / "mpilaunch").glob("agent-*.bin")
    kept.unlink()
    (kept / "something").mkdir(parents=True)
    dead = cache / "mpilaunch" / f"{kept.name}.{_dead_pid()}"
    dead.write_bytes(b"partial")
    notes = _job(launcher, bed, cache)
    assert notes == [f"mpilaunch: the kept agent code {kept} was a directory, not a file: built and kept again"]
    kept_there = [n for n in os.listdir(cache / "mpilaunch") if not n.startswith("hwloc-")]  # the topology's own
    assert kept_there == [kept.name] and kept.is_file()
    assert _job(launcher, bed, cache) == []


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
