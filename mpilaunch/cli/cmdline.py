"""The command line, read once: what entry.main starts first, the early agent's PMIx guess and
the run's parse all take from this one record.

Reading it is the fast scanner's work (cli/argscan.py) on the words cli/dialect.py made
canonical; an app context the scanner is not sure of is left for click (cli/parse.py), which
gives its own messages.
"""

from __future__ import annotations

from mpilaunch.cli import cliopts
from mpilaunch.cli.argscan import option_words, scan, split_apps
from mpilaunch.errors import LaunchError

# What a command line asks for
JOB, DRY_RUN, VERSION, HELP, SUBCOMMAND, INFO = "job", "dry-run", "version", "help", "subcommand", "ompi_info"
SINGLETON = "singleton"  # hydra's singleton start: cli/singleton.py
HOST_OPTIONS = ("hosts", "hostfile", "hydra_hosts", "hydra_hostfile", "launcher", "config", "configfile", "appfile")


class CommandLine:
    """argv as mpilaunch reads it: what it asks for, and for a job its words and app contexts."""

    __slots__ = ("args", "error", "kind", "name", "segments", "side", "words")

    def __init__(self, name: str, args: list[str]) -> None:
        self.name = name  # what mpilaunch was started as (mpirun, mpiexec, ...: cli/dialect.py)
        self.args = args  # as given, without the program's own name
        self.kind = JOB
        self.words = args  # canonical (cli/dialect.canonical): hydra's pairs joined, ambiguous words respelled
        self.side = "openmpi"  # the launcher whose words it speaks
        self.segments: list[tuple[dict, set[str]] | None] = []  # per app context: (params, given), None: click's
        self.error: LaunchError | None = None  # a line refused as it was read, said when the run parses it

    @property
    def starts_a_job(self) -> bool:
        """A job that runs (not help, a version, a dry run, a subcommand, a refused line)."""
        return self.kind == JOB and self.error is None and bool(self.args)

    @property
    def names_hosts(self) -> bool:
        """Whether the line names its hosts or its engine (else, in an allocation, the hosts are
        Slurm's and srun starts the agents); in a context the scanner left to click, by its
        options' spellings."""
        for seg, words in zip(self.segments, split_apps(self.words)):
            given = seg[1] if seg is not None else {w.opt.name for w in option_words(words) if w.opt is not None}
            if given & set(HOST_OPTIONS):
                return True
        return False


def read(argv: list[str], name: str = "mpilaunch") -> CommandLine:
    """The command line of `name` (argv without the program's own name)."""
    line = CommandLine(name, argv)
    if name == "ompi_info":
        line.kind = INFO
        return line
    if argv and argv[0] in cliopts.SUBCOMMANDS:
        line.kind = SUBCOMMAND
        return line
    if "-pmi_args" in argv[:2]:  # hydra's singleton start (cli/singleton.py); after -v under MPICH's PMI_DEBUG
        line.kind = SINGLETON
        return line
    for item in option_words(split_apps(argv)[0]):
        if item.opt is None and item.word in cliopts.VERSION_FLAGS:
            line.kind = VERSION
            return line
        if item.opt is None and item.word in cliopts.HELP_FLAGS:
            line.kind = HELP
            return line
    from mpilaunch.cli.dialect import canonical

    try:
        line.words, line.side = canonical(argv, name)
    except LaunchError as exc:
        line.error = exc
        return line
    line.segments = [scan(words) for words in split_apps(line.words)]
    if any(seg is not None and seg[0]["dry_run"] for seg in line.segments):
        line.kind = DRY_RUN
    return line
