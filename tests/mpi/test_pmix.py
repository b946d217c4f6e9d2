"""Open MPI ranks, served PMIx by the agents (`--mpi pmix`, and by default for programs linked
with Open MPI): Debian's Open MPI 4.1.4, as a C
program built with `mpicc.openmpi` and as `/usr/bin/python3` with `python3-mpi4py`; the server
is Debian's libpmix 4.2 (`libpmix2`). On one host PMIx completes fences itself; across hosts
(the sshd bed) each fence goes through the controller. mpi4py's collectives at every job size
over both families: tests/mpi/test_mpi.py. After every test: no process left (the `launcher`
fixture), no PMIx directory and no new file in /dev/shm."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpilaunch.agent.services.pmix import rank_gds
from mpilaunch.host.pmix_library import LIBRARY_PLACES
from tests.conftest import ROOT, Launcher
from tests.mpi.conftest import family_python
from tests.sshbed import SshBed, bed_available

MPICC = shutil.which("mpicc.openmpi")
LIBRARY = next((p for p in LIBRARY_PLACES if os.path.exists(p)), None)
pytestmark = pytest.mark.skipif(
    MPICC is None or LIBRARY is None, reason="needs Debian's openmpi-bin, libopenmpi-dev and libpmix2"
)

PROGRAM = r"""
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    int rank, size, sum, one = 1, flag = 0, *appnum = NULL;
    const char *me = getenv("OMPI_COMM_WORLD_RANK");
    if (argc > 1 && strcmp(argv[1], "die") == 0 && me && atoi(me) == 1) raise(SIGKILL);  /* before MPI_Init */
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    if (argc > 1 && strcmp(argv[1], "abort") == 0 && rank == 1) MPI_Abort(MPI_COMM_WORLD, 7);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d of %d sum %d app %d\n", rank, size, sum, flag ? *appnum : -1);
    MPI_Finalize();
    return 0;
}
"""

COLLECTIVES = str(ROOT / "tests" / "ranks" / "collectives.py")


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("openmpi")
    (where / "hello.c").write_text(PROGRAM)
    assert MPICC is not None
    subprocess.run([MPICC, "-o", str(where / "hello"), str(where / "hello.c")], check=True, timeout=120)
    return str(where / "hello")


def _lines(out: bytes) -> list[str]:
    return sorted(out.decode().splitlines())


@pytest.mark.parametrize("np", [1, 2, 4, 8])
def test_a_c_program_sees_the_whole_job(launcher: Launcher, program: str, np: int) -> None:
    proc = launcher.run("--mpi", "pmix", "--oversubscribe", "-n", str(np), program, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert _lines(proc.stdout) == sorted(f"rank {r} of {np} sum {np} app 0" for r in range(np))


def test_mpmd_ranks_know_their_app(launcher: Launcher, program: str) -> None:
    proc = launcher.run("--mpi", "pmix", "--oversubscribe", "-n", "2", program, ":", "-n", "1", program, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert _lines(proc.stdout) == ["rank 0 of 3 sum 3 app 0", "rank 1 of 3 sum 3 app 0", "rank 2 of 3 sum 3 app 1"]


def test_mpi_abort_ends_the_job_with_its_code(launcher: Launcher, program: str) -> None:
    proc = launcher.run("--mpi", "pmix", "--kill-timeout", "1", "-n", "2", program, "abort", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 7, err[-3000:]
    assert "mpilaunch: rank 1 called MPI_Abort with code 7" in err


def test_a_rank_killed_before_mpi_init_aborts_the_job_naming_it(launcher: Launcher, program: str) -> None:
    proc = launcher.run("--mpi", "pmix", "--kill-timeout", "1", "-n", "2", program, "die", timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 137, err[-3000:]
    assert "Rank:      1" in err and "SIGKILL" in err


def test_a_missing_library_is_one_line_naming_the_host(launcher: Launcher, program: str) -> None:
    proc = launcher.run("--mpi", "pmix", "--pmix-lib", "/nonexistent/libpmix.so.2", "-n", "2", program, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 126, err
    for rank in (0, 1):  # not started: the line names the rank, the host and the library
        assert f"mpilaunch: rank {rank} could not start: needs PMIx, which host" in err, err
    assert "cannot load /nonexistent/libpmix.so.2" in err and "Traceback" not in err


available, why = bed_available()


@pytest.mark.skipif(not available, reason=why)
def test_fences_across_hosts_go_through_the_controller(launcher: Launcher, program: str, tmp_path: Path) -> None:
    """2 hosts x 2 ranks of the sshd bed: every fence that spans hosts is joined by the
    controller. (The bed's hosts are this machine: Open MPI's TCP transport is told to use lo.)"""
    home = tmp_path / "home"
    home.mkdir()
    with SshBed(tmp_path / "bed", 2, setenv={"HOME": str(home)}) as bed:
        hosts = ["--ssh-config", str(bed.config), "-H", "node1:2,node2:2"]
        tcp = ["-x", "OMPI_MCA_btl_tcp_if_include=lo"]
        proc = launcher.run(*hosts, *tcp, "-n", "4", program, timeout=120)  # PMIx by default: each host saw Open MPI
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        assert _lines(proc.stdout) == sorted(f"rank {r} of 4 sum 4 app 0" for r in range(4))
        proc = launcher.run(*hosts, *tcp, "--mpi", "pmix", "--kill-timeout", "1", "-n", "4", program, "abort")
        assert proc.returncode == 7, proc.stderr.decode()[-3000:]
        left = bed.wait_clean(5.0)
        assert not left, f"left on the hosts: {left}"


@pytest.mark.parametrize("np", [2, 4])
def test_two_agents_on_this_machine_join_fences_without_sshd(launcher: Launcher, program: str, np: int) -> None:
    """--launcher local starts an agent per host name here (hydra's fork launcher): each has its
    own PMIx server and shared-memory directory, every fence goes through the controller, and
    the ranks of the two "hosts" talk TCP on loopback."""
    hosts = f"node1:{np // 2},node2:{np // 2}"
    tcp = ("-x", "OMPI_MCA_btl_tcp_if_include=lo")
    proc = launcher.run("--launcher", "local", "-H", hosts, *tcp, "-n", str(np), program, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert _lines(proc.stdout) == sorted(f"rank {r} of {np} sum {np} app 0" for r in range(np))
    proc = launcher.run("--launcher", "local", "-H", hosts, *tcp, "-n", str(np), program, "abort", timeout=120)
    assert proc.returncode == 7, proc.stderr.decode()[-3000:]


def test_debians_mpi4py_is_served_pmix_without_being_asked(launcher: Launcher, tmp_path: Path) -> None:
    """/usr/bin/python3's mpi4py is built for Open MPI: the job is served PMIx by default."""
    python = family_python("openmpi")
    proc = launcher.run("--oversubscribe", "-n", "3", python, COLLECTIVES, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["collectives ok 3"]


def test_a_hint_of_each_family_serves_pmi1_and_the_guard_stops_the_open_mpi_rank(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Two Pythons whose mpi4py differ: a hint decides nothing, the Open MPI guard still stops
    a rank that would run alone; nothing hangs."""
    python = family_python("openmpi")
    proc = launcher.run("-n", "1", python, COLLECTIVES, ":", "-n", "1", sys.executable, COLLECTIVES, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "uses Open MPI" in err, err[-3000:]


OPEN_MPI_RUN = shutil.which("mpirun.openmpi")


def _reports(err: bytes) -> list[str]:
    """The --report-bindings lines, less the launcher's pid."""
    return sorted(line.split("] ", 1)[1] for line in err.decode().splitlines() if " MCW rank " in line)


@pytest.mark.skipif(OPEN_MPI_RUN is None, reason="needs Debian's openmpi-bin")
@pytest.mark.parametrize("binding", [[], ["--bind-to", "core"], ["--bind-to", "none"], ["--bind-to", "hwthread"]])
def test_bindings_are_mpiruns_and_reported_in_its_words(launcher: Launcher, program: str, binding: list) -> None:
    """Open MPI ranks are bound as mpirun binds them (a core each at 2 ranks when nothing is
    asked), and --report-bindings says it as mpirun does, line for line."""
    ours = launcher.run(*binding, "--report-bindings", "-n", "2", program, timeout=120)
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    theirs = subprocess.run(
        [OPEN_MPI_RUN, *binding, "--report-bindings", "-n", "2", program], capture_output=True, env=env, timeout=120
    )
    assert theirs.returncode == 0, theirs.stderr.decode()[-3000:]
    assert _reports(ours.stderr) == _reports(theirs.stderr) and len(_reports(ours.stderr)) == 2
    said = "mpilaunch: Open MPI ranks bound to a core each, as by mpirun; --bind-to none: unbound"
    assert (said in ours.stderr.decode()) == (not binding)


def test_no_binding_note_where_no_rank_is_bound(launcher: Launcher, program: str) -> None:
    """More ranks than this machine's cores: mpirun binds none of them, nor does mpilaunch, and
    the binding note is not printed (it was, for a binding nobody got)."""
    ranks = str(2 * (os.cpu_count() or 1))
    ours = launcher.run("--report-bindings", "-n", ranks, program, timeout=120)
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    assert "ranks bound to a" not in ours.stderr.decode()
    assert all("not bound" in line for line in _reports(ours.stderr)) and len(_reports(ours.stderr)) == int(ranks)


def test_ranks_are_not_offered_pmix_4s_dstore() -> None:
    """ds21 and ds12 race with a direct modex of a local peer (services/pmix.py, RACY_GDS)."""
    assert rank_gds("ds21,ds12,hash") == "hash"  # Debian's libpmix2 4.2
    assert rank_gds("shmem2,hash") == "shmem2,hash"  # PMIx 5
    assert rank_gds("ds21") == "hash"


ASYNC_MODEX = ("-x", "OMPI_MCA_pmix_base_async_modex=1", "-x", "OMPI_MCA_pmix_base_collect_data=0")


@pytest.mark.parametrize("rank", ["c", "python"])
def test_direct_modex_across_agents(launcher: Launcher, program: str, tmp_path: Path, rank: str) -> None:
    """Open MPI's asynchronous modex: a fence without data, then each rank's data fetched from
    its host when first needed (the direct-modex upcall, routed through the controller to the
    rank's agent). Before 2026-11-25 the allreduce failed with MPI_ERR_INTERN; until the ranks
    were kept off PMIx 4's dstore (services/pmix.py, RACY_GDS), one run in 30 to 100 failed
    MPI_Init with 'PML add procs failed: Not found'."""
    argv = [program] if rank == "c" else [family_python("openmpi"), COLLECTIVES]
    hosts = ("--launcher", "local", "-H", "node1:2,node2:2", "-x", "OMPI_MCA_btl_tcp_if_include=lo")
    proc = launcher.run(*hosts, *ASYNC_MODEX, "-n", "4", *argv, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    expected = sorted(f"rank {r} of 4 sum 4 app 0" for r in range(4)) if rank == "c" else ["collectives ok 4"]
    assert _lines(proc.stdout) == expected
