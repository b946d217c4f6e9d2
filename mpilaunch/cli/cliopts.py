"""The run command's options as plain data: one table for click, the fast scanner and job files.

Kept free of click (and of dataclasses, which exec code at import) so that a plain run can
read its command line without paying for either; `command.run_command()` builds the click command
from this same table for --help, errors and job files.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

# How an option takes its value: FLAG (none), VALUE (one), MULTI (one, repeatable), PAIRS (two, repeatable),
# ENV (hydra's NAME=VALUE or NAME VALUE, repeatable; one NAME=VALUE word once cli/dialect.canonical joined it).
FLAG, VALUE, MULTI, PAIRS, ENV = "flag", "value", "multi", "pairs", "env"
# What a value must be; the click command maps each to its type (see command.run_command).
INT_MIN1, FLOAT_POS, FLOAT_NONNEG, CHOICE, RANK_CHOICE = "int>=1", "float>0", "float>=0", "choice", "stdin"
INT_MIN0 = "int>=0"
# Numbers are plain ASCII decimals, finite, and at most `maximum` (docs/reference.md lists each).
MAX_RANKS = 65536  # the largest job planned (plan/placement.MAX_RANKS): more is refused before any memory is spent
MAX_SECONDS = 365 * 86400.0  # --timeout (and MPIEXEC_TIMEOUT): a year
# torchrun's options that mean nothing here: accepted with their value, said once
TORCHRUN_IGNORED = (
    "event-log-handler", "logs-specs", "numa-binding", "signals-to-handle",
    "duplicate-stdout-filters", "duplicate-stderr-filters",
)  # fmt: skip
# Open MPI 4.1's mpirun flags that change nothing here: accepted, said once
OPEN_MPI_IGNORED = (
    "continuous", "enable-recovery", "disable-recovery", "report-child-jobs-separately", "leave-session-attached",
    "display-devel-map", "display-devel-allocation", "do-not-resolve", "debug-daemons", "noprefix",
    "show-progress", "report-state-on-timeout", "novm",
)  # fmt: skip
# hydra's options that mean nothing here (name -> why): accepted, said once; the first ones take a value
HYDRA_IGNORED_VALUES = {
    "localhost": "the launcher's own host name is found here",
    "order-nodes": "hosts are taken in the order given",
    "nameserver": "mpilaunch serves published names itself",
}
HYDRA_IGNORED_FLAGS = {
    "disable-x": "no X forwarding here",
    "enable-x": "no X forwarding here",
    "disable-auto-cleanup": "mpilaunch always ends the ranks of a failed job",
    "disable-hostname-propagation": "the ranks find their host names themselves",
    "print-all-exitcodes": "the summary names every rank that failed and its status",
    "envall": "a line in hydra's words sends every program the launcher's environment already",
    "envnone": "local ranks inherit the launcher's environment here",
    "pmi-port": "PMI is served over PMI_FD (--pmi-tcp for a port)",
    "profile": "no profiling here",
}
# hydra's launchers that mpilaunch has no engine of its own for: read as auto, with a note
OTHER_HYDRA_LAUNCHERS = ("pbs", "lsf", "ll", "cobalt", "persist", "manual")


class Opt:
    """One option: its parameter name, every spelling, and what its value may be."""

    __slots__ = ("check", "choices", "default", "flags", "help", "kind", "maximum", "metavar", "name", "show_default")

    def __init__(
        self,
        name: str,
        flags: tuple[str, ...],
        kind: str = VALUE,
        *,
        check: str | None = None,
        default: object = None,
        metavar: str | None = None,
        help: str | None = None,
        choices: tuple[str, ...] = (),
        show_default: bool = False,
        maximum: float | None = None,
    ) -> None:
        self.name = name
        self.flags = flags
        self.kind = kind
        self.check = check
        self.default = default
        self.metavar = metavar
        self.help = help
        self.choices = choices
        self.show_default = show_default
        self.maximum = maximum


# The parameter names of other launchers' options that mean nothing here: PREFIX + the name
TORCHRUN_IGNORED_PREFIX, OPEN_MPI_IGNORED_PREFIX, HYDRA_IGNORED_PREFIX = "ignored_", "openmpi_", "hydra_"


def ignored_param(prefix: str, name: str) -> str:
    """The parameter an ignored option of another launcher's is read into (`--numa-binding` ->
    ignored_numa_binding): made by _ignored, popped by the reader that says it is ignored."""
    return prefix + name.replace("-", "_")


def _ignored(
    whose: str, prefix: str, names: Iterable[str], spellings: Callable[[str], tuple[str, ...]], kind: str = VALUE
) -> tuple[Opt, ...]:
    """Another launcher's options that mean nothing here: accepted (with their value, unless a
    flag), and said once where they are read."""
    metavar = None if kind == FLAG else "VALUE"
    said = f"{whose}: means nothing here, said."
    return tuple(Opt(ignored_param(prefix, n), spellings(n), kind, metavar=metavar, help=said) for n in names)


RUN_OPTIONS: tuple[Opt, ...] = (
    Opt(
        "config",
        ("--config", "-config"),
        metavar="JOB.yaml",
        help="Job file: options, env, command; the command line wins.",
    ),
    Opt(
        "np",
        ("-n", "-np", "--np", "-c"),
        check=INT_MIN1,
        maximum=MAX_RANKS,
        help="Number of ranks (default: every slot).",
    ),
    Opt("hosts", ("-H", "--host", "-host"), MULTI, metavar="h1:N,h2:N", help="Hosts, slots."),
    Opt("hostfile", ("--hostfile", "-hostfile", "--machinefile", "-machinefile"), metavar="PATH", help="Hostfile."),
    Opt(
        "map_by",
        ("--map-by", "-map-by"),
        default="slot",
        metavar="slot|node|socket|ppr:N:node[:PE=M]",
        help="Placement policy (Open MPI's; :PE=M gives each rank M cores).",
    ),
    Opt("rank_by", ("--rank-by", "-rank-by"), metavar="slot|node", help="Rank order, when it differs from --map-by."),
    Opt(
        "npernode",
        ("--npernode", "-npernode", "-N"),
        check=INT_MIN1,
        maximum=MAX_RANKS,
        help="Ranks per node (ppr:N:node).",
    ),
    Opt(
        "npersocket",
        ("--npersocket", "-npersocket"),
        check=INT_MIN1,
        maximum=MAX_RANKS,
        help="Ranks per socket (ppr:N:socket).",
    ),
    Opt("bynode", ("--bynode", "-bynode"), FLAG, help="Open MPI's old --map-by node."),
    Opt("byslot", ("--byslot", "-byslot", "--bycore", "-bycore"), FLAG, help="Open MPI's old --map-by slot."),
    Opt("pernode", ("--pernode", "-pernode"), FLAG, help="Open MPI's old --npernode 1."),
    Opt("nolocal", ("--nolocal", "-nolocal"), FLAG, help="No rank on this machine: only the other hosts."),
    Opt("rankfile", ("--rankfile", "-rankfile", "-rf"), metavar="FILE", help="Open MPI's rankfile: not read."),
    Opt(
        "cpus_per_proc",
        ("--cpus-per-proc", "-cpus-per-proc", "--cpus-per-rank", "-cpus-per-rank"),
        check=INT_MIN1,
        maximum=4096,
        help="Open MPI's old --map-by ...:PE=N: N cores per rank.",
    ),
    Opt(
        "use_hwthread_cpus",
        ("--use-hwthread-cpus", "-use-hwthread-cpus"),
        FLAG,
        help="Hardware threads are the CPUs: slots, binding and PE count them instead of cores.",
    ),
    Opt(
        "hydra_hosts",
        ("-hosts", "--hosts"),
        MULTI,
        metavar="h1:N,h2",
        help="hydra's hosts: round-robin, no slot limit.",
    ),
    Opt("hydra_hostfile", ("-f",), metavar="PATH", help="hydra's hostfile (host:N lines): round-robin, no slot limit."),
    Opt(
        "ppn",
        ("-ppn", "--ppn"),
        check=INT_MIN1,
        maximum=MAX_RANKS,
        help="hydra's ranks per host: blocks of N on each host in turn, wrapping.",
    ),
    Opt("oversubscribe", ("--oversubscribe", "-oversubscribe"), FLAG, help="Allow more ranks than slots."),
    Opt(
        "nooversubscribe",
        ("--nooversubscribe", "-nooversubscribe"),
        FLAG,
        help="Open MPI's default: no more ranks than slots.",
    ),
    Opt(
        "display_allocation",
        ("--display-allocation", "-display-allocation"),
        FLAG,
        help="Print the hosts and their slots, then launch.",
    ),
    Opt("display_map", ("--display-map", "-display-map"), FLAG, help="Print the rank map, then launch."),
    Opt("dry_run", ("--dry-run", "-dry-run"), FLAG, help="Print the map and every rank's variables; start nothing."),
    Opt("exports", ("-x",), MULTI, metavar="VAR[=value]", help="Export a variable to every rank."),
    Opt("genv", ("-genv", "--genv"), ENV, metavar="VAR=VALUE", help="hydra's -x VAR=VALUE (also as two words)."),
    Opt("genvlist", ("-genvlist", "--genvlist"), MULTI, metavar="A,B", help="hydra's -x A -x B."),
    Opt(
        "genvall",
        ("-genvall", "--genvall"),
        FLAG,
        help="Every variable of the launcher's environment to every rank, remote ones too (hydra's default).",
    ),
    Opt("genvnone", ("-genvnone", "--genvnone"), FLAG, help="Only -x/-genv variables to remote ranks (the default)."),
    Opt(
        "iface",
        ("-iface", "--iface"),
        metavar="IF",
        help="hydra's network interface: the ranks' MPI, NCCL and Gloo use IF (FI_TCP_IFACE, "
        "OMPI_MCA_btl_tcp_if_include, NCCL_SOCKET_IFNAME, ...; yours win).",
    ),
    Opt(
        "app_env",
        ("-env", "--env"),
        ENV,
        metavar="VAR=VALUE",
        help="VAR=VALUE (also as two words) for this app context's ranks.",
    ),
    Opt("app_envlist", ("-envlist", "--envlist"), MULTI, metavar="A,B", help="These variables for this app context."),
    Opt("wdir", ("--wdir", "-wdir", "--wd", "-wd"), metavar="DIR", help="Working directory of the ranks."),
    Opt(
        "output_filename",
        ("--output-filename", "-output-filename"),
        metavar="DIR",
        help="Per-rank files DIR/1/rank.N/{stdout,stderr}.",
    ),
    Opt(
        "merge_stderr_to_stdout",
        ("--merge-stderr-to-stdout", "-merge-stderr-to-stdout"),
        FLAG,
        help="One stream per rank.",
    ),
    Opt("tag_output", ("--tag-output", "-tag-output"), FLAG, help="Prefix console lines with [1,rank]<stream>:."),
    Opt("prepend_rank", ("-l", "--prepend-rank", "-prepend-rank"), FLAG, help="Prefix console lines with [rank]."),
    Opt(
        "timestamp_output",
        ("--timestamp-output", "-timestamp-output"),
        FLAG,
        help="Prefix console lines with a time stamp.",
    ),
    Opt("stdin", ("--stdin", "-stdin"), check=RANK_CHOICE, default="0", help="Rank that gets stdin: N, all or none."),
    Opt(
        "mca",
        ("--mca", "-mca", "--gmca", "-gmca"),
        PAIRS,
        metavar="KEY VALUE",
        help="MCA parameter (exported as OMPI_MCA_KEY).",
    ),
    Opt("bind_to", ("--bind-to", "-bind-to"), default="none", metavar="none|core|socket|hwthread", help="CPU binding."),
    Opt("bind_to_core", ("--bind-to-core", "-bind-to-core"), FLAG, help="Open MPI's old --bind-to core."),
    Opt("bind_to_socket", ("--bind-to-socket", "-bind-to-socket"), FLAG, help="Open MPI's old --bind-to socket."),
    Opt("report_bindings", ("--report-bindings", "-report-bindings"), FLAG, help="Print each rank's CPU binding."),
    Opt(
        "timeout", ("--timeout", "-timeout"), check=FLOAT_POS, maximum=MAX_SECONDS, help="End the job after S seconds."
    ),
    Opt(
        "get_stack_traces",
        ("--get-stack-traces", "-get-stack-traces"),
        FLAG,
        help="With --timeout: print every rank's stack, grouped, before the job is killed.",
    ),
    Opt(
        "hang_timeout",
        ("--hang-timeout", "-hang-timeout"),
        check=FLOAT_POS,
        maximum=MAX_SECONDS,
        metavar="S",
        help="When no rank wrote any output for S seconds: print every rank's stack (again after each "
        "further S of silence); the job goes on.",
    ),
    Opt(
        "hang_action",
        ("--hang-action", "-hang-action"),
        check=CHOICE,
        choices=("stacks", "kill"),
        default="stacks",
        help="What --hang-timeout does: stacks (the job goes on) or kill (after the stacks; status 124, as a timeout).",
    ),
    Opt(
        "kill_timeout",
        ("--kill-timeout", "-kill-timeout"),
        check=FLOAT_NONNEG,
        maximum=3600.0,
        default=2.0,
        show_default=True,
        help="Seconds between SIGTERM and SIGKILL.",
    ),
    Opt(
        "mpi",
        ("--mpi", "-mpi"),
        check=CHOICE,
        choices=("auto", "pmi1", "pmi2", "pmix", "none"),
        default="auto",
        help="What the ranks are served: auto (what their MPI needs, as read off the programs; PMI and PMIx "
        "together where it cannot be read), pmi1 (PMI-1 and PMI-2, for MPICH and Intel MPI), pmi2 (also tell "
        "MPICH to use PMI-2), pmix (PMIx, for Open MPI) or none.",
    ),
    Opt(
        "pmix_lib",
        ("--pmix-lib", "-pmix-lib"),
        metavar="PATH",
        help="With --mpi pmix: the PMIx server library (libpmix.so.2, PMIx 4 or 5) on every host.",
    ),
    Opt(
        "pmi_tcp",
        ("--pmi-tcp", "-pmi-tcp"),
        FLAG,
        help="Serve PMI over loopback TCP (PMI_PORT + a secret PMI_ID) for ranks that cannot inherit PMI_FD.",
    ),
    Opt(
        "devices_per_rank",
        ("--devices-per-rank", "-devices-per-rank"),
        check=INT_MIN1,
        maximum=1024,
        metavar="N",
        help="Each rank sees only its N devices: CUDA_VISIBLE_DEVICES (or the ASCEND_RT_/HIP_ list you set) narrowed.",
    ),
    Opt(
        "rank_table",
        ("--rank-table", "-rank-table"),
        metavar="PATH",
        help="Write the job's HCCL rank table (MindSpore/Ascend).",
    ),
    Opt(
        "report_json",
        ("--report-json", "-report-json"),
        metavar="PATH",
        help="At the end of the run, write what happened (every rank's times, status, CPU, memory) as JSON.",
    ),
    Opt("ssh_config", ("--ssh-config", "-ssh-config"), metavar="PATH", help="SSH config (default ~/.ssh/config)."),
    Opt(
        "ssh_accept_new",
        ("--ssh-accept-new", "-ssh-accept-new"),
        FLAG,
        help="Accept and record unknown host keys (a changed key is always refused).",
    ),
    Opt(
        "ssh_client",
        ("--ssh-client", "-ssh-client"),
        check=CHOICE,
        choices=("auto", "openssh", "paramiko"),
        default="auto",
        help="SSH client for the hosts: openssh (an `ssh` process per host, reading your ssh config as ssh does), "
        "paramiko (in the launcher), or auto: openssh when `ssh` is on PATH, else paramiko.",
    ),
    Opt(
        "ssh_tree_width",
        ("--ssh-tree-width", "-ssh-tree-width"),
        check=INT_MIN1,
        maximum=MAX_RANKS,
        metavar="K",
        help="Tree spawn: connect to K hosts; each one's agent starts up to K more with ssh (hosts reach each other).",
    ),
    Opt(
        "launcher",
        ("--launcher", "-launcher", "-bootstrap", "--bootstrap"),
        check=CHOICE,
        choices=("auto", "ssh", "rsh", "slurm", "sge", "local", "fork", *OTHER_HYDRA_LAUNCHERS),
        default="auto",
        help="How agents start: ssh (this machine's hosts locally, the others over SSH; rsh: the same), slurm (one "
        "srun step of agents), sge (a `qrsh -inherit` task per other host of a Grid Engine job), local (alias fork: "
        "every host's agent on this machine, as hydra's fork launcher), or auto: slurm inside a Slurm allocation, "
        "sge inside a Grid Engine parallel job, whose hosts the job uses, else ssh. hydra's other launchers "
        "are read as auto, said once.",
    ),
    Opt(
        "configfile",
        ("-configfile", "--configfile"),
        metavar="FILE",
        help="hydra's file of app contexts: one per line, options and program, as between ' : '.",
    ),
    Opt("appfile", ("--app", "-app"), metavar="FILE", help="Open MPI's appfile: read as hydra's -configfile."),
    Opt(
        "allow_run_as_root",
        ("--allow-run-as-root", "-allow-run-as-root"),
        FLAG,
        help="Accepted, as mpirun's; root needs no flag here.",
    ),
    # torchrun's words (2.13), with its underscore spellings (cli/torchrun_words.py reads them)
    Opt(
        "nproc_per_node",
        ("--nproc-per-node", "--nproc_per_node"),
        metavar="N|auto|cpu|gpu",
        help="torchrun's ranks per node (with -H, a hostfile or an allocation: on each of its hosts).",
    ),
    Opt(
        "nnodes", ("--nnodes",), metavar="N|MIN:MAX", help="torchrun's node count; more than 1: one launcher per node."
    ),
    Opt("node_rank", ("--node-rank", "--node_rank"), check=INT_MIN0, maximum=MAX_RANKS, help="torchrun's node rank."),
    Opt("master_addr", ("--master-addr", "--master_addr"), metavar="HOST", help="torchrun's rendezvous host."),
    Opt(
        "master_port",
        ("--master-port", "--master_port"),
        check=INT_MIN1,
        maximum=65535,
        help="torchrun's rendezvous port.",
    ),
    Opt("standalone", ("--standalone",), FLAG, help="torchrun's single-node job on a free port."),
    Opt("rdzv_backend", ("--rdzv-backend", "--rdzv_backend"), metavar="static|c10d", help="torchrun's rendezvous."),
    Opt("rdzv_endpoint", ("--rdzv-endpoint", "--rdzv_endpoint"), metavar="HOST[:PORT]", help="torchrun's endpoint."),
    Opt("rdzv_id", ("--rdzv-id", "--rdzv_id"), metavar="ID", help="torchrun's run id (TORCHELASTIC_RUN_ID)."),
    Opt("rdzv_conf", ("--rdzv-conf", "--rdzv_conf"), metavar="K=V,...", help="torchrun's rendezvous settings."),
    Opt(
        "max_restarts",
        ("--max-restarts", "--max_restarts", "-max-restarts"),
        check=INT_MIN0,
        maximum=10000,
        help="Start the whole job again after a failure, up to N times (torchrun's and Open MPI's).",
    ),
    Opt(
        "restart_delay",
        ("--restart-delay", "-restart-delay"),
        check=FLOAT_NONNEG,
        maximum=3600.0,
        help="Seconds between a failed attempt's end and the next (default 3).",
    ),
    Opt("monitor_interval", ("--monitor-interval", "--monitor_interval"), metavar="S", help="torchrun's: accepted."),
    Opt("start_method", ("--start-method", "--start_method"), metavar="spawn|fork", help="torchrun's: accepted."),
    Opt("role", ("--role",), metavar="NAME", help="torchrun's role (ROLE_NAME)."),
    Opt("module", ("-m", "--module"), FLAG, help="torchrun's: the program is a Python module (python -m)."),
    Opt(
        "no_python", ("--no-python", "--no_python"), FLAG, help="torchrun's: run the program as it is, not with Python."
    ),
    Opt("run_path", ("--run-path", "--run_path"), FLAG, help="torchrun's: run the script with runpy.run_path."),
    Opt("log_dir", ("--log-dir", "--log_dir"), metavar="DIR", help="torchrun's log folder."),
    Opt("redirects", ("-r", "--redirects"), metavar="0-3|N:M,...", help="torchrun's: streams to files only."),
    Opt("tee", ("-t", "--tee"), metavar="0-3|N:M,...", help="torchrun's: streams to files and the console."),
    Opt(
        "local_ranks_filter",
        ("--local-ranks-filter", "--local_ranks_filter"),
        metavar="0,1",
        help="torchrun's: only these local ranks' output on the console.",
    ),
    Opt("local_addr", ("--local-addr", "--local_addr"), metavar="ADDR", help="torchrun's: this node's address."),
    Opt(
        "virtual_local_rank",
        ("--virtual-local-rank", "--virtual_local_rank"),
        FLAG,
        help="torchrun's: LOCAL_RANK 0 for every rank, each seeing its own GPU as device 0.",
    ),
    Opt(
        "shutdown_timeout",
        ("--shutdown-timeout", "--shutdown_timeout"),
        metavar="S",
        help="torchrun's: seconds the ranks get after a signal stopped the job, before SIGKILL (default 30).",
    ),
    *_ignored(
        "torchrun's",
        TORCHRUN_IGNORED_PREFIX,
        TORCHRUN_IGNORED,
        lambda name: (f"--{name}", f"--{name.replace('-', '_')}"),
    ),
    *_ignored("Open MPI's", OPEN_MPI_IGNORED_PREFIX, OPEN_MPI_IGNORED, lambda name: (f"--{name}", f"-{name}"), FLAG),
    Opt(
        "quiet", ("-q", "--quiet", "-quiet"), FLAG, help="Silence mpilaunch's own notes (errors and the summary stay)."
    ),
    Opt("verbose", ("-v", "--verbose", "-verbose"), FLAG, help="Accepted; mpilaunch's notes are on unless -q."),
    Opt(
        "prefix",
        ("--prefix", "-prefix"),
        metavar="DIR",
        help="Open MPI's install prefix: DIR/bin and DIR/lib lead the ranks' PATH and LD_LIBRARY_PATH.",
    ),
    Opt("am", ("-am", "--am"), MULTI, metavar="FILE[,FILE]", help="Open MPI's files of MCA parameters (key = value)."),
    Opt("tune", ("--tune", "-tune"), MULTI, metavar="FILE[,FILE]", help="Open MPI's files of -x and --mca options."),
    Opt(
        "rsh_agent",
        ("-bootstrap-exec", "--bootstrap-exec", "-launcher-exec", "--launcher-exec"),
        metavar="COMMAND",
        help="hydra's: a command in place of ssh for other hosts (Open MPI's -mca plm_rsh_agent).",
    ),
    Opt(
        "rsh_args",
        ("-bootstrap-exec-args", "--bootstrap-exec-args", "-launcher-exec-args", "--launcher-exec-args"),
        metavar="ARGS",
        help="hydra's: more arguments for ssh (Open MPI's -mca plm_rsh_args).",
    ),
    Opt(
        "outfile_pattern",
        ("-outfile-pattern", "--outfile-pattern"),
        metavar="PATTERN",
        help="hydra's: each rank's stdout also to this file (%%r rank, %%h host, %%g 0, %%p its host's index).",
    ),
    Opt(
        "errfile_pattern",
        ("-errfile-pattern", "--errfile-pattern"),
        metavar="PATTERN",
        help="hydra's: each rank's stderr also to this file (as -outfile-pattern).",
    ),
    Opt(
        "prepend_pattern",
        ("-prepend-pattern", "--prepend-pattern"),
        metavar="PATTERN",
        help="hydra's: this before each console line (%%r rank, %%h host, %%g 0, %%p its host's index).",
    ),
    Opt(
        "print_rank_map",
        ("-print-rank-map", "--print-rank-map"),
        FLAG,
        help="hydra's: print which host has which ranks.",
    ),
    Opt(
        "gpus_per_proc",
        ("-gpus-per-proc", "--gpus-per-proc"),
        check=INT_MIN1,
        maximum=1024,
        metavar="N",
        help="hydra's --devices-per-rank N.",
    ),
    Opt(
        "rmk", ("-rmk", "--rmk"), metavar="user|slurm|pbs|lsf", help="hydra's resource manager: where hosts come from."
    ),
    Opt("binding", ("-binding", "--binding"), metavar="cpu:cores|...", help="hydra's old -bind-to."),
    Opt(
        "demux", ("-demux", "--demux"), metavar="poll|select", help="hydra's I/O engine: accepted, ignored (said once)."
    ),
    Opt(
        "usize",
        ("-usize", "--usize"),
        metavar="N|SYSTEM|INFINITE",
        help="hydra's universe size (MPI_UNIVERSE_SIZE, OMPI_UNIVERSE_SIZE; default SYSTEM: the hosts' slots).",
    ),
    *_ignored("hydra's", HYDRA_IGNORED_PREFIX, HYDRA_IGNORED_VALUES, lambda name: (f"-{name}", f"--{name}")),
    *_ignored("hydra's", HYDRA_IGNORED_PREFIX, HYDRA_IGNORED_FLAGS, lambda name: (f"-{name}", f"--{name}"), FLAG),
)
# Spellings click handles itself (eager options); the fast scanner leaves them to it.
HELP_FLAGS = ("--help", "-help", "-h")
VERSION_FLAGS = ("--version", "-V", "-version", "-info", "--info")  # hydra's -info: its build details
SUBCOMMANDS = (
    "check",
    "allrun",
    "shims",
    "report",
    "stacks",
    "top",
)  # first words that are not a job: cli/main.SUBCOMMAND
APP_PARAMS = ("np", "wdir", "argv", "app_env", "app_envlist")  # per app context; the rest are the job's


def stdin_choice(value: str) -> str | None:
    """--stdin's value normalised, or None when it is not a rank number, all or none."""
    value = value.strip().lower()
    return value if value in ("all", "none") or value.isdigit() else None
