"""From a JobSpec to a running job: the plan, the checks that need this machine, the controller."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mpilaunch.controller import Controller
from mpilaunch.errors import LaunchError
from mpilaunch.output import Console, OutputSink
from mpilaunch.plan import LaunchPlan, build_plan, host_checks, remote_hosts, with_master
from mpilaunch.programs import carried_environment, program_problem
from mpilaunch.rank_env import inherited
from mpilaunch.report import dry_run_env, rank_map
from mpilaunch.spec import JobSpec
from mpilaunch.transport.local import LocalLink, start_local_agent

if TYPE_CHECKING:
    from mpilaunch.transport.ssh import SshLink


def check_local_programs(plan: LaunchPlan, env: Mapping[str, str], host: int) -> None:
    """A missing program or directory is a clear error before anything starts."""
    path = inherited(env).get("PATH", os.defpath)
    for check in host_checks(plan.job, host):
        problem = program_problem(check["program"], check["wdir"], check["path"] or path, plan.options.mpi != "none")
        if problem:
            raise LaunchError(problem)


def start_remote_agents(plan: LaunchPlan, remote: list[int]) -> tuple[dict[int, SshLink], LaunchPlan]:
    """One agent on every remote host, each checked before anything starts; then MASTER_ADDR is
    the address rank 0's host was reached at, and MASTER_PORT a port free there."""
    from mpilaunch import wire
    from mpilaunch.transport.ssh import SshOptions, start_agents

    options = plan.options
    env = plan.launcher_env
    rank0 = plan.job.ranks[0].host
    pick_port = rank0 in remote and not env.get("MASTER_PORT", "").isdigit()
    carried = carried_environment(dict(env))

    def check(index: int) -> bytes:
        return wire.control(
            "check",
            apps=host_checks(plan.job, index),
            carried=carried,
            mpi=options.mpi != "none",
            port=0 if pick_port and index == rank0 else -1,
            heartbeat=plan.heartbeat,
        )

    hosts = {i: (plan.hosts[i].name, plan.hosts[i].user, plan.hosts[i].port) for i in remote}
    ssh = SshOptions(config=options.ssh_config, accept_new=options.ssh_accept_new)
    results = start_agents(hosts, ssh, check)
    links = {i: r.link for i, r in results.items() if r.link is not None}
    problems = []
    for index, result in sorted(results.items()):
        name = plan.hosts[index].name
        if result.error is not None:
            problems.append(f"{name}: {result.error}")
        else:
            problems.extend(f"{name}: {p}" for p in (result.reply or {}).get("problems", ()))
    if problems:
        for link in links.values():
            link.close()
        raise LaunchError("\nmpilaunch: ".join(problems))  # one line per problem, in host order
    if rank0 in remote:
        port = int(results[rank0].reply["port"]) if pick_port else plan.master[1]  # type: ignore[index]
        plan = with_master(plan, (links[rank0].peer, port))
    elif any(link.local_address for link in links.values()):
        address = next(link.local_address for link in links.values() if link.local_address)
        plan = with_master(plan, (address, plan.master[1]))
    return links, plan


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
    return execute(plan).run()


def execute(plan: LaunchPlan, host_tags: bool = False) -> Controller:
    """Check what can be checked, open the output, start the agents: a controller ready to run."""
    options = plan.options
    job = plan.job
    remote = remote_hosts(plan.hosts, job.ranks)
    local = sorted({r.host for r in job.ranks} - set(remote))
    for index in local:
        check_local_programs(plan, plan.launcher_env, index)
    raise_fd_limit()
    log_dir = None
    copy_to_console = True
    if options.output_filename is not None:  # an empty one is refused by LogTree, not ignored
        log_dir = options.output_filename
        if log_dir.endswith(":nocopy"):  # Open MPI's spelling for "files only"
            log_dir, copy_to_console = log_dir[: -len(":nocopy")], False
    console = None
    if copy_to_console:
        console = Console(options.tag_output or host_tags, options.timestamp_output)
        if host_tags:
            console.host_tags = {r.rank: plan.hosts[r.host].name for r in job.ranks}
    sink = OutputSink(console, log_dir, options.merge_stderr_to_stdout)
    root = sink.add_job(1, list(range(len(job.ranks))))
    if root:
        print(f"mpilaunch: rank output goes to {root}/rank.N", file=sys.stderr, flush=True)
    links: dict[int, LocalLink | SshLink] = {}
    if remote:
        if local:  # forked before any SSH connection exists, so it holds none of them
            links[local[0]] = start_local_agent()
        try:
            remote_links, plan = start_remote_agents(plan, remote)
        except BaseException:
            for link in links.values():
                link.close()
                link.wait()
            raise
        links.update(remote_links)
    return Controller(plan, sink, links, summary=not host_tags)
