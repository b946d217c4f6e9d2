"""From a JobSpec to a running job: the plan, the checks that need this machine, the controller."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping

from mpilaunch.controller import Controller
from mpilaunch.errors import LaunchError
from mpilaunch.mpi_family import open_mpi_library
from mpilaunch.output import Console, OutputSink
from mpilaunch.plan import LaunchPlan, build_plan, remote_hosts
from mpilaunch.rank_env import inherited
from mpilaunch.report import dry_run_env, rank_map
from mpilaunch.spec import JobSpec


def check_local_programs(plan: LaunchPlan, env: Mapping[str, str]) -> None:
    """A missing program or directory is a clear error before anything starts."""
    base = inherited(env)
    job = plan.job
    for app, (argv, wdir) in enumerate(zip(job.argvs, job.wdirs)):
        if not os.path.isdir(wdir):
            raise LaunchError(f"working directory {wdir!r} does not exist")
        rank = next(r for r in job.ranks if r.app == app)
        path = job.envs[rank.rank].get("PATH", base.get("PATH", os.defpath))
        program = argv[0]
        target = program if os.sep in program else shutil.which(program, path=path)
        if target and os.sep in program and not os.path.isabs(program):
            target = os.path.join(wdir, program)
        if not target or not os.path.isfile(target):
            raise LaunchError(f"program {program!r} not found (PATH and working directory {wdir})")
        if not os.access(target, os.X_OK):
            raise LaunchError(f"program {program!r} is not executable")
        library = open_mpi_library(target) if plan.options.mpi != "none" else None
        if library:
            raise LaunchError(
                f"program {program!r} is linked with Open MPI ({library}); Open MPI ranks need a PMIx server, "
                "which mpilaunch does not provide, so each would run alone as a singleton of size 1. "
                "Use Open MPI's mpirun, rebuild with MPICH, or pass --mpi none to start it anyway"
            )


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
    job = plan.job
    if options.display_map or options.dry_run:
        print(rank_map(plan.hosts, job.ranks, job.argvs, source), flush=True)
    if options.dry_run:
        print(dry_run_env(job.ranks, plan.hosts, job.envs), flush=True)
        return 0
    remote = remote_hosts(plan.hosts, job.ranks)
    if remote:
        raise LaunchError(f"host {remote[0]!r} is remote; launching over SSH is not available in this version")
    check_local_programs(plan, env)
    raise_fd_limit()
    log_dir = None
    copy_to_console = True
    if options.output_filename:
        log_dir = options.output_filename
        if log_dir.endswith(":nocopy"):  # Open MPI's spelling for "files only"
            log_dir, copy_to_console = log_dir[: -len(":nocopy")], False
    console = Console(options.tag_output, options.timestamp_output) if copy_to_console else None
    sink = OutputSink(console, log_dir, options.merge_stderr_to_stdout)
    root = sink.add_job(1, list(range(len(job.ranks))))
    if root:
        print(f"mpilaunch: rank output goes to {root}/rank.N", file=sys.stderr, flush=True)
    return Controller(plan, sink).run()
