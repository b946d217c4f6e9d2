"""The Slurm job step that runs a run's agents: its `srun` line, what each task runs to connect
back, and the step started at the launcher's first instruction.

Under `salloc` the step's start (Slurm creating it, each node's Python starting) is the longest
wait of a short job. When the command line already says the job will be one step over the
whole allocation (hosts from Slurm, no `--launcher`, no step above the launcher), entry.main
starts it before anything else is imported, and Slurm creates it while the launcher parses and
plans; the Slurm transport then takes it (`take`), or the launcher ends it
(slurm.discard_early_step). Agents
of nodes the plan leaves without ranks connect back too and are sent away, as `mpirun` starts
a daemon on every node of an allocation.

Light on purpose (`_socket`, `os.posix_spawn`, no `shlex`): it runs before the launcher's imports.
"""

from __future__ import annotations

import _socket
import os
import sys

from mpilaunch.transport.stage1 import SECRET_VAR, connect_back_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


def srun_command(nodes: Sequence[str] | int, agent: str, srun: str = "srun") -> list[str]:
    """The job step that starts one agent on each node (names, or a count: every node of the
    allocation): one task per node, every CPU of the node's allocation given to it and no
    binding by Slurm (the agent binds its ranks when asked), beside other steps of the
    allocation, ended whole if one agent fails."""
    count = nodes if isinstance(nodes, int) else len(nodes)
    where = [] if isinstance(nodes, int) else [f"--nodelist={','.join(nodes)}"]
    return [
        srun,
        f"--nodes={count}",
        f"--ntasks={count}",
        "--ntasks-per-node=1",
        *where,
        "--cpu-bind=none",
        "--whole",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--input=none",
        "--job-name=mpilaunch",
        "sh",
        "-c",
        agent,
    ]


def agent_shell(address: str, port: int, python: str) -> str:
    """What each task runs: an agent that connects back and says it is the node Slurm started
    it on (stage1.connect_back_line)."""
    return connect_back_line(address, port, python, 'os.environ.get("SLURMD_NODENAME", "")')


def spawn_srun(argv: list[str], env: Mapping[str, str]) -> int:
    """srun in a session of its own (Ctrl-C reaches the launcher, which stops the job its way),
    its stdin /dev/null; its pid."""
    return os.posix_spawn(
        argv[0],
        argv,
        env,
        setsid=True,
        file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)],
    )


class StartedStep:
    """A step srun has started: the listener its agents connect back to, their secret, srun's
    pid, and how many nodes (agents) it has."""

    def __init__(self, listener: _socket.socket, secret: str, pid: int, nodes: int) -> None:
        self.listener = listener
        self.secret = secret
        self.pid = pid
        self.nodes = nodes


def start_step(nodes: Sequence[str] | int, env: Mapping[str, str], python: str) -> StartedStep:
    """srun starting one agent on each node (names, or a count: the whole allocation), each to
    connect back to a listener of this process; LaunchError when srun cannot be run."""
    from mpilaunch.errors import LaunchError
    from mpilaunch.host.programs import find_program

    try:
        srun = find_program("srun", dict(env))
    except OSError:
        raise LaunchError("--launcher slurm: no `srun` found on PATH") from None
    count = nodes if isinstance(nodes, int) else len(nodes)
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        listener.bind(("", 0))
        listener.listen(count + 8)
        secret = os.urandom(16).hex()
        address = env.get("MPILAUNCH_SLURM_ADDRESS") or os.uname().nodename
        agent = agent_shell(address, listener.getsockname()[1], python)
        pid = spawn_srun(srun_command(nodes, agent, srun), {**env, SECRET_VAR: secret})
    except OSError as exc:
        listener.close()
        raise LaunchError(f"--launcher slurm: cannot run {srun}: {exc.strerror or exc}") from None
    return StartedStep(listener, secret, pid, count)


_early: StartedStep | None = None


def allocation_nodes(env: Mapping[str, str]) -> int:
    """How many nodes a step over the whole allocation has (else 0), for a command line inside
    one that names no host nor engine (entry.early_start): its hosts are the allocation's unless
    an MLP_MPI_* host list, which comes first, is set."""
    if env.get("MLP_MPI_HOSTFILE") or env.get("MLP_MPI_HOSTS"):
        return 0
    if not (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")):
        return 0
    count = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    return int(count) if count.isdigit() and int(count) >= 1 else 0


def prestart(nodes: int) -> None:
    """Start the step of `nodes` agents now (nothing when srun cannot be run: the launch says so)."""
    global _early
    from mpilaunch.errors import LaunchError

    try:
        _early = start_step(nodes, os.environ, sys.executable)
    except LaunchError:
        pass


def claim_started_step() -> StartedStep | None:
    """The step started early, for the Slurm transport to use (once)."""
    global _early
    early, _early = _early, None
    return early
