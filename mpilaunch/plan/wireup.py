"""What a job's PMI looks like before it starts: the process mapping, the job's description that
every PMI service gets, and which agent services the job uses."""

from __future__ import annotations

from mpilaunch.errors import LaunchError
from mpilaunch.protocol.messages import MPI4PY_HINT, UNKNOWN, PmiJob, PmixJob

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the early agent's guess (cli/pmix_guess.py) imports this before the fork
    from collections.abc import Sequence

    from mpilaunch.plan.placement import Rank
    from mpilaunch.plan.spec import Options


def process_mapping(node_of_rank: Sequence[int]) -> str:
    """PMI_process_mapping in the vector format: (vector,(first_node,node_count,ranks_per_node),...).

    Ranks 0..n-1 are grouped into runs on one node; consecutive runs of equal length on
    consecutive nodes fold into one block, e.g. 2 nodes x 4 by slot -> (vector,(0,2,4)).
    """
    runs: list[list[int]] = []
    for node in node_of_rank:
        if runs and runs[-1][0] == node:
            runs[-1][1] += 1
        else:
            runs.append([node, 1])
    blocks: list[list[int]] = []
    for node, length in runs:
        if blocks and blocks[-1][2] == length and blocks[-1][0] + blocks[-1][1] == node:
            blocks[-1][1] += 1
        else:
            blocks.append([node, 1, length])
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"


BOTH = "pmi+pmix"  # what --mpi auto becomes for a job whose programs may use either family


def served_mpi(mpi: str, found: Sequence[tuple[str, str, str]]) -> str:
    """What --mpi becomes once the programs were read, from (program, family, library) of each
    (host/mpi_family.py): with auto or pmi1, PMIx when they are linked with Open MPI, or are
    Python whose mpi4py is (a hint: it only decides when nothing else does); with auto, both
    when a program may start either family unseen (a shell, a script, an interpreter) and none
    is linked with an MPICH-family MPI; else mpi itself. A job that mixes programs linked with
    either family, or asks PMIx for MPICH-family programs, is refused (they would not share one
    MPI_COMM_WORLD, or would run alone)."""
    opaque = any(family == UNKNOWN for _, family, _ in found)
    found = [(program, family, lib) for program, family, lib in found if family != UNKNOWN]
    linked = [(program, family, lib) for program, family, lib in found if not lib.startswith(MPI4PY_HINT)]
    open_mpi = [(program, lib) for program, family, lib in linked if family == "openmpi"]
    mpich = [(program, lib) for program, family, lib in linked if family in ("mpich", "impi")]
    hinted = {"mpich" if f == "impi" else f for _, f, lib in found if lib.startswith(MPI4PY_HINT)}
    if open_mpi and mpich:
        raise LaunchError(
            f"program {open_mpi[0][0]!r} is linked with Open MPI ({open_mpi[0][1]}) and {mpich[0][0]!r} with an "
            f"MPICH-family MPI ({mpich[0][1]}): their ranks cannot share one MPI_COMM_WORLD; run them as two jobs"
        )
    if mpi == "pmix" and mpich:
        raise LaunchError(
            f"program {mpich[0][0]!r} is linked with an MPICH-family MPI ({mpich[0][1]}), which is served PMI-1, "
            "not PMIx: drop --mpi pmix"
        )
    if mpi not in ("auto", "pmi1"):
        return mpi
    if open_mpi or (hinted == {"openmpi"} and not mpich and not (opaque and mpi == "auto")):
        return "pmix"
    if opaque and not mpich and mpi == "auto":
        return BOTH
    return mpi


def services(options: Options) -> tuple[str, ...]:
    """The agent services a job's ranks get (agent/services/registry.py): PMI-1/PMI-2 over an
    inherited socket or loopback TCP, with the guard that stops Open MPI ranks from running as
    singletons; PMIx; both PMI and PMIx (the guard watching only ranks that got no PMIx, on a
    host that could not start it); none with --mpi none."""
    pmi = "pmi-tcp" if options.pmi_tcp else "pmi"
    if options.mpi == "pmix":
        return ("pmix",)
    if options.mpi == BOTH:
        return (pmi, "pmix", "openmpi-guard")  # the guard only for ranks PMIx cannot be served to
    if options.mpi not in ("auto", "pmi1", "pmi2"):  # the server answers both versions; pmi2 only tells MPICH to use it
        return ()
    return (pmi, "openmpi-guard")


def pmi_job(job: int, ranks: Sequence[Rank], universe: int, job_id: str) -> PmiJob:
    """A job as its PMI services see it: kvs_<MPILAUNCH_JOB_ID>_<job>, its size and mapping (a
    spawned job's preput and spawner are set once it is planned: build.spawn_plan)."""
    return PmiJob(
        job=job,
        size=len(ranks),
        universe=universe,
        kvsname=f"kvs_{job_id}_{job}",
        mapping=process_mapping([r.node_rank for r in ranks]),
        preput={},
    )


def pmix_job(
    ranks: Sequence[Rank],
    hosts: Sequence[str],
    apps: Sequence[int],
    universe: int,
    nspace: str,
    library: str | None,
    job: int = 1,
) -> PmixJob:
    """A job as each host's PMIx server registers it (node: set per host by the controller).
    hosts: the name of every host index; apps: each app context's number of ranks."""
    used = sorted({r.host for r in ranks})
    nodes = tuple(tuple(r.rank for r in ranks if r.host == host) for host in used)
    return PmixJob(
        nspace=nspace,
        size=len(ranks),
        universe=max(universe, len(ranks)),
        nodes=nodes,
        hosts=tuple(hosts[host] for host in used),
        apps=tuple(apps),
        library=library,
        job=job,
    )
