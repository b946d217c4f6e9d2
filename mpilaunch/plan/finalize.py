"""The plan finished with what the hosts said of themselves: a launch is plan, probe, finalize, run.

build_plan (build.py) plans from the command line alone; the launcher then probes the hosts
(its agents' checks: their CPUs and devices, which MPI each program is linked with, where
each host was reached, a port free on rank 0's); finalize, here, takes those facts and decides
the rest in one step: MASTER_ADDR/PORT, what the job is served, the Launch of every host, and
the notes to say. Pure, as the rest of plan/.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpilaunch.errors import LaunchError
from mpilaunch.plan import devices
from mpilaunch.plan.build import (
    LaunchPlan,
    cores_short,
    intel_note,
    launch_messages,
    serves_open_mpi,
    with_master,
)
from mpilaunch.plan.spec import Options
from mpilaunch.plan.wireup import served_mpi
from mpilaunch.protocol.messages import MPI4PY_HINT, Launch
from mpilaunch.protocol.record import Record


class Facts(Record):
    """What probing the hosts found: each host's facts (hostinfo.probe's answer, "address"),
    which MPI each program is linked with on each host and which torch it imports, and
    MASTER_ADDR/PORT once rank 0's host was reached (None: the plan's stands)."""

    host_info: dict[int, dict]
    families: dict[int, dict[str, str]]
    torch: dict[int, dict[str, str]]  # host -> program -> the torch it would import (torchrun's jobs)
    master: tuple[str, int] | None = None


class Final(Record):
    """The plan to run: every host's Launch of job 1, and the notes to say before it starts."""

    plan: LaunchPlan
    launches: dict[int, Launch]
    notes: tuple[str, ...]


def refuses_open_mpi(options: Options) -> bool:
    """A program linked with Open MPI is refused where the user asked for PMI-2 (it would run as
    a singleton); by default its job is served PMIx instead, --mpi none lets it run alone."""
    return options.mpi == "pmi2"


def asks_families(options: Options) -> bool:
    """Whether the hosts are asked which MPI each program is linked with (what to serve)."""
    return options.mpi in ("auto", "pmi1", "pmix")


def choose_mpi(plan: LaunchPlan, families: Mapping[int, Mapping[str, str]]) -> LaunchPlan:
    """What the job is served, now that each host said which MPI its programs are linked with
    (plan/wireup.served_mpi); Intel MPI's ranks get its launcher's defaults."""
    found = sorted({(program, *text.split(" ", 1)) for per in families.values() for program, text in per.items()})
    if any(family == "impi" for _, family, _ in found) and not any(
        family == "openmpi" and not lib.startswith(MPI4PY_HINT) for _, family, lib in found
    ):
        plan = plan._replace(intel_mpi=True)  # Intel's launcher's pinning and yield (build._mpich_defaults)
    chosen = served_mpi(plan.options.mpi, found)
    if chosen == plan.options.mpi:
        return plan
    return with_master(plan._replace(options=plan.options._replace(mpi=chosen)), plan.master)


# The torch releases whose TCPStore the ranks' store serves (host/tcpstore.py: both numberings;
# the commands are only ever added at the end). Those after it were not read.
STORE_SERVES = ((2, 0), (2, 14))


def store_serves(release: str) -> bool:
    """Whether the ranks' store speaks the TCPStore of this torch `__version__` ("2.1.2+cpu")."""
    numbers = release.split("+")[0].split(".")
    try:
        major, minor = int(numbers[0]), int(numbers[1])
    except (IndexError, ValueError):
        return False
    return STORE_SERVES[0] <= (major, minor) <= STORE_SERVES[1]


def own_store(plan: LaunchPlan, releases: Mapping[int, Mapping[str, str]]) -> tuple[LaunchPlan, str]:
    """torchrun's job whose rank 0 imports a torch the ranks' store does not serve: its ranks
    meet in rank 0's own TCPStore (TORCHELASTIC_USE_AGENT_STORE=False, as torch alone does),
    with a note; the plan as it is otherwise. One launcher per node: the meeting's store serves."""
    torch = plan.options.torch
    if torch is None or torch.node_rank is not None or not torch.agent_store:
        return plan, ""
    rank0 = plan.job.ranks[0].host
    unserved = sorted({r for r in releases.get(rank0, {}).values() if not store_serves(r)})
    if not unserved:
        return plan, ""
    first, last = (".".join(map(str, r)) for r in STORE_SERVES)
    note = (
        f"the ranks' torch {unserved[0]} on {plan.hosts[rank0].name} speaks a TCPStore mpilaunch does not serve "
        f"(it serves torch {first} to {last}): the ranks meet in rank 0's own store "
        "(TORCHELASTIC_USE_AGENT_STORE=False)"
    )
    options = plan.options._replace(torch=torch._replace(agent_store=False))
    return with_master(plan._replace(options=options), plan.master), note


def finalize(plan: LaunchPlan, facts: Facts) -> Final:
    """The plan with the hosts' facts, every host's Launch and the notes; LaunchError where the
    facts make the job impossible (a host with too few cores for PE=M)."""
    plan = plan._replace(host_info=facts.host_info)
    if facts.master is not None:
        plan = with_master(plan, facts.master)  # every rank's variables again, now that each host is known
    plan = choose_mpi(plan, facts.families)
    plan, store_note = own_store(plan, facts.torch)
    short = cores_short(plan)
    if short:
        raise LaunchError(short)
    job, options = plan.job, plan.options
    notes = [store_note]
    launches = launch_messages(plan, job, range(len(job.ranks)), set(plan.stdin_ranks))
    bound = {launch.bind_to for launch in launches.values()} - {"none"}
    if not options.bind_to and serves_open_mpi(job) and bound:  # no note where every host has more ranks than slots
        notes.append(f"Open MPI ranks bound to a {bound.pop()} each, as by mpirun; --bind-to none: unbound")
    notes.append(intel_note(plan, launches) if plan.intel_mpi else "")
    notes.append(
        devices.omp_note(
            job.ranks,
            plan.hosts,
            job.rank_envs(),
            plan.host_info,
            plan.launcher_env,
            plan.exports,
            plan.options.torch is not None,
        )
    )
    return Final(plan, launches, tuple(note for note in notes if note))
