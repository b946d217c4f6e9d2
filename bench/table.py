"""bench.run's results as docs/performance.md's main table: one row per scenario, each launcher's
median in a column, the ratios against Open MPI's mpirun and hydra measured in the same run, and
the target with whether it is met; a heading line says the commit, the date, the machine and the
number of runs, so the table can be pasted as it is.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
from collections.abc import Callable

# Short names of the scenarios, as the table has them (bench.run's titles say more).
SHORT = {
    "true": "`-n 8 true`, local",
    "output": "output: 4 ranks × 100,000 lines, `--output-filename`",
    "abort": "abort: one rank exits 3, the others sleep (failure to exit)",
    **{f"barrier{n}": f"mpi4py barrier, {n} MPICH ranks" for n in (2, 4, 8, 16, 32)},
    **{f"ompi_barrier{n}": f"mpi4py barrier, {n} Open MPI ranks (served PMIx)" for n in (2, 4, 8, 16, 32)},
    "sh_barrier2": "`sh -c` running mpi4py over MPICH, 2 ranks (PMI and PMIx served)",
    "sh_ompi_barrier2": "`sh -c` running mpi4py over Open MPI, 2 ranks (PMI and PMIx served)",
    "sleep256": "256 ranks of `echo; sleep 1` (launcher side: peak PSS, CPU)",
    "pmix256": "the same, `--mpi pmix`",
    "ssh_true": "ssh, 4 hosts × 2 ranks `true` (the default client: `ssh` on PATH)",
    "ssh_true_openssh": "the same, `--ssh-client openssh`",
    "ssh_true_paramiko": "the same, `--ssh-client paramiko`",
    "ssh_barrier": "ssh, 4 hosts × 2 ranks, mpi4py barrier (MPICH)",
    "ssh_barrier_openssh": "the same, `--ssh-client openssh`",
    "ssh_ompi_barrier": "ssh, 4 hosts × 2 ranks, mpi4py barrier (Open MPI, TCP)",
    "ssh_fanout32": "ssh fan-out, 32 hosts × 1 `true`",
    "ssh_fanout32_openssh": "the same, `--ssh-client openssh`",
    "ssh_tree32": "ssh tree spawn, 32 hosts, `--ssh-tree-width 8` (peers flat)",
    "ssh_chain8": "ssh tree spawn as a chain, 8 hosts, `--ssh-tree-width 1`",
}

ORDER = {key: index for index, key in enumerate(SHORT)}  # "the same, ..." rows come right below what they vary


def ok(results: list[dict]) -> list[dict]:
    return [r for r in results if not r.get("failed")]


def median(results: list[dict], field: str = "seconds") -> float:
    return statistics.median(r[field] for r in ok(results))


def ratio_at_most(peer: str, bound: float) -> Callable[[dict[str, list[dict]]], str | None]:
    """A target: mpilaunch's median / the peer's at most bound."""

    def judge(results: dict[str, list[dict]]) -> str | None:
        if peer not in results:
            return None
        ratio = median(results["mpilaunch"]) / median(results[peer])
        name = {"openmpi": "Open MPI", "hydra": "hydra"}[peer]
        return f"≤ {bound:.1f}x {name}: {'met' if ratio <= bound else 'not met'}"

    return judge


def field_at_most(field: str, bound: float, unit: str, words: str) -> Callable[[dict[str, list[dict]]], str]:
    def judge(results: dict[str, list[dict]]) -> str:
        return f"{words} ≤ {bound:g} {unit}: {'met' if median(results['mpilaunch'], field) <= bound else 'not met'}"

    return judge


def mangled_none(results: dict[str, list[dict]]) -> str:
    ours = results["mpilaunch"]
    return f"0 mangled: {'met' if max(r['mangled'] for r in ok(ours)) == 0 else 'not met'}"


# The targets (docs/performance.md): each scenario's judges, in order.
TARGETS: dict[str, list[Callable[[dict[str, list[dict]]], str | None]]] = {
    "true": [ratio_at_most("openmpi", 0.9)],
    "output": [ratio_at_most("openmpi", 0.5), mangled_none],
    "abort": [field_at_most("all_gone", 0.2, "s", "all gone")],
    **{f"barrier{n}": [ratio_at_most("hydra", 1.0)] for n in (2, 4, 8, 16, 32)},
    **{f"ompi_barrier{n}": [ratio_at_most("openmpi", 1.0)] for n in (2, 4, 8, 16, 32)},
    "sleep256": [field_at_most("rss_mb", 25, "MB", "PSS"), field_at_most("cpu", 0.3, "s", "CPU")],
    "ssh_true": [ratio_at_most("hydra", 1.0)],
    "ssh_fanout32": [field_at_most("seconds", 2.0, "s", "wall")],
}


def cell(key: str, results: list[dict]) -> str:
    """One launcher's median, with what the scenario also measures."""
    text = f"{median(results):.3f} s"
    good = ok(results)
    if key == "output":
        files = min(r["file_lines"] for r in good)
        text += f", {max(r['mangled'] for r in good):,} mangled" + (f", {files:,} lines in the files" if files else "")
    elif key == "abort":
        text += f", all gone after {median(results, 'all_gone'):.3f} s, status {good[0]['status']}"
    elif key in ("sleep256", "pmix256"):
        text += f"; {median(results, 'rss_mb'):.1f} MB peak PSS, {median(results, 'cpu'):.2f} s CPU"
    elif key.startswith("ssh"):
        text += f"; launcher CPU {median(results, 'cpu'):.2f} s"
    bad = len(results) - len(good)
    return text + (f" ({bad} of {len(results)} runs failed)" if bad else "")


def row(key: str, title: str, results: dict[str, list[dict]]) -> str:
    ours = median(results["mpilaunch"])
    cells = [cell(key, results[name]) if name in results else "" for name in ("mpilaunch", "openmpi", "hydra")]
    ratios = [f"{ours / median(results[peer]):.2f}x" if peer in results else "" for peer in ("openmpi", "hydra")]
    judged = [j for j in (judge(results) for judge in TARGETS.get(key, [])) if j]
    return "| " + " | ".join([SHORT.get(key, title), *cells, *ratios, "; ".join(judged)]) + " |"


def version(argv: list[str], pick: Callable[[str], str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except OSError:
        return "?"
    return pick(proc.stdout + proc.stderr) if proc.returncode == 0 else "?"


def runs_said(counts: dict[str, int]) -> str:
    """Runs per launcher: "5 each; 15 for `true`, `barrier2`; 3 for `output`" (bench.run's keys)."""
    by_count: dict[int, list[str]] = {}
    for key, n in counts.items():
        by_count.setdefault(n, []).append(f"`{key}`")
    if not by_count:
        return "no runs"
    usual = max(by_count, key=lambda n: len(by_count[n]))
    others = [f"{n} for {', '.join(keys)}" for n, keys in sorted(by_count.items()) if n != usual]
    return "; ".join([f"{usual} of each launcher", *others])


def heading(commit: str, reps: int, counts: dict[str, int]) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    first_version = lambda out: next(iter(re.findall(r"\d+\.\d+\.\d+", out)), "?")  # noqa: E731
    ompi = version(["/usr/bin/mpirun.openmpi", "--version"], first_version)
    pick = lambda out: out.strip()  # noqa: E731
    mpich = version([sys.executable, "-c", "import importlib.metadata as m; print(m.version('mpich'))"], pick)
    mpi4py = version([sys.executable, "-c", "import mpi4py; print(mpi4py.__version__)"], pick)
    runs = runs_said(counts)
    today = datetime.date.today().isoformat()
    return (
        f"Measured on {today} at `{commit}` on this project's machine ({os.cpu_count()} cores of {cpu}, "
        f"{platform.system()} {platform.release()}, {platform.python_implementation()} {platform.python_version()}), "
        f"mpilaunch from a venv with a plain install (bench/installed.py): `python -m bench.run --reps {reps}`, the "
        f"launchers alternating. Peers: Open MPI {ompi} `mpirun` (Debian `openmpi-bin`) and hydra `mpiexec` (the "
        f"`mpich` {mpich} wheel); mpi4py {mpi4py}. Medians of the runs that completed ({runs}). Ratio = mpilaunch "
        "/ peer: below 1 is faster."
    )


def markdown(rows: list[tuple[str, str, dict[str, list[dict]]]], commit: str, reps: int, counts: dict[str, int]) -> str:
    lines = [
        heading(commit, reps, counts),
        "",
        "| scenario | mpilaunch | Open MPI | hydra | vs Open MPI | vs hydra | target |",
        "|---|---|---|---|---|---|---|",
        *(row(key, title, results) for key, title, results in sorted(rows, key=lambda r: ORDER.get(r[0], len(ORDER)))),
        "",
    ]
    return "\n".join(lines)
