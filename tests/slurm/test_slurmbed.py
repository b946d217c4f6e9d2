"""The one-node Slurm bed itself, and the Slurm behaviour a launch engine built on srun relies on.

What the engine needs to know, checked here against real daemons: a step can run beside another
step of the same allocation only with `--overlap`; `--cpu-bind=none` leaves one task per node on
every CPU the job has there; a task is a child of slurmstepd and carries SLURM_STEP_ID & co.;
scancel of a job sends SIGCONT+SIGTERM at once and SIGKILL max(KillWait, 5) s later, while
scancel of a step, SIGTERM to srun and SIGKILL to srun alone all SIGKILL the tasks at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.slurmbed import (
    TAG_VAR,
    SlurmBed,
    ancestors,
    parent_pid,
    pid_alive,
    process_name,
    slurm_available,
    slurmbed_fixtures,
    system_slurm_pids,
)

available, why = slurm_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
slurm, clean_slurm = slurmbed_fixtures("slurmbed")

# Run inside a step: what a task sees of itself (affinity, Slurm variables, its parents, the job).
PROBE = r"""
import json, os, subprocess

def stat(pid):
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()

def comm(pid):
    with open(f"/proc/{pid}/comm") as handle:
        return handle.read().strip()

chain, pid = [], os.getppid()
while pid > 1:
    chain.append([pid, comm(pid)])
    pid = int(stat(pid)[1])
job_id = os.environ["SLURM_JOB_ID"]
job = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True, text=True).stdout
steps = subprocess.run(["squeue", "-s", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True).stdout
print(json.dumps({
    "pid": os.getpid(),
    "affinity": sorted(os.sched_getaffinity(0)),
    "chain": chain,
    "env": {k: v for k, v in os.environ.items() if k.startswith("SLURM")},
    "job": job,
    "steps": steps.split(),
}))
"""

# Run as a task: logs every catchable signal with a timestamp, ignores them, and never exits.
TRAP = r"""
import os, signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
def note(sig, frame):
    log.write(f"{time.time():.3f} {signal.Signals(sig).name}\n")
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCONT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, note)
log.write(f"{time.time():.3f} ready {os.getpid()}\n")
while True:
    time.sleep(0.05)
"""


def cpu_list(text: str) -> set[int]:
    """`0-1,4` (Slurm's CPU_IDs) as {0, 1, 4}."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    """Poll predicate() until it returns something true; its value, or fail with `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def step_tasks(bed: SlurmBed, name: str) -> list[int]:
    """Live processes called `name` whose parent is one of the bed's slurmstepd: a step's tasks."""
    stepds = set(bed.stepd_pids())
    return [pid for pid in bed.leftover_pids() if process_name(pid) == name and parent_pid(pid) in stepds]


def test_node_is_idle(slurm: SlurmBed) -> None:
    """The bed is ready only once the node registered: sinfo shows it idle in the debug partition."""
    out = slurm.run(["sinfo", "-h", "-o", "%P %t %D %c %N"], check=True)
    assert out.stdout.split() == ["debug*", "idle", "1", str(slurm.cpus), slurm.node]
    assert slurm.node == socket.gethostname().split(".")[0]


def test_srun_runs_tasks_on_the_node(slurm: SlurmBed) -> None:
    """srun -n2 starts two tasks on this host and returns their output."""
    out = slurm.run(["srun", "-N1", "-n2", "hostname"], timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [socket.gethostname()] * 2


def test_salloc_sets_the_allocation_variables(slurm: SlurmBed) -> None:
    """The shell salloc runs gets the job id, node list and tasks per node an engine reads."""
    cmd = "echo $SLURM_JOB_ID $SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE $SLURM_JOB_NUM_NODES $SLURM_NTASKS"
    out = slurm.run(["salloc", "-N1", "-n2", "sh", "-c", cmd], timeout=30)
    assert out.returncode == 0, out.stderr
    job_id, nodelist, per_node, nodes, ntasks = out.stdout.split()
    assert job_id.isdigit()
    assert (nodelist, per_node, nodes, ntasks) == (slurm.node, "2", "1", "2")
    assert f"Granted job allocation {job_id}" in out.stderr


def test_sbatch_job_completes(slurm: SlurmBed, tmp_path: Path) -> None:
    """A batch job runs to COMPLETED (no slurmdbd: scontrol, not sacct) and writes its output file."""
    output = tmp_path / "batch.out"
    out = slurm.run(
        ["sbatch", "--parsable", "-n1", "-o", str(output), "--wrap", "echo batch $SLURM_JOB_ID on $(hostname)"],
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    info = slurm.wait_job(job_id, timeout=30)
    assert (info["JobState"], info["ExitCode"], info["NodeList"]) == ("COMPLETED", "0:0", slurm.node)
    assert output.read_text().split() == ["batch", job_id, "on", socket.gethostname()]


def test_scancel_ends_a_running_step(slurm: SlurmBed) -> None:
    """scancel of the job of a running `srun sleep 100`: the sleep, its slurmstepd and srun are gone."""
    srun = slurm.popen(["srun", "-N1", "-n1", "sleep", "100"])
    try:
        sleeps = wait_for(lambda: step_tasks(slurm, "sleep"), 15, "the sleep task under slurmstepd")
        stepds = slurm.stepd_pids()
        (job_id,) = slurm.job_ids()
        began = time.monotonic()
        slurm.run(["scancel", job_id], check=True)
        srun.communicate(timeout=20)
        gone = wait_for(lambda: not any(pid_alive(p) for p in (*sleeps, *stepds)), 15, "step processes gone")
        took = time.monotonic() - began
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.communicate()
    assert gone and took < 5, f"{took:.1f}s"  # sleep dies of the SIGTERM: no KillWait
    assert srun.returncode != 0  # 143: srun reports the task killed by SIGTERM
    assert slurm.wait_job(job_id, timeout=15)["JobState"] == "CANCELLED"


# How a step's tasks end, by what the engine does: (action, signals the task sees first, seconds
# until it is killed at the earliest and at the latest). SIGKILL is never caught, so only its time shows.
# A SIGCONT can come a few milliseconds before the SIGKILL (seen once in CI, 2026-11-25, SIGKILL to
# srun): the task notes it only if its handler runs in between, so where no signal is expected a
# SIGCONT alone is allowed.
STOPS = {
    # slurmd: SIGCONT + SIGTERM to every step, SIGKILL after max(KillWait, 5) s (srun waits KillWait + 2 s)
    "scancel JOB": ("scancel-job", ["SIGCONT", "SIGTERM"], 2.0, 10.0),
    # a step cancelled alone gets SIGKILL at once, no SIGTERM first
    "scancel JOB.STEP": ("scancel-step", [], 0.0, 2.0),
    # srun on SIGTERM: "forcing job termination", SIGKILL to the tasks at once
    "SIGTERM to srun": ("srun-term", [], 0.0, 2.0),
    # srun's child (its shepherd) sees srun die and cancels the step: SIGKILL at once
    "SIGKILL to srun": ("srun-kill", [], 0.0, 2.0),
}


@pytest.mark.parametrize("how", list(STOPS))
def test_how_a_step_is_stopped(slurm: SlurmBed, tmp_path: Path, how: str) -> None:
    """A task that catches and ignores every catchable signal, stopped four ways: which signals it
    sees and when SIGKILL comes; then the task and its slurmstepd are gone and srun has exited."""
    action, expected, earliest, latest = STOPS[how]
    trap, log = tmp_path / "trap.py", tmp_path / "trap.log"
    trap.write_text(TRAP)
    srun = slurm.popen(["srun", "-N1", "-n1", sys.executable, str(trap), str(log)])
    try:
        wait_for(lambda: log.exists() and "ready" in log.read_text(), 15, "the trap task ready")
        task = int(log.read_text().split()[2])
        stepds = slurm.stepd_pids()
        assert ancestors(task)[0] == (parent_pid(task), "slurmstepd") and parent_pid(task) in stepds
        (job_id,) = slurm.job_ids()
        began = time.time()
        if action == "scancel-job":
            slurm.run(["scancel", job_id], check=True)
        elif action == "scancel-step":
            slurm.run(["scancel", f"{job_id}.0"], check=True)
        else:
            srun.send_signal(signal.SIGTERM if action == "srun-term" else signal.SIGKILL)
        wait_for(lambda: not pid_alive(task), 20, "the task killed")
        killed = time.time() - began
        wait_for(lambda: not any(pid_alive(p) for p in stepds), 20, "slurmstepd gone")
        srun.communicate(timeout=20)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.communicate()
    lines = log.read_text().splitlines()[1:]
    signals = [(float(t) - began, name) for t, name in (line.split()[:2] for line in lines)]
    seen = [name for _, name in signals]
    if "SIGCONT" not in expected:
        seen = [name for name in seen if name != "SIGCONT"]  # the racy SIGCONT just before SIGKILL
    assert sorted(seen) == sorted(expected), signals
    assert all(t < 2.0 for t, _ in signals), signals
    assert earliest <= killed < latest, f"SIGKILL after {killed:.1f}s"


def test_killing_srun_with_its_shepherd_leaves_the_step_running(slurm: SlurmBed) -> None:
    """srun forks a child that cancels the step when srun dies; SIGKILL to srun's whole process
    group kills that child too, and the step's task goes on running until the job is cancelled."""
    srun = slurm.popen(["srun", "-N1", "-n1", "sleep", "100"], start_new_session=True)
    try:
        (sleep,) = wait_for(lambda: step_tasks(slurm, "sleep"), 15, "the sleep task under slurmstepd")
        shepherds = [p for p in slurm.leftover_pids() if parent_pid(p) == srun.pid and process_name(p) == "srun"]
        assert len(shepherds) == 1
        os.killpg(srun.pid, signal.SIGKILL)
        srun.communicate(timeout=10)
        time.sleep(1.0)
        assert pid_alive(sleep)
        (job_id,) = slurm.job_ids()
        assert [s["StepId"] for s in slurm.steps(job_id)] == [f"{job_id}.0"]
        slurm.run(["scancel", job_id], check=True)
        wait_for(lambda: not pid_alive(sleep), 10, "the orphaned step's task killed by scancel")
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.communicate()


@pytest.mark.parametrize("share", ["whole node", "part of the node"])
def test_overlap_step_sees_every_allocated_cpu(slurm: SlurmBed, tmp_path: Path, share: str) -> None:
    """Inside an allocation whose CPUs a step already holds: a plain second srun waits, while
    `--overlap` starts one task per node at once; with `--cpu-bind=none` it can run on every CPU
    the job has on the node (and no other), it is a child of slurmstepd, and SLURM_STEP_ID etc. say so."""
    ntasks = slurm.cpus if share == "whole node" else 1
    if ntasks == slurm.cpus and share != "whole node":
        pytest.skip("a one-CPU node has no part to allocate")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    script = tmp_path / "alloc.sh"
    script.write_text(
        f"srun --ntasks={ntasks} sleep 60 &\n"  # step 0 holds every CPU of the allocation
        'until squeue -s -h -j "$SLURM_JOB_ID" -o %i | grep -q "\\.0$"; do sleep 0.05; done\n'
        "timeout 2 srun --ntasks=1 true 2>/dev/null; echo plain=$?\n"
        "srun --nodes=$SLURM_JOB_NUM_NODES --ntasks=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 --cpu-bind=none"
        f" --kill-on-bad-exit=1 --overlap {sys.executable} {probe}\n"
        'echo overlap=$?\nscancel "$SLURM_JOB_ID.0"\nwait\n'
    )
    out = slurm.run(["salloc", "-N1", f"-n{ntasks}", "sh", str(script)], timeout=45)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "plain=124" in lines, "a second step without --overlap should wait for step 0's CPUs"
    assert "overlap=0" in lines, out.stdout + out.stderr
    seen = json.loads(next(line for line in lines if line.startswith("{")))
    env = seen["env"]
    job_id = env["SLURM_JOB_ID"]
    assert f"{job_id}.0" in seen["steps"] and f"{job_id}.{env['SLURM_STEP_ID']}" in seen["steps"]
    assert env["SLURM_STEP_ID"] == env["SLURM_STEPID"] != "0"
    assert (env["SLURM_STEP_NUM_TASKS"], env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"]) == (
        "1",
        "0",
        "0",
        "0",
    )
    assert env["SLURM_STEP_NODELIST"] == slurm.node and env["SLURMD_NODENAME"] == slurm.node
    assert seen["chain"][0][1] == "slurmstepd", seen["chain"]
    job_cpus = cpu_list(re.search(r"CPU_IDs=(\S+)", seen["job"]).group(1))  # type: ignore[union-attr]
    assert len(job_cpus) == ntasks
    assert set(seen["affinity"]) == job_cpus, (seen["affinity"], job_cpus, env.get("SLURM_CPU_BIND"))
    assert not pid_alive(seen["pid"])


def _of_bed(pid: int, bed: SlurmBed) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/environ", "rb") as environ:
            text = cmdline.read() + b"\0" + environ.read()
    except OSError:  # gone meanwhile
        return False
    return str(bed.base).encode() in text or f"{TAG_VAR}={bed.tag}".encode() in text


def test_a_second_bed_starts_and_leaves_nothing(tmp_path: Path) -> None:
    """Start and close a bed of its own, timed: every daemon it started and every process of its
    jobs is gone afterwards, and no slurm/munge process of this bed remains on the machine."""
    before = set(system_slurm_pids())
    with SlurmBed(tmp_path / "bed") as bed:
        assert bed.start_seconds < 20
        out = bed.run(["srun", "-n1", "true"], timeout=30)
        assert out.returncode == 0, out.stderr
        daemons = bed.recorded_pids()
        assert len(daemons) == 4, bed.daemon_pids()  # munged, slurmctld, slurmscriptd, slurmd
    assert bed.close_seconds < 10
    assert not [pid for pid in daemons if pid_alive(pid)]
    assert not bed.leftover_pids()
    # a slurm or munge process that appeared meanwhile is this bed's if it names its folder or
    # carries its tag (other beds may run beside this test: pytest -n)
    new = set(system_slurm_pids()) - before
    assert not [pid for pid in new if _of_bed(pid, bed)]
    assert os.environ.get("SLURM_CONF") != str(bed.conf)  # nothing leaked into this process
