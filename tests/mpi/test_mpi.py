"""Real MPI: mpi4py ranks over the `mpich` wheel get one COMM_WORLD from mpilaunch's PMI-1 server
(and the collectives, over Debian's Open MPI too, from its PMIx server)."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpilaunch.host.mpi_family import needed_libraries
from tests.conftest import ROOT, Launcher, tagged_pids, write_script
from tests.mpi.conftest import family_python

pytest.importorskip("mpi4py")
PY = sys.executable
RAW = str(ROOT / "tests" / "ranks" / "pmi_raw.py")

COLLECTIVES = str(ROOT / "tests" / "ranks" / "collectives.py")


# The job sizes tried for each family, and the words it is served with: MPICH's PMI-1 by default,
# Open MPI's PMIx as asked (its default is tests/mpi/test_pmix.py's).
SIZES = [("mpich", np) for np in (1, 2, 4, 8, 16)] + [("openmpi", np) for np in (1, 2, 4, 8)]
SERVED = {"mpich": (), "openmpi": ("--mpi", "pmix")}


@pytest.mark.parametrize(("family", "np"), SIZES)
def test_collectives_see_the_whole_job(launcher: Launcher, family: str, np: int) -> None:
    python = family_python(family)
    proc = launcher.run(*SERVED[family], "--oversubscribe", "-n", str(np), python, COLLECTIVES, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == [f"collectives ok {np}"]


def test_without_pmi_ranks_are_singletons(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "size.py", "from mpi4py import MPI\nprint(MPI.COMM_WORLD.Get_size())\n")
    proc = launcher.run("--mpi", "none", "-n", "2", PY, script, timeout=120)
    assert proc.stdout.decode().split() == ["1", "1"]
    proc = launcher.run("-n", "2", PY, script, timeout=120)
    assert proc.stdout.decode().split() == ["2", "2"]


def test_mpi4py_bench_helloworld_and_ringtest(launcher: Launcher) -> None:
    proc = launcher.run("--oversubscribe", "-n", "4", PY, "-m", "mpi4py.bench", "helloworld", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.decode().splitlines())
    assert lines == [f"Hello, World! I am process {r} of 4 on {lines[r].rsplit(' ', 1)[1]}" for r in range(4)]
    proc = launcher.run("--oversubscribe", "-n", "4", PY, "-m", "mpi4py.bench", "ringtest", "-l", "10", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "time for 10 loops" in proc.stdout.decode()


def test_mpmd_appnum_per_app(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "app.py",
        "import sys\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "print(c.Get_rank(), c.Get_size(), c.Get_attr(MPI.APPNUM), sys.argv[1], flush=True)\n",
    )
    proc = launcher.run("--oversubscribe", "-n", "1", PY, script, "a", ":", "-n", "2", PY, script, "b", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().splitlines()) == ["0 3 0 a", "1 3 1 b", "2 3 1 b"]


def test_mpi_abort_ends_the_job_with_its_code(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "abort.py",
        "import time\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\nc.Barrier()\n"
        "if c.Get_rank() == 1:\n    c.Abort(7)\ntime.sleep(60)\n",
    )
    start = time.monotonic()
    proc = launcher.run("--oversubscribe", "-n", "3", PY, script, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 7, err
    assert time.monotonic() - start < 10
    assert "rank 1 called MPI_Abort with code 7" in err and "Rank:      1" in err
    assert "Killed by mpilaunch: ranks 0,2" in err
    assert not tagged_pids(launcher.tag)


def test_rank_dying_before_a_barrier_aborts_instead_of_hanging(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "die.py",
        "import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\nif c.Get_rank() == 2:\n    os._exit(0)\nc.Barrier()\n",
    )
    proc = launcher.run(
        "--oversubscribe", "-n", "3", "-mca", "orte_abort_on_non_zero_status", "0", PY, script, timeout=60
    )
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "exited without MPI_Finalize" in err and "Rank:      2" in err
    assert "  Exit code: 0, but it ended before finalizing (no MPI_Finalize)\n" in err and "Exit code: 1" not in err


def test_publish_and_lookup_name(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "names.py",
        "from mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "if c.Get_rank() == 0:\n    MPI.Publish_name('svc', 'port-0-xyz')\n"
        "c.Barrier()\n"
        "print(c.Get_rank(), MPI.Lookup_name('svc'), flush=True)\n"
        "c.Barrier()\n"
        "if c.Get_rank() == 0:\n    MPI.Unpublish_name('svc', 'port-0-xyz')\n",
    )
    proc = launcher.run("-n", "2", PY, script, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().splitlines()) == ["0 port-0-xyz", "1 port-0-xyz"]


def test_many_barriers(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "barriers.py",
        "from mpi4py import MPI\nc = MPI.COMM_WORLD\nfor i in range(200):\n    c.Barrier()\n"
        "print('done', c.Get_rank())\n",
    )
    proc = launcher.run("--oversubscribe", "-n", "4", PY, script, timeout=120)
    assert proc.returncode == 0 and proc.stdout.decode().count("done") == 4


def test_protocol_limits_and_errors(launcher: Launcher) -> None:
    proc = launcher.run("-n", "2", PY, RAW, "limits", timeout=60)
    assert proc.returncode == 0, proc.stderr
    replies = proc.stdout.decode().splitlines()
    assert replies.count("cmd=put_result rc=0") == 2
    assert "cmd=put_result rc=-1 msg=key_length_out_of_range" in replies
    assert "cmd=put_result rc=-1 msg=value_too_long" in replies
    assert "cmd=put_result rc=-1 msg=unknown_kvsname" in replies
    assert "cmd=get_result rc=-1 msg=key_not_found" in replies
    assert "cmd=no_such_command_result rc=-1 msg=unknown_command" in replies
    assert replies.count("cmd=finalize_ack rc=0") == 2
    assert b"unknown PMI command 'no_such_command'" in proc.stderr


@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        ("garbage", "PMI protocol error: line is not ASCII"),
        ("long_line", "PMI protocol error: a line longer than"),
        ("long_line_nl", "PMI protocol error: a line longer than"),
        ("hangup", "closed its PMI connection before finalize"),
    ],
)
def test_hostile_clients_abort_the_job_naming_the_rank(launcher: Launcher, scenario: str, words: str) -> None:
    start = time.monotonic()
    proc = launcher.run("-n", "2", PY, RAW, scenario, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert time.monotonic() - start < 10
    assert f"mpilaunch: rank 1 {words}" in err
    assert "Traceback" not in err


PARENT = """
import sys
from mpi4py import MPI
child = MPI.COMM_SELF.Spawn(sys.executable, args=[sys.argv[1]], maxprocs=int(sys.argv[2]))
answers = child.gather(None, root=MPI.ROOT)
print("parent got", answers, flush=True)
child.Disconnect()
"""
CHILD = """
import os
from mpi4py import MPI
parent = MPI.Comm.Get_parent()
world = MPI.COMM_WORLD
print("child", world.Get_rank(), "says hi", flush=True)
parent.gather((world.Get_rank(), world.Get_size(), os.environ["PMI_SPAWNED"]), root=0)
parent.Disconnect()
"""


def test_spawned_children_reply_to_their_parent(launcher: Launcher, tmp_path: Path) -> None:
    parent = write_script(tmp_path, "parent.py", PARENT)
    child = write_script(tmp_path, "child.py", CHILD)
    proc = launcher.run(
        "--oversubscribe", "--tag-output", "--output-filename", "logs", "-n", "1", PY, parent, child, "3", timeout=120
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode().splitlines()
    assert "[1,0]<stdout>:parent got [(0, 3, '1'), (1, 3, '1'), (2, 3, '1')]" in out
    assert sorted(line for line in out if "says hi" in line) == [f"[2,{r}]<stdout>:child {r} says hi" for r in range(3)]
    for r in range(3):
        assert (tmp_path / "logs" / "2" / f"rank.{r}" / "stdout").read_text() == f"child {r} says hi\n"
    assert not tagged_pids(launcher.tag)


def test_spawn_multiple(launcher: Launcher, tmp_path: Path) -> None:
    child = write_script(tmp_path, "child.py", CHILD)
    parent = write_script(
        tmp_path,
        "multi.py",
        "import sys\nfrom mpi4py import MPI\n"
        f"c = MPI.COMM_SELF.Spawn_multiple([sys.executable] * 2, [[{child!r}], [{child!r}]], [1, 2])\n"
        "print('sizes', c.Get_remote_size(), sorted(c.gather(None, root=MPI.ROOT)), flush=True)\n"
        "c.Disconnect()\n",
    )
    proc = launcher.run("--oversubscribe", "-n", "1", PY, parent, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "sizes 3 [(0, 3, '1'), (1, 3, '1'), (2, 3, '1')]" in proc.stdout.decode()


def test_spawn_without_free_slots_is_refused_cleanly(launcher: Launcher, tmp_path: Path) -> None:
    parent = write_script(tmp_path, "parent.py", PARENT)
    child = write_script(tmp_path, "child.py", CHILD)
    proc = launcher.run("-H", "localhost:2", "-n", "1", PY, parent, child, "4", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "MPI_Comm_spawn from rank 0 refused: There are not enough slots" in err
    assert not tagged_pids(launcher.tag)


def test_a_failing_child_aborts_the_whole_run(launcher: Launcher, tmp_path: Path) -> None:
    parent = write_script(tmp_path, "parent.py", PARENT)
    child = write_script(
        tmp_path,
        "bad_child.py",
        "import os\nfrom mpi4py import MPI\nparent = MPI.Comm.Get_parent()\n"
        "if MPI.COMM_WORLD.Get_rank() == 1:\n    os._exit(9)  # a crash: no MPI_Finalize\n"
        "parent.gather(0, root=0)\n",
    )
    proc = launcher.run("--oversubscribe", "-n", "1", PY, parent, child, "2", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 9, err
    assert "Rank:      1 of spawned job 2" in err
    assert not tagged_pids(launcher.tag)


def test_pmi_over_tcp(launcher: Launcher, tmp_path: Path) -> None:
    no_fd = "import os\nassert 'PMI_FD' not in os.environ\n"
    script = write_script(tmp_path, "coll.py", no_fd + Path(COLLECTIVES).read_text())
    proc = launcher.run("--pmi-tcp", "--oversubscribe", "-n", "4", PY, script, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["collectives ok 4"]


def test_pmi_tcp_refuses_a_wrong_id(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "intruder.py",
        "import os, socket\n"
        "host, port = os.environ['PMI_PORT'].split(':')\n"
        "s = socket.create_connection((host, int(port)))\n"
        "s.sendall(b'cmd=initack pmiid=%d\\n' % (int(os.environ['PMI_ID']) ^ 1))\n"
        "print('intruder got', s.recv(100), flush=True)\n"
        "from mpi4py import MPI\n"
        "print('then MPI size', MPI.COMM_WORLD.Get_size(), flush=True)\n",
    )
    proc = launcher.run("--pmi-tcp", "-n", "2", PY, script, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode().splitlines()
    assert out.count("intruder got b''") == 2 and out.count("then MPI size 2") == 2
    said = [line for line in proc.stderr.decode().splitlines() if "refused" in line]
    assert said[0] == (
        "mpilaunch: refused a PMI connection that did not present a valid PMI_ID (it presented a wrong or used "
        "PMI_ID); any more are summed up at the end"
    )
    assert re.fullmatch(
        r"mpilaunch: refused 2 connections to the PMI port 127\.0\.0\.1:\d+ in all: 2 presented a wrong or used PMI_ID",
        said[1],
    )
    assert len(said) == 2, said


def test_spawn_over_tcp(launcher: Launcher, tmp_path: Path) -> None:
    parent = write_script(tmp_path, "parent.py", PARENT)
    child = write_script(tmp_path, "child.py", CHILD)
    proc = launcher.run("--pmi-tcp", "--oversubscribe", "-n", "1", PY, parent, child, "2", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "parent got [(0, 2, '1'), (1, 2, '1')]" in proc.stdout.decode()


@pytest.mark.parametrize(("code", "status"), [(7, 7), (0, 1), (256, 1), (-1, 255)])
def test_mpi_abort_status_is_never_success(launcher: Launcher, tmp_path: Path, code: int, status: int) -> None:
    script = write_script(
        tmp_path,
        "abort.py",
        f"import time\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 0:\n    MPI.COMM_WORLD.Abort({code})\n"
        "time.sleep(30)\n",
    )
    proc = launcher.run("-n", "2", PY, script, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == status, err
    assert f"called MPI_Abort with code {code}" in err and f"Exit code: {status}" in err


def test_spawn_onto_a_host_that_cannot_be_reached_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    """No rank of job 1 runs on far-away-host: its agent is started for the spawn, and since the
    name resolves to nothing, the spawn is refused naming it (the parent then fails)."""
    parent = write_script(tmp_path, "parent.py", PARENT)
    child = write_script(tmp_path, "child.py", CHILD)
    proc = launcher.run("-H", "localhost:1,far-away-host:4", "-n", "1", PY, parent, child, "2", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "refused: far-away-host: " in err and "far-away-host" in err.split("refused: far-away-host: ", 1)[1]
    assert not tagged_pids(launcher.tag)


HELLO_C = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("rank %d of %d\n", rank, size);
    MPI_Finalize();
    return 0;
}
"""


def _compile(compiler: str, tmp_path: Path, name: str) -> str:
    source = tmp_path / "hello.c"
    source.write_text(HELLO_C)
    out = tmp_path / name
    subprocess.run([compiler, "-o", str(out), str(source)], check=True, capture_output=True, timeout=120)
    return str(out)


WHEEL_MPICC = Path(sysconfig.get_path("scripts")) / "mpicc"
OPENMPI_MPICC = Path("/usr/bin/mpicc.openmpi")


@pytest.mark.skipif(not WHEEL_MPICC.exists(), reason="the mpich wheel's mpicc is not installed")
def test_a_c_program_built_with_mpich(launcher: Launcher, tmp_path: Path) -> None:
    program = _compile(str(WHEEL_MPICC), tmp_path, "hello_mpich")
    assert "libmpi.so.12" in needed_libraries(program)
    proc = launcher.run("-n", "2", program, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().splitlines()) == ["rank 0 of 2", "rank 1 of 2"]


@pytest.mark.skipif(not OPENMPI_MPICC.exists(), reason="Debian's libopenmpi-dev is not installed")
def test_an_open_mpi_program_is_served_pmix_never_run_as_singletons(launcher: Launcher, tmp_path: Path) -> None:
    """By default a program linked with Open MPI gets PMIx (one job of 2); asked for PMI-2 it is
    refused in one line; --mpi none starts singletons, the user's explicit choice."""
    program = _compile(str(OPENMPI_MPICC), tmp_path, "hello_ompi")
    proc = launcher.run("-n", "2", program, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == ["rank 0 of 2", "rank 1 of 2"]
    proc = launcher.run("--mpi", "pmi2", "-n", "2", program, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b"", err
    assert "is linked with Open MPI (libmpi.so.40)" in err and "--mpi pmix" in err and len(err.splitlines()) == 1
    proc = launcher.run("--mpi", "none", "-n", "2", program, timeout=60)  # the user's explicit choice
    assert proc.stdout.decode().splitlines() == ["rank 0 of 1", "rank 0 of 1"]


@pytest.mark.skipif(not (OPENMPI_MPICC.exists() and WHEEL_MPICC.exists()), reason="needs both MPIs' mpicc")
def test_a_job_that_mixes_mpi_families_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    """Open MPI and MPICH ranks cannot share one MPI_COMM_WORLD: one line, status 2, nothing
    started; and --mpi pmix does not serve MPICH ranks."""
    ompi = _compile(str(OPENMPI_MPICC), tmp_path, "hello_ompi")
    mpich = _compile(str(WHEEL_MPICC), tmp_path, "hello_mpich")
    proc = launcher.run("-n", "1", ompi, ":", "-n", "1", mpich, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b"", err
    assert "cannot share one MPI_COMM_WORLD" in err and len(err.splitlines()) == 1
    proc = launcher.run("--mpi", "pmix", "-n", "2", mpich, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "drop --mpi pmix" in err and len(err.splitlines()) == 1, err


def test_elf_reader_on_real_files_and_garbage(tmp_path: Path) -> None:
    assert "libc.so.6" in needed_libraries(sys.executable) or needed_libraries("/bin/true") == ["libc.so.6"]
    assert needed_libraries(str(ROOT / "README.md")) == []
    assert needed_libraries(str(tmp_path / "missing")) == []


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_elf_reader_never_raises(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"\x7fELF\x02\x01" + data)
    assert isinstance(needed_libraries(str(path)), list)
