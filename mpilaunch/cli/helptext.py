"""`mpilaunch --help`, written from the options table (cliopts): what mpilaunch is, its
subcommands, and its own options by group, on one screen. `--help mpirun|hydra|torchrun` lists
one launcher's words (as Open MPI's `mpirun --help TOPIC`) with the variables it reads, and
`--help-all` every option of every launcher."""

from __future__ import annotations

from mpilaunch.cli import cliopts
from mpilaunch.cli.cliopts import CHOICE, FLAG, FLOAT_NONNEG, FLOAT_POS, IGNORED, INT_MIN0, INT_MIN1, OWN, Opt

GROUPS = (
    (cliopts.RANKS, "Ranks and hosts"),
    (cliopts.PLACING, "Placement and binding"),
    (cliopts.ENVIRON, "Environment"),
    (cliopts.OUTPUT, "Output and logs"),
    (cliopts.LIMITS, "Failure, restarts and time limits"),
    (cliopts.DEBUG, "Debugging and reports"),
    (cliopts.MPI, "MPI"),
)
WIDTH = 34  # the spellings' column
TITLES = {cliopts.OPENMPI: "Open MPI's mpirun", cliopts.HYDRA: "hydra's mpiexec", cliopts.TORCHRUN: "torchrun's"}
HEAD = """\
Usage: mpilaunch [options] program [args] [ : [options] program [args] ]...
Launch a parallel job, mpirun style: its ranks here, over SSH, or in a Slurm allocation.
Options come before the program: the words after it are the program's own.

Subcommands (mpilaunch SUBCOMMAND --help):
  check [hosts] [program]        Can every host be reached, and run the program?
  allrun [hosts] command         Run a command once on every host.
  report RUN.json -o OUT         Draw a run's --report-json as an HTML page or a PNG.
  stacks [PID]                   Print the stack of every rank of a running job.
  top [PID]                      Watch a running job's ranks live.
  shims DIR                      Put mpirun, mpiexec, torchrun, ... that run mpilaunch in DIR."""
TAIL = """\
Other launchers' words are read with their meaning: --help mpirun, --help hydra and
--help torchrun list each one's; --help-all lists every option. --version: the version.

Examples:
  mpilaunch -n 8 python net.py
  mpilaunch -n 16 -H host1:8,host2:8 python net.py
  mpilaunch -np 16 --hostfile hostfile --output-filename log_output python net.py
  mpilaunch -n 1 python server.py : -n 3 python worker.py"""


def help_text(topic: str = "") -> str:
    """The help for a topic: "" (mpilaunch's own options), "all", or a launcher (cliopts.HELP_TOPICS)."""
    launcher = cliopts.HELP_TOPICS.get(topic.lower())
    if launcher is not None:
        return _launcher_help(launcher)
    rows = cliopts.all_rows() if topic == "all" else cliopts.rows()
    lines = [HEAD]
    for group, title in GROUPS:
        lines += ["", f"{title}:", *(_line(o, topic == "all") for o in rows if o.group == group and OWN in o.whose)]
    if topic == "all":
        for launcher, title in TITLES.items():
            lines += ["", f"{title} words:", *_lines(list(cliopts.load(launcher).ROWS))]
    return "\n".join([*lines, "", TAIL])


def _launcher_help(launcher: str) -> str:
    module = cliopts.load(launcher)
    rows = [o for o in cliopts.all_rows() if launcher in o.whose]
    lines = [f"{TITLES[launcher]} words, read here with their meaning (mpilaunch --help: its own options):"]
    lines += [*_lines(rows), "", "Its variables:"]
    lines += [
        f"  {name:<{WIDTH}} {what}" if len(name) <= WIDTH else f"  {name}\n  {'':<{WIDTH}} {what}"
        for name, what in module.ENVIRONMENT
    ]
    return "\n".join(lines)


def _lines(rows: list[Opt]) -> list[str]:
    """Rows one a line, every spelling; those that mean nothing here together, by why."""
    import textwrap

    out = [_line(o, True) for o in rows if IGNORED not in o.roles]
    ignored = [o for o in rows if IGNORED in o.roles]
    for why in dict.fromkeys(o.help for o in ignored):
        words = ", ".join(o.flags[0] + ("" if o.kind == FLAG else " V") for o in ignored if o.help == why)
        text = f"{words}: {why} (accepted, said once)"
        out += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    return out


def _line(opt: Opt, every: bool = False) -> str:
    """One row: its spellings (every one, or the first and the short ones) and its value, then its
    help, on the next line when every spelling does not leave room."""
    first, second = opt.flags[0], opt.flags[1:2] if len(opt.flags[0]) == 2 else ()  # -n, -np; -H, --host
    flags = opt.flags if every else (first, *second, *(f for f in opt.flags[1 + len(second) :] if len(f) == 2))
    left = ", ".join(flags) + ("" if opt.kind == FLAG else f" {_metavar(opt)}")
    if len(left) <= WIDTH or not every:
        return f"  {left:<{WIDTH}} {opt.help}"
    return f"  {left}\n  {'':<{WIDTH}} {opt.help}"


def _metavar(opt: Opt) -> str:
    if opt.metavar:
        return opt.metavar
    if opt.check == CHOICE:
        return "|".join(opt.choices)
    if opt.check in (INT_MIN1, INT_MIN0):
        return "N"
    return "S" if opt.check in (FLOAT_POS, FLOAT_NONNEG) else "VALUE"
