"""Benchmarks: mpilaunch against Open MPI's mpirun and MPICH's hydra mpiexec, in one run.

Run by hand (not part of the tests):  python -m bench.run [--reps 5] [--only true ...] [--write FILE]
Each scenario runs the three launchers alternately, several times, and reports medians and the
ratio mpilaunch / peer. Peers that are not installed are skipped. mpilaunch is the one `pip
install` gives of this commit (bench/installed.py). --write FILE writes docs/performance.md's
main table (bench/table.py), its heading line with the commit, the date and the runs, to paste.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import TAG, tagged

ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "ranks" / "writer.py"
LINE = re.compile(rb"rank \d{4} line \d{8} x{44}")
# Without PYTHONPATH: the installed mpilaunch imports what pip installed, never a checkout.
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMPI_ALLOW_RUN_AS_ROOT": "1"}
ENV["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"


def launchers(commit: str = "HEAD") -> dict[str, list[str]]:
    """Each launcher's argv prefix: mpilaunch as `pip install .` of this commit gives it
    (bench/installed.py), the peers' scripts themselves (no pyenv shim in the way)."""
    from bench.installed import installed

    scripts = Path(sysconfig.get_path("scripts"))
    found = {"mpilaunch": [str(installed(commit) / "mpilaunch")]}
    if Path("/usr/bin/mpirun.openmpi").exists():
        found["openmpi"] = ["/usr/bin/mpirun.openmpi", "--allow-run-as-root"]
    hydra = scripts / "mpiexec.hydra"
    if hydra.exists():
        found["hydra"] = [str(hydra)]
    return found


def oversub(name: str) -> list[str]:
    return [] if name == "hydra" else ["--oversubscribe"]


def timed(argv: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=ENV, **kw)
    return time.perf_counter() - start, proc


def scenario_true(name: str, prefix: list[str], work: Path) -> dict:
    elapsed, proc = timed([*prefix, *oversub(name), "-n", "8", "true"], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {"seconds": elapsed}


def scenario_output(name: str, prefix: list[str], work: Path) -> dict:
    out_dir = work / f"out-{name}"
    shutil.rmtree(out_dir, ignore_errors=True)
    files = [] if name == "hydra" else ["--output-filename", str(out_dir)]
    argv = [*prefix, *oversub(name), *files, "-n", "4", sys.executable, str(WRITER), "100000"]
    elapsed, proc = timed(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=300)
    lines = proc.stdout.split(b"\n")[:-1]
    mangled = sum(1 for line in lines if not LINE.fullmatch(line.split(b":", 1)[-1] if b"]<" in line else line))
    in_files = 0
    if files:
        in_files = sum(p.read_bytes().count(b"\n") for p in out_dir.rglob("stdout"))
    return {"seconds": elapsed, "mangled": mangled, "console_lines": len(lines), "file_lines": in_files}


ABORT_RANK = """
import os, sys, time
if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK")) == "1":
    time.sleep(1.0)
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
time.sleep(30)
"""


def scenario_abort(name: str, prefix: list[str], work: Path) -> dict:
    script = work / "abort_rank.py"
    script.write_text(ABORT_RANK)
    stamp = work / f"failed-{name}"
    stamp.unlink(missing_ok=True)
    tag = f"BENCH_TAG_{os.getpid()}_{time.time_ns()}"
    env = {**ENV, TAG: tag}
    argv = [*prefix, *oversub(name), "-n", "4"]
    if name == "openmpi":
        argv += ["-x", TAG]
    proc = subprocess.Popen([*argv, sys.executable, str(script), str(stamp)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        status = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        status = proc.wait()
    exited = time.time()
    while tagged(tag) and time.time() - exited < 15:
        time.sleep(0.01)
    all_gone = time.time()
    for pid in tagged(tag):
        os.kill(pid, 9)
    failed_at = float(stamp.read_text())
    return {"seconds": exited - failed_at, "all_gone": all_gone - failed_at, "status": status}


BARRIER = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"


def scenario_barrier(size: int):
    """mpi4py wire-up: every rank initialises MPI (PMI) and passes one barrier."""

    def run(name: str, prefix: list[str], work: Path) -> dict:
        elapsed, proc = timed(
            [*prefix, *oversub(name), "-n", str(size), sys.executable, "-c", BARRIER], capture_output=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return {"seconds": elapsed}

    return run


RANK_PROGRAMS = {"sh", "sleep"}  # the ranks of the sleep256 scenario; everything else is launcher
GUARDIAN = "mpilaunch-guardian"  # the agent's guardian is a shell too, and is launcher side
KCMP_VM = 1  # kcmp(2): do two processes share one address space


def scenario_ompi_barrier(size: int):
    """mpi4py over Debian's Open MPI 4.1.4 (/usr/bin/python3, python3-mpi4py): wire-up and one
    barrier; mpilaunch serves the ranks PMIx (its default sees the interpreter's mpi4py), mpirun
    starts them itself."""

    def run(name: str, prefix: list[str], work: Path) -> dict:
        argv = [*prefix, *oversub(name), "-n", str(size), "/usr/bin/python3", "-c", BARRIER]
        elapsed, proc = timed(argv, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return {"seconds": elapsed}

    return run


def scenario_shell_barrier(python: str, size: int):
    """mpi4py wire-up + barrier with `sh -c` as the program: mpilaunch (its default, --mpi auto)
    cannot tell the MPI and serves PMI and PMIx together; mpirun and hydra serve their own."""

    def run(name: str, prefix: list[str], work: Path) -> dict:
        argv = [*prefix, *oversub(name), "-n", str(size), "sh", "-c", f"{python} -c '{BARRIER}'"]
        elapsed, proc = timed(argv, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return {"seconds": elapsed}

    return run


def shares_parents_memory(pid: int, ppid: int) -> bool:
    """Whether pid shares ppid's address space (kcmp KCMP_VM): a child posix_spawn (vfork)
    started that has not exec'd yet. Its PSS is its parent's, and summing both would count the
    parent twice; a forked child has memory of its own, shared page by page, and counts."""
    import ctypes

    number = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
    if number is None or ppid <= 1:
        return False
    return ctypes.CDLL(None, use_errno=True).syscall(number, pid, ppid, KCMP_VM, 0, 0) == 0


def scenario_sleep256(name: str, prefix: list[str], work: Path, served: tuple[str, ...] = ()) -> dict:
    """256 ranks of `echo; sleep 1`: the launcher side's peak memory (sum of PSS over its
    processes: launcher, agent or proxies, not ranks) and CPU seconds, sampled with psutil.
    served: mpilaunch's --mpi (pmix256: its agent's PMIx server registers all 256, as
    mpirun's does)."""
    import psutil

    argv = [*prefix, *oversub(name), *(served if name == "mpilaunch" else ()), "-n", "256"]
    argv += ["sh", "-c", "echo rank up; sleep 1"]
    start = time.perf_counter()
    proc = psutil.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    cpu: dict[int, float] = {}
    peak = 0
    lines = 0
    os.set_blocking(proc.stdout.fileno(), False)
    while proc.poll() is None:
        try:
            lines += (os.read(proc.stdout.fileno(), 1 << 20) or b"").count(b"\n")
        except BlockingIOError:
            pass
        rss = 0
        try:
            family = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            family = [proc]
        for member in family:
            try:
                if member.name() in RANK_PROGRAMS and GUARDIAN not in member.cmdline():
                    continue
                if shares_parents_memory(member.pid, member.ppid()):
                    continue  # a child posix_spawn started, before its exec: its memory is its parent's
                with member.oneshot():
                    rss += member.memory_full_info().pss  # shared pages split: launcher and agent share their fork's
                    times = member.cpu_times()
                    cpu[member.pid] = times.user + times.system
            except psutil.Error:
                pass
        peak = max(peak, rss)
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    os.set_blocking(proc.stdout.fileno(), True)
    lines += proc.stdout.read().count(b"\n")
    assert proc.returncode == 0 and lines == 256, (proc.returncode, lines)
    return {"seconds": elapsed, "rss_mb": peak / 2**20, "cpu": sum(cpu.values())}


class SshHosts:
    """One sshd bed (tests/sshbed.py) shared by the SSH scenarios, and each launcher's way to use it."""

    bed = None
    wrapper: Path

    @classmethod
    def get(cls, hosts: int, work: Path):  # -> SshBed
        if cls.bed is not None and len(cls.bed.names) < hosts:
            cls.bed.close()
            cls.bed = None
        if cls.bed is None:
            from tests.sshbed import SshBed

            # An empty HOME: the remote shell reads no ~/.bashrc (here it runs `pyenv init`, 0.15 s of
            # CPU per connection, which on 2 cores would swamp what the launchers themselves cost).
            home = work / "empty-home"
            home.mkdir(exist_ok=True)
            cls.bed = SshBed(work / f"bed{hosts}", hosts, setenv={"HOME": str(home)}).start()
            cls.wrapper = work / "ssh-bed"  # hydra and Open MPI run `ssh`; this one reads the bed's config
            cls.wrapper.write_text(f'#!/bin/sh\nexec ssh -F {cls.bed.config} "$@"\n')
            cls.wrapper.chmod(0o755)
        return cls.bed

    @classmethod
    def argv(cls, name: str, prefix: list[str], hosts: str) -> list[str]:
        if name == "mpilaunch":
            return [*prefix, "--ssh-config", str(cls.bed.config), "-H", hosts]  # type: ignore[union-attr]
        if name == "hydra":
            return [*prefix, "-launcher", "ssh", "-launcher-exec", str(cls.wrapper), "-hosts", hosts]
        return [*prefix, "--mca", "plm_rsh_agent", str(cls.wrapper), "-H", hosts]

    @classmethod
    def close(cls) -> None:
        if cls.bed is not None:
            cls.bed.close()
            cls.bed = None


def ompi_tcp(name: str) -> list[str]:
    """TCP on loopback and no shared memory, for Open MPI ranks on the bed: its "hosts" are one
    machine, where mpirun's orteds would share vader's segment names and crash."""
    tcp = ("btl", "self,tcp"), ("btl_tcp_if_include", "lo")
    if name == "mpilaunch":
        return [word for key, value in tcp for word in ("-x", f"OMPI_MCA_{key}={value}")]
    return [word for key, value in tcp for word in ("--mca", key, value)]


def scenario_ssh(
    hosts: int,
    per_host: int,
    program: list[str],
    tree: int | None = None,
    client: str | None = None,
    options: Callable[[str], list[str]] | None = None,
):
    """tree: mpilaunch runs with --ssh-tree-width tree (the peers' fan-out is flat); client:
    mpilaunch runs with --ssh-client client (the peers run `ssh` anyway); options(launcher):
    more words for that launcher."""

    def run(name: str, prefix: list[str], work: Path) -> dict:
        import resource

        bed = SshHosts.get(hosts, work)
        spec = ",".join(f"{n}:{per_host}" for n in bed.names[:hosts])
        width = ["--ssh-tree-width", str(tree)] if tree and name == "mpilaunch" else []
        width += ["--ssh-client", client] if client and name == "mpilaunch" else []
        width += options(name) if options else []
        argv = [*SshHosts.argv(name, prefix, spec), *width, "-n", str(hosts * per_host), *program]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        elapsed, proc = timed(argv, capture_output=True, timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert proc.returncode == 0, proc.stderr[-2000:]
        left = bed.wait_clean(5.0)
        assert not left, f"{name} left processes on the hosts: {left}"
        # The launcher's own CPU (its children here, not the remote side, which sshd runs).
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return {"seconds": elapsed, "cpu": cpu}

    return run


SCENARIOS = {
    "true": ("`-n 8 true`, local", scenario_true),
    "output": ("4 ranks x 100,000 lines of 70 bytes (mpirun/mpilaunch with --output-filename)", scenario_output),
    "abort": ("abort: rank 1 exits 3 after 1 s, others sleep (time from failure to launcher exit)", scenario_abort),
    **{
        f"barrier{n}": (
            f"mpi4py wire-up + barrier, {n} ranks (hydra only: Open MPI cannot run MPICH ranks)",
            scenario_barrier(n),
        )
        for n in (2, 4, 8, 16, 32)
    },
    **{
        f"ompi_barrier{n}": (
            f"mpi4py over Open MPI 4.1.4, wire-up + barrier, {n} ranks (Open MPI only)",
            scenario_ompi_barrier(n),
        )
        for n in (2, 4, 8, 16, 32)
    },
    "sh_barrier2": (
        "`sh -c` running mpi4py over MPICH, wire-up + barrier, 2 ranks (mpilaunch serves PMI and PMIx; hydra only)",
        scenario_shell_barrier(sys.executable, 2),
    ),
    "sh_ompi_barrier2": (
        "`sh -c` running mpi4py over Open MPI 4.1.4, wire-up + barrier, 2 ranks (mpilaunch serves PMI and PMIx)",
        scenario_shell_barrier("/usr/bin/python3", 2),
    ),
    "sleep256": ("256 ranks of `echo; sleep 1` (launcher side: peak memory (PSS), CPU seconds)", scenario_sleep256),
    "pmix256": (
        "256 ranks of `echo; sleep 1` served PMIx (mpilaunch --mpi pmix; launcher side: peak PSS, CPU seconds)",
        lambda name, prefix, work: scenario_sleep256(name, prefix, work, ("--mpi", "pmix")),
    ),
    "ssh_true": ("ssh, 4 hosts x 2 ranks of `true`", scenario_ssh(4, 2, ["true"])),
    "ssh_barrier": (
        "ssh, 4 hosts x 2 ranks, mpi4py wire-up + barrier (hydra only)",
        scenario_ssh(4, 2, [sys.executable, "-c", BARRIER]),
    ),
    "ssh_fanout32": ("ssh fan-out, 32 hosts x 1 rank of `true`", scenario_ssh(32, 1, ["true"])),
    "ssh_true_openssh": (
        "ssh, 4 hosts x 2 ranks of `true` (mpilaunch --ssh-client openssh)",
        scenario_ssh(4, 2, ["true"], client="openssh"),
    ),
    "ssh_barrier_openssh": (
        "ssh, 4 hosts x 2 ranks, mpi4py wire-up + barrier (mpilaunch --ssh-client openssh; hydra only)",
        scenario_ssh(4, 2, [sys.executable, "-c", BARRIER], client="openssh"),
    ),
    "ssh_fanout32_openssh": (
        "ssh fan-out, 32 hosts x 1 rank of `true` (mpilaunch --ssh-client openssh)",
        scenario_ssh(32, 1, ["true"], client="openssh"),
    ),
    "ssh_tree32": (
        "ssh tree spawn, 32 hosts x 1 rank of `true` (mpilaunch --ssh-tree-width 8; peers flat)",
        scenario_ssh(32, 1, ["true"], tree=8),
    ),
    "ssh_ompi_barrier": (
        "ssh, 4 hosts x 2 ranks, mpi4py over Open MPI 4.1.4, wire-up + barrier",
        scenario_ssh(4, 2, ["/usr/bin/python3", "-c", BARRIER], options=ompi_tcp),
    ),
    "ssh_true_paramiko": (
        "ssh, 4 hosts x 2 ranks of `true` (mpilaunch --ssh-client paramiko)",
        scenario_ssh(4, 2, ["true"], client="paramiko"),
    ),
    "ssh_chain8": (
        "ssh tree spawn as a chain, 8 hosts x 1 rank of `true` (mpilaunch --ssh-tree-width 1; peers flat)",
        scenario_ssh(8, 1, ["true"], tree=1),
    ),
}
MPICH_ONLY = {key for key in SCENARIOS if key.startswith(("barrier", "ssh_barrier", "sh_barrier"))}
OPEN_MPI_ONLY = {key for key in SCENARIOS if "ompi_barrier" in key}  # hydra cannot start Open MPI ranks
# Open MPI's mpirun over 32 bed hosts took 38 s once, then failed (orte_session_dir errors).
NO_OPENMPI = MPICH_ONLY | {"ssh_fanout32", "ssh_fanout32_openssh", "ssh_tree32", "ssh_chain8"}
NO_HYDRA = {"pmix256"}  # hydra serves no PMIx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    parser.add_argument("--write", help="write performance.md's main table here (Markdown)")
    parser.add_argument("--chart", help="write a PNG chart of the scaling curves here (needs matplotlib)")
    args = parser.parse_args()
    from bench.installed import commit_of

    commit = commit_of()  # once: a commit made during the run changes nothing here
    peers = launchers(commit)
    rows = []
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.closing(SshHosts):
        work = Path(tmp)
        for key in args.only or SCENARIOS:
            title, func = SCENARIOS[key]
            results: dict[str, list[dict]] = {name: [] for name in peers}
            slow = ("output", "barrier16", "barrier32", "ssh_fanout32", "ssh_fanout32_openssh", "ssh_tree32")
            # Short, or noisy against a 1.0x target: three times the runs, for a steadier median.
            quick = ("true", "barrier2", "barrier4", "ssh_true", "ssh_true_openssh")
            reps = max(3, args.reps // 2) if key in slow else args.reps * 3 if key in quick else args.reps
            counts[key] = reps
            runners = {
                n: p
                for n, p in peers.items()
                if not (key in NO_OPENMPI and n == "openmpi")
                and not ((key in OPEN_MPI_ONLY or key in NO_HYDRA) and n == "hydra")
            }
            results = {name: [] for name in runners}
            for _ in range(reps):
                for name, prefix in runners.items():
                    try:
                        results[name].append(func(name, prefix, work))
                    except (AssertionError, subprocess.TimeoutExpired) as exc:  # counted, shown, not fatal
                        last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
                        print(f"  {name} failed once: {last[0][:200]}", file=sys.stderr, flush=True)
                        results[name].append({"failed": True})
            results = {name: res for name, res in results.items() if ok(res)}
            rows.append((key, title, results))
            print(report_row(key, title, results), flush=True)
    if args.write:
        from bench.table import markdown

        Path(args.write).write_text(markdown(rows, commit[:7], args.reps, counts))
    if args.chart:
        chart(rows, args.chart)


def chart(rows: list, path: str) -> None:
    """Wire-up time against ranks, one line per launcher (the `bench` extra brings matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[tuple[int, float]]] = {}
    for key, _, results in rows:
        if key.startswith("barrier"):
            for name, res in results.items():
                curves.setdefault(name, []).append((int(key[len("barrier") :]), median(res)))
    if not curves:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in sorted(curves.items()):
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks (mpi4py, one barrier)")
    ax.set_ylabel("seconds, median")
    ax.set_title("MPI wire-up on one 2-core machine")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def ok(results: list[dict]) -> list[dict]:
    """The runs that completed (a peer that crashes now and then still gets a median)."""
    return [r for r in results if not r.get("failed")]


def failed_note(results: list[dict]) -> str:
    bad = len(results) - len(ok(results))
    return f"; {bad} of {len(results)} runs failed" if bad else ""


def median(results: list[dict], field: str = "seconds") -> float:
    return statistics.median(r[field] for r in ok(results))


def report_row(key: str, title: str, results: dict[str, list[dict]]) -> str:
    ours = median(results["mpilaunch"])
    parts = [f"{title}:"]
    for name, res in results.items():
        extra = ""
        if key == "output":
            extra = (
                f", mangled {max(r['mangled'] for r in ok(res))}, console lines "
                f"{min(r['console_lines'] for r in ok(res))}, file lines {min(r['file_lines'] for r in ok(res))}"
            )
        if key == "abort":
            extra = f", all ranks gone {median(res, 'all_gone'):.3f} s, status {ok(res)[0]['status']}"
        if key in ("sleep256", "pmix256"):
            extra = f", peak PSS {median(res, 'rss_mb'):.1f} MB, CPU {median(res, 'cpu'):.2f} s"
        if key.startswith("ssh"):
            extra = f", launcher CPU {median(res, 'cpu'):.2f} s"
        ratio = f" (mpilaunch/{name} = {ours / median(res):.2f}x)" if name != "mpilaunch" else ""
        parts.append(f"  {name:10s} {median(res):.3f} s{extra}{ratio}{failed_note(res)}")
    return "\n".join(parts)


if __name__ == "__main__":
    main()
