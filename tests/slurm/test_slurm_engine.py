"""Slurm as the launch engine (issue "Launch through the engine the cluster already trusts"), on a
real one-node Slurm (tests/slurmbed.py): inside an allocation mpilaunch starts its agents with
one `srun` step, so every rank runs in the step (its ancestor is slurmstepd); the agents connect
back over TCP with a secret from the step's environment; variables, logs, exit codes and MPI
wire-up are as on one machine; scancel and --timeout end the step with nothing left.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.slurmbed import SlurmBed, ancestors, slurm_available, slurmbed_fixtures

available, why = slurm_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
slurm, clean_slurm = slurmbed_fixtures("slurmengine")
PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

SHOW = """
import os, sys
chain, pid = [], os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/comm") as handle:
        chain.append(handle.read().strip())
    with open(f"/proc/{pid}/stat") as handle:
        pid = int(handle.read().rsplit(")", 1)[1].split()[1])
keys = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_STEP_ID")
print(" ".join(os.environ.get(k, "-") for k in keys), "slurmstepd" in chain, "MPILAUNCH_AGENT_SECRET" in os.environ)
sys.stderr.write(f"err {os.environ['RANK']}\\n")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and os.environ["RANK"] == "1" else 0)
"""


def _env(bed: SlurmBed) -> dict[str, str]:
    return bed.client_env(
        {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONPATH": str(ROOT)}
    )


def _mpilaunch(*args: str) -> list[str]:
    return [PY, "-m", "mpilaunch", *args]


def test_salloc_runs_every_rank_inside_one_srun_step(slurm: SlurmBed, tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    logs = ("--output-filename", str(tmp_path / "logs"))
    argv = ["salloc", "-N1", f"-n{slurm.cpus}", *_mpilaunch(*logs, PY, str(script))]
    proc = slurm.run(argv, env=_env(slurm), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = slurm.cpus
    rows = sorted(line for line in proc.stdout.splitlines() if line.strip())
    # every rank: the job's variables, a step of the allocation (step 0: the agents' srun), under slurmstepd,
    # and the agents' secret not passed on
    assert rows == sorted(f"{r} {n} {r} {r} {n} 0 True False" for r in range(n)), proc.stdout
    for rank in range(n):
        assert (tmp_path / "logs" / "1" / f"rank.{rank}" / "stderr").read_text() == f"err {rank}\n"


def test_a_failed_rank_ends_the_job_with_its_code(slurm: SlurmBed, tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    proc = slurm.run(["salloc", "-N1", "-n2", *_mpilaunch(PY, str(script), "3")], env=_env(slurm), timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Rank:      1" in proc.stderr and "Exit code: 3" in proc.stderr


def test_mpi4py_over_mpich_wires_up_in_the_step(slurm: SlurmBed, tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.rank, c.size, c.allreduce(c.rank))"
    proc = slurm.run(["salloc", "-N1", "-n2", *_mpilaunch(PY, "-c", code)], env=_env(slurm), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(proc.stdout.split("\n")[:-1]) == ["0 2 1", "1 2 1"]


def test_a_shells_ranks_are_served_pmi_and_pmix_in_the_step(slurm: SlurmBed, tmp_path: Path) -> None:
    """The srun-started agent reads `sh` as opaque and serves both: Open MPI (its PMIx server in
    the step, its hwloc description's CPUs the step's) and MPICH ranks wire up."""
    import shutil
    import subprocess

    from tests.mpi.test_mpi import HELLO_C

    mpicc = shutil.which("mpicc.openmpi")
    if mpicc is None:
        pytest.skip("needs Debian's openmpi-bin and libopenmpi-dev")
    (tmp_path / "hello.c").write_text(HELLO_C)
    subprocess.run([mpicc, "-o", str(tmp_path / "hello"), str(tmp_path / "hello.c")], check=True, timeout=120)
    argv = ["salloc", "-N1", "-n2", *_mpilaunch("sh", "-c", str(tmp_path / "hello"))]
    ompi = slurm.run(argv, env=_env(slurm), timeout=120)
    assert ompi.returncode == 0, ompi.stderr[-3000:]
    assert sorted(ompi.stdout.split("\n")[:-1]) == ["rank 0 of 2", "rank 1 of 2"]
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.rank, c.size, c.allreduce(c.rank))"
    line = f"{PY} -c '{code}'"
    mpich = slurm.run(["salloc", "-N1", "-n2", *_mpilaunch("sh", "-c", line)], env=_env(slurm), timeout=120)
    assert mpich.returncode == 0, mpich.stderr[-3000:]
    assert sorted(mpich.stdout.split("\n")[:-1]) == ["0 2 1", "1 2 1"]


def test_an_sbatch_script(slurm: SlurmBed, tmp_path: Path) -> None:
    """In a batch script the launcher already runs in a step (the batch step): its own node's
    agent is forked, as mpirun's daemon is, and the ranks run in that step (no step 0)."""
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    show = tmp_path / "show.py"
    show.write_text(SHOW)
    script.write_text(
        f"#!/bin/sh\n{PY} -m mpilaunch sh -c 'echo rank $RANK of $WORLD_SIZE'\necho status $?\n"
        f"{PY} -m mpilaunch {PY} {show}\n"
    )
    submitted = slurm.run(["sbatch", "-N1", "-n2", "-o", str(out), "--parsable", str(script)], env=_env(slurm))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    record = slurm.wait_job(job, timeout=60)
    assert record["JobState"] == "COMPLETED", record
    lines = [line for line in out.read_text().splitlines() if not line.startswith(("mpilaunch: ", "err "))]
    assert sorted(lines[:2]) == ["rank 0 of 2", "rank 1 of 2"] and lines[2] == "status 0", lines
    assert sorted(lines[3:]) == ["0 2 0 0 2 - True False", "1 2 1 1 2 - True False"], lines  # in the batch step


@pytest.mark.parametrize(
    "words, said",
    [
        (["-n", "2", "--no-such-option", "true"], "No such option '--no-such-option'"),
        (["-n", "100", "true"], "There are not enough slots available"),
        (["-n", "2", "/no/such/program"], "program '/no/such/program' not found"),
    ],
    ids=["refused by the parser", "refused by the plan", "refused by the agent's check"],
)
def test_the_step_starts_before_the_launch_and_a_refused_job_ends_it(
    slurm: SlurmBed, words: list[str], said: str
) -> None:
    """Under salloc the srun step over the allocation starts at the launcher's first instruction
    (transport/slurm_step.py), so a command line refused by the parser or the plan has a step
    too: it ends quietly (its agents sent away), with status 2, one line, and nothing left."""
    proc = slurm.run(["salloc", "-N1", "-n2", *_mpilaunch(*words)], env=_env(slurm), timeout=60)
    assert proc.returncode == 2, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("salloc:")]
    assert len(ours) == 1 and said in ours[0], proc.stderr  # no traceback, no srun complaint
    job = proc.stderr.split("Granted job allocation ", 1)[1].split()[0]
    assert f"launch task StepId={job}.0 " in slurm.log("slurmd")  # the step was started for it
    deadline = time.monotonic() + 10
    while slurm.leftover_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not slurm.leftover_pids()


def test_scancel_ends_every_rank_and_says_so(slurm: SlurmBed, tmp_path: Path) -> None:
    marks = tmp_path / "pids"
    marks.mkdir()
    body = f"import os, time\nopen('{marks}/' + str(os.getpid()), 'w').close()\ntime.sleep(120)\n"
    (tmp_path / "sleep.py").write_text(body)
    proc = slurm.popen(["salloc", "-N1", "-n2", *_mpilaunch(PY, str(tmp_path / "sleep.py"))], env=_env(slurm))
    deadline = time.monotonic() + 60
    while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.name) for p in marks.iterdir()]
    assert len(pids) == 2
    assert all(any(name == "slurmstepd" for _, name in ancestors(pid)) for pid in pids)
    job = slurm.job_ids()[0]
    assert slurm.run(["scancel", job]).returncode == 0
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, err
    assert "by Slurm (scancel, or the job's time limit)" in err or "Slurm job step ended" in err, err
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def test_timeout_and_ctrl_c_end_the_step(slurm: SlurmBed, tmp_path: Path) -> None:
    proc = slurm.run(["salloc", "-N1", "-n2", *_mpilaunch("--timeout", "2", "sleep", "60")], env=_env(slurm))
    assert proc.returncode == 124, proc.stderr[-3000:]
    run = slurm.popen(["salloc", "-N1", "-n2", *_mpilaunch("sleep", "60")], env=_env(slurm))
    deadline = time.monotonic() + 30
    while not any(slurm.steps(job) for job in slurm.job_ids()) and time.monotonic() < deadline:
        time.sleep(0.1)  # the job list read once a round: the first job may leave it between two reads
    time.sleep(0.5)
    mpilaunch = [c for c in _children(run.pid) if "mpilaunch" in _cmdline(c)]
    assert mpilaunch, "mpilaunch did not start under salloc"
    os.kill(mpilaunch[0], signal.SIGINT)
    run.communicate(timeout=60)
    assert run.returncode in (130, 1), run.returncode  # salloc reports its command's status (or 1)


def test_launcher_ssh_inside_an_allocation_is_the_old_way(slurm: SlurmBed) -> None:
    """--launcher ssh: this machine's agent is forked as before, outside any step."""
    proc = slurm.run(
        ["salloc", "-N1", "-n1", *_mpilaunch("--launcher", "ssh", "sh", "-c", "echo ${SLURM_STEP_ID-none}")],
        env=_env(slurm),
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "none", proc.stderr


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_torchruns_ranks_per_node_inside_an_allocation_of_fewer_cpus(slurm: SlurmBed, tmp_path: Path) -> None:
    """torchrun runs --nproc-per-node ranks on a node whatever Slurm gave it; so does mpilaunch
    under torchrun's words: 3 ranks in an allocation of one CPU, all inside the step."""
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    argv = ["salloc", "-N1", "-n1", *_mpilaunch("--nproc-per-node", "3", str(script))]
    proc = slurm.run(argv, env=_env(slurm), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sorted(line for line in proc.stdout.splitlines() if line.strip())
    assert rows == sorted(f"{r} 3 {r} {r} 3 0 True False" for r in range(3)), proc.stdout
