"""Per-host commands: `mpilaunch check` (can every host run the job?) and `mpilaunch allrun`
(one command once per host, e.g. a `pip install` on every machine)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from mpilaunch.host.programs import carried_environment, probe_port, program_problem
from mpilaunch.plan import hosts as hostlib
from mpilaunch.plan.build import resolve_hosts
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.spec import AppContext, JobSpec, Options
from mpilaunch.protocol.messages import AppCheck, Check, encode
from mpilaunch.transport.base import STAGES, HostResult, close_and_wait
from mpilaunch.transport.sshcommon import SshOptions

COLUMNS = ("HOST", "ADDRESS", "RESOLVE", "CONNECT", "HOST KEY", "AUTH", "PYTHON", "PROGRAM", "PORT")


@dataclass
class CheckRow:
    host: str
    address: str = "-"
    cells: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def _local_row(host: Host, program: str | None, wdir: str, port: int) -> CheckRow:
    problems = []
    program_cell = "-"
    if program:
        problem = program_problem(program, wdir, os.environ.get("PATH", os.defpath), False)
        program_cell = "FAIL" if problem else "ok"
        if problem:
            problems.append(problem)
    _, free = probe_port(port)
    if not free:
        problems.append(f"port {port} is in use")
    python = ".".join(map(str, sys.version_info[:3]))
    cells = ("local", "-", "-", "-", python, program_cell, port_cell(port, free))
    return CheckRow(host.name, "this machine", cells, tuple(problems))


def step_cells(stage: str) -> tuple[str, ...]:
    """RESOLVE, CONNECT, HOST KEY, AUTH and PYTHON (the agent) of a host whose start failed at
    stage: the steps before it `ok` (passed: the transport got beyond them), it `FAIL`, the
    steps after it `-` (not run). A failure at no known step (ssh said nothing that names one)
    shows `?` for each SSH step: none of them is known to have passed."""
    if stage not in STAGES:
        return ("?",) * (len(STAGES) - 1) + ("-",)
    failed = STAGES.index(stage)
    return tuple("ok" if i < failed else "FAIL" if i == failed else "-" for i in range(len(STAGES)))


def _remote_row(host: Host, result: HostResult, port: int, program: str | None) -> CheckRow:
    address = result.address
    if result.error is not None:
        cells = step_cells(result.error.stage)
        return CheckRow(host.name, address, (*cells, "-", "-"), (str(result.error),))
    reply = result.reply
    hello = result.link.hello if result.link is not None else None
    python = hello.python if hello is not None else "?"
    problems = tuple(reply.problems) if reply is not None else ()
    free = bool(reply.port_free) if reply is not None else False
    program_cell = ("FAIL" if problems else "ok") if program else "-"
    cells = ("ok", "ok", "ok", "ok", python, program_cell, port_cell(port, free))
    if not free:
        problems += (f"port {port} is in use",)
    return CheckRow(host.name, address, cells, problems)


def port_cell(port: int, free: bool) -> str:
    if port == 0:
        return "auto" if free else "NONE FREE"
    return "free" if free else "IN USE"


def check_table(rows: list[CheckRow]) -> str:
    table = [COLUMNS] + [(r.host, r.address, *r.cells) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    for row in rows:
        lines.extend(f"{row.host}: {problem}" for problem in row.problems)
    return "\n".join(lines)


def run_check(options: Options, program: str | None, port: int | None) -> int:
    """A preflight table, one row per host; status 1 when any host fails a check."""
    from mpilaunch.launcher.start.greeting import WINDOW, start_agents
    from mpilaunch.transport.base import transport_class
    from mpilaunch.transport.sshcommon import ssh_client

    hosts, _ = resolve_hosts(options)
    if port is None:
        env_port = os.environ.get("MASTER_PORT", "")
        port = int(env_port) if env_port.isdigit() else 0  # a job picks a free one: check that it can
    wdir = os.getcwd()
    remote = {i: h for i, h in enumerate(hosts) if hostlib.needs_ssh(h)}
    carried = carried_environment(dict(os.environ))
    apps = (AppCheck(program=program, wdir=wdir),) if program else ()
    check = encode(Check(apps=apps, carried=carried, mpi=False, port=port))
    ssh = SshOptions(config=options.ssh_config, accept_new=options.ssh_accept_new)
    transport = transport_class(ssh_client(options.ssh_client))(ssh)  # type: ignore[call-arg]
    results = start_agents(transport, remote, lambda index: check, options.ssh_concurrent or WINDOW)
    try:
        transport.addresses(remote, results)
        rows = []
        for index, host in enumerate(hosts):
            if index in results:
                rows.append(_remote_row(host, results[index], port, program))
            else:
                rows.append(_local_row(host, program, wdir, port))
    finally:  # what carried each agent (an ssh client) leaves before the table is out
        close_and_wait(r.link for r in results.values())
    print(check_table(rows), flush=True)
    return 0 if all(r.ok for r in rows) else 1


def run_allrun(
    options: Options, argv: tuple[str, ...], wdir: str | None, exports: tuple[tuple[str, str | None], ...]
) -> int:
    """The command once on every host (not per slot), output tagged with the host's name, then
    each host's exit status; every host runs to its end whatever the others do."""
    from mpilaunch.launcher.report.report_text import describe_status
    from mpilaunch.launcher.start.here import ThisMachine
    from mpilaunch.launcher.start.launch import execute
    from mpilaunch.plan.build import build_plan

    hosts = [h._replace(slots=1, max_slots=None) for h in resolve_hosts(options)[0]]
    options = options._replace(map_by="slot", mpi="none", mca=(("orte_abort_on_non_zero_status", "0"),))
    spec = JobSpec((AppContext(argv, len(hosts), exports, wdir),), options)
    plan, _ = build_plan(spec, os.environ, ThisMachine(), hosts)
    controller = execute(plan, host_tags=True)
    status = controller.run()
    width = max(len(h.name) for h in hosts)
    lines = []
    for state in controller.procs:
        host = hosts[state.rank.host].name
        code = state.status
        text = "not run" if code is None else ("ok" if code == 0 else " ".join(describe_status(code).split()))
        if state.reason and code != 0:
            text += f" ({state.reason})"
        lines.append(f"{host.ljust(width)}  {text}")
    failed = sum(1 for s in controller.procs if s.status != 0)
    lines.append(f"allrun: {len(hosts) - failed} of {len(hosts)} hosts succeeded")
    print("\n".join(lines), file=sys.stderr, flush=True)
    return status
