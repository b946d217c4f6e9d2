"""Texts for people: the rank map, the dry-run listing and the failure summary."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Iterable, Mapping, Sequence

from mpilaunch.launcher.report.root_cause import FRAMES_SHOWN, RootCause
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.placement import Rank
from mpilaunch.plan.rank_env import mask
from mpilaunch.protocol.messages import Death

RULE = "-" * 74


def ranges(numbers: Sequence[int]) -> str:
    """[0,1,2,5] -> '0-2,5'."""
    out: list[str] = []
    nums = sorted(numbers)
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def rank_list(numbers: Sequence[int], others: int = 0) -> str:
    """`rank 0`, `ranks 0-2,5` (never a bare number, which reads as a count), and the ranks of
    spawned jobs: `ranks 0,2 and 1 rank of spawned jobs`."""
    parts = []
    if numbers:
        parts.append(f"rank{'s' if len(numbers) > 1 else ''} {ranges(numbers)}")
    if others:
        parts.append(f"{others} rank{'s' if others > 1 else ''} of spawned jobs")
    return " and ".join(parts) or "none"


def rank_map(hosts: Sequence[Host], ranks: Sequence[Rank], apps: Sequence[Sequence[str]], source: str) -> str:
    """The job map, one block per host, in the spirit of mpirun --display-map."""
    total = sum(h.slots or 0 for h in hosts)
    lines = [" ========================   JOB MAP   ========================", f" hosts from: {source}; {total} slots"]
    for index, host in enumerate(hosts):
        mine = [r for r in ranks if r.host == index]
        cap = host.max_slots if host.max_slots is not None else 0
        lines.append(f" Data for node: {host.name}\tNum slots: {host.slots}\tMax slots: {cap}\tNum procs: {len(mine)}")
        for r in mine:
            lines.append(f" \tRank {r.rank}\tApp: {r.app} ({shlex.join(apps[r.app])})\tLocal rank: {r.local_rank}")
    lines.append(" =============================================================")
    return "\n".join(lines)


def allocation(hosts: Sequence[Host]) -> str:
    """--display-allocation: the hosts and their slots, in mpirun's layout."""
    lines = ["", "======================   ALLOCATED NODES   ======================"]
    for host in hosts:
        cap = host.max_slots if host.max_slots is not None else 0
        lines.append(f"\t{host.name}: slots={host.slots} max_slots={cap} slots_inuse=0")
    lines.append("=================================================================")
    return "\n".join(lines)


def hydra_rank_map(hosts: Sequence[Host], ranks: Sequence[Rank]) -> str:
    """hydra's -print-rank-map: `(host:0,1,4)` per host that has ranks, in host order."""
    lines = []
    for index, host in enumerate(hosts):
        mine = [str(r.rank) for r in ranks if r.host == index]
        if mine:
            lines.append(f"({host.name}:{','.join(mine)})")
    return "\n".join(lines) + "\n"


def dry_run_env(ranks: Sequence[Rank], hosts: Sequence[Host], envs: Iterable[Mapping[str, str]]) -> str:
    lines = []
    for r, env in zip(ranks, envs):
        lines.append(f"rank {r.rank} on {hosts[r.host].name}:")
        lines.extend(f"  {k}={mask(k, v)}" for k, v in sorted(env.items()))
    return "\n".join(lines)


def describe_status(status: int | None, before_finalizing: bool = False, started: bool = True) -> str:
    """Exit status as subprocess reports it (negative: killed by that signal; None: not known,
    its host was lost); an MPI rank that exited 0 without MPI_Finalize says so; a rank that
    never started has no exit status and no signal (its reason says why)."""
    if not started:
        return "Status:    not started"
    if status is None:
        return "Status:    not known (its host was lost)"
    if before_finalizing:
        return f"Exit code: {status}, but it ended before finalizing (no MPI_Finalize)"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"Signal:    {name} ({-status})"
    return f"Exit code: {status}"


def failure_summary(
    *,
    rank: int,
    job: int = 1,
    host: str,
    pid: int | None,
    status: int | None,
    argv: Sequence[str],
    last_lines: Sequence[str],
    killed: Sequence[int],
    killed_other: int = 0,
    aborted: bool,
    failed_total: int,
    ran_on: str | None = None,
    reason: str | None = None,
    before_finalizing: bool = False,
    cause: RootCause | None = None,
    death: Death | None = None,
    started: bool = True,
) -> str:
    if not started:
        head = "mpilaunch could not start one or more processes" + (
            ", thus causing the job\nto be terminated" if aborted else f" ({ran_on or 'abort on failure was off'})"
        )
        head += ". The first process it could not start was:"
    elif aborted:
        head = (
            "mpilaunch detected that one or more processes exited with non-zero status, thus causing\n"
            "the job to be terminated. The first process to do so was:"
        )
    else:
        head = (
            f"mpilaunch detected that {failed_total} process(es) exited with non-zero status "
            f"({ran_on or 'abort on failure was off'}, so the others ran on). The first process to do so was:"
        )
    where = f"{rank}" if job == 1 else f"{rank} of spawned job {job}"
    lines = [RULE]
    oom = oom_words(death) if death is not None else None
    if oom is not None:  # how it died first: what most readers came for
        lines += [f"rank {where} on {host} was {oom}", *([] if cause is not None else [""])]
    if cause is not None:  # the rank's own words
        lines += [f"rank {where} on {host} raised {cause.line}", ""]
    lines += [head, "", f"  Rank:      {where}", f"  Host:      {host}", f"  PID:       {pid if pid else '-'}"]
    lines.append(f"  Command:   {shown_command(argv)}")
    lines.append(f"  {describe_status(status, before_finalizing, started)}")
    if reason:
        lines.append(f"  Reason:    {reason}")
    if oom is not None:
        lines.append(f"  Killed by: {oom[len('killed by ') :]}")
    core = core_words(death, pid) if death is not None else None
    if core is not None:
        lines.append(f"  Core file: {core}")
    if cause is not None:
        lines.append(f"  Error:     {cause.line}  (from {cause.source})")
        if cause.frames:
            lines.append("  Innermost frames:")
            for frame in cause.frames[:FRAMES_SHOWN]:
                lines.extend(f"    {part}" for part in frame.splitlines())
    if last_lines:
        lines.append("  Last stderr lines:")
        lines.extend(f"    {line}" for line in last_lines)
    if killed or killed_other:
        lines.append("")
        lines.append(f"Killed by mpilaunch: {rank_list(killed, killed_other)}")
    lines.append(RULE)
    return "\n".join(lines)


def size(value: int) -> str:
    """Bytes for people: 100 MiB, 23.5 GiB."""
    number = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if number < 1024 or unit == "TiB":
            break
        number /= 1024
    return f"{number:.1f}".removesuffix(".0") + f" {unit}"


def oom_words(death: Death) -> str | None:
    """`killed by the out-of-memory killer (cgroup limit 100 MiB / host memory 24 GiB; peak RSS
    96 MiB)`, if it was."""
    if not death.oom:
        return None
    limits = (("cgroup limit", death.limit_bytes), ("host memory", death.host_bytes))
    memory = [f"{what} {size(n)}" for what, n in limits if n]
    parts = [" / ".join(memory)] if memory else []
    if death.peak_rss:
        parts.append(f"peak RSS {size(death.peak_rss)}")
    return "killed by the out-of-memory killer" + (f" ({'; '.join(parts)})" if parts else "")


def core_words(death: Death, pid: int | None) -> str | None:
    """Where the core file is, or where it went when there is no file to name."""
    if death.core:
        return death.core
    if death.core_handler == "systemd-coredump":
        return "dumped to systemd-coredump, not to a file" + (f" (coredumpctl info {pid})" if pid else "")
    if death.core_handler:
        return f"dumped to {death.core_handler} (core_pattern pipes cores to it), not to a file"
    if death.core_pattern:
        return f"dumped, but not found where core_pattern ({death.core_pattern}) puts it"
    return None


COMMAND_SHOWN = 400  # characters of a failed rank's command in the summary (--report-json has it whole)


def shown_command(argv: Sequence[str]) -> str:
    """The command as a shell would take it, cut after COMMAND_SHOWN characters (a 2 MB argv is
    not a 2 MB line)."""
    text = shlex.join(argv)
    return text if len(text) <= COMMAND_SHOWN else f"{text[:COMMAND_SHOWN]}... ({len(text)} characters)"
