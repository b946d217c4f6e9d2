"""A job through `mpilaunch shims` costs what mpilaunch called directly costs: paired runs.

Run by hand:  python -m bench.shims [--pairs 40]
Each pair runs `mpilaunch -n 8 true` and `SHIMS/mpirun -n 8 true` (the same job through the
`mpirun` that `mpilaunch shims` writes) in turn, the order alternating; the ratio is taken pair
by pair, so a drift of the machine's speed cancels out. Also `SHIMS/mpiexec.hydra -hosts
localhost -ppn 8 true` against `mpilaunch -hosts localhost -ppn 8 true`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return time.perf_counter() - start


def paired(direct: list[str], shim: list[str], pairs: int) -> list[float]:
    """shim / direct, pair by pair, after one warm-up of each."""
    wall(direct)
    wall(shim)
    ratios = []
    for index in range(pairs):
        if index % 2:
            b, a = wall(shim), wall(direct)
        else:
            a, b = wall(direct), wall(shim)
        ratios.append(b / a)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40)
    args = parser.parse_args()
    scripts = Path(sysconfig.get_path("scripts"))
    mpilaunch = str(scripts / "mpilaunch") if (scripts / "mpilaunch").exists() else "mpilaunch"
    with tempfile.TemporaryDirectory() as folder:
        shims = subprocess.run([mpilaunch, "shims", folder], capture_output=True, text=True, check=True).stdout.strip()
        cases = {
            "-n 8 true (mpirun)": ([mpilaunch, "-n", "8", "true"], [os.path.join(shims, "mpirun"), "-n", "8", "true"]),
            "-hosts localhost -ppn 8 true (mpiexec.hydra)": (
                [mpilaunch, "-hosts", "localhost", "-ppn", "8", "true"],
                [os.path.join(shims, "mpiexec.hydra"), "-hosts", "localhost", "-ppn", "8", "true"],
            ),
        }
        print(f"{args.pairs} pairs each; ratio = through the shim / mpilaunch directly")
        for title, (direct, shim) in cases.items():
            ratios = paired(direct, shim, args.pairs)
            quartiles = statistics.quantiles(ratios, n=4)
            print(
                f"{title}: median {statistics.median(ratios):.3f}x, "
                f"quartiles {quartiles[0]:.3f}x to {quartiles[2]:.3f}x, min {min(ratios):.3f}x, max {max(ratios):.3f}x"
            )


if __name__ == "__main__":
    main()
