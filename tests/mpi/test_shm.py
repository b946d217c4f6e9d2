"""Nothing left in /dev/shm (issue "No process left, ever", part 5).

MPICH ranks that end abnormally leave their `mpich_shm_*` segment, under hydra as under
mpilaunch before: the agent now records what its ranks map in /dev/shm while they run and
removes, after the job, what was not there before, is this user's, and no live process maps.
The plain-Python cases check the "never anything else" half with files the test controls."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher, tagged_pids, write_script

PY = sys.executable

MPI_RANK = """
import os, signal, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
with open(f"/proc/self/maps") as maps:
    mine = sorted({line.split()[-1] for line in maps if "/dev/shm/mpich_shm_" in line})
with open(sys.argv[1] + f".{comm.rank}", "w") as out:
    out.write("\\n".join(mine))
time.sleep(0.6)  # the job runs past the agent's looks (0.1, 0.3 s after the start): what they see is tested
print("past the looks", flush=True)
how = sys.argv[2]
if comm.rank == 1:
    if how == "abort":
        comm.Abort(3)
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
"""


def _segments(tmp_path: Path) -> set[str]:
    found: set[str] = set()
    for name in os.listdir(tmp_path):
        if name.startswith("maps."):
            found |= set(filter(None, (tmp_path / name).read_text().split("\n")))
    return found


@pytest.mark.parametrize("how", ["abort", "killed", "launcher killed", "killed below a shell"])
def test_an_mpich_segment_left_by_an_abnormal_end_is_removed(launcher: Launcher, tmp_path: Path, how: str) -> None:
    """Below a shell: the segment is mapped by the rank's child, which the agent looks at too."""
    pytest.importorskip("mpi4py")
    script = write_script(tmp_path, "shm_rank.py", MPI_RANK)
    args: tuple[str, ...] = ("--kill-timeout", "0.5", "-n", "2", PY, script, str(tmp_path / "maps"), how)
    if how == "killed below a shell":  # `; exit $?`: the shell stays the rank, python its child
        args = (*args[:4], "sh", "-c", f"{PY} {script} {tmp_path / 'maps'} killed; exit $?")
    if how == "launcher killed":
        proc = launcher.popen(*args)
        assert proc.stdout is not None
        said = proc.stdout.readline() + proc.stdout.readline()  # the ranks mapped their segments and ran on
        assert said == b"past the looks\n" * 2, said
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 5
        while tagged_pids(launcher.tag) and time.monotonic() < deadline:  # the agent ends with its link
            time.sleep(0.05)
    else:
        done = launcher.run(*args, timeout=120)
        assert done.returncode == (3 if how == "abort" else 137), done.stderr.decode()[-2000:]
        if how == "killed below a shell":
            assert "Command:   sh -c" in done.stderr.decode()
    segments = _segments(tmp_path)
    assert segments, "the ranks mapped no mpich_shm segment: nothing was tested"
    left = [path for path in segments if os.path.exists(path)]
    assert not left, f"left in /dev/shm: {left}"


PY_RANK = """
import mmap, os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
path = sys.argv[rank + 1]
if not os.path.exists(path):  # made as MPI libraries make their segments: this user's only
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.write(fd, b"\\0" * 4096)
    os.close(fd)
with open(path, "r+b") as f:
    m = mmap.mmap(f.fileno(), 4096)
time.sleep(0.5)  # the ranks run past the agent's first looks (0.1, 0.3 s): what they see is tested
sys.exit(1)
"""


def test_only_what_the_job_made_and_nobody_maps_is_removed(launcher: Launcher, tmp_path: Path) -> None:
    """Rank 0 maps a file it made (removed after the job), rank 1 one that was there before
    (kept), rank 2 one it made that another process, outside the job, also maps (kept). (A file
    that others may map too is also kept where some process's maps cannot be read, as the
    container's init's here: host/shm.py.)"""
    tag = launcher.tag[:12]
    made, existing, shared = (f"/dev/shm/mpilaunch-test-{tag}-{name}" for name in ("made", "existing", "shared"))
    Path(existing).write_bytes(b"\0" * 4096)
    script = write_script(tmp_path, "py_rank.py", PY_RANK)
    holder = None
    try:
        holder = subprocess.Popen(  # maps `shared` once the rank has made it, and holds it
            [
                PY,
                "-c",
                "import mmap, os, sys, time\n"
                "while not os.path.exists(sys.argv[1]) or os.path.getsize(sys.argv[1]) < 4096: time.sleep(0.01)\n"
                "f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 4096); print('mapped', flush=True)\n"
                "time.sleep(60)\n",
                shared,
            ],
            stdout=subprocess.PIPE,
        )
        proc = launcher.run("-n", "3", "--oversubscribe", PY, script, made, existing, shared, timeout=60)
        assert proc.returncode == 1, proc.stderr.decode()
        assert holder.stdout is not None and holder.stdout.readline() == b"mapped\n"
        assert not os.path.exists(made)
        assert os.path.exists(existing)
        assert os.path.exists(shared)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        for path in (made, existing, shared):
            if os.path.exists(path):
                os.unlink(path)


def test_the_look_at_the_maps_sees_what_mmap_maps(tmp_path: Path) -> None:
    """host/shm.mapped_by against a mapping made here: the path and the file's own (dev, ino)."""
    from mpilaunch.host import shm

    path = f"/dev/shm/mpilaunch-test-{os.getpid()}"
    try:
        with open(path, "wb+") as f:
            f.write(b"\0" * 4096)
            f.flush()
            m = mmap.mmap(f.fileno(), 4096)
            st = os.stat(path)
            assert shm.mapped_by(os.getpid())[path] == (st.st_dev, st.st_ino)
            assert (st.st_dev, st.st_ino) in shm.present()
            m.close()
    finally:
        os.unlink(path)
