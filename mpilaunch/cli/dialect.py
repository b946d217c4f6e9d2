"""Whose words a command line speaks: mpilaunch reads Open MPI's `mpirun` and hydra's `mpiexec`,
and runs under their names too (`mpilaunch shims`).

Most words mean the same to both launchers and are read the same whatever the name. Three are
spelled alike but place ranks differently (`-host`, `-hostfile`, `-machinefile`): they take the
meaning of the launcher the line speaks. That is the one mpilaunch was started as (`mpirun`,
`orterun`: Open MPI; `mpiexec.hydra`: hydra), or, for `mpiexec` and `mpilaunch`, the one whose
own words the line uses (under `mpiexec`, those three are hydra's unless the line uses a word
only Open MPI has). This pass, before the line is parsed, rewrites those three to an
unambiguous spelling, joins hydra's two-word `-genv NAME VALUE` (and `-env`) into `NAME=VALUE`,
and refuses a line that places ranks both ways.
"""

from __future__ import annotations

from mpilaunch.cli.argscan import OptionWord, option_words, split_apps
from mpilaunch.cli.cliopts import (
    ENV,
    FLAG,
    HYDRA_IGNORED_FLAGS,
    HYDRA_IGNORED_PREFIX,
    HYDRA_IGNORED_VALUES,
    ignored_param,
)
from mpilaunch.errors import LaunchError

OPENMPI, HYDRA = "openmpi", "hydra"
BY_NAME = {  # names whose launcher is known; mpiexec and mpilaunch go by the words
    "mpirun": OPENMPI,
    "orterun": OPENMPI,
    "oshrun": OPENMPI,
    "mpirun.openmpi": OPENMPI,
    "mpiexec.openmpi": OPENMPI,
    "mpiexec.hydra": HYDRA,
    "mpirun.mpich": HYDRA,
    "mpiexec.mpich": HYDRA,
}
AMBIGUOUS = {  # spelling -> (Open MPI's meaning, hydra's meaning), each an unambiguous spelling
    "-host": ("--host", "-hosts"),
    "-hostfile": ("--hostfile", "-f"),
    "-machinefile": ("--machinefile", "-f"),
    "--host": ("--host", "-hosts"),  # hydra reads every option with two dashes too
    "--hostfile": ("--hostfile", "-f"),
    "--machinefile": ("--machinefile", "-f"),
}
# Options only Open MPI's mpirun has: under the name mpiexec, a line with one of them reads the
# ambiguous words as Open MPI's; a line with none, as hydra's (it runs what Open MPI refuses).
OPENMPI_ONLY = frozenset(
    {
        "exports",
        "mca",
        "oversubscribe",
        "nooversubscribe",
        "am",
        "tune",
        "tag_output",
        "output_filename",
        "merge_stderr_to_stdout",
        "timestamp_output",
        "prefix",
        "display_map",
        "display_allocation",
        "report_bindings",
        "use_hwthread_cpus",
    }
)
OPENMPI_PLACEMENT = frozenset({"hosts", "hostfile", "rank_by", "npernode", "npersocket", "bynode", "byslot"})
HYDRA_PLACEMENT = frozenset({"hydra_hosts", "hydra_hostfile", "ppn"})
HYDRA_ONLY = HYDRA_PLACEMENT | {  # options no Open MPI mpirun has: a line with one speaks hydra
    "genv",
    "genvlist",
    "genvall",
    "genvnone",
    "app_env",
    "app_envlist",
    "iface",
    "configfile",
    "prepend_rank",
    "prepend_pattern",
    "rsh_agent",
    "rsh_args",
    "outfile_pattern",
    "errfile_pattern",
    "print_rank_map",
    "gpus_per_proc",
    "rmk",
    "binding",
    "demux",
    "usize",
    *(ignored_param(HYDRA_IGNORED_PREFIX, name) for name in (*HYDRA_IGNORED_VALUES, *HYDRA_IGNORED_FLAGS)),
}


def dialect_of(name: str) -> str | None:
    """The launcher a program name stands for, or None (mpiexec, mpilaunch: by the words)."""
    return BY_NAME.get(name)


def _places_across_hosts(param: str, value: str) -> bool:
    """--map-by node or ppr: Open MPI's placement; hydra's -map-by names binding objects."""
    if param != "map_by":
        return param in OPENMPI_PLACEMENT
    return value.lower().startswith(("node", "ppr"))


def canonical(argv: list[str], name: str = "mpilaunch") -> tuple[list[str], str]:
    """(argv with every ambiguous word in its unambiguous spelling and -genv/-env one word each,
    the launcher whose words it speaks: OPENMPI or HYDRA); LaunchError for a line that places
    ranks both as Open MPI and as hydra."""
    segments = split_apps(argv)
    found = [list(option_words(words)) for words in segments]
    params = [
        (w.opt.name, w.word, w.values)
        for per in found
        for w in per
        if w.opt is not None and w.word.partition("=")[0] not in AMBIGUOUS  # those follow the others
    ]
    omp = [word for param, word, values in params if _places_across_hosts(param, values[0] if values else "")]
    hyd = [word for param, word, _ in params if param in HYDRA_PLACEMENT]
    if omp and hyd:
        raise LaunchError(
            f"{omp[0]} places ranks as Open MPI's mpirun does and {hyd[0]} as hydra's mpiexec does; "
            "give the options of one of them"
        )
    side = HYDRA if hyd else OPENMPI if omp else dialect_of(name)
    if side is None:
        side = _side_of_words({param for param, _, _ in params}, name, found)
    out: list[str] = []
    for words, per in zip(segments, found):
        if out:
            out.append(":")
        out.extend(_rewritten(words, per, side))
    return out, side


def _side_of_words(params: set[str], name: str, found: list[list[OptionWord]]) -> str:
    """A line with no placement word of either: hydra's if it has a word of hydra's; under the
    name mpiexec, hydra's too when it has an ambiguous host word and no word of Open MPI's."""
    if params & HYDRA_ONLY:
        return HYDRA
    ambiguous = any(w.opt is not None and w.word.partition("=")[0] in AMBIGUOUS for per in found for w in per)
    return HYDRA if name == "mpiexec" and ambiguous and not params & OPENMPI_ONLY else OPENMPI


def _rewritten(words: list[str], found: list[OptionWord], side: str) -> list[str]:
    """One app context's words, its ambiguous options respelled and hydra's pairs joined."""
    out = list(words)
    for item in reversed(found):  # from the end: an earlier index stays valid
        if item.opt is None:
            continue
        head, eq, glued = item.word.partition("=")
        respelled = AMBIGUOUS[head][side == HYDRA] if head in AMBIGUOUS else head
        if eq and len(respelled) == 2 and item.opt.kind != FLAG and item.word.startswith(f"{head}="):
            out[item.index : item.index + 1] = [respelled, glued]  # -n=2, as hydra reads it (click: -n '=2')
        elif respelled != head:
            out[item.index] = f"{respelled}={glued}" if eq else respelled
        if item.opt.kind == ENV and not eq and len(item.values) == 2:
            out[item.index + 1 : item.index + 3] = [f"{item.values[0]}={item.values[1]}"]
    return out
