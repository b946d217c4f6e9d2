"""Whose words a command line speaks: mpilaunch reads Open MPI's `mpirun` and hydra's `mpiexec`,
and runs under their names too (`mpilaunch shims`).

Most words mean the same to both launchers and are read the same whatever the name. Three are
spelled alike but place ranks differently (`-host`, `-hostfile`, `-machinefile`): they take the
meaning of the launcher the line speaks. That is the one mpilaunch was started as (`mpirun`,
`orterun`: Open MPI; `mpiexec.hydra`: hydra), or, for `mpiexec` and `mpilaunch`, the one whose
own words the line uses (the table's `whose` column: cliopts.only; under `mpiexec`, those three
are hydra's unless the line uses a word hydra has not). This pass over the line's tokens
(cli/tokens.py) respells those three unambiguously, joins hydra's two-word `-genv NAME VALUE`
(and `-env`) into `NAME=VALUE`, and refuses a line that places ranks both ways.
"""

from __future__ import annotations

from mpilaunch.cli import cliopts
from mpilaunch.cli.cliopts import ENV, FLAG, HYDRA, OPENMPI, PLACES
from mpilaunch.cli.tokens import Token, respelled
from mpilaunch.errors import LaunchError

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


def _places(t: Token) -> str | None:
    """Whose way a token places ranks across hosts: --map-by node or ppr is Open MPI's (hydra's
    -map-by names binding objects); else its row's."""
    opt = t.opt
    if opt is None or (PLACES not in opt.roles and opt.name != "map_by"):
        return None
    if opt.name == "map_by":
        return OPENMPI if t.values and t.values[0].lower().startswith(("node", "ppr")) else None
    return OPENMPI if OPENMPI in opt.whose else HYDRA


def canonical(contexts: list[list[Token]], name: str = "mpilaunch") -> tuple[list[list[Token]], str]:
    """(every app context's tokens with every ambiguous word respelled and -genv/-env one value
    each, the launcher whose words the line speaks: OPENMPI or HYDRA); LaunchError for a line
    that places ranks both as Open MPI and as hydra."""
    found = [t for per in contexts for t in per if t.opt is not None]
    plain = [t for t in found if t.head not in AMBIGUOUS]  # those follow the others
    omp = [t.word for t in plain if _places(t) == OPENMPI]
    hyd = [t.word for t in plain if _places(t) == HYDRA]
    if omp and hyd:
        raise LaunchError(
            f"{omp[0]} places ranks as Open MPI's mpirun does and {hyd[0]} as hydra's mpiexec does; "
            "give the options of one of them"
        )
    side = HYDRA if hyd else OPENMPI if omp else BY_NAME.get(name)
    if side is None:
        params = {t.opt.name for t in plain}  # type: ignore[union-attr]
        if params & cliopts.only(HYDRA):
            side = HYDRA
        else:  # under mpiexec, an ambiguous host word and no word of Open MPI's: hydra's
            ambiguous = len(plain) < len(found)
            side = HYDRA if name == "mpiexec" and ambiguous and not params & cliopts.only(OPENMPI) else OPENMPI
    return [[_as_read(t, side) for t in per] for per in contexts], side


def _as_read(t: Token, side: str) -> Token:
    """A token as the side reads it: an ambiguous spelling as its meaning's, -n=2 as -n 2 (as
    hydra reads it; click would read -n '=2'), hydra's two-word -genv NAME VALUE as NAME=VALUE."""
    if t.opt is None:
        return t
    head = t.head
    word = AMBIGUOUS[head][side == HYDRA] if head in AMBIGUOUS else head
    eq = t.eq and not (len(word) == 2 and t.opt.kind != FLAG)
    values = t.values
    if t.opt.kind == ENV and not t.eq and len(values) == 2:
        values = (f"{values[0]}={values[1]}",)
    return t if word == head and eq == t.eq and values is t.values else respelled(t, word, values, eq)
