"""The command line's words as one table: a row per option, with every spelling, what its value
may be, whose word it is (mpilaunch's own, Open MPI's, hydra's, torchrun's: several may share
one), the roles it plays and where `--help` shows it.

mpilaunch's own rows are here; the rows only another launcher has live in that launcher's
module (`cli/openmpi_words.py`, `cli/hydra_words.py`, `cli/torchrun_words.py`) with their
meanings, and join the table when a word is not found among those loaded (`row_for`), or when
the line speaks that launcher (`load`): a plain `mpilaunch -n 8 true` reads neither hydra's
nor torchrun's. Kept free of click (and of dataclasses, which exec code at import):
`command.run_command()` builds click's command from the same rows, for errors and job files.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

# How an option takes its value: FLAG (none), VALUE (one), MULTI (one, repeatable), PAIRS (two, repeatable),
# ENV (hydra's NAME=VALUE or NAME VALUE, repeatable; one NAME=VALUE word once cli/dialect.canonical joined it).
FLAG, VALUE, MULTI, PAIRS, ENV = "flag", "value", "multi", "pairs", "env"
# What a value must be; the click command maps each to its type (see command.run_command).
INT_MIN1, FLOAT_POS, FLOAT_NONNEG, CHOICE, RANK_CHOICE = "int>=1", "float>0", "float>=0", "choice", "stdin"
INT_MIN0, STREAMS = "int>=0", "streams"  # STREAMS: torchrun's -r/-t (0-3 or LOCAL_RANK:0-3,...), read by its module
# Numbers are plain ASCII decimals, finite, and at most `maximum` (docs/reference.md lists each).
MAX_RANKS = 65536  # the largest job planned (plan/placement.MAX_RANKS): more is refused before any memory is spent
MAX_SECONDS = 365 * 86400.0  # --timeout (and MPIEXEC_TIMEOUT): a year
# Whose word a row is
OWN, OPENMPI, HYDRA, TORCHRUN = "mpilaunch", "openmpi", "hydra", "torchrun"
LAUNCHERS = {  # each other launcher's module: its rows (ROWS), variables (ENVIRONMENT), rules (RULES), meanings
    OPENMPI: "mpilaunch.cli.openmpi_words",
    HYDRA: "mpilaunch.cli.hydra_words",
    TORCHRUN: "mpilaunch.cli.torchrun_words",
}
# The roles a row plays, beyond taking its value
IGNORED = "ignored"  # means nothing here: accepted, said once (its help says why)
HOSTS = "hosts"  # names the job's hosts
WHERE = "where"  # may say where agents start (a job file, --launcher): in an allocation, the hosts are not Slurm's
CONTEXTS = "contexts"  # a file of app contexts (hydra's -configfile, Open MPI's --app)
PLACES = "places"  # places ranks across hosts its launcher's way (Open MPI's by slot, hydra's round-robin)
PER_APP = "per-app"  # belongs to the app context it is written in
ADDS_UP = "adds-up"  # given in several app contexts, the values add up (else the last one wins)
NO_KEY = "no-key"  # not a job file key (another file, or what a job file says with x: and env:)
# Where `mpilaunch --help` shows mpilaunch's own options (cli/helptext.GROUPS names them)
RANKS, PLACING, ENVIRON, OUTPUT, LIMITS, DEBUG, MPI = "ranks", "placing", "environ", "output", "limits", "debug", "mpi"
# hydra's launchers that mpilaunch has no engine of its own for: read as auto, with a note
OTHER_HYDRA_LAUNCHERS = ("pbs", "lsf", "ll", "cobalt", "persist", "manual")


class Opt:
    """One row: the parameter name, every spelling (one string, split at spaces), what its value may
    be, whose word it is, its roles, its help group (mpilaunch's own) and, for another launcher's
    word that stands for an option of mpilaunch's, `means`: (that option, the value a flag sets;
    None: the word's value)."""

    __slots__ = ("check", "choices", "default", "flags", "group", "help", "kind", "maximum", "means", "metavar", "name",
                 "roles", "whose")  # fmt: skip

    def __init__(
        self,
        name: str,
        flags: str,
        kind: str = VALUE,
        *,
        check: str | None = None,
        default: object = None,
        metavar: str | None = None,
        help: str = "",
        choices: tuple[str, ...] = (),
        maximum: float | None = None,
        whose: tuple[str, ...] = (OWN,),
        roles: tuple[str, ...] = (),
        group: str | None = None,
        means: tuple[str, object] | None = None,
    ) -> None:
        self.name = name
        self.flags = tuple(flags.split())
        self.kind = kind
        self.check = check
        self.default = default
        self.metavar = metavar
        self.help = help
        self.choices = choices
        self.maximum = maximum
        self.whose = whose
        self.roles = roles
        self.group = group
        self.means = means

    @property
    def unset(self) -> object:
        """The value when not given, as click gives it."""
        return () if self.kind in (MULTI, PAIRS, ENV) else False if self.kind == FLAG else self.default


def ignored(names: str, whose: str, kind: str = VALUE, why: str = "means nothing here") -> tuple[Opt, ...]:
    """Another launcher's options that mean nothing here (each `NAME` or `NAME=why`, split at
    '; '): accepted with their value (unless flags), said once where they are read."""
    out = []
    for item in names.split("; "):
        name, _, own_why = item.partition("=")
        dashes = f"-{name} --{name}" if whose == HYDRA else f"--{name} -{name}"
        if whose == TORCHRUN:
            dashes = f"--{name} --{name.replace('-', '_')}"
        param = f"{whose}_{name.replace('-', '_')}"
        metavar = None if kind == FLAG else "VALUE"
        out.append(Opt(param, dashes, kind, whose=(whose,), roles=(IGNORED,), metavar=metavar, help=own_why or why))
    return tuple(out)


OM, OMH = (OWN, OPENMPI), (OWN, OPENMPI, HYDRA)  # mpilaunch's words that are Open MPI's (and hydra's) too
# fmt: off
ROWS: tuple[Opt, ...] = (  # mpilaunch's own
    Opt("config", "--config -config", metavar="JOB.yaml", roles=(WHERE, NO_KEY), group=RANKS,
        help="Job file: options, env, command; the command line wins."),
    Opt("np", "-n -np --np -c", check=INT_MIN1, maximum=MAX_RANKS, whose=OMH, roles=(PER_APP,), group=RANKS,
        help="Number of ranks (default: every slot)."),
    Opt("hosts", "-H --host -host", MULTI, metavar="h1:N,h2:N", whose=OM, roles=(HOSTS, PLACES, ADDS_UP),
        group=RANKS, help="Hosts and their slots."),
    Opt("hostfile", "--hostfile -hostfile --machinefile -machinefile", metavar="PATH", whose=OM,
        roles=(HOSTS, PLACES), group=RANKS, help="Hostfile: a host a line, slots=N."),
    Opt("nolocal", "--nolocal -nolocal", FLAG, whose=OM, group=RANKS,
        help="No rank on this machine: only the other hosts."),
    Opt("launcher", "--launcher -launcher -bootstrap --bootstrap", check=CHOICE,
        choices=("auto", "ssh", "rsh", "slurm", "sge", "local", "fork", *OTHER_HYDRA_LAUNCHERS), default="auto",
        whose=(OWN, HYDRA), roles=(WHERE,), group=RANKS, metavar="ssh|slurm|sge|local",
        help="How agents start (default: srun, qrsh in their jobs; else ssh)."),
    Opt("ssh_config", "--ssh-config -ssh-config", metavar="PATH", group=RANKS,
        help="SSH config (default ~/.ssh/config)."),
    Opt("ssh_accept_new", "--ssh-accept-new -ssh-accept-new", FLAG, group=RANKS,
        help="Accept and record unknown host keys (never a changed one)."),
    Opt("ssh_client", "--ssh-client -ssh-client", check=CHOICE, choices=("auto", "openssh", "paramiko"),
        default="auto", group=RANKS, help="An ssh process per host, or paramiko (auto: ssh if on PATH)."),
    Opt("ssh_tree_width", "--ssh-tree-width -ssh-tree-width", check=INT_MIN0, maximum=MAX_RANKS, metavar="K",
        group=RANKS, help="Tree spawn: K hosts reached from here, each starting K more (default 32; 0: off)."),
    Opt("ssh_concurrent", "--ssh-concurrent -ssh-concurrent", check=INT_MIN1, maximum=MAX_RANKS, metavar="N",
        group=RANKS, help="At most N hosts' connections set up at once (default 32)."),
    Opt("map_by", "--map-by -map-by", default="slot", metavar="slot|node|ppr:N:node", whose=OMH,
        group=PLACING, help="Placement (Open MPI's); :PE=M gives each rank M cores."),
    Opt("rank_by", "--rank-by -rank-by", metavar="slot|node", whose=OM, roles=(PLACES,), group=PLACING,
        help="Rank order, when it differs from --map-by."),
    Opt("npernode", "--npernode -npernode -N", check=INT_MIN1, maximum=MAX_RANKS, whose=OM, roles=(PLACES,),
        group=PLACING, help="Ranks per host (ppr:N:node)."),
    Opt("oversubscribe", "--oversubscribe -oversubscribe", FLAG, whose=OM, group=PLACING,
        help="Allow more ranks than slots."),
    Opt("use_hwthread_cpus", "--use-hwthread-cpus -use-hwthread-cpus", FLAG, whose=OM, group=PLACING,
        help="Hardware threads are the CPUs (slots, binding, PE)."),
    Opt("bind_to", "--bind-to -bind-to", default="none", metavar="none|core|socket", whose=OMH, group=PLACING,
        help="CPU binding (also numa, hwthread)."),
    Opt("report_bindings", "--report-bindings -report-bindings", FLAG, whose=OM, group=PLACING,
        help="Print each rank's CPU binding."),
    Opt("devices_per_rank", "--devices-per-rank -devices-per-rank", check=INT_MIN1, maximum=1024, metavar="N",
        group=PLACING, help="Each rank sees only its N devices (CUDA_VISIBLE_DEVICES, ...)."),
    Opt("exports", "-x", MULTI, metavar="VAR[=value]", whose=OM, roles=(ADDS_UP,), group=ENVIRON,
        help="Export a variable to every rank."),
    Opt("wdir", "--wdir -wdir --wd -wd", metavar="DIR", whose=OMH, roles=(PER_APP,), group=ENVIRON,
        help="Working directory of the ranks."),
    Opt("output_filename", "--output-filename -output-filename", metavar="DIR", whose=OM, group=OUTPUT,
        help="Per-rank files DIR/1/rank.N/{stdout,stderr}."),
    Opt("merge_stderr_to_stdout", "--merge-stderr-to-stdout -merge-stderr-to-stdout", FLAG, whose=OM,
        group=OUTPUT, help="One stream per rank."),
    Opt("tag_output", "--tag-output -tag-output", FLAG, whose=OM, group=OUTPUT,
        help="Prefix console lines with [1,rank]<stream>:."),
    Opt("timestamp_output", "--timestamp-output -timestamp-output", FLAG, whose=OM, group=OUTPUT,
        help="Prefix console lines with a time stamp."),
    Opt("stdin", "--stdin -stdin", check=RANK_CHOICE, default="0", metavar="N|all|none", whose=OM, group=OUTPUT,
        help="Which rank gets stdin (default 0)."),
    Opt("quiet", "-q --quiet -quiet", FLAG, whose=OM, group=OUTPUT,
        help="Silence mpilaunch's own notes (errors and the summary stay)."),
    Opt("timeout", "--timeout -timeout", check=FLOAT_POS, maximum=MAX_SECONDS, whose=OM, group=LIMITS,
        help="End the job after S seconds (status 124)."),
    Opt("hang_timeout", "--hang-timeout -hang-timeout", check=FLOAT_POS, maximum=MAX_SECONDS, metavar="S",
        group=LIMITS, help="No output from any rank for S seconds: print every rank's stack."),
    Opt("hang_action", "--hang-action -hang-action", check=CHOICE, choices=("stacks", "kill"), default="stacks",
        group=LIMITS, help="After those stacks: the job goes on, or is killed."),
    Opt("kill_timeout", "--kill-timeout -kill-timeout", check=FLOAT_NONNEG, maximum=3600.0, default=2.0,
        group=LIMITS, help="Seconds between SIGTERM and SIGKILL (default 2)."),
    Opt("max_restarts", "--max-restarts --max_restarts -max-restarts", check=INT_MIN0, maximum=10000,
        whose=(OWN, OPENMPI, TORCHRUN), group=LIMITS, help="Start the whole job again after a failure, N times."),
    Opt("restart_delay", "--restart-delay -restart-delay", check=FLOAT_NONNEG, maximum=3600.0, group=LIMITS,
        help="Seconds before such a restart (default 3)."),
    Opt("dry_run", "--dry-run -dry-run", FLAG, whose=OM, group=DEBUG,
        help="Print the map and every rank's variables; start nothing."),
    Opt("display_map", "--display-map -display-map", FLAG, whose=OM, group=DEBUG,
        help="Print the rank map, then launch."),
    Opt("display_allocation", "--display-allocation -display-allocation", FLAG, whose=OM, group=DEBUG,
        help="Print the hosts and their slots, then launch."),
    Opt("get_stack_traces", "--get-stack-traces -get-stack-traces", FLAG, whose=OM, group=DEBUG,
        help="At --timeout: print every rank's stack before the kill."),
    Opt("report_json", "--report-json -report-json", metavar="PATH", group=DEBUG,
        help="At the end, write what happened to every rank as JSON."),
    Opt("mpi", "--mpi -mpi", check=CHOICE, choices=("auto", "pmi1", "pmi2", "pmix", "none"), default="auto",
        group=MPI, help="What the ranks are served (auto: what their MPI needs)."),
    Opt("pmix_lib", "--pmix-lib -pmix-lib", metavar="PATH", group=MPI, help="The PMIx server library (libpmix.so.2)."),
    Opt("pmi_tcp", "--pmi-tcp -pmi-tcp", FLAG, group=MPI, help="Serve PMI over loopback TCP, not an inherited PMI_FD."),
    Opt("mca", "--mca -mca --gmca -gmca", PAIRS, metavar="KEY VALUE", whose=OM, roles=(ADDS_UP,), group=MPI,
        help="MCA parameter (exported as OMPI_MCA_KEY)."),
    Opt("rank_table", "--rank-table -rank-table", metavar="PATH", group=MPI,
        help="Write the job's HCCL rank table (MindSpore/Ascend)."),
)
# fmt: on
# Spellings that are no option: the command line's kind (cli/cmdline.read)
HELP_FLAGS = ("--help", "-help", "-h", "--help-all", "-help-all")
HELP_TOPICS = {"mpirun": OPENMPI, "openmpi": OPENMPI, "hydra": HYDRA, "mpiexec": HYDRA, "torchrun": TORCHRUN}
VERSION_FLAGS = ("--version", "-V", "-version", "-info", "--info")  # hydra's -info: its build details
SUBCOMMANDS = (
    "check",
    "allrun",
    "shims",
    "report",
    "stacks",
    "top",
)  # first words that are not a job: cli/main.SUBCOMMAND

_rows: dict[str, list[Opt]] = {OWN: list(ROWS)}  # the rows loaded, by launcher
_by_flag = {flag: opt for opt in ROWS for flag in opt.flags}  # every spelling loaded -> its row


def load(launcher: str) -> ModuleType:
    """That launcher's module; its rows join the table the first time."""
    import importlib

    module = importlib.import_module(LAUNCHERS[launcher])
    if launcher not in _rows:
        _rows[launcher] = list(module.ROWS)
        _by_flag.update({flag: opt for opt in module.ROWS for flag in opt.flags})
    return module


def loaded(launcher: str) -> bool:
    return launcher in _rows


def row_for(spelling: str) -> Opt | None:
    """The row of a spelling; one no loaded row has loads the other launchers' rows first."""
    opt = _by_flag.get(spelling)
    if opt is None and len(_rows) <= len(LAUNCHERS):
        for launcher in LAUNCHERS:
            load(launcher)
        opt = _by_flag.get(spelling)
    return opt


def rows() -> list[Opt]:
    """The rows loaded: mpilaunch's own, then Open MPI's, hydra's and torchrun's."""
    return [opt for launcher in (OWN, *LAUNCHERS) for opt in _rows.get(launcher, ())]


def all_rows() -> list[Opt]:
    """Every launcher's rows (loaded now): for click's command, --help-all and the per-host commands."""
    for launcher in LAUNCHERS:
        load(launcher)
    return rows()


def named(role: str) -> frozenset[str]:
    """The parameters of the loaded rows that play a role."""
    return frozenset(opt.name for opt in rows() if role in opt.roles)


def only(launcher: str) -> frozenset[str]:
    """The loaded words that tell a line is that launcher's: for hydra and torchrun, words neither
    mpilaunch nor Open MPI has (a line with one is theirs); for Open MPI, words hydra has not
    (under the name mpiexec, a line with one is Open MPI's)."""
    if launcher == OPENMPI:
        return frozenset(o.name for o in rows() if OPENMPI in o.whose and HYDRA not in o.whose)
    return frozenset(o.name for o in rows() if o.whose == (launcher,))


def placing(launcher: str) -> frozenset[str]:
    """The loaded words that place ranks across hosts as that launcher does."""
    return frozenset(o.name for o in rows() if PLACES in o.roles and launcher in o.whose)


def meant(values: dict[str, object], given: set[str]) -> set[str]:
    """Other launchers' words that stand for an option of mpilaunch's (`means`: -pernode is
    --npernode 1) set it, unless the line gave it (or an earlier such word did): the options so set."""
    out: set[str] = set()
    for opt in rows():
        value = values.pop(opt.name, None) if opt.means is not None else None
        if value is None or value is False:
            continue
        target, constant = opt.means  # type: ignore[misc]
        if target not in given and target not in out:
            values[target] = value if constant is None else constant
            out.add(target)
    return out


def said_ignored(values: dict[str, object], launcher: str, form: str) -> list[str]:
    """A note for each word of that launcher's that means nothing here and was given (taken out of
    values); form: how its note reads, with {flag}, {value} (' VALUE' or '') and {why}."""
    notes = []
    for opt in _rows.get(launcher, ()):
        value = values.pop(opt.name, None) if IGNORED in opt.roles else None
        if value is not None and value is not False:
            notes.append(form.format(flag=opt.flags[0], value="" if value is True else f" {value}", why=opt.help))
    return notes


def stdin_choice(value: str) -> str | None:
    """--stdin's value normalised, or None when it is not a rank number, all or none."""
    value = value.strip().lower()
    return value if value in ("all", "none") or value.isdigit() else None
