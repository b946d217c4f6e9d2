"""From a JobSpec to a running job: hosts, placement, environments, checks, controller."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import replace

from mpilaunch import hosts as hostlib
from mpilaunch.controller import Controller, LaunchPlan
from mpilaunch.errors import LaunchError
from mpilaunch.hosts import Host
from mpilaunch.output import Console, LogTree, OutputSink
from mpilaunch.placement import place
from mpilaunch.pmi.simple import process_mapping
from mpilaunch.rank_env import JobLayout, inherited, job_variables, rank_environment
from mpilaunch.report import dry_run_env, rank_map
from mpilaunch.spec import JobSpec, Options


def resolve_hosts(options: Options) -> tuple[list[Host], str]:
    """The job's hosts and where they came from; -H restricts a hostfile to the hosts it names."""
    listed = [h for value in options.hosts for h in hostlib.parse_host_list(value)]
    if options.hostfile:
        from_file = hostlib.read_hostfile(options.hostfile)
        if not listed:
            return hostlib.merge_local_aliases(from_file), f"hostfile {options.hostfile}"
        names = {h.name for h in from_file}
        for host in listed:
            if host.name not in names:
                raise LaunchError(f"-H names {host.name!r}, which is not in the hostfile {options.hostfile}")
        counts = {h.name: h.slots for h in hostlib.merge_hosts(listed)}  # -H's counts win
        chosen = [replace(h, slots=counts[h.name]) for h in from_file if h.name in counts]
        return chosen, f"hostfile {options.hostfile} restricted by -H"
    if listed:
        return hostlib.merge_local_aliases(hostlib.merge_hosts(listed)), "-H"
    return hostlib.localhost_default(), "localhost (no hosts given)"


def with_slots(hosts: list[Host], source: str) -> list[Host]:
    """Fill in core counts for hosts listed without slots (only known here for this machine)."""
    unknown = [h.name for h in hosts if h.slots is None and not hostlib.is_local(h.name)]
    if unknown:
        raise LaunchError(f"{source}: no slot count for remote host {unknown[0]!r}; give one with slots=N or host:N")
    return hostlib.with_core_counts(hosts, {h.name: os.cpu_count() or 1 for h in hosts})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def master_address(hosts: list[Host], used: set[int], rank0_host: int) -> str:
    name = hosts[rank0_host].name
    if hostlib.is_local(name):
        all_local = all(hostlib.is_local(hosts[i].name) for i in used)
        return "127.0.0.1" if all_local else socket.gethostname()
    return name


def stdin_ranks(choice: str, np: int) -> list[int]:
    if choice == "none":
        return []
    if choice == "all":
        return list(range(np))
    rank = int(choice)
    if rank >= np:
        raise LaunchError(f"--stdin {rank}: the job has only {np} ranks")
    return [rank]


def build_plan(spec: JobSpec, env: Mapping[str, str]) -> tuple[LaunchPlan, str]:
    options = spec.options
    hosts, source = resolve_hosts(options)
    hosts = with_slots(hosts, source)
    ranks = place(
        hosts,
        [(app.np, app.argv[0]) for app in spec.apps],
        options.map_by,
        options.npernode,
        options.oversubscribe,
    )
    app_sizes = [sum(1 for r in ranks if r.app == i) for i in range(len(spec.apps))]
    master_port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT", "").isdigit() else free_port()
    layout = JobLayout(
        ranks=ranks,
        app_sizes=app_sizes,
        universe_size=sum(h.slots or 0 for h in hosts),
        job_id=f"{int(time.time()):x}{os.getpid():x}{os.urandom(2).hex()}",
        master_addr=master_address(hosts, {r.host for r in ranks}, ranks[0].host),
        master_port=master_port,
        mca=options.mca,
    )
    common = job_variables(layout, env)
    pmi = None
    if options.mpi == "pmi1":
        pmi = {
            "size": len(ranks),
            "universe": layout.universe_size,
            "kvsname": f"kvs_{layout.job_id}_0",
            "mapping": process_mapping([r.node_rank for r in ranks]),
        }
    envs = [rank_environment(r, common, spec.apps[r.app].exports, env) for r in ranks]
    plan = LaunchPlan(
        hosts=hosts,
        ranks=ranks,
        argvs=[app.argv for app in spec.apps],
        wdirs=[os.path.abspath(app.wdir) if app.wdir else os.getcwd() for app in spec.apps],
        envs=envs,
        stdin_ranks=stdin_ranks(options.stdin, len(ranks)),
        options=options,
        pmi=pmi,
    )
    return plan, source


def check_local_programs(plan: LaunchPlan, env: Mapping[str, str]) -> None:
    """A missing program or directory is a clear error before anything starts."""
    base = inherited(env)
    for app, (argv, wdir) in enumerate(zip(plan.argvs, plan.wdirs)):
        if not os.path.isdir(wdir):
            raise LaunchError(f"working directory {wdir!r} does not exist")
        rank = next(r for r in plan.ranks if r.app == app)
        path = plan.envs[rank.rank].get("PATH", base.get("PATH", os.defpath))
        program = argv[0]
        target = program if os.sep in program else shutil.which(program, path=path)
        if target and os.sep in program and not os.path.isabs(program):
            target = os.path.join(wdir, program)
        if not target or not os.path.isfile(target):
            raise LaunchError(f"program {program!r} not found (PATH and working directory {wdir})")
        if not os.access(target, os.X_OK):
            raise LaunchError(f"program {program!r} is not executable")


def raise_fd_limit() -> None:
    """Log files need two descriptors per rank; lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def run_job(spec: JobSpec) -> int:
    env = os.environ
    plan, source = build_plan(spec, env)
    options = spec.options
    if options.display_map or options.dry_run:
        print(rank_map(plan.hosts, plan.ranks, plan.argvs, source), flush=True)
    if options.dry_run:
        print(dry_run_env(plan.ranks, plan.hosts, plan.envs), flush=True)
        return 0
    remote = sorted({plan.hosts[r.host].name for r in plan.ranks if not hostlib.is_local(plan.hosts[r.host].name)})
    if remote:
        raise LaunchError(f"host {remote[0]!r} is remote; launching over SSH is not available in this version")
    check_local_programs(plan, env)
    raise_fd_limit()
    tree = None
    copy_to_console = True
    if options.output_filename:
        base = options.output_filename
        if base.endswith(":nocopy"):  # Open MPI's spelling for "files only"
            base, copy_to_console = base[: -len(":nocopy")], False
        tree = LogTree(base, len(plan.ranks), options.merge_stderr_to_stdout)
        print(f"mpilaunch: rank output goes to {tree.root}/rank.N", file=sys.stderr, flush=True)
    console = Console(options.tag_output, options.timestamp_output) if copy_to_console else None
    sink = OutputSink(console, tree, options.merge_stderr_to_stdout)
    return Controller(plan, sink).run()
