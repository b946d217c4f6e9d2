"""What the user asked for, as frozen data: the output of the command line.

Records (record.py), not dataclasses: `dataclasses` imports `inspect`, and building them is
slow (docs/performance.md, "Start-up tricks").
"""

from __future__ import annotations

from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class AppContext(Record):
    """One program of the job (MPMD jobs have several, split by ' : ')."""

    argv: tuple[str, ...]
    np: int | None = None
    exports: tuple[tuple[str, str | None], ...] = ()  # -x VAR[=value]
    wdir: str | None = None
    hosts: tuple[str, ...] = ()  # -H given in this app context: its ranks go to these hosts only


class TorchRun(Record):
    """torchrun's job, as its command line (or mpilaunch's with torchrun's words) asks for it."""

    nproc_per_node: int  # ranks on each node
    nnodes: int | None = None  # None: as many as the hosts (-H, a hostfile, an allocation); MIN:MAX's MAX
    node_rank: int | None = None  # with nnodes: this launcher starts that node's ranks only (one launcher per node)
    endpoint: tuple[str, int] | None = None  # where the nodes' launchers meet (--rdzv-endpoint, --master-addr/port)
    min_nodes: int = 0  # --nnodes MIN:MAX's MIN (0: nnodes); with endpoint and no node_rank the meeting numbers nodes
    nodes_asked: tuple[int, int] = (0, 0)  # --nnodes (MIN, MAX) with nowhere to meet: one launcher, the hosts' count
    last_call: float = 30.0  # c10d's last_call_timeout: the wait for more nodes once MIN joined
    join_timeout: float = 600.0  # c10d's join_timeout
    is_host: bool | None = None  # c10d's is_host: serve the meeting's store (None: if the endpoint is this machine)
    master_addr: str = ""  # one node, --master-port given: the ranks' MASTER_ADDR (torchrun's 127.0.0.1 if not given)
    master_port: int = 0  # ... and MASTER_PORT; 0: a free port, whatever the environment says (torchrun's)
    run_id: str = ""  # TORCHELASTIC_RUN_ID (--rdzv-id or none, as torchrun), "": the job's id
    role: str = "default"
    standalone: bool = False
    local_ranks_filter: tuple[int, ...] = ()  # only these local ranks on the console (torchrun's)
    redirects: tuple[tuple[int, int], ...] = ()  # (local rank or -1 for all, streams 1|2|3): to files only
    tee: tuple[tuple[int, int], ...] = ()  # ... to files and the console
    virtual_local_rank: bool = False  # LOCAL_RANK 0 and one GPU in CUDA_VISIBLE_DEVICES per rank (torchrun's)
    agent_store: bool = True  # the ranks meet in the agent's store (False: rank 0's own, for a torch not served)

    def on_console(self, local_rank: int) -> int:
        """The streams (1 stdout, 2 stderr, as a mask) of this local rank the console shows."""
        if self.local_ranks_filter and local_rank not in self.local_ranks_filter:
            return 0
        return 3 & ~_streams(self.redirects, local_rank) | _streams(self.tee, local_rank)

    def master(self, planned: str, free_port: Callable[[], int]) -> tuple[str, int]:
        """MASTER_ADDR and MASTER_PORT as torchrun gives them on one node: --master-addr (else
        127.0.0.1) with --master-port; else `localhost` and a free port, never the environment's
        (two jobs started with the same MASTER_PORT would meet on it)."""
        if self.master_port:
            return self.master_addr or planned, self.master_port
        return "localhost" if planned == "127.0.0.1" else planned, free_port()

    def console_label(self, local_rank: int, stream: int) -> str:
        """torchrun's `[<role><local rank>]:` before each console line of a tee'd stream (1 or 2)."""
        teed = self.on_console(local_rank) & _streams(self.tee, local_rank) & stream
        return f"[{self.role}{local_rank}]:" if teed else ""

    @property
    def to_files(self) -> bool:
        """--redirects or --tee: the output goes to files, which need a log tree."""
        return any(mask for _, mask in self.redirects + self.tee)


def _streams(rules: tuple[tuple[int, int], ...], local_rank: int) -> int:
    return next((mask for who, mask in rules if who in (-1, local_rank)), 0)


class Options(Record):
    """Job-wide options; defaults are mpirun's."""

    hosts: tuple[str, ...] = ()  # -H values, each "a:2,b" (or hydra's -hosts values)
    hostfile: str | None = None  # (or hydra's -f)
    placement: str = "openmpi"  # openmpi: by slot with Open MPI's rules; hydra (-hosts, -ppn, -f): round-robin
    ppn: int | None = None  # hydra's -ppn
    universe_size: int | None = None  # hydra's -usize; None: the hosts' slots
    dialect: str = "openmpi"  # whose words the line speaks (cli/dialect.py); hydra: no -n is 1 rank here
    rules: str = "openmpi"  # whose failure and signal rules the run keeps: openmpi or hydra (policy.py)
    map_by: str = "slot"  # slot | node | ppr:N:node | ppr:N:socket
    rank_by: str | None = None  # slot | node, when it differs from map_by's order
    npernode: int | None = None
    cpus_per_rank: int = 0  # Open MPI's PE=M: each rank bound to M cores (hwthreads with use_hwthread_cpus)
    use_hwthread_cpus: bool = False
    oversubscribe: bool = False
    display_map: bool = False
    display_allocation: bool = False
    print_rank_map: bool = False  # hydra's rank map: (host:(0,1))...
    dry_run: bool = False
    output_filename: str | None = None
    merge_stderr_to_stdout: bool = False
    tag_output: bool = False
    prepend_rank: bool = False  # hydra's -l: [rank] before each console line
    prepend_pattern: str | None = None  # hydra's -prepend-pattern: %r, %h, %g, %p expanded before each line
    timestamp_output: bool = False
    stdin: str = "0"  # rank number, "all" or "none"
    mca: tuple[tuple[str, str], ...] = ()
    bind_to: str = ""  # none, core, socket, hwthread; "" when not asked for (Open MPI ranks: mpirun's default)
    report_bindings: bool = False
    devices_per_rank: int | None = None  # each rank's slice of its host's device list (CUDA_VISIBLE_DEVICES, ...)
    rank_table: str | None = None  # where to write the HCCL rank table of the job (sets RANK_TABLE_FILE)
    timeout: float | None = None
    get_stack_traces: bool = False  # with --timeout: every rank's stack before the kill (Open MPI's)
    hang_timeout: float | None = None  # stacks after this many seconds without any rank's output
    hang_action: str = "stacks"  # stacks (the job goes on) or kill (after the stacks; status as a timeout)
    kill_timeout: float = 2.0
    nolocal: bool = False  # Open MPI's --nolocal: no rank on this machine
    nooversubscribe: bool = False  # asked for: a job on this machine alone is held to its cores too
    signal_grace: float | None = None  # after a signal stopped the run, SIGKILL to the ranks left (torchrun's)
    allow_run_as_root: bool = False
    mpi: str = "auto"  # served to the ranks: auto, pmi1, pmi2 (same server, MPICH told to use PMI-2), pmix, none
    # (auto becomes pmi1, pmix or plan/wireup.BOTH once the programs were looked at: plan/finalize.choose_mpi)
    pmix_lib: str | None = None  # the PMIx server library (--pmix-lib), else each agent finds its host's
    pmi_tcp: bool = False  # PMI over loopback TCP (PMI_PORT + PMI_ID) instead of an inherited PMI_FD
    report_json: str | None = None  # where the run's JSON report goes
    ssh_config: str | None = None  # instead of ~/.ssh/config
    ssh_accept_new: bool = False  # add unknown host keys to known_hosts (changed keys are always refused)
    ssh_client: str = "auto"  # openssh (an `ssh` process per host), paramiko (in the launcher), auto: openssh if found
    ssh_tree_width: int | None = None  # tree spawn: the launcher and each agent start at most this many hosts
    ssh_concurrent: int | None = None  # hosts' connections set up at once (plm_rsh_num_concurrent); None: WINDOW
    quiet: bool = False  # -q: none of mpilaunch's own notes
    prefix: str | None = None  # Open MPI's --prefix: DIR/bin and DIR/lib first on remote ranks' paths
    rsh_agent: tuple[str, ...] = ()  # in place of `ssh` (plm_rsh_agent, -bootstrap-exec)
    rsh_args: tuple[str, ...] = ()  # more arguments for it (plm_rsh_args, -bootstrap-exec-args)
    outfile_pattern: str | None = None  # hydra's per-rank stdout file (%r rank, %h host, ...)
    errfile_pattern: str | None = None
    notes: tuple[str, ...] = ()  # options read and ignored, said once at the start
    torch: TorchRun | None = None  # torchrun's words were used (or mpilaunch was started as torchrun)
    max_restarts: int = 0  # the whole job started again after a failure, up to this many times
    restart_delay: float = 3.0  # seconds between a failed attempt's end and the next
    launcher: str = "auto"  # auto, ssh, slurm, sge, or local/fork (every host's agent on this machine)
    in_slurm_step: bool = False  # with slurm: the launcher runs in a job step (sbatch), its node's agent is forked
    engine_starts_here: bool = False  # with sge: this machine's agent starts through qrsh too (not forked)

    def mca_setting(self, key: str, default: str) -> str:
        """The value of an -mca setting, stripped and lower-cased: the last one given, else default."""
        return next((val for name, val in reversed(self.mca) if name == key), default).strip().lower()

    @property
    def abort_on_failure(self) -> bool:
        """Open MPI's orte_abort_on_non_zero_status; the last -mca setting wins."""
        return self.mca_setting("orte_abort_on_non_zero_status", "1") not in ("0", "false", "no", "off")


class JobSpec(Record):
    """The command line as data: its programs and the job-wide options."""

    apps: tuple[AppContext, ...]
    options: Options = Options()
