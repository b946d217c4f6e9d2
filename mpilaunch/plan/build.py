"""Planning, before any process starts: hosts, placement and every rank's environment.

Pure functions of the JobSpec and the launcher's environment; MPI_Comm_spawn plans its new
jobs with the same code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from types import MappingProxyType

from mpilaunch.errors import LaunchError
from mpilaunch.plan import devices
from mpilaunch.plan import hosts as hostlib
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.placement import Rank, place, place_round_robin
from mpilaunch.plan.rank_env import (
    LEAK_NAMES,
    LEAK_PREFIXES,
    JobLayout,
    inherited,
    job_variables,
    prefixed_paths,
    rank_environment,
)
from mpilaunch.plan.spec import AppContext, JobSpec, Options, TorchRun
from mpilaunch.plan.wireup import BOTH, pmi_job, pmix_job, services
from mpilaunch.protocol.messages import Launch, PmiJob, PmixJob, RankSpec, SpawnApp
from mpilaunch.protocol.record import Record

# MPICH reads its PMI version from any of these (MPIR_CVAR_PMI_VERSION is the documented one).
PMI_VERSION_NAMES = ("MPIR_CVAR_PMI_VERSION", "MPIR_PARAM_PMI_VERSION", "MPICH_PMI_VERSION")


class JobPlan(Record):
    """One job: the launched one is job 1, each MPI_Comm_spawn adds one."""

    job: int
    ranks: list[Rank]
    argvs: list[tuple[str, ...]]  # per app
    wdirs: list[str]  # per app
    env: dict[str, str]  # variables every rank gets on top of its host's environment
    envs: list[dict[str, str]]  # per rank: its own variables on top of env
    pmi: PmiJob | None = None  # what agents need to serve this job PMI, or None (--mpi none)
    services: tuple[str, ...] = ()  # the agent services its ranks get (plan/wireup.services)
    pmix: PmixJob | None = None  # what each host's PMIx server registers (--mpi pmix)
    first: int = 0  # one launcher per node (torchrun's --node-rank): the job-wide rank of ranks[0]
    world: int = 0  # ... of a job this many ranks large (0: these ranks are the job)

    def rank_env(self, index: int) -> dict[str, str]:
        """One rank's variables, whole: the job's and its own."""
        return {**self.env, **self.envs[index]}

    def rank_envs(self) -> Iterator[dict[str, str]]:
        """Every rank's variables, whole, in rank order, made one at a time."""
        return map(self.rank_env, range(len(self.ranks)))

    @property
    def named_ranks(self) -> list[Rank]:
        """The ranks as people see them: numbered job-wide (a node's ranks shifted by first)."""
        return [r._replace(rank=r.rank + self.first) for r in self.ranks] if self.first else self.ranks


class LaunchPlan(Record):
    """Everything the controller needs, computed before any process starts."""

    hosts: list[Host]
    job: JobPlan
    stdin_ranks: list[int]
    options: Options
    job_id: str = ""
    master: tuple[str, int] = ("127.0.0.1", 0)
    exports: tuple[tuple[str, str | None], ...] = ()
    app_exports: tuple[tuple[tuple[str, str | None], ...], ...] = ()  # by app, when hydra's -env makes them differ
    intel_mpi: bool = False  # a program (or a Python's mpi4py) loads Intel MPI: its launcher's defaults apply
    launcher_env: Mapping[str, str] = MappingProxyType({})
    heartbeat: float = 30.0  # seconds of silence on a remote link before its host counts as lost
    host_info: Mapping[int, dict] = MappingProxyType({})  # hostinfo.probe answers (+ "address"), by host index
    notes: tuple[str, ...] = ()  # said once before the job starts (unless -q)
    may_oversubscribe: bool = False  # --oversubscribe, hydra's placement, or this machine alone: spawns too
    attempt: int = 0  # restarts of the run before this plan's job (--max-restarts)
    sockets: int = 1  # of each host, for ppr:N:socket (this machine's)


def resolve_hosts(options: Options, env: Mapping[str, str] | None = None) -> tuple[list[Host], str]:
    """The job's hosts and where they came from; -H restricts a hostfile to the hosts it names.
    With neither, an allocation in env (MLP_MPI_*, Slurm, PBS, LSF; see hostsources), else localhost."""
    listed = [h for value in options.hosts for h in hostlib.parse_host_list(value)]
    if options.hostfile:
        from_file = hostlib.read_hostfile(options.hostfile)
        if not listed:
            return hostlib.merge_local_aliases(from_file), f"hostfile {options.hostfile}"
        names = {h.name for h in from_file}
        for host in listed:
            if host.name not in names:
                raise LaunchError(f"-H names {host.name!r}, which is not in the hostfile {options.hostfile}")
        counts = {h.name: h.slots or 1 for h in hostlib.merge_hosts(listed)}  # -H's counts win, up to max_slots
        chosen = [
            h._replace(slots=min(counts[h.name], h.max_slots or counts[h.name])) for h in from_file if h.name in counts
        ]
        return hostlib.merge_local_aliases(chosen), f"hostfile {options.hostfile} restricted by -H"
    if listed:
        return hostlib.merge_local_aliases(hostlib.merge_hosts(listed)), "-H"
    env = os.environ if env is None else env
    if any(env.get(name) for name in hostlib.ENVIRONMENT_SOURCES):
        from mpilaunch.plan.hostsources import from_environment

        found = from_environment(env)
        if found is not None:
            return hostlib.merge_local_aliases(found[0]), found[1]
    return [Host("localhost", os.cpu_count() or 1)], LOCAL_SOURCE


LOCAL_SOURCE = "localhost (no hosts given)"


LOCAL_LAUNCHERS = ("local", "fork")  # --launcher values that start every host's agent on this machine


ENGINES = ("slurm", "sge")  # --launcher values whose transport is the batch system's own (srun, qrsh)
FALSE_WORDS = ("0", "no", "false", "off", "disabled")


def over_ssh(options: Options, host: Host) -> bool:
    """Started by a transport (SSH, or Slurm's srun for every host, this one too, so that all
    ranks run in the job step; Grid Engine's qrsh for the other hosts): a host that is not this
    machine, unless --launcher local starts every host's agent here (hydra's fork launcher:
    several agents on one machine)."""
    if options.launcher == "slurm":  # in a step already (a batch script): this node's agent is forked here
        return not (options.in_slurm_step and not hostlib.needs_ssh(host))
    if options.launcher == "sge":  # this machine's agent is forked, as mpirun's and hydra's are, unless asked
        return options.engine_starts_here or hostlib.needs_ssh(host)
    return options.launcher not in LOCAL_LAUNCHERS and hostlib.needs_ssh(host)


def in_slurm_allocation(env: Mapping[str, str], source: str) -> bool:
    """--launcher auto picks Slurm inside an allocation whose hosts the job uses."""
    return bool(env.get("SLURM_JOB_ID")) and source.startswith("Slurm allocation")


def in_sge_job(env: Mapping[str, str], source: str) -> bool:
    """--launcher auto picks Grid Engine inside a parallel job whose hosts (PE_HOSTFILE) the job uses."""
    return bool(env.get("JOB_ID") and env.get("SGE_ROOT")) and source.startswith("Grid Engine")


def engine_starts_here(options: Options, env: Mapping[str, str]) -> bool:
    """This machine's agent started by the engine too (qrsh), in the words peers' users know:
    hydra's HYDRA_LAUNCHER_AUTOFORK=0, Open MPI's ras_base_launch_orted_on_hn (-mca or its
    OMPI_MCA_ variable). The -mca setting wins over the variable; the last one given wins."""
    if env.get("HYDRA_LAUNCHER_AUTOFORK", "").strip().lower() in FALSE_WORDS:
        return True
    value = options.mca_setting("ras_base_launch_orted_on_hn", env.get("OMPI_MCA_ras_base_launch_orted_on_hn", ""))
    return bool(value) and value not in FALSE_WORDS


def with_slots(hosts: list[Host], source: str, options: Options) -> list[Host]:
    """Fill in core counts for hosts listed without slots (only known here for this machine).
    A remote host's CPUs come in its agent's Hello, after placement: its count must be given."""
    unknown = [h.name for h in hosts if h.slots is None and over_ssh(options, h)]
    if unknown:
        raise LaunchError(f"{source}: no slot count for remote host {unknown[0]!r}; give one with slots=N or host:N")
    return hostlib.with_core_counts(hosts, {h.name: os.cpu_count() or 1 for h in hosts})


def torchrun_slots(hosts: list[Host], per_node: int) -> list[Host]:
    """torchrun has no slots: under its words every host takes --nproc-per-node ranks, whatever
    -H, a hostfile or the allocation says of its slots (more slots stay, unused)."""
    return [h._replace(slots=max(h.slots or 0, per_node), max_slots=None) for h in hosts]


def torchrun_nodes(torch: TorchRun, hosts: list[Host], source: str, allocated: bool) -> list[Host]:
    """torchrun's --nnodes (or --standalone) with one launcher for the job: the hosts are its
    nodes, so their count must be what it says; a job of another size would be silently wrong.
    An allocation of more hosts lends its first: this machine, then the others in its order (as
    torchrun --nnodes 1 in a batch script runs on the batch host)."""
    low, high = torch.nodes_asked
    if not high or low <= len(hosts) <= high:
        return hosts
    if allocated and len(hosts) > high:
        return sorted(hosts, key=hostlib.needs_ssh)[:high]
    said = "--standalone" if torch.standalone else f"--nnodes {low}" + (f":{high}" if high != low else "")
    if source == LOCAL_SOURCE:
        raise LaunchError(
            f"{said}: no hosts given, so this machine alone; give -H or a hostfile with {low} hosts, or a launcher "
            "on each node its --node-rank and where the nodes meet (--master-addr or --rdzv-endpoint)"
        )
    raise LaunchError(
        f"{said} with {len(hosts)} hosts from {source}: one mpilaunch starts the ranks of all its hosts, so "
        f"torchrun's nodes are those hosts; give as many hosts, or drop {said.split()[0]}"
    )


class Here:
    """What the planner asks of this machine. The launcher gives the real answers
    (launcher/start/here.py); planning itself starts no process and opens no socket."""

    def free_port(self) -> int:
        """A TCP port free here (for MASTER_PORT)."""
        raise NotImplementedError

    def facts(self, request: Mapping[str, object], path: str) -> dict:
        """This machine's answer to a probe request (devices.probe_request): see hostinfo.probe."""
        raise NotImplementedError

    def in_job_step(self) -> bool:
        """Whether this process runs inside a Slurm job step (a batch script's)."""
        return False

    def sockets(self) -> int:
        """This machine's sockets (ppr:N:socket counts them for every host: a cluster's are alike)."""
        return 1


def master_address(options: Options, hosts: list[Host], used: set[int], rank0_host: int) -> str:
    """MASTER_ADDR as planned, before any host is reached: 127.0.0.1 when every rank runs here,
    this machine's name when rank 0 runs here and others elsewhere, else rank 0's host's name.
    It is what --dry-run shows; once the agents answered, the address rank 0's host was really
    reached at (or this machine's as the hosts see it) replaces it (launch.remote_facts,
    finalize)."""
    if not over_ssh(options, hosts[rank0_host]):
        all_local = not any(over_ssh(options, hosts[i]) for i in used)
        return "127.0.0.1" if all_local else os.uname().nodename  # socket.gethostname() is uname's
    return hosts[rank0_host].name


def user_port(options: Options, env: Mapping[str, str]) -> int | None:
    """The MASTER_PORT the user chose, else None (a free one is picked on rank 0's host): under
    torchrun's words its --master-port (or endpoint), never the environment's, as torchrun."""
    torch = options.torch
    if torch is None:
        return int(env["MASTER_PORT"]) if env.get("MASTER_PORT", "").isdigit() else None
    return torch.endpoint[1] if torch.endpoint else torch.master_port or None


def remote_hosts(options: Options, hosts: list[Host], ranks: Sequence[Rank]) -> list[int]:
    """Indices of the hosts these ranks would run on that are reached over SSH."""
    return sorted(i for i in {r.host for r in ranks} if over_ssh(options, hosts[i]))


def host_checks(job: JobPlan, host: int) -> list[dict]:
    """What must exist on one host before launch: each program placed there, in its working
    directory, found on the PATH the user exported (-x PATH) or else the host's own."""
    checks = []
    for app in sorted({r.app for r in job.ranks if r.host == host}):
        rank = next(r for r in job.ranks if r.app == app and r.host == host)
        checks.append(
            {"program": job.argvs[app][0], "wdir": job.wdirs[app], "path": job.rank_env(rank.rank).get("PATH")}
        )
    return checks


def with_master(plan: LaunchPlan, master: tuple[str, int]) -> LaunchPlan:
    """Job 1 again with MASTER_ADDR/PORT known only once the hosts were reached (the address
    rank 0's host was reached at, a port free there)."""
    plan = plan._replace(master=master)
    return plan._replace(job=job_plan(plan, 1, plan.job.ranks, list(zip(plan.job.argvs, plan.job.wdirs))))


def cores_short(plan: LaunchPlan) -> str:
    """Why Open MPI's PE=M cannot be honoured (a host with fewer CPUs than its ranks times M, as
    mpirun refuses it), or ""; known once every host said how many CPUs it has."""
    per = plan.options.cpus_per_rank
    if per <= 1:
        return ""
    for index in sorted({r.host for r in plan.job.ranks}):
        count = sum(1 for r in plan.job.ranks if r.host == index)
        cpus = (plan.host_info.get(index) or {}).get("cpus") or 0
        if cpus and count * per > cpus:
            return (
                f"{plan.hosts[index].name}: {count} ranks of {per} cores each (PE={per}) need {count * per} "
                f"cores, and it has {cpus}; place fewer ranks there or give each fewer cores"
            )
    return ""


def open_mpi_binding(size: int, oversubscribed: bool) -> str:
    """mpirun's binding when none is asked for (Open MPI 4.1 and 5): a core per rank for jobs of
    2 ranks or fewer, a socket for larger ones, none on a host with more ranks than slots."""
    return "none" if oversubscribed else "core" if size <= 2 else "socket"


def serves_open_mpi(job: JobPlan) -> bool:
    """A job served PMIx alone: its ranks are Open MPI's, and get what mpirun gives them."""
    return job.pmix is not None and job.pmi is None


YIELD_NAMES = ("I_MPI_WAIT_MODE", "I_MPI_THREAD_YIELD", "I_MPI_SPIN_COUNT")  # a user's own choice of spinning


def _mpich_defaults(plan: LaunchPlan, index: int, ranks: tuple[RankSpec, ...], bind_to: str) -> tuple:
    """What Intel's mpiexec gives its ranks that changes their speed (MPICH ignores both): on a
    host with more ranks than usable CPUs, I_MPI_WAIT_MODE=1 (the ranks yield instead of
    spinning); and Intel MPI's ranks, unless --bind-to or an I_MPI_PIN variable says otherwise,
    pinned to their share of the host's CPUs ("auto", Intel's I_MPI_PIN_DOMAIN=auto)."""
    user = _user_names(plan)
    cpus = (plan.host_info.get(index) or {}).get("cpus") or 0
    if cpus and len(ranks) > cpus and not any(name in user for name in YIELD_NAMES):
        ranks = tuple(r._replace(env={**r.env, "I_MPI_WAIT_MODE": "1"}) for r in ranks)
    pinned = any(name.startswith("I_MPI_PIN") for name in user)
    if plan.intel_mpi and not plan.options.bind_to and not pinned and len(ranks) > 1:
        bind_to = "auto"
    return ranks, bind_to


def _user_names(plan: LaunchPlan) -> set[str]:
    """The variables the user set: in the launcher's environment, or exported with a value."""
    return {*plan.launcher_env, *(name for name, value in plan.exports if value is not None)}


def intel_note(plan: LaunchPlan, launches: Mapping[int, Launch]) -> str:
    """One line for what was set for Intel MPI's ranks, and how to turn it off."""
    pinned = any(launch.bind_to == "auto" for launch in launches.values())
    ours = not any(name in _user_names(plan) for name in YIELD_NAMES)
    yielding = ours and any("I_MPI_WAIT_MODE" in r.env for launch in launches.values() for r in launch.ranks)
    parts = []
    if pinned:
        parts.append("pinned as Intel's mpiexec pins them (each its share of its host's CPUs; --bind-to none: not)")
    if yielding:
        parts.append("told to yield on hosts with more ranks than CPUs (I_MPI_WAIT_MODE=1; -x I_MPI_WAIT_MODE=0: spin)")
    return "Intel MPI ranks are " + " and ".join(parts) if parts else ""


def launch_messages(
    plan: LaunchPlan, job: JobPlan, procs: Sequence[int], stdin: Collection[int], others: Sequence[PmixJob] = ()
) -> dict[int, Launch]:
    """Each host's Launch of a job, by host index. procs: the job's process ids in rank order
    (job 1's are its ranks); stdin: the process ids that get the launcher's stdin. A host's
    PMIx description says its place among the job's hosts and whether its ranks outnumber its
    slots (Open MPI ranks then yield); others: the run's other PMIx jobs, each host's server
    registers them too (MPI_Comm_spawn)."""
    options = plan.options
    used = sorted({r.host for r in job.ranks})
    launches = {}
    for node, index in enumerate(used):
        ranks = tuple(
            RankSpec(
                proc=procs[r.rank],
                rank=r.rank,
                local_rank=r.local_rank,
                app=r.app,
                argv=tuple(job.argvs[r.app]),
                wdir=job.wdirs[r.app],
                env=job.envs[r.rank],
                stdin=procs[r.rank] in stdin,
            )
            for r in job.ranks
            if r.host == index
        )
        over = len(ranks) > (plan.hosts[index].slots or 0)
        pmix = job.pmix._replace(node=node, oversubscribed=over) if job.pmix is not None else None
        bind_to = options.bind_to or (open_mpi_binding(len(job.ranks), over) if serves_open_mpi(job) else "none")
        pe = options.cpus_per_rank or 1
        if options.cpus_per_rank and not options.bind_to:  # PE=M binds to M cores (hwthreads) per rank
            bind_to = "hwthread" if options.use_hwthread_cpus else "core"
        elif options.use_hwthread_cpus and bind_to == "core":
            bind_to = "hwthread"
        if job.pmi is not None:
            ranks, bind_to = _mpich_defaults(plan, index, ranks, bind_to)
        torch = options.torch
        agent_store = torch is not None and torch.agent_store and torch.node_rank is None and job.job == 1
        launches[index] = Launch(
            store_port=plan.master[1] if agent_store and index == job.ranks[0].host else 0,
            store_host=plan.master[0] if agent_store and index == job.ranks[0].host else "",
            job=job.job,
            ranks=ranks,
            env=job.env,
            services=job.services,
            pmi=job.pmi,
            pmix=pmix,
            merge=options.merge_stderr_to_stdout,
            bind_to=bind_to,
            cpus_per_rank=pe,
            report_bindings=options.report_bindings,
            drop_prefixes=LEAK_PREFIXES,
            drop_names=tuple(sorted(LEAK_NAMES)),
            others=tuple(others) if pmix is not None else (),
        )
    return launches


def virtual_local_rank(local_rank: int, visible: str | None) -> dict[str, str]:
    """torchrun's --virtual-local-rank: LOCAL_RANK 0, and as the only GPU the rank's own (its
    local rank's entry of the launcher's CUDA_VISIBLE_DEVICES, or that number), so device 0 is it."""
    if visible is None:
        return {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": str(local_rank)}
    gpus = visible.split(",")
    if local_rank >= len(gpus):
        raise LaunchError(f"--virtual-local-rank: local rank {local_rank} has no GPU in CUDA_VISIBLE_DEVICES={visible}")
    return {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": gpus[local_rank].strip()}


def stdin_ranks(choice: str, np: int) -> list[int]:
    if choice == "none":
        return []
    if choice == "all":
        return list(range(np))
    rank = int(choice)
    if rank >= np:
        raise LaunchError(f"--stdin {rank}: the job has only {np} ranks")
    return [rank]


def job_plan(
    plan: LaunchPlan,
    job: int,
    ranks: list[Rank],
    apps: Sequence[tuple[tuple[str, ...], str]],  # (argv, wdir) per app
) -> JobPlan:
    """Environments and PMI data of one job's ranks, from the rest of the plan; job 1 takes the
    plan's app_exports, when given, as each app's exports (hydra's -env), instead of exports."""
    options, env, hosts, exports = plan.options, plan.launcher_env, plan.hosts, plan.exports
    first = job == 1  # app_exports, devices and the rank table belong to the launched job, not to spawned ones
    app_sizes = [sum(1 for r in ranks if r.app == i) for i in range(len(apps))]
    torch = options.torch
    per_node = torch is not None and torch.node_rank is not None  # one launcher per node: this one's ranks
    layout = JobLayout(
        ranks=ranks,
        app_sizes=app_sizes,
        universe_size=options.universe_size or sum(h.slots or 0 for h in hosts),
        job_id=plan.job_id if first else f"{plan.job_id}.{job}",
        master_addr=plan.master[0],
        master_port=plan.master[1],
        mca=options.mca,
        attempt=plan.attempt,
        max_restarts=options.max_restarts,
        run_id=torch.run_id if torch is not None else "",
        role=torch.role if torch is not None else "default",
        agent_store=torch is not None and torch.agent_store and first,
        torch=torch is not None,
        offset=torch.node_rank * torch.nproc_per_node if per_node else 0,  # type: ignore[operator, union-attr]
        world=(torch.nnodes or 1) * torch.nproc_per_node if per_node else 0,  # type: ignore[union-attr]
        node=torch.node_rank if per_node else 0,  # type: ignore[union-attr]
        nodes=torch.nnodes or 1 if per_node else 0,  # type: ignore[union-attr]
    )
    common = job_variables(layout, env)
    if not first:
        common["PMI_SPAWNED"] = "1"  # MPI_Comm_spawn's ranks
    if options.mpi in ("pmi2", BOTH) and not any(name in env for name in PMI_VERSION_NAMES):
        # MPICH picks its PMI client at run time (the user's choice wins); offered PMI and PMIx
        # both, it would refuse to guess
        common["MPIR_CVAR_PMI_VERSION"] = "2" if options.mpi == "pmi2" else "1"
    app_exports = plan.app_exports if first else ()
    envs = [rank_environment(r, app_exports[r.app] if app_exports else exports, env, layout) for r in ranks]
    per_rank, table = (options.devices_per_rank, options.rank_table) if first else (None, None)
    more = devices.rank_extras(
        ranks,
        hosts,
        plan.host_info,
        per_rank=per_rank,
        rank_table=table,
        launcher_env=env,
        exports=exports,
        torch_omp=torch is not None,
    )
    for r, rank_env, extras in zip(ranks, envs, more):
        rank_env.update(extras)
        rank_env["PMI_HOSTNAME"] = hosts[r.host].name  # hydra's: the rank's host as the host list names it
    if torch is not None and torch.virtual_local_rank:
        for r, rank_env in zip(ranks, envs):
            rank_env.update(virtual_local_rank(r.local_rank, env.get("CUDA_VISIBLE_DEVICES")))
    if options.prefix:  # Open MPI's --prefix, for this machine's ranks (launch.py carries it to the others)
        here = {i for i, host in enumerate(hosts) if not hostlib.needs_ssh(host)}
        for r, rank_env in zip(ranks, envs):
            if r.host in here:
                rank_env.update(prefixed_paths(options.prefix, {**env, **rank_env}))
    served = services(options)
    pmix = None
    if "pmix" in served:
        names = [h.name for h in hosts]
        nspace = f"mpilaunch.{layout.job_id}"
        pmix = pmix_job(ranks, names, app_sizes, layout.universe_size, nspace, options.pmix_lib, job)
    # hydra's: no universe size unless -usize gives one (PMI's -1); mpirun-style lines: the slots
    universe = -1 if options.rules == "hydra" and options.universe_size is None else layout.universe_size
    pmi = pmi_job(job, ranks, universe, layout.job_id) if served and served[0] != "pmix" else None
    argvs, wdirs = [a for a, _ in apps], [w for _, w in apps]
    return JobPlan(job, ranks, argvs, wdirs, common, envs, pmi, served, pmix, layout.offset, layout.world)


def heartbeat_timeout(env: Mapping[str, str]) -> float:
    """MPILAUNCH_HEARTBEAT_TIMEOUT, in seconds (default 30)."""
    raw = env.get("MPILAUNCH_HEARTBEAT_TIMEOUT", "")
    try:
        value = float(raw) if raw else 30.0
    except ValueError:
        raise LaunchError(f"MPILAUNCH_HEARTBEAT_TIMEOUT={raw!r} is not a number of seconds") from None
    if not 0.5 <= value <= 86400:
        raise LaunchError(f"MPILAUNCH_HEARTBEAT_TIMEOUT={raw!r} must be between 0.5 and 86400 seconds")
    return value


def hydra_hosts(options: Options, env: Mapping[str, str]) -> tuple[list[Host], list[tuple[int, int]], str]:
    """hydra's host list (-hosts, -f, else the allocation or this machine), as the job's hosts and
    its entries (host index, count: -ppn's if given) in list order, an entry repeating the one
    before it merged into it; a host's slots are its counts."""
    if options.hosts:
        listed = [h for v in options.hosts for h in hostlib.parse_host_list(v, f"-hosts {hostlib.shown(v)}")]
        source = "-hosts"
    elif options.hostfile:
        listed = hostlib.read_hostfile(options.hostfile, merge=False)
        source = f"hostfile {options.hostfile}"
    else:
        listed, source = resolve_hosts(options, env)
    listed = hostlib.merge_consecutive(listed)
    counts = [options.ppn or h.slots or 1 for h in listed]
    hosts, index = hostlib.entry_hosts([h._replace(slots=c, max_slots=None) for h, c in zip(listed, counts)])
    return hosts, list(zip(index, counts)), source


def place_job(
    hosts: list[Host],
    entries: list[tuple[int, int]] | None,
    apps: list[tuple[int | None, str]],
    options: Options,
    source: str,
    sockets: int = 1,
    only: list[set[int] | None] | None = None,
) -> tuple[list[Rank], list[str]]:
    """The job's ranks, and what to say about them: hydra's round-robin (entries), else Open
    MPI's rules (only: each program's own hosts); a job on this machine alone may have more
    ranks than cores (said once)."""
    if entries is not None:
        return place_round_robin(entries, [np for np, _ in apps], len(hosts), options.ppn), []
    map_by = options.map_by

    def placed(over: bool) -> list[Rank]:
        return place(hosts, apps, map_by, options.npernode, over, rank_by=options.rank_by, sockets=sockets, only=only)

    try:
        return placed(options.oversubscribe), []
    except LaunchError as exc:
        if (
            options.oversubscribe
            or options.nooversubscribe
            or source != LOCAL_SOURCE
            or "not enough slots" not in str(exc)
        ):
            raise
    ranks = placed(True)
    cores = hosts[0].slots
    return ranks, [f"{len(ranks)} ranks on {cores} cores: they take turns"]


def build_plan(
    spec: JobSpec, env: Mapping[str, str], here: Here, hosts: list[Host] | None = None, attempt: int = 0
) -> tuple[LaunchPlan, str]:
    """The whole plan of job 1; hosts, when given, replace those of the options (allrun);
    attempt: restarts of the run so far (--max-restarts)."""
    options = spec.options
    entries = None
    torch = options.torch
    allocated = False  # the hosts are an allocation's (Slurm, Grid Engine, ...), not named by the user
    if hosts is not None:
        source = "the host list"
    elif torch is not None and torch.node_rank is not None:  # torchrun's way: a launcher on each node
        hosts = [Host("localhost", torch.nproc_per_node)]
        source = f"node {torch.node_rank} of {torch.nnodes} (torchrun's --nnodes/--node-rank)"
    else:
        if options.placement == "hydra":
            hosts, entries, source = hydra_hosts(options, env)
        else:
            hosts, source = resolve_hosts(options, env)
            allocated = not (options.hosts or options.hostfile) and source != LOCAL_SOURCE
        if options.launcher == "auto" and in_slurm_allocation(env, source):
            options = options._replace(launcher="slurm")
        elif options.launcher == "auto" and in_sge_job(env, source):
            options = options._replace(launcher="sge")
        if options.launcher == "sge" and engine_starts_here(options, env):
            options = options._replace(engine_starts_here=True)
        if torch is not None and options.npernode is not None and (source != LOCAL_SOURCE or entries is not None):
            hosts = torchrun_slots(hosts, options.npernode)
            if entries is not None:  # hydra's host list: each host once, as torchrun's nodes (-ppn gives way)
                entries = [(index, options.npernode) for index in range(len(hosts))]
                options = options._replace(ppn=None)
        hosts = with_slots(hosts, source, options)
    if options.nolocal:
        kept = [i for i, host in enumerate(hosts) if hostlib.needs_ssh(host)]
        if not kept:
            raise LaunchError(f"--nolocal: every host of the job ({source}) is this machine")
        if entries is not None:  # hydra's list: this machine's entries go, the others' hosts renumbered
            renumbered = {old: new for new, old in enumerate(kept)}
            entries = [(renumbered[host], count) for host, count in entries if host in renumbered]
        hosts = [hosts[i] for i in kept]
    if torch is not None:
        hosts = torchrun_nodes(torch, hosts, source, allocated)
    if options.launcher == "slurm" and here.in_job_step():
        options = options._replace(in_slurm_step=True)  # the launcher's node: as mpirun, its daemon is forked
    nps = [app.np for app in spec.apps]
    if nps == [None] and source.startswith(("MLP_MPI_", "Grid Engine")):
        from mpilaunch.plan.hostsources import mlp_np, sge_nslots

        # the platform's MLP_MPI_NP is the default -n; a Grid Engine job's slots are its ranks, as under mpirun
        mlp = source.startswith("MLP_MPI_")
        nps[0] = mlp_np(env) if mlp else sge_nslots(env)
        source += f", -n {nps[0]} from {'MLP_MPI_NP' if mlp else 'NSLOTS'}" if nps[0] else ""
    if options.dialect == "hydra" and source == LOCAL_SOURCE and entries is None and torch is None:
        nps = [1 if np is None else np for np in nps]  # hydra's host list with none given: this machine, once
    sockets = here.sockets() if "socket" in options.map_by else 1
    apps_np = [(np, app.argv[0]) for np, app in zip(nps, spec.apps)]
    only = app_hosts(spec.apps, hosts) if entries is None and torch is None else None
    ranks, notes = place_job(hosts, entries, apps_np, options, source, sockets, only)
    job_id = f"{int(time.time()):x}{os.getpid():x}{os.urandom(2).hex()}"
    if torch is not None and torch.endpoint is not None:  # the nodes' launchers meet there; so do the ranks
        master = torch.endpoint
    else:
        address = master_address(options, hosts, {r.host for r in ranks}, ranks[0].host)
        port = user_port(options, env)
        master = torch.master(address, here.free_port) if torch is not None else (address, port or here.free_port())
    exports = spec.apps[0].exports
    app_exports = tuple(app.exports for app in spec.apps)
    app_exports = app_exports if len(set(app_exports)) > 1 else ()
    apps = [(app.argv, os.path.abspath(app.wdir) if app.wdir else os.getcwd()) for app in spec.apps]
    if options.rank_table:
        options = options._replace(rank_table=os.path.abspath(options.rank_table))
    probe = devices.probe_request(options.devices_per_rank, options.rank_table, env, exports)
    local = sorted({r.host for r in ranks if not over_ssh(options, hosts[r.host])})
    facts = here.facts(probe, inherited(env).get("PATH", os.defpath)) if local else {}
    host_info = {index: dict(facts) for index in local}  # every name of this machine: one set of facts
    plan = LaunchPlan(
        hosts=hosts,
        job=None,  # type: ignore[arg-type]  # job_plan, below, makes it of the rest of the plan
        stdin_ranks=[],
        options=options,
        job_id=job_id,
        master=master,
        exports=exports,
        app_exports=app_exports,
        launcher_env=dict(env),
        host_info=host_info,
        notes=(*options.notes, *notes),
        sockets=sockets,
        may_oversubscribe=options.oversubscribe or source == LOCAL_SOURCE or entries is not None,
        attempt=attempt,
    )
    job = job_plan(plan, 1, ranks, apps)
    plan = plan._replace(job=job, stdin_ranks=stdin_ranks(options.stdin, len(ranks)), heartbeat=heartbeat_timeout(env))
    return plan, source


SPAWN_HOST_KEYS = ("host", "hosts")  # MPI's reserved info key; hydra reads "hosts" too


def spawn_hosts(info: Mapping[str, str], hosts: Sequence[Host]) -> set[int] | None:
    """The hosts an MPI_Comm_spawn app may use, from its info (`host=a,b`, a name's `:N` slots
    ignored), as indices of the job's hosts; None when it names none. This machine's names
    (its hostname, localhost, 127.0.0.1) are its host of the job. Spawned ranks run where the
    job has agents, so a name that is not one of its hosts is refused."""
    words = (word.strip() for key in SPAWN_HOST_KEYS for word in info.get(key, "").split(","))
    names = [word.split(":", 1)[0] for word in words if word]
    return host_indices(names, hosts, "its info names") if names else None


def host_indices(names: Sequence[str], hosts: Sequence[Host], said: str) -> set[int]:
    """The job's hosts of these names, as indices; this machine's names (its hostname,
    localhost, 127.0.0.1) are its host of the job. A name not among them: said + one line."""
    known = {host.name: index for index, host in enumerate(hosts)}
    here = next((index for index, host in enumerate(hosts) if not hostlib.needs_ssh(host)), None)
    found = set()
    for name in names:
        index = known.get(name, here if hostlib.is_local(name) else None)
        if index is None:
            listed = ", ".join(host.name for host in hosts)
            raise LaunchError(f"{said} host {hostlib.shown(name)}, not one of the job's hosts ({listed})")
        found.add(index)
    return found


def app_hosts(apps: Sequence[AppContext], hosts: Sequence[Host]) -> list[set[int] | None] | None:
    """Each program's hosts, when the command line gave -H in its app context (Open MPI's
    `-np 1 -H a prog : -np 1 -H b prog` runs prog on a, then on b); None for a program without.
    One program's -H alone is the job's hosts already."""
    if sum(1 for app in apps if app.hosts) < 2:
        return None
    return [
        host_indices([h.name for v in app.hosts for h in hostlib.parse_host_list(v)], hosts, "-H names")
        if app.hosts
        else None
        for app in apps
    ]


def spawn_plan(
    plan: LaunchPlan,
    job: int,
    apps: Sequence[SpawnApp],
    in_use: list[int],
    preput: Mapping[str, str],
    parent: tuple[str, int] | None = None,
) -> JobPlan:
    """A job asked for by MPI_Comm_spawn(_multiple): ranks on free slots, PMI_SPAWNED set, and
    each app's variables from the spawning rank (PMIx's). parent: the PMIx namespace and rank of
    the spawning rank."""
    options = plan.options
    ranks = place(
        plan.hosts,
        [(app.nprocs, app.argv[0]) for app in apps],
        options.map_by,
        None,
        plan.may_oversubscribe,
        in_use=in_use,
        rank_by=options.rank_by,
        sockets=plan.sockets,
        only=[spawn_hosts(app.info, plan.hosts) for app in apps],
    )
    app_dirs = [(tuple(app.argv), app.wdir or plan.job.wdirs[0]) for app in apps]
    child = job_plan(plan, job, ranks, app_dirs)
    for rank in child.ranks:
        child.envs[rank.rank].update(apps[rank.app].env)
    if child.pmi is not None:  # PMI-2's fullinit tells the new job's ranks who spawned them
        spawner = apps[0].spawner if apps else None
        child = child._replace(pmi=child.pmi._replace(preput=dict(preput), spawner=spawner))
    if child.pmix is not None and parent is not None:
        child = child._replace(pmix=child.pmix._replace(parent=parent[0], parent_rank=parent[1]))
    return child
