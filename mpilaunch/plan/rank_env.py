"""Per-rank environment: what each rank is told about itself and the job."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from mpilaunch.plan.placement import Rank
from mpilaunch.protocol.record import Record

# Variables an enclosing launcher (mpirun, hydra, srun's PMI) leaves behind; passing
# them on would make a rank join the outer job or misreport its identity.
LEAK_PREFIXES = ("PMIX_", "PMI_", "OMPI_COMM_WORLD_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_")
LEAK_NAMES = frozenset(
    {
        "OMPI_UNIVERSE_SIZE",
        "OMPI_NUM_APP_CTX",
        "OMPI_APP_CTX_NUM_PROCS",
        "OMPI_FIRST_RANKS",
        "OMPI_FILE_LOCATION",
        "OMPI_COMMAND",
        "OMPI_ARGV",
        "IPATH_NO_BACKTRACE",
        "MPILAUNCH_JOB_ID",
    }
)
# Defaults that the launcher's own environment may override (they are the user's choice).
_USER_DEFAULTS = ("MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED")
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # these two compiled by re on first use (-x, --dry-run)
SECRET_NAME = r"(?i)TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL"


def inherited(env: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment less an enclosing launcher's variables."""
    return {k: v for k, v in env.items() if k not in LEAK_NAMES and not k.startswith(LEAK_PREFIXES)}


def valid_env_name(name: str) -> bool:
    return bool(re.match(_ENV_NAME, name))


class JobLayout(Record):
    """What every rank's variables are computed from."""

    ranks: Sequence[Rank]
    app_sizes: Sequence[int]
    universe_size: int
    job_id: str
    master_addr: str
    master_port: int
    mca: Sequence[tuple[str, str]] = ()
    attempt: int = 0  # TORCHELASTIC_RESTART_COUNT: restarts of the job so far
    max_restarts: int = 0
    run_id: str = ""  # TORCHELASTIC_RUN_ID (job_id when empty)
    role: str = "default"  # ROLE_NAME
    agent_store: bool = False  # a store of the launcher's serves MASTER_ADDR:PORT (TORCHELASTIC_USE_AGENT_STORE)
    torch: bool = False  # torchrun's command line: its knobs too (TORCH_NCCL_ASYNC_ERROR_HANDLING, ...)
    offset: int = 0  # one launcher per node (torchrun --nnodes/--node-rank): the first rank of this node
    world: int = 0  # ... the whole job's size then (0: these ranks are the job)
    node: int = 0  # ... and this node's rank (GROUP_RANK)
    nodes: int = 0  # ... of this many (GROUP_WORLD_SIZE; 0: the hosts of these ranks)


def job_variables(layout: JobLayout, launcher_env: Mapping[str, str]) -> dict[str, str]:
    """Variables equal for every rank of the job."""
    firsts, total = [], 0
    for size in layout.app_sizes:
        firsts.append(str(total))
        total += size
    total = layout.world or total
    nodes = layout.nodes or len({r.host for r in layout.ranks})
    env = {
        "OMPI_COMM_WORLD_SIZE": str(total),
        "OMPI_UNIVERSE_SIZE": str(layout.universe_size),
        "OMPI_NUM_APP_CTX": str(len(layout.app_sizes)),
        "OMPI_APP_CTX_NUM_PROCS": " ".join(str(s) for s in layout.app_sizes),
        "OMPI_FIRST_RANKS": " ".join(firsts),
        "PMI_SIZE": str(total),
        "WORLD_SIZE": str(total),
        "RANK_SIZE": str(total),
        "MPILAUNCH_JOB_ID": layout.job_id,
        "MASTER_ADDR": layout.master_addr,
        "MASTER_PORT": str(layout.master_port),
        "PYTHONUNBUFFERED": "1",
        # torchrun's (torch.distributed.elastic): is_torchelastic_launched() and @record read them
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_WORLD_SIZE": str(total),
        "ROLE_NAME": layout.role,
        "TORCHELASTIC_RUN_ID": layout.run_id or layout.job_id,
        "TORCHELASTIC_RESTART_COUNT": str(layout.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(layout.max_restarts),
        "TORCHELASTIC_USE_AGENT_STORE": str(layout.agent_store),
    }
    if layout.torch:
        env.update(TORCH_NCCL_ASYNC_ERROR_HANDLING="1", TORCHELASTIC_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    for key, value in layout.mca:
        env[f"OMPI_MCA_{key}"] = value
    for name in _USER_DEFAULTS:  # torchrun reads no MASTER_* of its environment: its own are the ranks'
        if name in launcher_env and not (layout.torch and name.startswith("MASTER_")):
            env[name] = launcher_env[name]
    return env


def rank_variables(rank: Rank, offset: int = 0, node_offset: int = 0) -> dict[str, str]:
    """Variables that name this rank (Open MPI, PMI, PyTorch and MindSpore spellings); offset:
    the first rank of this launcher's node, when each node has its own (torchrun's way)."""
    r, local, lsize = str(rank.rank + offset), str(rank.local_rank), str(rank.local_size)
    node = str(rank.node_rank + node_offset)
    return {
        "OMPI_MCA_orte_app_num": str(rank.app),
        "OMPI_COMM_WORLD_RANK": r,
        "OMPI_COMM_WORLD_LOCAL_RANK": local,
        "OMPI_COMM_WORLD_LOCAL_SIZE": lsize,
        "OMPI_COMM_WORLD_NODE_RANK": local,
        "PMI_RANK": r,
        "MPI_LOCALRANKID": local,  # hydra's
        "MPI_LOCALNRANKS": lsize,
        "RANK": r,
        "ROLE_RANK": r,
        "LOCAL_RANK": local,
        "LOCAL_WORLD_SIZE": lsize,
        "NODE_RANK": node,
        "GROUP_RANK": node,
        "RANK_ID": r,
        "DEVICE_ID": local,
    }


def rank_environment(
    rank: Rank,
    exports: Sequence[tuple[str, str | None]],
    launcher_env: Mapping[str, str],
    layout: JobLayout | None = None,
) -> dict[str, str]:
    """The variables set for one rank on top of its host's inherited environment and of the
    job's (job_variables, which every rank gets): only what is its own or overrides those, so a
    job's ranks do not each carry a copy of the job's variables.

    -x values win over everything; -x NAME without a value sends the launcher's value.
    """
    env = rank_variables(rank, layout.offset, layout.node) if layout is not None else rank_variables(rank)
    for name, value in exports:
        if value is None:
            if name in launcher_env:
                env[name] = launcher_env[name]
        else:
            env[name] = value
    return env


def prefixed_paths(prefix: str, env: Mapping[str, str]) -> dict[str, str]:
    """Open MPI's --prefix DIR: DIR/bin first on PATH and DIR/lib first on LD_LIBRARY_PATH."""
    import os

    top = os.path.abspath(prefix)
    return {
        name: os.pathsep.join(p for p in (os.path.join(top, sub), env.get(name)) if p)
        for name, sub in (("PATH", "bin"), ("LD_LIBRARY_PATH", "lib"))
    }


def mask(name: str, value: str) -> str:
    """Hide values whose names look like credentials (for --dry-run output)."""
    return "****" if re.search(SECRET_NAME, name) else value
