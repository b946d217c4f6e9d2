"""The PMIx server's hwloc description, kept per boot, host and hwloc version
(agent/services/topology.py): written after a job whose server read the machine, read by the
next job's server; Open MPI ranks bind the same either way."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mpilaunch.agent.services import topology
from tests.conftest import Launcher
from tests.mpi.test_mpi import HELLO_C
from tests.smalldisk import NOT_A_FILE, fill, put_not_a_file, small_tmpfs

MPICC = shutil.which("mpicc.openmpi")
pytestmark = pytest.mark.skipif(
    MPICC is None or topology.cache_path() is None, reason="needs Debian's Open MPI and libhwloc.so.15"
)


def test_the_description_is_hwlocs_own_and_the_variables_are_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = topology.CachedTopology()
    assert kept.path is not None and kept.path.startswith(str(tmp_path / "mpilaunch" / "hwloc-"))
    kept.before()  # nothing kept yet: hwloc reads the machine
    assert "HWLOC_XMLFILE" not in os.environ
    kept.after()
    kept.keep()
    assert os.path.isfile(kept.path)
    hwloc = ctypes.CDLL("libhwloc.so.15")  # hwloc itself loads what was written
    handle = ctypes.c_void_p()
    assert hwloc.hwloc_topology_init(ctypes.byref(handle)) == 0
    try:
        assert hwloc.hwloc_topology_set_xml(handle, kept.path.encode()) == 0
        assert hwloc.hwloc_topology_load(handle) == 0
    finally:
        hwloc.hwloc_topology_destroy(handle)
    again = topology.CachedTopology()
    again.before()
    assert os.environ["HWLOC_XMLFILE"] == kept.path and os.environ["HWLOC_THISSYSTEM_ALLOWED_RESOURCES"] == "1"
    again.after()
    assert not any(name in os.environ for name in topology.NAMES)
    monkeypatch.setenv("HWLOC_XMLFILE", "/the/users/own.xml")
    assert topology.CachedTopology().path is None  # the user's own description wins


def test_a_job_keeps_the_description_and_the_next_binds_as_before(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "hello.c").write_text(HELLO_C)
    subprocess.run([MPICC, "-o", str(tmp_path / "hello"), str(tmp_path / "hello.c")], check=True, timeout=120)
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache)}
    runs = []
    for _ in range(2):
        proc = launcher.run("--report-bindings", "-n", "2", str(tmp_path / "hello"), env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        assert sorted(proc.stdout.decode().splitlines()) == ["rank 0 of 2", "rank 1 of 2"]
        runs.append(sorted(line.split("]", 1)[1] for line in proc.stderr.decode().splitlines() if "MCW rank" in line))
        assert len(list((cache / "mpilaunch").glob("hwloc-*.xml"))) == 1
    assert runs[0] == runs[1] and len(runs[0]) == 2  # read from the machine, then from the file


# -- a kept description that is damaged, and a cache that cannot be written (issue 27, items 5, 7) ---
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's: its mpi4py is built on Open MPI, so the job is served PMIx
HELLO_PY = "from mpi4py import MPI\nc = MPI.COMM_WORLD\nprint(f'rank {c.Get_rank()} of {c.Get_size()}', flush=True)\n"


def _another_machine() -> bytes:
    """A description hwloc loads, of a machine with more processing units than this one."""
    hwloc = ctypes.CDLL("libhwloc.so.15")
    handle = ctypes.c_void_p()
    assert hwloc.hwloc_topology_init(ctypes.byref(handle)) == 0
    try:
        units = (os.cpu_count() or 1) * 4
        assert hwloc.hwloc_topology_set_synthetic(handle, f"pack:2 core:{units // 2} pu:1".encode()) == 0
        assert hwloc.hwloc_topology_load(handle) == 0
        text, size = ctypes.c_void_p(), ctypes.c_int()
        assert hwloc.hwloc_topology_export_xmlbuffer(handle, ctypes.byref(text), ctypes.byref(size), 0) == 0
        data = ctypes.string_at(text.value, size.value - 1)
        hwloc.hwloc_free_xmlbuffer(handle, text)
        return data
    finally:
        hwloc.hwloc_topology_destroy(handle)


def _damage(path: Path, shape: str, good: bytes) -> str:
    """Put a damaged description at path; what the note says of it."""
    if shape == "topology-element":
        path.write_bytes(b"<topology/>\n")
    elif shape == "garbage":
        path.write_bytes(bytes(range(256)) * 4)
    elif shape == "cut-short":
        path.write_bytes(good[: len(good) // 2])
    elif shape == "empty":
        path.write_bytes(b"")
    elif shape == "another-machine":
        path.write_bytes(_another_machine())
        return f"describes {(os.cpu_count() or 1) * 4} processing units (this machine has {os.cpu_count()})"
    elif shape in NOT_A_FILE:
        return f"was {put_not_a_file(path, shape)}, not a file"
    return "is refused by hwloc"


def _run_hello(launcher: Launcher, tmp_path: Path, env: dict) -> tuple[list[str], list[str]]:
    script = tmp_path / "hello.py"
    script.write_text(HELLO_PY)
    proc = launcher.run("--bind-to", "none", "-n", "2", SYSTEM_PYTHON, str(script), env=env, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert sorted(proc.stdout.decode().splitlines()) == ["rank 0 of 2", "rank 1 of 2"]
    return [line for line in err.splitlines() if "hwloc description" in line], err.splitlines()


SHAPES = ["topology-element", "garbage", "cut-short", "empty", "another-machine", "empty-directory", "fifo",
          "link-to-dev-zero"]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_a_damaged_description_is_discarded_and_kept_again_in_the_same_run(
    launcher: Launcher, tmp_path: Path, shape: str
) -> None:
    """`echo '<topology/>' >` the kept file made every Open MPI job exit 126 for good, naming no
    file. Now the job runs, one note names the file, the machine is read, and the description is
    kept again by that same run: the next one uses it without a word."""
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache)}
    notes, _ = _run_hello(launcher, tmp_path, env)  # keeps a good one
    assert not notes
    (kept,) = (cache / "mpilaunch").glob("hwloc-*.xml")
    good = kept.read_bytes()
    kept.unlink()
    said = _damage(kept, shape, good)
    notes, _ = _run_hello(launcher, tmp_path, env)
    host = __import__("socket").gethostname()
    said = f"mpilaunch: {host}: the kept hwloc description {kept} {said}: discarded, this machine is read instead"
    assert notes == [said]
    assert kept.is_file() and not kept.is_symlink() and b"<topology" in kept.read_bytes()
    assert sorted(os.listdir(cache / "mpilaunch")) == [kept.name]  # nothing partial beside it
    handle, hwloc = ctypes.c_void_p(), ctypes.CDLL("libhwloc.so.15")
    assert hwloc.hwloc_topology_init(ctypes.byref(handle)) == 0
    try:
        assert hwloc.hwloc_topology_set_xml(handle, str(kept).encode()) == 0
        assert hwloc.hwloc_topology_load(handle) == 0
    finally:
        hwloc.hwloc_topology_destroy(handle)
    notes, _ = _run_hello(launcher, tmp_path, env)
    assert not notes


def test_a_cache_that_cannot_be_written_leaves_nothing_and_fails_nothing(launcher: Launcher, tmp_path: Path) -> None:
    """A full disk (a 64 KiB tmpfs, filled): every job runs, and no partial file is left (6 KB
    piled up per job before)."""
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        (disk / "mpilaunch").mkdir()
        fill(disk / "filler")
        for _ in range(3):
            notes, _ = _run_hello(launcher, tmp_path, {"XDG_CACHE_HOME": str(disk)})
            assert not notes
            assert os.listdir(disk / "mpilaunch") == []


def test_a_directory_in_the_descriptions_place_is_discarded_once(launcher: Launcher, tmp_path: Path) -> None:
    """A directory that holds files where the description is kept was "discarded" by every job,
    with the same note each time, and never went (issue 35). Now the first job removes it, with
    what it holds, and keeps the description there; the next says nothing."""
    cache = tmp_path / "cache"
    path = topology_path(cache)
    (path / "something" / "deeper").mkdir(parents=True)
    (path / "something" / "deeper" / "file").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    (path / "link").symlink_to(tmp_path / "elsewhere")  # removed, not followed
    notes, _ = _run_hello(launcher, tmp_path, {"XDG_CACHE_HOME": str(cache)})
    assert notes == [f"mpilaunch: {__import__('socket').gethostname()}: the kept hwloc description {path} "
                     "was a directory, not a file: discarded, this machine is read instead"]  # fmt: skip
    assert os.listdir(cache / "mpilaunch") == [path.name] and path.is_file() and b"<topology" in path.read_bytes()
    assert (tmp_path / "elsewhere").is_dir()
    notes, _ = _run_hello(launcher, tmp_path, {"XDG_CACHE_HOME": str(cache)})
    assert not notes


def topology_path(cache: Path) -> Path:
    """Where a run with XDG_CACHE_HOME=cache keeps this machine's description."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        where = topology.cache_path()
    finally:
        if old is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = old
    assert where is not None
    return Path(where)
