"""What this host does for the launcher before and as a job's ranks start: it answers the
launcher's Check (programs, a port, the host's facts) and starts each Launch's ranks, with
their variables, CPU bindings and the job's services, behind one gate.

The host's environment the ranks start from is kept here: a remote host's is merged with the
launcher's search paths at its Check. Stdlib only: shipped with the agent.
"""

from __future__ import annotations

import os

from mpilaunch.host import hostinfo, spawn
from mpilaunch.host.binding import cpu_groups, cpus_for, domains
from mpilaunch.host.binding import report as binding_report
from mpilaunch.host.programs import merge_host_environment, probe_port, program_family, program_problem
from mpilaunch.protocol.messages import Check, Checked, Launch, Note

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.ranks import Ranks
    from mpilaunch.agent.services.base import Services
    from mpilaunch.agent.torch_support import TorchSupport
    from mpilaunch.protocol.record import Record

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # torch's @record writes a rank's exception there, unless the job names it


class Launches:
    def __init__(
        self, ranks: Ranks, services: Services, torch: TorchSupport, send: Callable[[Record], None], host: str
    ) -> None:
        self.ranks = ranks
        self.services = services
        self.torch = torch  # error files; torchrun's agent store
        self.send = send
        self.host = host
        self.host_env: dict[str, str] = dict(os.environ)

    def check(self, message: Check) -> Checked:
        """Before anything starts: take the launcher's paths, and say whether each program and
        directory exists here, whether a MASTER_PORT is free (or pick one), and what the job
        asks about this host (CPUs, GPUs, device IPs: hostinfo.probe)."""
        self.host_env = merge_host_environment(dict(os.environ), message.carried)
        path = self.host_env.get("PATH", os.defpath)
        problems = []
        families: dict[str, str] | None = {} if message.families else None
        releases: dict[str, str] | None = {} if message.torch else None
        if releases is not None:
            from mpilaunch.host.torch_release import torch_release  # a torch job's only (reads mpi_family's paths)
        for app in message.apps:
            where = app.path or path
            problem = program_problem(app.program, app.wdir, where, message.mpi)
            if problem and problem not in problems:
                problems.append(problem)
            found = program_family(app.program, app.wdir, where) if families is not None and not problem else None
            if found is not None:
                families[app.program] = " ".join(found)  # type: ignore[index]
            release = torch_release(app.program, app.wdir, where) if releases is not None and not problem else None
            if release is not None:
                releases[app.program] = release  # type: ignore[index]
        port, port_free = message.port, None
        if port >= 0:
            port, port_free = probe_port(port)
        info = hostinfo.probe(message.probe.gpus, message.probe.hccn, path) if message.probe is not None else None
        return Checked(problems=problems, port=port, port_free=port_free, info=info, families=families, torch=releases)

    def launch(self, message: Launch) -> None:
        drop_names, drop_prefixes = set(message.drop_names), tuple(message.drop_prefixes)
        base = {k: v for k, v in self.host_env.items() if k not in drop_names and not k.startswith(drop_prefixes)}
        if message.store_port:
            self.torch.serve_store(message.store_port, message.store_host)
        services = self.services.start_job(message)
        level = message.bind_to
        groups = domains(len(message.ranks)) if level == "auto" else cpu_groups(level) if level != "none" else []
        gate = spawn.Gate()  # the ranks of this launch start together, once all are spawned
        started = 0
        found: dict[tuple[str, str | None], str] = {}  # their programs, looked up once per PATH
        try:
            for spec in message.ranks:
                cpus = cpus_for(level, spec.local_rank, groups, message.cpus_per_rank)
                if message.report_bindings:  # in Open MPI's words
                    self.send(Note(text=f"[{self.host}:{os.getpid()}] MCW rank {spec.rank} {binding_report(cpus)}"))
                env = {**base, **message.env, **spec.env}
                if ERROR_FILE not in spec.env and ERROR_FILE not in message.env:
                    env[ERROR_FILE] = self.torch.error_file(message.job, spec.rank)
                started += self.ranks.spawn(message.job, spec, env, message.merge, cpus, gate, services, found)
        finally:
            gate.release(started)
