"""The command line, read once: what entry.main starts first, the early agent's PMIx guess and
the run's parse all take from this one record.

Its words are walked once (cli/tokens.py), made canonical by cli/dialect.py and read by the
fast scanner; an app context the scanner is not sure of is left for click (cli/parse.py), which
gives its own messages.
"""

from __future__ import annotations

from mpilaunch.cli import cliopts
from mpilaunch.cli.tokens import Token, scan, split_apps, tokens
from mpilaunch.errors import LaunchError

# What a command line asks for
JOB, DRY_RUN, VERSION, HELP, SUBCOMMAND, INFO = "job", "dry-run", "version", "help", "subcommand", "ompi_info"
SINGLETON = "singleton"  # hydra's singleton start: cli/singleton.py


class CommandLine:
    """argv as mpilaunch reads it: what it asks for, and for a job its app contexts and tokens."""

    __slots__ = ("args", "contexts", "error", "kind", "name", "segments", "side", "tokens", "topic")

    def __init__(self, name: str, args: list[str]) -> None:
        self.name = name  # what mpilaunch was started as (mpirun, mpiexec, ...: cli/dialect.py)
        self.args = args  # as given, without the program's own name
        self.kind = JOB
        self.topic = ""  # for help: the word after --help (mpirun, hydra, torchrun), or --help-all
        self.contexts = split_apps(args)  # each app context's words, as given
        self.tokens: list[list[Token]] = []  # each one's options, canonical (cli/dialect.canonical)
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
        Slurm's and srun starts the agents)."""
        roles = {cliopts.HOSTS, cliopts.WHERE, cliopts.CONTEXTS}
        return any(t.opt is not None and roles & set(t.opt.roles) for per in self.tokens for t in per)


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
    found = [tokens(words) for words in line.contexts]
    for per, words in zip(found, line.contexts):
        last = per[-1] if per else None
        if last is not None and last.opt is None and last.word in cliopts.VERSION_FLAGS:
            line.kind = VERSION
            return line
        if last is not None and last.opt is None and last.word in cliopts.HELP_FLAGS:
            line.kind = HELP
            after = words[last.index + 1 : last.index + 2]
            line.topic = "all" if last.word.endswith("-all") else after[0] if after else ""
            return line
    from mpilaunch.cli.dialect import canonical

    try:
        line.tokens, line.side = canonical(found, name)
    except LaunchError as exc:
        line.error = exc
        return line
    line.segments = [scan(words, per) for words, per in zip(line.contexts, line.tokens)]
    if any(seg is not None and seg[0]["dry_run"] for seg in line.segments):
        line.kind = DRY_RUN
    if name == "mpilaunch" and not found[0] and argv:
        line.error = subcommand_typo(argv[0])
    return line


def subcommand_typo(word: str) -> LaunchError | None:
    """`mpilaunch chek`: a first word one letter off a subcommand that is no program here (not on
    PATH, no file of that name) is refused with the subcommand it is likely to mean."""
    near = [s for s in cliopts.SUBCOMMANDS if _one_edit(word, s)]
    if not near or "/" in word:
        return None
    import os

    from mpilaunch.host.programs import find_program

    try:
        find_program(word, dict(os.environ))
    except FileNotFoundError:
        if not os.path.lexists(word):
            return LaunchError(f"no program {word!r}; did you mean the subcommand {near[0]!r}?")
    return None


def _one_edit(a: str, b: str) -> bool:
    """One letter added, dropped, changed, or two next to each other swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if len(a) == len(b):
        return a[i + 1 :] == b[i + 1 :] or (a[i : i + 2] == b[i : i + 2][::-1] and a[i + 2 :] == b[i + 2 :])
    return a[i:] == b[i + 1 :] if len(a) < len(b) else a[i + 1 :] == b[i:]
