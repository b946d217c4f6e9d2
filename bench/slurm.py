"""Benchmarks inside a Slurm allocation: mpilaunch (its agents started by srun), Open MPI's
mpirun (plm/slurm: orted through srun) and MPICH's hydra mpiexec (bootstrap slurm), started the
same way inside one allocation of the one-node Slurm the tests use (tests/slurmbed.py).

Run by hand (as root, with Debian's slurmctld slurmd slurm-client munge):
    python -m bench.slurm [--reps 7] [--commit REV]
mpilaunch is the one `pip install` gives (bench/installed.py), not this checkout.
Scenarios: `-n 8 true`, and mpi4py wire-up + one barrier at 8 ranks (MPICH ranks: mpilaunch and
hydra; Open MPI's mpirun runs Debian's python3-mpi4py, which is the same work over its own MPI).
The launchers run alternately in one `salloc -N1 -n8 --overcommit --exclusive` (this 2-CPU node,
whole; the launchers in no step), then the same in an `sbatch` job (the launchers in its batch
step); medians of the wall time, ratios against each peer; the target is mpilaunch at most 1.0x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BARRIER = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def commands(installed: Path) -> dict[str, dict[str, list[str]]]:
    """scenario -> launcher -> argv, for the launchers found here; mpilaunch is the one
    installed in the venv `installed` (bench/installed.py), its ranks that venv's Python."""
    scripts = Path(sysconfig.get_path("scripts"))  # the scripts themselves: no pyenv shim in the way
    mpilaunch = [str(installed / "mpilaunch"), "--oversubscribe"]
    out: dict[str, dict[str, list[str]]] = {"true8": {}, "barrier8": {}}
    out["true8"]["mpilaunch"] = [*mpilaunch, "-n", "8", "true"]
    out["barrier8"]["mpilaunch"] = [*mpilaunch, "-n", "8", str(installed / "python"), "-c", BARRIER]
    mpirun = shutil.which("mpirun.openmpi")
    if mpirun:
        out["true8"]["mpirun"] = [mpirun, "--oversubscribe", "-n", "8", "true"]
        out["barrier8"]["mpirun"] = [mpirun, "--oversubscribe", "-n", "8", "/usr/bin/python3", "-c", BARRIER]
    hydra = str(scripts / "mpiexec.hydra") if (scripts / "mpiexec.hydra").exists() else None
    if hydra:
        out["true8"]["hydra"] = [hydra, "-n", "8", "true"]
        out["barrier8"]["hydra"] = [hydra, "-n", "8", sys.executable, "-c", BARRIER]
    # The floor under salloc: the launcher's own start, and its step alone (mpilaunch's srun line,
    # its task's Python doing nothing), which every `-n 8 true` of mpilaunch's waits for in turn.
    from mpilaunch.transport.slurm_step import srun_command

    out["floor"] = {
        "mpilaunch --version": [str(installed / "mpilaunch"), "--version"],
        "its step, python -S -c pass": srun_command(1, f"exec {installed / 'python'} -S -c pass"),
    }
    return out


def inside(reps: int, installed: Path) -> None:
    """In the allocation: every launcher of every scenario, alternately; JSON on stdout."""
    results: dict[str, dict[str, list[float]]] = {}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the launchers as installed, not this checkout
    env.update(ROOT_ENV)
    for scenario, launchers in commands(installed).items():
        times = results.setdefault(scenario, {name: [] for name in launchers})
        for _ in range(reps + 1):  # the first round warms the caches and is dropped
            for name, argv in launchers.items():
                start = time.perf_counter()
                proc = subprocess.run(argv, capture_output=True, env=env, timeout=120)
                elapsed = time.perf_counter() - start
                if proc.returncode != 0:
                    sys.stderr.write(f"{scenario} {name} failed: {proc.stderr.decode()[-500:]}\n")
                    continue
                times[name].append(elapsed)
        for name in times:
            times[name] = times[name][1:]
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # the venv's bin, in the allocation
    parser.add_argument("--commit", default="HEAD", help="the commit whose `pip install` is timed")
    args = parser.parse_args()
    if args.inside:
        inside(args.reps, Path(args.inside))
        return
    sys.path.insert(0, str(ROOT))
    from bench.installed import installed
    from tests.slurmbed import SlurmBed, slurm_available

    venv = installed(args.commit)

    ok, why = slurm_available()
    if not ok:
        raise SystemExit(f"bench.slurm: {why}")
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    inner = [sys.executable, "-m", "bench.slurm", "--inside", str(venv), "--reps", str(args.reps)]
    size = ["-N1", "-n8", "--overcommit", "--exclusive"]
    runs = {}
    with SlurmBed(work) as bed:
        env = bed.client_env({"PYTHONPATH": str(ROOT)})
        # salloc: the launchers run in no step (mpilaunch's agents: one srun step)
        proc = bed.run(["salloc", *size, *inner], env=env, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        runs["salloc"] = json.loads(proc.stdout.strip().splitlines()[-1])
        # sbatch: the launchers run in the batch step (mpilaunch forks this node's agent there)
        out = work / "batch.out"
        command = " ".join(inner)
        proc = bed.run(["sbatch", "--wait", *size, "-o", str(out), "--wrap", command], env=env, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:] + out.read_text()[-2000:])
        runs["sbatch"] = json.loads(out.read_text().strip().splitlines()[-1])
    print("| how | scenario | launcher | median s | mpilaunch / launcher |")
    print("|---|---|---|---|---|")
    for how, results in runs.items():
        for scenario, times in results.items():
            ours = statistics.median(times["mpilaunch"]) if times.get("mpilaunch") else None
            for name, values in times.items():
                if not values:
                    print(f"| {how} | {scenario} | {name} | failed | |")
                    continue
                median = statistics.median(values)
                ratio = f"{ours / median:.2f}x" if ours else ""
                print(f"| {how} | {scenario} | {name} | {median:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
