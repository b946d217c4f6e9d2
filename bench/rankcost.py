"""Where the launcher side's memory and CPU go, for one job: by process and by mapping, or by
function in the local agent and the launcher.

Run by hand (not part of the tests):
  python -m bench.rankcost memory -n 256 sh -c 'echo rank up; sleep 1'
  python -m bench.rankcost profile -n 256 sh -c 'echo rank up; sleep 1'
Both time mpilaunch as `pip install` gives it (bench/installed.py: a venv of this checkout's
HEAD, or of --commit REV). `memory` runs that venv's `mpilaunch ARGS` and samples its processes every 10 ms (the
launcher, the local agent and its guardian; not the ranks): at the peak of their summed PSS it
prints each one's /proc/PID/smaps_rollup and its largest mappings, and at the end each one's CPU
seconds. `profile` runs the command in a process of the venv's Python (this file, started by
path, so only the installed mpilaunch can be imported) under cProfile, timed by each thread's CPU
clock (not the wall clock, which a loaded machine fills with waits), the forked local agent
profiled on its own: the top functions of each, by their own time.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

GUARDIAN = "mpilaunch-guardian"
FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Private_Clean", "Private_Dirty", "Rss")


IN_VENV = "BENCH_RANKCOST_INSTALLED"  # set when profile runs under the installed venv's Python


def _rollup(pid: int) -> dict[str, int]:
    found = {}
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            words = line.split()
            if len(words) == 3 and words[0].endswith(":"):
                found[words[0][:-1]] = int(words[1])
    return found


def _mappings(pid: int) -> collections.Counter:
    """PSS (kB) by what is mapped: a file's path, [heap], [anon], [stack]."""
    found: collections.Counter = collections.Counter()
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as handle:
        for line in handle:
            words = line.split()
            if "-" in words[0] and not words[0].endswith(":"):
                name = words[5] if len(words) > 5 else "[anon]"
            elif words[0] == "Pss:":
                found[name] += int(words[1])
    return found


def _launcher_side(pid: int, psutil) -> list:  # type: ignore[no-untyped-def]
    """The launcher, its Python children (the local agent) and their guardians (a shell, or a
    fork of the agent with its command line): not the ranks, the agent's other children, and
    not a child the agent is spawning before its exec (it shares the agent's memory)."""
    from bench.run import shares_parents_memory

    try:
        launcher = psutil.Process(pid)
        found = [launcher]
        for agent in launcher.children():
            if "python" in os.path.basename(os.readlink(f"/proc/{agent.pid}/exe")):
                found.append(agent)
                line = agent.cmdline()
                for child in agent.children():
                    words = child.cmdline()
                    if GUARDIAN in words or (words == line and not shares_parents_memory(child.pid, agent.pid)):
                        found.append(child)
        return found
    except (OSError, psutil.Error):
        return []


def memory(args: list[str], top: int, commit: str = "HEAD") -> None:
    import psutil

    from bench.installed import clean_env, installed

    mpilaunch = str(installed(commit) / "mpilaunch")
    proc = subprocess.Popen([mpilaunch, *args], stdout=subprocess.DEVNULL, env=clean_env())
    peak, at_peak, cpu = 0, {}, {}
    while proc.poll() is None:
        sample = {}
        for member in _launcher_side(proc.pid, psutil):
            try:
                sample[member.pid] = (member.ppid(), " ".join(member.cmdline())[:70], _rollup(member.pid))
                times = member.cpu_times()
                cpu[member.pid] = times.user + times.system
            except (OSError, psutil.Error):
                pass
        total = sum(rollup.get("Pss", 0) for _, _, rollup in sample.values())
        if total > peak:
            peak = total
            at_peak = {pid: (*row, _mappings(pid)) for pid, row in sample.items() if os.path.exists(f"/proc/{pid}")}
        time.sleep(0.01)
    print(f"peak PSS of the launcher side: {peak / 1024:.1f} MB; CPU {sum(cpu.values()):.3f} s")
    for pid, (ppid, command, rollup, maps) in at_peak.items():
        fields = ", ".join(f"{name} {rollup.get(name, 0) / 1024:.1f}" for name in FIELDS)
        print(f"{pid} (parent {ppid}, CPU {cpu.get(pid, 0):.3f} s) {command}\n  MB: {fields}")
        for name, kb in maps.most_common(top):
            print(f"  {kb / 1024:6.2f} MB  {name}")


def profile(args: list[str], top: int) -> None:
    import cProfile
    import pstats

    import mpilaunch.agent.agent as agent_module
    import mpilaunch.entry as entry

    serve = agent_module.serve
    kept = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rankcost-agent-{os.getpid()}.prof")

    def profiled_serve(*a, **k):  # type: ignore[no-untyped-def]
        agent = cProfile.Profile(time.thread_time)
        agent.enable()
        try:
            return serve(*a, **k)
        finally:
            agent.disable()
            agent.dump_stats(kept + ".part")
            os.replace(kept + ".part", kept)  # whole, or not there yet

    agent_module.serve = profiled_serve
    leave = entry.leave
    launcher = cProfile.Profile(time.thread_time)

    def report(status: int) -> None:
        launcher.disable()
        sys.stdout.flush()
        for _ in range(500):  # the agent writes its profile as it leaves, about when the launcher does
            if os.path.exists(kept):
                break
            time.sleep(0.01)
        for name, stats in (("launcher", launcher), ("agent", kept)):
            read = pstats.Stats(stats, stream=sys.stderr)
            print(f"\n{name}: {read.total_tt:.3f} s of CPU, profiled", file=sys.stderr)
            read.sort_stats("tottime").print_stats(top)
        os.unlink(kept)
        leave(status)

    entry.leave = report
    sys.argv = ["mpilaunch", *args]
    launcher.enable()
    entry.main()


def main() -> None:
    """memory|profile [--top N] [--commit REV] MPILAUNCH-ARGUMENTS..."""
    words = sys.argv[1:]
    if not words or words[0] not in ("memory", "profile"):
        raise SystemExit(f"usage: python -m bench.rankcost {main.__doc__}")
    top = 12
    if words[1:2] == ["--top"]:
        top, words = int(words[2]), words[:1] + words[3:]
    commit = "HEAD"
    if words[1:2] == ["--commit"]:
        commit, words = words[2], words[:1] + words[3:]
    if words[0] == "memory":
        memory(words[1:], top, commit)
    elif os.environ.get(IN_VENV):
        profile(words[1:], top)
    else:
        from bench.installed import clean_env, installed

        python = str(installed(commit) / "python")
        os.execve(python, [python, __file__, words[0], "--top", str(top), *words[1:]], {**clean_env(), IN_VENV: "1"})


if __name__ == "__main__":
    main()
