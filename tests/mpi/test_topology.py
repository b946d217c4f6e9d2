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
