"""A restart after a rank's failure: mpilaunch --max-restarts against torchrun's, on one script.

Run by hand:  python -m bench.restart [--pairs 10] [--nproc 2] [--torch]
Both launchers run the same rank script with --nproc-per-node N --max-restarts 1 (mpilaunch with
--restart-delay 0: torchrun waits for nothing between attempts either). On attempt 0
(TORCHELASTIC_RESTART_COUNT=0) every rank stamps its start; rank 1 waits until all N have, then
stamps the time and leaves with status 1 at once (os._exit: a torch rank's interpreter shutdown
would add its own time) while the others sleep (the launcher must stop them). On attempt 1 every
rank stamps its start on its first line and exits 0. The stamps are CLOCK_MONOTONIC, one clock for
every process of the machine. Measured: failure to the first rank of attempt 1 running (the
restart), failure to the last one running, and the whole command's wall time.

torchrun notices a failed rank by polling every --monitor-interval seconds; it runs with its
default interval and with a small one (--small-interval), each said in the table. mpilaunch's
agent learns of a rank's exit when it happens. With --torch the ranks also import torch (after
the stamp on attempt 1: the metric is process start, not import). Every round runs mpilaunch and
each torchrun setting once, in a rotating order; ratios mpilaunch / torchrun are taken round by
round, so a drift of the machine's speed cancels out.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import TAG, tagged
from bench.installed import clean_env, commit_of, installed

RANK = """\
import time
started = time.clock_gettime(time.CLOCK_MONOTONIC)
import os, sys
folder, attempt, rank = sys.argv[1], os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
size = int(os.environ["WORLD_SIZE"])


def stamp(name, value):
    with open(os.path.join(folder, name + ".tmp"), "w") as f:
        f.write(repr(value))
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


if IMPORT_TORCH:
    import torch  # noqa: F401
stamp(f"start-{attempt}-{rank}", started)
if attempt != "0":
    sys.exit(0)
if rank == "1":
    end = time.monotonic() + 60
    while time.monotonic() < end and not all(
        os.path.exists(os.path.join(folder, f"start-0-{other}")) for other in range(size)
    ):
        time.sleep(0.01)
    time.sleep(0.2)  # the launcher idle, every rank up: then the failure
    stamp("failed", time.clock_gettime(time.CLOCK_MONOTONIC))
    os._exit(1)  # at once: the stamp is the process's end, with no interpreter finalization after it
time.sleep(60)
"""


def commands(nproc: int, intervals: list[float], venv: Path) -> dict[str, list[str]]:
    """Launcher setting -> argv before the script: mpilaunch as installed in the venv (its ranks that
    venv's Python, bench/installed.py), torchrun this Python's."""
    common = ["--nproc-per-node", str(nproc), "--max-restarts", "1"]
    found = {"mpilaunch": [str(venv / "mpilaunch"), *common, "--restart-delay", "0"]}
    for interval in intervals:
        found[f"torchrun --monitor-interval {interval:g}"] = [
            sys.executable, "-m", "torch.distributed.run", *common, "--monitor-interval", f"{interval:g}",
        ]  # fmt: skip
    return found


def one_run(argv: list[str], script: Path, folder: Path, nproc: int) -> dict[str, float]:
    """One command; the seconds from the failure to the first and last rank of attempt 1 and the wall."""
    folder.mkdir()
    tag = f"restart_{os.getpid()}_{time.time_ns()}"
    env = {**clean_env(), TAG: tag}
    start = time.perf_counter()
    proc = subprocess.run([*argv, str(script), str(folder)], env=env, capture_output=True, timeout=300)
    wall = time.perf_counter() - start
    left = tagged(tag)
    for pid in left:
        os.kill(pid, 9)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert not left, f"processes left: {left}"
    failed = float((folder / "failed").read_text())
    starts = [float((folder / f"start-1-{rank}").read_text()) for rank in range(nproc)]
    return {"first": min(starts) - failed, "last": max(starts) - failed, "wall": wall}


def rounds(cases: dict[str, list[str]], script: Path, work: Path, nproc: int, count: int) -> dict[str, list[dict]]:
    """count rounds after one warm-up round; each round's order rotated by one."""
    names = list(cases)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for index in range(count + 1):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            result = one_run(cases[name], script, work / f"{index}-{names.index(name)}", nproc)
            if index:
                runs[name].append(result)
        print(f"  round {index}/{count} done" if index else "  warm-up done", file=sys.stderr, flush=True)
    return runs


def spread(values: list[float], scale: float = 1.0, unit: str = "") -> str:
    values = sorted(v * scale for v in values)
    return f"{statistics.median(values):.3f}{unit} ({values[0]:.3f}-{values[-1]:.3f})"


def table(runs: dict[str, list[dict]]) -> None:
    ours = runs["mpilaunch"]
    print(f"{'launcher':34}{'failure to first rank, s':>28}{'to last rank, s':>28}{'whole command, s':>28}")
    for name, results in runs.items():
        cells = [spread([r[key] for r in results]) for key in ("first", "last", "wall")]
        print(f"{name:34}" + "".join(f"{cell:>28}" for cell in cells))
    for name, results in runs.items():
        if name == "mpilaunch":
            continue
        keys = ("first", "last", "wall")
        cells = [spread([a[key] / b[key] for a, b in zip(ours, results)], unit="x") for key in keys]
        print(f"{'mpilaunch / ' + name.split(' ', 1)[1]:34}" + "".join(f"{cell:>28}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="rounds of each launcher setting, after a warm-up")
    parser.add_argument("--nproc", type=int, default=2, help="--nproc-per-node")
    parser.add_argument("--small-interval", type=float, default=0.01, help="torchrun's small --monitor-interval")
    parser.add_argument("--torch", action="store_true", help="the ranks import torch too (a second table)")
    parser.add_argument("--commit", default="HEAD", help="the commit of mpilaunch to install and time")
    args = parser.parse_args()
    venv = installed(args.commit, system_site=args.torch)  # the ranks find the system's torch with --torch
    import torch
    from torch.distributed.run import get_args_parser

    default = get_args_parser().get_default("monitor_interval")
    intervals = [default] + ([args.small_interval] if args.small_interval != default else [])
    cases = commands(args.nproc, intervals, venv)
    now = datetime.datetime.now().astimezone().isoformat(timespec="minutes")
    commit = commit_of(args.commit)[:12]
    print(
        f"{platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {now}; "
        f"mpilaunch {commit} installed; "
        f"Python {platform.python_version()}, torch {torch.__version__} (torchrun's default --monitor-interval "
        f"{default:g})"
    )
    print(f"--nproc-per-node {args.nproc}; median (min-max) of {args.pairs} rounds; ratios taken round by round")
    variants = {"plain Python ranks": False, **({"ranks importing torch": True} if args.torch else {})}
    with tempfile.TemporaryDirectory() as tmp:
        for title, imports in variants.items():
            work = Path(tmp) / title.replace(" ", "-")
            work.mkdir()
            script = work / "rank.py"
            script.write_text(RANK.replace("IMPORT_TORCH", repr(imports)))
            runs = rounds(cases, script, work, args.nproc, args.pairs)
            print(f"\n{title}")
            table(runs)
        print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
