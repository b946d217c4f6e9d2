"""From a JobSpec to a running job: the plan, the checks that need this machine, the controller."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Mapping

from mpilaunch.errors import LaunchError
from mpilaunch.host.programs import carried_environment, program_family, program_problem
from mpilaunch.launcher.decide.events import NodesEnded, NodesRegroup
from mpilaunch.launcher.decide.signal_table import LEAVES_WITH
from mpilaunch.launcher.output.sink import Console, OutputSink
from mpilaunch.launcher.start.here import ThisMachine
from mpilaunch.plan import devices
from mpilaunch.plan.build import ENGINES, JobPlan, LaunchPlan, build_plan, host_checks, remote_hosts, user_port
from mpilaunch.plan.finalize import Facts, asks_families, finalize, refuses_open_mpi
from mpilaunch.plan.rank_env import inherited, prefixed_paths
from mpilaunch.plan.spec import JobSpec, Options
from mpilaunch.protocol.messages import AppCheck, Check, Probe, Put, PutDone, encode
from mpilaunch.protocol.record import Record
from mpilaunch.protocol.wire import STDERR, STDOUT
from mpilaunch.transport.base import HostResult, Link, Transport, close_and_wait, host_problems, transport_class
from mpilaunch.transport.local import LocalTransport, raise_fd_limit

TREE_WIDTH = 32  # tree spawn by default above this many remote hosts (--ssh-tree-width 0: never)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.launcher.loop.controller import Controller


def check_local_programs(plan: LaunchPlan, env: Mapping[str, str], host: int) -> dict[str, str]:
    """A missing program or directory is a clear error before anything starts; the MPI each
    program is linked with, when the job's PMI depends on it (see choose_mpi)."""
    path = inherited(env).get("PATH", os.defpath)
    refuse = refuses_open_mpi(plan.options)
    families: dict[str, str] = {}
    for check in host_checks(plan.job, host):
        problem = program_problem(check["program"], check["wdir"], check["path"] or path, refuse)
        if problem:
            raise LaunchError(problem)
        found = program_family(check["program"], check["wdir"], check["path"] or path)
        if found is not None and asks_families(plan.options):
            families[check["program"]] = " ".join(found)
    return families


def local_torch_releases(plan: LaunchPlan, env: Mapping[str, str], host: int) -> dict[str, str]:
    """The torch each of a torchrun job's programs would import on this machine (none for
    another job): what the ranks' store is to speak (plan/finalize.own_store)."""
    if plan.options.torch is None:
        return {}
    from mpilaunch.host.torch_release import torch_release

    path = inherited(env).get("PATH", os.defpath)
    checks = host_checks(plan.job, host)
    found = {c["program"]: torch_release(c["program"], c["wdir"], c["path"] or path) for c in checks}
    return {program: release for program, release in found.items() if release is not None}


def remote_transport(options: Options, hosts: int) -> Transport:
    """The transport that starts the agents of this many remote hosts: --ssh-client's, behind
    relays with --ssh-tree-width when there are more hosts than that."""
    from mpilaunch.transport.sshcommon import SshOptions, ssh_client  # a local job never needs them

    ssh = SshOptions(
        config=options.ssh_config, accept_new=options.ssh_accept_new, command=options.rsh_agent, extra=options.rsh_args
    )
    if options.launcher in ENGINES:
        return transport_class(options.launcher)(ssh)  # type: ignore[call-arg]
    client = ssh_client(options.ssh_client)
    if options.rsh_agent or options.rsh_args:  # a command line of the user's: only a command can take it
        if options.ssh_client == "paramiko":
            raise LaunchError("plm_rsh_agent/plm_rsh_args (-bootstrap-exec/-exec-args) need --ssh-client openssh")
        client = "openssh"
    transport = transport_class(client)(ssh)  # type: ignore[call-arg]
    width = tree_width(options, hosts)
    if width:
        return transport_class("tree")(transport, ssh, width)  # type: ignore[call-arg]
    return transport


def tree_width(options: Options, hosts: int) -> int:
    """The tree's width for this many remote hosts, 0 for none: --ssh-tree-width's (0 turns it
    off), else TREE_WIDTH above that many hosts, as Open MPI tree-spawns by default: past 32
    hosts the bed starts faster through 32 heads, with a fraction of the launcher's CPU and
    memory (docs/performance.md, "Hundreds of hosts")."""
    width = TREE_WIDTH if options.ssh_tree_width is None else options.ssh_tree_width
    return width if width and hosts > width else 0


def agent_checks(plan: LaunchPlan, job: JobPlan, port_on: int | None) -> Callable[[int], bytes]:
    """Each remote host's Check for job: its programs, the launcher's search paths, the probe,
    and on host port_on a free port for MASTER_PORT."""
    options = plan.options
    carried = carried_environment(dict(plan.launcher_env))
    if options.prefix:  # Open MPI's --prefix: its bin and lib first on every remote host
        carried.update(prefixed_paths(options.prefix, carried))
    probe = devices.probe_request(options.devices_per_rank, options.rank_table, plan.launcher_env, plan.exports)

    def check(index: int) -> bytes:
        return encode(
            Check(
                apps=tuple(AppCheck(**app) for app in host_checks(job, index)),
                carried=carried,
                mpi=refuses_open_mpi(options),
                port=0 if index == port_on else -1,
                heartbeat=plan.heartbeat,
                probe=Probe(**probe),
                families=asks_families(options),
                torch=options.torch is not None,
            )
        )

    return check


def start_remote_agents(plan: LaunchPlan, remote: list[int]) -> tuple[dict[int, Link], dict[int, HostResult]]:
    """One agent on every remote host, each checked before anything starts (the agent checks the
    programs, answers the probe and, on rank 0's host, finds a free port for MASTER_PORT)."""
    rank0 = plan.job.ranks[0].host
    pick_port = rank0 in remote and user_port(plan.options, plan.launcher_env) is None
    results = start_checked_agents(plan, plan.job, remote, rank0 if pick_port else None)
    links = {i: r.link for i, r in results.items() if r.link is not None}
    problems = host_problems(results, lambda index: plan.hosts[index].name)
    if problems:
        close_and_wait(links.values())  # an agent's ssh or srun may not outlive the launcher
        raise LaunchError("\nmpilaunch: ".join(problems))  # one line per problem, in host order
    return links, results


def start_checked_agents(
    plan: LaunchPlan, job: JobPlan, hosts: list[int], port_on: int | None = None
) -> dict[int, HostResult]:
    """Agents on these remote hosts, each checked for job (agent_checks): job 1's, and those of
    the hosts of a spawned job that have none yet (no rank of job 1 runs there), by the same transport."""
    from mpilaunch.launcher.start.greeting import start_agents  # remote hosts only

    transport = remote_transport(plan.options, len(hosts))
    checks = agent_checks(plan, job, port_on)
    return start_agents(transport, {i: plan.hosts[i] for i in hosts}, checks, window(plan.options, len(hosts)))


def window(options: Options, hosts: int) -> int | None:
    """How many hosts' connections are set up at once: --ssh-concurrent (WINDOW by default);
    all at once behind relays (tree spawn bounds each one's own) and under Slurm or Grid Engine,
    whose one step or job starts them."""
    if options.launcher in ENGINES or tree_width(options, hosts):
        return None
    from mpilaunch.launcher.start.greeting import WINDOW

    return options.ssh_concurrent or WINDOW


def remote_facts(plan: LaunchPlan, links: Mapping[int, Link], results: Mapping[int, HostResult]) -> Facts:
    """What the remote hosts said of themselves, with this machine's facts: where each host was
    reached, MASTER_ADDR the address rank 0's host was reached at (or this machine's as the
    hosts see it), MASTER_PORT a port free there."""
    rank0 = plan.job.ranks[0].host
    ours = next((link.local_address for link in links.values() if link.local_address), "")
    info = {i: {**h, "address": ours or h.get("address", "")} for i, h in plan.host_info.items()}
    families: dict[int, dict[str, str]] = {}
    releases: dict[int, dict[str, str]] = {}
    for index, link in links.items():  # what each host found out about itself, and where it was reached
        reply = results[index].reply
        info[index] = {"cpus": link.hello.cpus if link.hello else None, **((reply.info if reply else None) or {})}
        families[index] = dict((reply.families if reply else None) or {})  # which MPI each program is linked with
        if families[index]:
            info[index]["families"] = families[index]
        releases[index] = dict((reply.torch if reply else None) or {})  # the torch each program would import
        info[index]["address"] = link.peer
    master = None
    if rank0 in links:
        picked = user_port(plan.options, plan.launcher_env) is None
        port = results[rank0].reply.port if picked else plan.master[1]  # type: ignore[union-attr]
        master = (links[rank0].peer, port)
    elif ours:
        master = (ours, plan.master[1])
    torch = plan.options.torch
    if master is not None and torch is not None and torch.master_addr:  # torchrun's --master-addr is the ranks'
        master = (torch.master_addr, master[1])
    return Facts(host_info=info, families=families, master=master, torch=releases)


def rank_table(plan: LaunchPlan) -> tuple[str, list[str]]:
    """The rank table's text for this plan, and notes on what HCCL may not accept."""
    job = plan.job
    from mpilaunch.plan.ranktable import format_rank_table, job_rank_table  # only with --rank-table

    table, notes = job_rank_table(
        job.ranks,
        plan.hosts,
        plan.host_info,
        per_rank=plan.options.devices_per_rank,
        launcher_env=plan.launcher_env,
        exports=plan.exports,
    )
    return format_rank_table(table), notes


def write_rank_table(plan: LaunchPlan, links: Mapping[int, Link]) -> None:
    """--rank-table: the file here, and at the same path on every remote host (by its agent), so
    each rank finds its RANK_TABLE_FILE; status 2 when a host cannot write it."""
    from mpilaunch.host.files import write_file
    from mpilaunch.launcher.start.gather import gather

    path = plan.options.rank_table
    assert path is not None
    text, notes = rank_table(plan)
    error = write_file(path, text)
    if error:
        raise LaunchError(f"--rank-table: {error}")
    remote = {i: link for i, link in sorted(links.items()) if not link.local}
    for link in remote.values():
        link.send(encode(Put(path=path, data=text)))
    problems = []
    replies = gather(remote, PutDone, max(10.0, plan.heartbeat)) if remote else {}
    for index in remote:
        reply = replies.get(index)
        if reply is None or reply.error:  # type: ignore[attr-defined]
            why = reply.error if reply else "no answer from its agent"  # type: ignore[attr-defined]
            problems.append(f"{plan.hosts[index].name}: --rank-table: {why}")
    if problems:
        raise LaunchError("\nmpilaunch: ".join(problems))
    servers = len({r.host for r in plan.job.ranks})
    what = f"{servers} server{'s' if servers > 1 else ''}, {len(plan.job.ranks)} devices"
    where = f" (and on {', '.join(plan.hosts[i].name for i in remote)})" if remote else ""
    say(plan.options, f"rank table ({what}) written to {path}{where}")
    for note in notes:
        say(plan.options, f"rank table: {note}")


def run_job(spec: JobSpec, here: LocalTransport | None = None) -> int:
    """The run: its attempts (the whole job started again after a failure, --max-restarts), each
    planned, probed, finalized and run; the exit status is the last attempt's. here: this
    machine's agents (one may be forked already: entry.main)."""
    here = LocalTransport() if here is None else here
    options = spec.options
    torch = options.torch
    if torch is not None and torch.to_files and options.output_filename is None and not options.dry_run:
        import tempfile  # torchrun's --redirects and --tee without --log-dir: files in a temp dir, as its

        options = options._replace(output_filename=tempfile.mkdtemp(prefix="mpilaunch-logs-"))
        spec = spec._replace(options=options)
    LEAVES_WITH[:] = [1] if torch is not None else []  # a signal between attempts: torchrun's status
    grows = torch is not None and torch.endpoint is not None and 0 < torch.min_nodes < (torch.nnodes or 0)
    earlier: list[dict[str, object]] | None = [] if options.max_restarts or grows else None  # late nodes restart
    turn = Turn()
    while True:
        ended = run_attempt(spec, turn, earlier, here)
        turn = turn._replace(start=turn.start + 1, round=None if ended.round is None else ended.round + 1)
        if ended.regroup:  # a late node: the ranks start again with it at once, not counted (torchrun's way)
            here.prestart()
            continue
        status, restarts = ended.status, turn.restarts
        if status in (0, None) or ended.stopped or restarts >= options.max_restarts:
            return status or 0
        delay = options.restart_delay
        say(
            options,
            f"attempt {restarts} ended with status {status}: the job starts again in {delay:g} s "
            f"(attempt {restarts + 1} of {options.max_restarts + 1})",
        )
        here.prestart()  # the next attempt's agent sets itself up during the delay
        time.sleep(delay)  # Ctrl-C or SIGTERM meanwhile leaves at once, as before a run (entry.main)
        turn = turn._replace(restarts=restarts + 1)


class Turn(Record):
    """Which start of the ranks an attempt is."""

    start: int = 0  # this launcher's starts before it: its log tree DIR/attempt.K (else the meeting's round)
    restarts: int = 0  # the restarts --max-restarts counted (TORCHELASTIC_RESTART_COUNT)
    round: int | None = None  # the nodes' meeting's (torchrun's way); None, the first: the store's current


class Ended(Record):
    """How an attempt ended: its status (None: a dry run), whether the user stopped it (no
    restart then), whether the nodes meet again for a late node, and its meeting's round."""

    status: int | None
    stopped: bool
    regroup: bool = False
    round: int | None = None


def spec_for_attempt(spec: JobSpec, attempt: int) -> JobSpec:
    """An attempt after the first writes its log tree under DIR/attempt.K (the first: DIR itself,
    Open MPI's DIR/1/rank.N)."""
    tree = spec.options.output_filename
    if not attempt or tree is None:
        return spec
    base, nocopy = (tree[: -len(":nocopy")], ":nocopy") if tree.endswith(":nocopy") else (tree, "")
    tree = os.path.join(base, f"attempt.{attempt}") + nocopy
    return spec._replace(options=spec.options._replace(output_filename=tree))


def run_attempt(spec: JobSpec, turn: Turn, earlier: list[dict[str, object]] | None, here: LocalTransport) -> Ended:
    """One attempt of the run, and how it ended."""
    options = spec.options
    attempt = turn.restarts
    plan = None
    meeting = None
    torch = options.torch
    try:
        if torch is not None and torch.endpoint is not None and not options.dry_run:  # one launcher per node
            from mpilaunch.launcher.meeting.rendezvous import NodeRendezvous

            meeting = NodeRendezvous(torch, turn.round, say=lambda note: say(options, note))
            meeting.join()  # every node's launcher is there before any rank starts
            if torch.node_rank is None:  # c10d's meeting numbered the nodes
                torch = torch._replace(node_rank=meeting.node, nnodes=meeting.nodes)
                spec = spec._replace(options=options._replace(torch=torch))
        elif torch is not None and torch.endpoint is not None and torch.node_rank is None:
            if not turn.start:
                say(options, f"the nodes' meeting numbers them: shown as node 0 of {torch.nnodes}")
            spec = spec._replace(options=options._replace(torch=torch._replace(node_rank=0)))
        spec = spec_for_attempt(spec, turn.start if meeting is None else meeting.attempt)  # the nodes' round: one tree
        plan, source = build_plan(spec, os.environ, ThisMachine(), attempt=attempt)
        if not turn.start:
            for note in plan.notes:
                say(options, note)
            if options.dry_run or options.display_map or options.display_allocation or options.print_rank_map:
                show_plan(plan, source)
        if options.dry_run:
            return Ended(None, True)
        controller = execute(plan, notes=not turn.start, here=here)
    except LaunchError as exc:
        if meeting is not None:
            meeting.finish(exc.status)
        if options.report_json:  # a CI system reads why the job never started, not only its status
            from mpilaunch.launcher.report.json_report import write_refused

            write_refused(options.report_json, plan, launcher_command(), exc)
        raise
    if meeting is not None:
        policy = controller.policy

        def ended_elsewhere(why: str) -> None:
            say(options, f"{why}: this node's ranks are stopped")
            policy.handle(NodesEnded(why))

        def regroup(line: str) -> None:
            policy.handle(NodesRegroup(line))
            if policy.regroup == line:  # its ranks all ran: they start again with the late node
                say(options, line)

        meeting.watch_from(controller.sel, ended_elsewhere, regroup)
    report = None
    if options.report_json:
        from mpilaunch.launcher.report.json_report import JsonReport

        report = JsonReport(
            options.report_json,
            plan,
            controller.policy,
            controller.jobs,
            controller.output,
            launcher_command(),
            earlier,
            controller.stacks.taken,
        )
        controller.events.subscribe(report)
    policy = controller.policy
    try:
        status = controller.run()
    finally:
        stopped = policy.stop_signal is not None or policy.timed_out
        if meeting is not None:  # every node hears how this one ended; one that stops stops them all
            stopped = meeting.finish(policy.exit_status(), stopped or attempt >= options.max_restarts) or stopped
    if meeting is not None and meeting.elsewhere and not status:  # this node's ranks ended well, another's not
        say(options, f"{meeting.elsewhere}: the job failed")
        status = 1
    if report is not None and report.lost and not status:  # the ranks did well, but a CI reads no report
        status, stopped = 2, True  # not run again for it: the ranks' work is done
    if earlier is not None and report is not None and report.last is not None:
        earlier.append(report.last)
    if meeting is None:
        return Ended(status, stopped)
    return Ended(status, stopped, meeting.regroup, meeting.attempt)  # regroup: no failure, no signal anywhere


def launcher_command() -> list[str]:
    return ["mpilaunch", *sys.argv[1:]]


def show_plan(plan: LaunchPlan, source: str) -> None:
    """--display-allocation, --display-map, -print-rank-map and --dry-run: the hosts, the map, and
    (dry run) every rank's variables and the rank table."""
    from mpilaunch.launcher.report.report_text import allocation, dry_run_env, hydra_rank_map, rank_map

    options = plan.options
    job = plan.job
    ranks = job.named_ranks
    if options.display_allocation:
        print(allocation(plan.hosts), flush=True)
    if options.print_rank_map:
        print(hydra_rank_map(plan.hosts, ranks), flush=True)
    if options.display_map or options.dry_run:
        print(rank_map(plan.hosts, ranks, job.argvs, source), flush=True)
    if options.dry_run:
        print(dry_run_env(ranks, plan.hosts, job.rank_envs()), flush=True)
        if plan.options.rank_table:
            text, _ = rank_table(plan)
            print(f"rank table for {plan.options.rank_table} (not written in a dry run):\n{text}", end="", flush=True)


def pattern_places(plan: LaunchPlan) -> list[tuple[str, int]]:
    """hydra's %h and %p of each rank: its host's name, and that host's place among the job's."""
    used = {host: place for place, host in enumerate(sorted({r.host for r in plan.job.ranks}))}
    return [(plan.hosts[r.host].name, used[r.host]) for r in plan.job.ranks]


def open_output(plan: LaunchPlan, host_tags: bool) -> OutputSink:
    """The console copy and the log tree DIR/1/rank.N (Open MPI's `DIR:nocopy`: files only)."""
    options = plan.options
    log_dir, copy_to_console = options.output_filename, True  # an empty one is refused by LogTree, not ignored
    if log_dir is not None and log_dir.endswith(":nocopy"):
        log_dir, copy_to_console = log_dir[: -len(":nocopy")], False
    torch = options.torch
    console = None
    if copy_to_console:
        console = Console(options.tag_output or host_tags, options.timestamp_output, rank_label=options.prepend_rank)
        if host_tags:
            console.host_tags = {r.rank: plan.hosts[r.host].name for r in plan.job.ranks}
    sink = OutputSink(console, log_dir, options.merge_stderr_to_stdout, owner=plan.job_id)
    patterns = {s: p for s, p in ((STDOUT, options.outfile_pattern), (STDERR, options.errfile_pattern)) if p}
    labelled = console is not None and options.prepend_pattern is not None  # hydra's, on each console line
    if patterns or labelled:
        from mpilaunch.launcher.output.pattern_files import PatternFiles, expand_pattern  # hydra's patterns only

        places = pattern_places(plan)
        if patterns:
            sink.patterns = PatternFiles(patterns, places, sink.same)  # refused before the log tree is emptied
        if labelled:
            for rank, (host, proxy) in enumerate(places):
                label = expand_pattern(options.prepend_pattern, rank, host, 1, proxy).encode("utf-8", "surrogateescape")
                console.line_labels.update({(rank, STDOUT): label, (rank, STDERR): label})
    if torch is not None:  # torchrun's streams kept off the console, and its label on each line of a tee'd one
        for r in plan.job.ranks:
            for stream, mask in ((STDOUT, 1), (STDERR, 2)):
                if not torch.on_console(r.local_rank) & mask:
                    sink.off_console.add((r.rank, stream))
                label = torch.console_label(r.local_rank, mask)
                if label and console is not None:
                    console.line_labels[(r.rank, stream)] = label.encode("utf-8", "surrogateescape")
    try:
        root = sink.add_job(1, list(range(len(plan.job.ranks))), plan.job.first, plan.job.world)
    except BaseException:
        sink.unlock()
        raise
    if sink.patterns is not None:
        sink.patterns.start()  # every file is the job's own: the old output goes
    if root:
        say(options, f"rank output goes to {root}/rank.N")
    return sink


def say(options: Options, note: str) -> None:
    """One of mpilaunch's own notes on stderr, unless it is empty or -q asked for none."""
    if note and not options.quiet:
        try:
            sys.stderr.write(f"mpilaunch: {note}\n")  # one write: the line stays whole beside the ranks' output
            sys.stderr.flush()
        except BrokenPipeError:  # the console went away (`| head -1`): the job runs on, as with its ranks' output
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)


def probe(plan: LaunchPlan, here: LocalTransport) -> tuple[dict[int, Link], Facts]:
    """Check what can be checked here, start every host's agent (this machine's first, forked
    before any SSH connection exists, so it holds none of them), and gather what each host said
    of itself: the links, and the facts that finalize the plan."""
    job = plan.job
    remote = remote_hosts(plan.options, plan.hosts, job.ranks)
    local = sorted({r.host for r in job.ranks} - set(remote))
    families = {index: check_local_programs(plan, plan.launcher_env, index) for index in local}
    releases = {index: local_torch_releases(plan, plan.launcher_env, index) for index in local}
    raise_fd_limit()
    if not local:
        here.discard(wait=False)  # forked at start-up in case the job had local ranks; it has none
    if not remote:
        return {}, Facts(host_info=dict(plan.host_info), families=families, torch=releases)
    links: dict[int, Link] = {}
    if local:  # the first (forked early) now; any other this machine runs (--launcher local) with the launch
        links[local[0]] = here.agent()
    try:
        remote_links, results = start_remote_agents(plan, remote)
    except BaseException:
        close_and_wait(links.values())
        raise
    links.update(remote_links)
    here.discard()  # reaps the early agent told to stop above: it has left by now
    facts = remote_facts(plan, remote_links, results)
    return links, facts._replace(families={**families, **facts.families}, torch={**releases, **facts.torch})


def execute(
    plan: LaunchPlan, host_tags: bool = False, notes: bool = True, here: LocalTransport | None = None
) -> Controller:
    """Plan, probe, finalize, run: the agents started and checked, the plan finished with what
    the hosts said, the output opened, job 1's ranks started: a controller ready to run."""
    here = LocalTransport() if here is None else here  # this machine's agents
    links, facts = probe(plan, here)
    try:
        final = finalize(plan, facts)
        plan = final.plan
        if plan.options.rank_table:
            write_rank_table(plan, links)
        sink = open_output(plan, host_tags)  # only once every host passed its checks: a refused job leaves no files
    except BaseException:
        close_and_wait(links.values())
        raise
    for note in final.notes if notes else ():  # said once in a run, not again for each restart
        say(plan.options, note)
    # Job 1's ranks start now, and the controller's modules are imported while they do: what the
    # agents answer, and any signal, waits (in the links, in the signal pipe) until the controller reads it.
    from mpilaunch.launcher.loop.signals import SignalPipe

    signals = SignalPipe()
    try:
        signals.catch()
        links.update({index: here.agent() for index in final.launches if index not in links})
        for index, launch in final.launches.items():
            try:
                links[index].send(encode(launch))
            except OSError:  # the agent is gone (a limit stopped it): the controller reads its end, and why
                pass
        from mpilaunch.launcher.loop.controller import Controller

        return Controller(
            plan, sink, links, summary=not host_tags, launched=True, agents=here.agent,
            remote_agents=functools.partial(start_checked_agents, plan), signals=signals,
        )  # fmt: skip
    except BaseException:
        signals.release()
        close_and_wait(links.values())
        raise
