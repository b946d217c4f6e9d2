"""Whatever the hosts' sources say, through the command (`mpilaunch --dry-run`, a process of its
own in a clean environment): hostfiles, -H values and job files of any bytes, the hosts from the
environment that --display-map names, a Grid Engine job's slots. Either a dry run (status 0) or
one line naming what is wrong (status 2); never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.unit.test_sge_command import PE_FILE

CLEAN = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMPI_ALLOW_RUN_AS_ROOT": "1"}
CLEAN["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
if "PYTHONPATH" in os.environ:
    CLEAN["PYTHONPATH"] = os.environ["PYTHONPATH"]


def dry_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mpilaunch --dry-run ARGS` with only CLEAN and env: it must never print a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "mpilaunch", "--dry-run", *args],
        capture_output=True,
        text=True,
        env={**CLEAN, **(env or {})},
        cwd=ROOT,
        timeout=60,
    )
    assert "Traceback" not in proc.stderr
    return proc


# -- hostfiles, -H and job files of any bytes ---------------------------------------------------------
@given(st.binary(max_size=200))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_hostfile_through_the_command(tmp_path_factory, data: bytes) -> None:
    """Any hostfile bytes: exit 0 (dry run) or exit 2 with one line naming the file; never a traceback."""
    directory = tmp_path_factory.mktemp("hf")
    path = directory / "hostfile"
    path.write_bytes(data)
    proc = dry_run("--oversubscribe", "--hostfile", str(path), "-n", "1", "true")
    if proc.returncode != 0:
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0], proc.stderr


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=30))
@settings(max_examples=25, deadline=None)
def test_fuzz_host_option_through_the_command(value: str) -> None:
    proc = dry_run("-H", value, "-n", "1", "true")
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@given(st.binary(max_size=120))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_job_file_bytes_through_the_command(tmp_path_factory, data: bytes) -> None:
    """Any bytes: exit 0 (dry run) or 2 with one line naming the file; never a traceback."""
    path = tmp_path_factory.mktemp("jf") / "job.yaml"
    path.write_bytes(data)
    proc = dry_run("--config", str(path), "-n", "1", "true")
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0], proc.stderr


# -- hosts from the environment -------------------------------------------------------------------------
def map_lines(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines() if "hosts from" in line or "Data for node" in line]


def test_display_map_names_the_source() -> None:
    proc = dry_run("true", env={"MLP_MPI_HOSTS": "worker0:2,worker1:2", "MLP_MPI_NP": "3"})
    assert proc.returncode == 0, proc.stderr
    assert map_lines(proc.stdout) == [
        "hosts from: MLP_MPI_HOSTS, -n 3 from MLP_MPI_NP; 4 slots",
        "Data for node: worker0\tNum slots: 2\tMax slots: 0\tNum procs: 2",
        "Data for node: worker1\tNum slots: 2\tMax slots: 0\tNum procs: 1",
    ]
    env = {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)", "MLP_MPI_NP": "1"}
    proc = dry_run("--map-by", "node", "true", env=env)
    assert proc.returncode == 0, proc.stderr
    assert map_lines(proc.stdout) == [  # MLP_MPI_NP goes with MLP_MPI_HOSTS only
        "hosts from: Slurm allocation (SLURM_JOB_NODELIST); 4 slots",
        "Data for node: node01\tNum slots: 2\tMax slots: 0\tNum procs: 2",
        "Data for node: node02\tNum slots: 2\tMax slots: 0\tNum procs: 2",
    ]
    proc = dry_run("-n", "2", "true", env={"MLP_MPI_HOSTS": "worker0:4", "MLP_MPI_NP": "4"})
    assert map_lines(proc.stdout)[0] == "hosts from: MLP_MPI_HOSTS; 4 slots"  # -n wins over MLP_MPI_NP


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MLP_MPI_HOSTS": "w0:2,,w1"}, "mpilaunch: MLP_MPI_HOSTS='w0:2,,w1': empty host name"),
        ({"MLP_MPI_HOSTS": "w0:2", "MLP_MPI_NP": "eight"}, "mpilaunch: MLP_MPI_NP='eight': expected a number of ranks"),
        ({"SLURM_JOB_NODELIST": "node[01-"}, "mpilaunch: SLURM_JOB_NODELIST='node[01-': unclosed '['"),
        (
            {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x)"},
            "mpilaunch: SLURM_TASKS_PER_NODE='2(x)': expected N or N(xM), not '2(x)'",
        ),
        ({"LSB_MCPU_HOSTS": "h1 4 h2"}, "mpilaunch: LSB_MCPU_HOSTS='h1 4 h2': expected pairs"),
        ({"PBS_NODEFILE": "/nonexistent/nodefile"}, "mpilaunch: PBS_NODEFILE: /nonexistent/nodefile: cannot read"),
        ({"MLP_MPI_HOSTS": "w0", "MLP_MPI_NP": "4"}, "mpilaunch: There are not enough slots available"),
    ],
)
def test_bad_values_one_line_status_2(env: dict[str, str], message: str) -> None:
    proc = dry_run("true", env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(message), lines


def test_the_jobs_slots_are_its_ranks_without_n(tmp_path: Path) -> None:
    """A Grid Engine job's PE_HOSTFILE and NSLOTS."""
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text(PE_FILE)
    job = {"PE_HOSTFILE": str(hostfile), "NSLOTS": "3", "JOB_ID": "5", "SGE_ROOT": str(tmp_path)}
    proc = dry_run("true", env=job)
    assert proc.returncode == 0, proc.stderr
    assert f"hosts from: Grid Engine job's PE_HOSTFILE {hostfile}, -n 3 from NSLOTS; 4 slots" in proc.stdout
    assert proc.stdout.count("\tRank ") == 3
    given = dry_run("-n", "2", "true", env=job)
    assert given.stdout.count("\tRank ") == 2
    bad = dry_run("true", env={**job, "NSLOTS": "three"})
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "mpilaunch: NSLOTS='three': expected the job's number of slots (a whole number, at least 1)"
    ]
    hostfile.write_text("n1\n")
    broken = dry_run("true", env=job)
    assert broken.returncode == 2 and broken.stderr.strip().splitlines() == [
        f"mpilaunch: PE_HOSTFILE: {hostfile}:1: expected `host slots queue range`, not 'n1'"
    ]
