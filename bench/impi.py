"""Benchmarks: Intel MPI ranks under mpilaunch and under Intel's own mpiexec (hydra), in one run.

Run by hand (not part of the tests):  python -m bench.impi [--reps 5] [--loops 1000] [--budget 3] [--tuned]
The ranks are mpi4py in the Intel MPI venv that tests/mpi/test_impi.py builds (impi-rt wheel,
~/.cache/mpilaunch-tests/impi; built here if missing). Scenarios, at 2, 4 and 8 ranks:
  ring     mpi4py.bench ringtest: a 1-byte token passed around the ranks; microseconds per loop
           as the ranks time it (more ranks than cores is where a rank that spins instead of
           yielding stalls the one whose turn it is); each launcher's runs are sized by a probe to
           about --budget seconds, at most --loops loops (the `loops` column, in launcher order)
  barrier  a whole job: start, MPI_Init over PMI, one barrier, exit; seconds of wall time
mpilaunch (as `pip install` gives it: bench/installed.py) is given nothing beyond
--allow-run-as-root --oversubscribe, Intel's mpiexec nothing at all; the target is a ratio
mpilaunch / mpiexec of at most 1.1 everywhere. --tuned adds a row of mpilaunch with what Intel's
launcher does by itself (--bind-to core, and I_MPI_WAIT_MODE=1 when a host has more ranks than
CPUs), to show what per-family defaults would give.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

RING_TIME = re.compile(rb"time for (\d+) loops = ([0-9.eE+-]+) seconds")
BARRIER = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"
SIZES = (2, 4, 8)
PROBE = 20  # ringtest loops of the probe that sizes the runs
SCENARIOS = [f"{kind}{n}" for kind in ("ring", "barrier") for n in SIZES]
# What the caller's shell may carry that would tune one launcher's ranks and not the other's.
DROPPED = ("I_MPI_", "PMI_", "MPI4PY_", "HYDRA_", "MPIEXEC_", "PYTHONPATH")


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    env.setdefault("OMP_NUM_THREADS", "1")  # mpilaunch would say it sets this; hydra leaves it
    return env


def impi_prefix(given: str | None) -> Path:
    """The Intel MPI venv: --venv, else the tests' cached one (built now if it is not there)."""
    if given:
        return Path(given)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.mpi.test_impi import IMPI_PACKAGES
    from tests.venvs import cached_venv

    python, why = cached_venv("impi", IMPI_PACKAGES)
    if python is None:
        raise SystemExit(why)
    return python.parent.parent


def launchers(prefix: Path, tuned: bool) -> dict[str, Callable[[int], list[str]]]:
    """Each launcher's argv prefix for n ranks; mpilaunch as `pip install` gives it (bench/installed.py)."""
    from bench.installed import installed

    ours = str(installed() / "mpilaunch")
    cpus = len(os.sched_getaffinity(0))
    found: dict[str, Callable[[int], list[str]]] = {
        "impi mpiexec": lambda n: [str(prefix / "bin" / "mpiexec"), "-n", str(n)],
        "mpilaunch": lambda n: [ours, "--allow-run-as-root", "--oversubscribe", "-n", str(n)],
    }
    if tuned:

        def tuned_argv(n: int) -> list[str]:
            wait = ["-x", "I_MPI_WAIT_MODE=1"] if n > cpus else []
            return [ours, "--allow-run-as-root", "--oversubscribe", "--bind-to", "core", *wait, "-n", str(n)]

        found["mpilaunch tuned"] = tuned_argv
    return found


def ring(prefix: list[str], python: str, loops: int) -> float:
    argv = [*prefix, python, "-m", "mpi4py.bench", "ringtest", "-l", str(loops), "-s", str(max(10, loops // 10))]
    proc = subprocess.run(argv, capture_output=True, env=clean_env(), timeout=600)
    found = RING_TIME.search(proc.stdout)
    assert proc.returncode == 0 and found, proc.stderr[-2000:]
    return float(found.group(2)) / int(found.group(1)) * 1e6


def barrier(prefix: list[str], python: str, loops: int) -> float:
    start = time.perf_counter()
    proc = subprocess.run([*prefix, python, "-c", BARRIER], capture_output=True, env=clean_env(), timeout=300)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    return elapsed


def ring_loops(argv: list[str], python: str, most: int, budget: float) -> int:
    """Loops for a ringtest run of about `budget` seconds, at most `most`, from a 20-loop probe
    (a rank that spins on an oversubscribed host takes tens of ms a loop: 1000 would be a minute)."""
    try:
        per_loop = ring(argv, python, PROBE) / 1e6
    except (AssertionError, subprocess.TimeoutExpired):  # the runs will say what fails
        return PROBE
    return max(PROBE, min(most, int(budget / max(per_loop, 1e-9))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="alternating runs per launcher and scenario")
    parser.add_argument("--loops", type=int, default=1000, help="ringtest loops per run, at most")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of ringtest per run, about")
    parser.add_argument("--venv", help="an Intel MPI venv (impi-rt and mpi4py installed)")
    parser.add_argument("--tuned", action="store_true", help="add mpilaunch with --bind-to core and I_MPI_WAIT_MODE")
    parser.add_argument("--only", nargs="*", choices=SCENARIOS, help="scenarios, e.g. ring4 barrier8")
    args = parser.parse_args()
    prefix = impi_prefix(args.venv)
    python = str(prefix / "bin" / "python")
    peers = launchers(prefix, args.tuned)
    scenarios = {f"ring{n}": ("us/loop", n, ring) for n in SIZES}
    scenarios.update({f"barrier{n}": ("s", n, barrier) for n in SIZES})
    assert list(scenarios) == SCENARIOS
    print(f"Intel MPI venv {prefix}; {os.cpu_count()} CPUs; medians of {args.reps} alternating runs", flush=True)
    print(header(list(peers)), flush=True)
    for key in args.only or scenarios:
        unit, size, func = scenarios[key]
        loops = {name: 0 for name in peers}
        if func is ring:
            loops = {name: ring_loops(argv(size), python, args.loops, args.budget) for name, argv in peers.items()}
        results: dict[str, list[float]] = {name: [] for name in peers}
        for _ in range(args.reps):
            for name, argv in peers.items():
                try:
                    results[name].append(func(argv(size), python, loops[name]))
                except (AssertionError, subprocess.TimeoutExpired) as exc:  # counted, shown, not fatal
                    last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
                    print(f"  {name} failed once: {last[0][:200]}", file=sys.stderr, flush=True)
        print(row(key, unit, results, loops), flush=True)


def header(names: list[str]) -> str:
    cells = ["scenario", "unit", *names, *(f"{n} / impi mpiexec" for n in names if n != "impi mpiexec"), "loops"]
    return "| " + " | ".join(cells) + " |\n|" + "---|" * len(cells)


def row(key: str, unit: str, results: dict[str, list[float]], loops: dict[str, int]) -> str:
    medians = {name: statistics.median(vals) if vals else float("nan") for name, vals in results.items()}
    peer = medians["impi mpiexec"]
    precision = 1 if unit == "us/loop" else 3
    cells = [key, unit, *(f"{m:.{precision}f}" for m in medians.values())]
    cells += [f"{m / peer:.2f}x" for name, m in medians.items() if name != "impi mpiexec"]
    cells.append(" / ".join(str(n) for n in loops.values()) if any(loops.values()) else "-")
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
