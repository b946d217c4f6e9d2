"""Hundreds of hosts: mpilaunch against hydra on one bed of loopback sshd servers.

Run by hand, from the venv of a plain install (not part of the tests):

    python -m bench.hosts --hosts 64 128 256 [--reps 3] [--write /tmp/hosts.md]

One bed (tests/sshbed.py) of the largest size; each size uses its first HOSTS hosts. For each
size, `-n HOSTS true` and an MPICH barrier (mpi4py over the `mpich` wheel, one rank per host)
run under mpilaunch (`bench.installed`: `pip install .` of this commit) and hydra (the wheel's
`mpiexec.hydra`, `-launcher ssh -launcher-exec` a wrapper running `ssh -F`), alternating.

Measured per run: wall time; the launcher tree's CPU (the launcher and every process it reaped:
its `ssh` clients; RUSAGE_CHILDREN of this process); the hosts' CPU (what the bed's sshd
servers reaped: sshd sessions, shells, agents or hydra's proxies, the ranks; their cutime and
cstime, every sshd here being a subreaper); the launcher tree's peak RSS (the launcher and its
descendants, summed, sampled every 0.25 s with psutil).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from bench import TAG

BARRIER = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"
PROGRAMS = {"true": ["true"], "barrier": [sys.executable, "-c", BARRIER]}
TIMEOUT = 900.0
TICKS = os.sysconf("SC_CLK_TCK")


def launchers(commits: list[str]) -> dict[str, list[str]]:
    """mpilaunch of each commit (named `mpilaunch` when only HEAD is asked for), then hydra."""
    from bench.installed import installed

    if commits == ["HEAD"]:
        found = {"mpilaunch": [str(installed() / "mpilaunch")]}
    else:
        found = {f"mpilaunch {name}": [str(installed(name) / "mpilaunch")] for name in commits}
    hydra = Path(sysconfig.get_path("scripts")) / "mpiexec.hydra"
    if hydra.exists():
        found["hydra"] = [str(hydra)]
    return found


def children_cpu(pids: list[int]) -> float:
    """CPU seconds of what these processes reaped (utime+stime of their waited-for descendants)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += int(fields[13]) + int(fields[14])  # cutime, cstime (fields 16, 17)
        except (OSError, IndexError, ValueError):
            pass
    return total / TICKS


class PeakRss:
    """The peak of the summed RSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.25):
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            total = 0
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_once(name: str, prefix: list[str], bed, wrapper: Path, hosts: int, program: str, extra: list[str]) -> dict:
    names = bed.names[:hosts]
    if name == "hydra":
        where = ["-launcher", "ssh", "-launcher-exec", str(wrapper), "-hosts", ",".join(f"{n}:1" for n in names)]
    else:
        where = ["--ssh-config", str(bed.config), "-H", ",".join(f"{n}:1" for n in names), *extra]
    argv = [*prefix, *where, "-n", str(hosts), *PROGRAMS[program]]
    env = {**os.environ, TAG: bed.tag}
    daemons = bed.daemon_pids()
    remote_before = children_cpu(daemons)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = PeakRss(proc.pid)
    try:
        err = proc.communicate(timeout=TIMEOUT)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        err = proc.communicate()[1]
    wall = time.perf_counter() - start
    rss = peak.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    left = bed.wait_clean(10.0)
    remote = children_cpu(daemons) - remote_before
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    result = {"seconds": wall, "cpu": cpu, "remote_cpu": remote, "rss_mb": rss / 2**20, "status": proc.returncode}
    if proc.returncode != 0 or left:
        lines = err.decode(errors="replace").strip().splitlines()
        why = lines[-1] if lines else f"status {proc.returncode}"
        result["why"] = why[:200] + (" (left processes)" if left else "")
    return result


def summary(results: list[dict]) -> dict:
    good = [r for r in results if "why" not in r]
    if not good:
        return {"failed": len(results), "why": results[-1].get("why", "")}
    med = {key: statistics.median(r[key] for r in good) for key in ("seconds", "cpu", "remote_cpu", "rss_mb")}
    return {**med, "failed": len(results) - len(good), "runs": len(results)}


def table(rows: list[tuple[int, str, dict[str, dict]]]) -> str:
    head = (
        "| hosts | program | launcher | wall s | ratio | launcher CPU s | per host ms | hosts' CPU per host ms "
        "| peak RSS MB | failed |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for hosts, program, by in rows:
        for name, s in by.items():
            if "seconds" not in s:
                lines.append(f"| {hosts} | {program} | {name} | failed: {s['why']} | | | | | | {s['failed']} |")
                continue
            ratio = ""
            if name.startswith("mpilaunch") and "seconds" in by.get("hydra", {}):
                ratio = f"{s['seconds'] / by['hydra']['seconds']:.2f}x"
            lines.append(
                f"| {hosts} | {program} | {name} | {s['seconds']:.1f} | {ratio} | {s['cpu']:.2f} "
                f"| {1000 * s['cpu'] / hosts:.1f} | {1000 * s['remote_cpu'] / hosts:.0f} | {s['rss_mb']:.0f} "
                f"| {s['failed']} of {s['runs']} |"
            )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--programs", nargs="+", choices=sorted(PROGRAMS), default=["true", "barrier"])
    parser.add_argument("--only", nargs="+", help="launchers to run (default: mpilaunch and hydra)")
    parser.add_argument("--write", help="write the Markdown table here")
    parser.add_argument("--extra", default="", help="more words for mpilaunch (e.g. '--ssh-tree-width 32')")
    parser.add_argument("--commits", nargs="+", default=["HEAD"], help="mpilaunch of each commit, side by side")
    args = parser.parse_args(argv)
    from tests.sshbed import SshBed

    peers = {k: v for k, v in launchers(args.commits).items() if not args.only or k.split()[0] in args.only}
    rows = []
    # One sshd per host, each with a handful of descriptors; the launchers hold 3 per host.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
        work = Path(tmp)
        home = work / "empty-home"  # the remote shell reads no ~/.bashrc (bench/run.py's SshHosts says why)
        home.mkdir()
        with SshBed(work / "bed", max(args.hosts), setenv={"HOME": str(home)}) as bed:
            wrapper = work / "ssh-bed"
            wrapper.write_text(f'#!/bin/sh\nexec ssh -F {bed.config} "$@"\n')
            wrapper.chmod(0o755)
            for hosts in args.hosts:
                for program in args.programs:
                    results: dict[str, list[dict]] = {name: [] for name in peers}
                    for _ in range(args.reps):
                        for name, prefix in peers.items():
                            one = run_once(name, prefix, bed, wrapper, hosts, program, args.extra.split())
                            results[name].append(one)
                            print(f"  {hosts} {program} {name}: {one}", file=sys.stderr, flush=True)
                    rows.append((hosts, program, {name: summary(res) for name, res in results.items()}))
                    print(table(rows[-1:]), flush=True)
    text = table(rows)
    print(text)
    if args.write:
        Path(args.write).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
