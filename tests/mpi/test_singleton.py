"""Hydra's singleton start through the `mpiexec` shim: an MPICH program run without a launcher
that calls MPI_Comm_spawn execs `mpiexec -pmi_args PORT ...` and waits for it to connect back.
The shim hands that to hydra's `mpiexec.hydra` when one is on PATH; without one it refuses the
program's handshake, so the program does not wait for ever (cli/singleton.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script
from tests.procs import held

pytest.importorskip("mpi4py")
PY = sys.executable
HYDRA_DIR = sysconfig.get_path("scripts")  # where the mpich wheel puts mpiexec.hydra
SYSTEM_PATH = "/usr/bin:/bin"  # no mpiexec.hydra there (Debian's mpiexec is Open MPI's)

SPAWNER = """
import sys
from mpi4py import MPI
child = (
    "from mpi4py import MPI; p = MPI.Comm.Get_parent(); "
    "open(f'child.{MPI.COMM_WORLD.Get_rank()}', 'w').write(str(p.Get_remote_size())); p.Disconnect()"
)
comm = MPI.COMM_SELF.Spawn(sys.executable, ["-c", child], maxprocs=2)
print("spawned", comm.Get_remote_size(), flush=True)
comm.Disconnect()
"""


@pytest.fixture(autouse=True)
def segments_of_the_singleton_removed() -> Iterator[None]:
    """An MPICH singleton that spawned leaves its shared-memory segment (`mpich_shm_*`), under
    hydra as here: no agent of mpilaunch ran it to clean up, so the test removes what appeared
    and no live process maps (beside it, another test's MPICH ranks may have made theirs)."""
    before = set(os.listdir("/dev/shm"))
    yield
    for name in set(os.listdir("/dev/shm")) - before:
        path = os.path.join("/dev/shm", name)
        if name.startswith("mpich_shm_") and not held(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@pytest.fixture
def shims(launcher: Launcher, tmp_path: Path) -> Path:
    proc = launcher.run("shims", str(tmp_path / "bin"))
    assert proc.returncode == 0, proc.stderr.decode()
    return tmp_path / "bin"


def singleton(launcher: Launcher, shims: Path, path: str) -> subprocess.CompletedProcess:
    """The spawner run as a plain program (no launcher), the shims first on PATH; one that waits
    for ever fails the test at the timeout."""
    script = write_script(launcher.tmp_path, "spawner.py", SPAWNER)
    env = {**launcher.env, "PATH": f"{shims}{os.pathsep}{path}"}
    return subprocess.run(
        [PY, script], capture_output=True, env=env, timeout=120, cwd=launcher.tmp_path, stdin=subprocess.DEVNULL
    )


def test_a_singletons_spawn_is_handed_to_hydra(launcher: Launcher, shims: Path) -> None:
    if not os.access(os.path.join(HYDRA_DIR, "mpiexec.hydra"), os.X_OK):
        pytest.skip("no mpiexec.hydra beside this interpreter")
    for _ in range(5):  # MPICH's UCX fails hydra's spawn now and then beside other MPI jobs: not the shim's
        proc = singleton(launcher, shims, f"{HYDRA_DIR}{os.pathsep}{SYSTEM_PATH}")
        if proc.returncode == 0 or b"MPIDI_UCX_insert_upid" not in proc.stderr:
            break
        time.sleep(1)  # not synchronisation: a pause before asking UCX again
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["spawned 2"]
    for rank in (0, 1):  # each child saw its parent, a group of 1
        assert (launcher.tmp_path / f"child.{rank}").read_text() == "1"


def test_without_hydra_a_singletons_spawn_is_refused_at_once(launcher: Launcher, shims: Path) -> None:
    """MPICH 5's singleton then fails its MPI_Comm_spawn (it crashes there: its own error path);
    what matters is that it ends, and the shim said why."""
    proc = singleton(launcher, shims, SYSTEM_PATH)
    assert proc.returncode != 0
    said = [line for line in proc.stderr.decode().splitlines() if line.startswith("mpilaunch:")]
    assert said == [
        "mpilaunch: hydra's singleton start (mpiexec -pmi_args: an MPICH program started without a launcher "
        "asked for one, for MPI_Comm_spawn or the universe size) is not served by mpilaunch and no "
        "mpiexec.hydra is on PATH; start the program under the launcher (mpilaunch -n 1 PROGRAM)"
    ]
    assert "spawned" not in proc.stdout.decode()


def test_the_shims_own_mpiexec_hydra_is_passed_over(launcher: Launcher, shims: Path) -> None:
    from mpilaunch.cli.shims import first_real

    assert first_real("mpiexec.hydra", f"{shims}{os.pathsep}{SYSTEM_PATH}") is None
    if os.access(os.path.join(HYDRA_DIR, "mpiexec.hydra"), os.X_OK):
        assert first_real("mpiexec.hydra", f"{shims}{os.pathsep}{HYDRA_DIR}") == os.path.join(
            HYDRA_DIR, "mpiexec.hydra"
        )


@pytest.mark.parametrize("words", [["-pmi_args"], ["-pmi_args", "x", "i", "k", "1"], ["-v", "-pmi_args", "0"]])
def test_bad_singleton_words_are_one_line_and_status_2(launcher: Launcher, words: list[str]) -> None:
    proc = launcher.run(*words, env={"PATH": SYSTEM_PATH})
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("mpilaunch: -pmi_args: expected PORT INTERFACE KEY PID, got ")
    assert len(proc.stderr.decode().splitlines()) == 1
