"""Open MPI's `mpirun` (4.1) words, end to end: the rows only Open MPI has (mpilaunch's own rows
that are Open MPI's too are in cli/cliopts.py), the MCA parameters it reads from the
environment, its exit-status rules, and what each word means here: mpilaunch's own field, or a
note that mpilaunch has no such thing and ignores it.

Pure functions of the parsed values (and, for MCA parameters, the environment Open MPI would
read them from): cli/parse.py calls them once per command line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from mpilaunch.cli.cliopts import (
    ADDS_UP,
    CONTEXTS,
    FLAG,
    HYDRA,
    INT_MIN1,
    MAX_RANKS,
    MULTI,
    NO_KEY,
    OPENMPI,
    PLACES,
    Opt,
    ignored,
    said_ignored,
)
from mpilaunch.errors import LaunchError

RULES = "openmpi"  # the failure and signal rules its words select (launcher/decide/policy.py)
MINE = (OPENMPI,)
# fmt: off
ROWS: tuple[Opt, ...] = (
    Opt("npersocket", "--npersocket -npersocket", check=INT_MIN1, maximum=MAX_RANKS, whose=MINE, roles=(PLACES,),
        help="Ranks per socket (ppr:N:socket)."),
    Opt("bynode", "--bynode -bynode", FLAG, whose=MINE, roles=(PLACES,), means=("map_by", "node"),
        help="The older --map-by node."),
    Opt("byslot", "--byslot -byslot --bycore -bycore", FLAG, whose=MINE, roles=(PLACES,), means=("map_by", "slot"),
        help="The older --map-by slot."),
    Opt("pernode", "--pernode -pernode", FLAG, whose=MINE, means=("npernode", 1), help="The older --npernode 1."),
    Opt("cpus_per_proc", "--cpus-per-proc -cpus-per-proc --cpus-per-rank -cpus-per-rank", check=INT_MIN1,
        maximum=4096, whose=MINE, help="The older --map-by ...:PE=N: N cores per rank."),
    Opt("bind_to_core", "--bind-to-core -bind-to-core", FLAG, whose=MINE, help="The older --bind-to core."),
    Opt("bind_to_socket", "--bind-to-socket -bind-to-socket", FLAG, whose=MINE, help="The older --bind-to socket."),
    Opt("nooversubscribe", "--nooversubscribe -nooversubscribe", FLAG, whose=MINE,
        help="Open MPI's default: no more ranks than slots."),
    Opt("rankfile", "--rankfile -rankfile -rf", metavar="FILE", whose=MINE, help="A rankfile: not read (refused)."),
    Opt("appfile", "--app -app", metavar="FILE", whose=MINE, roles=(CONTEXTS, NO_KEY),
        help="An appfile: read as hydra's -configfile."),
    Opt("am", "-am --am", MULTI, metavar="FILE[,FILE]", whose=MINE, roles=(ADDS_UP, NO_KEY),
        help="Files of MCA parameters (key = value)."),
    Opt("tune", "--tune -tune", MULTI, metavar="FILE[,FILE]", whose=MINE, roles=(ADDS_UP, NO_KEY),
        help="Files of -x and --mca options."),
    Opt("prefix", "--prefix -prefix", metavar="DIR", whose=MINE,
        help="Install prefix: DIR/bin and DIR/lib lead the ranks' PATH and LD_LIBRARY_PATH."),
    Opt("allow_run_as_root", "--allow-run-as-root -allow-run-as-root", FLAG, whose=MINE,
        help="Accepted; root needs no flag here."),
    Opt("verbose", "-v --verbose -verbose", FLAG, whose=(OPENMPI, HYDRA),
        help="Accepted; mpilaunch's notes are on unless -q."),
    *ignored("continuous; enable-recovery; disable-recovery; report-child-jobs-separately; leave-session-attached; "
             "display-devel-map; display-devel-allocation; do-not-resolve; debug-daemons; noprefix; show-progress; "
             "report-state-on-timeout; novm", OPENMPI, FLAG),
)
# fmt: on
ENVIRONMENT = (
    ("OMPI_MCA_<key>", "an MCA parameter, as -mca KEY VALUE (the command line wins); all reach the ranks"),
    ("OMPI_MCA_orte_abort_on_non_zero_status", "0: a failed rank does not end the others"),
    ("OMPI_MCA_rmaps_base_oversubscribe", "and the other mapping, binding and output parameters: their options"),
    ("OMPI_MCA_plm_rsh_agent", "a command in place of ssh (plm_rsh_args: more arguments for it)"),
    ("MPIEXEC_TIMEOUT", "--timeout, when not given"),
)
MAP_OBJECTS = ("slot", "node", "core", "hwthread", "socket", "numa", "l3cache", "l2cache", "l1cache", "board")
RANK_BY = (*MAP_OBJECTS, "fill", "span")
PPR_OBJECTS = ("node", "socket")


def read_map_by(value: str) -> tuple[str, int, bool | None, bool]:
    """Open MPI 4.1's --map-by: `OBJECT[:MODIFIER[,MODIFIER]...]` or `ppr:N:OBJECT[:...]`, with the
    modifiers PE=M, OVERSUBSCRIBE, NOOVERSUBSCRIBE, SPAN and DISPLAY. Returns (the policy: slot,
    node or ppr:N:OBJECT, as Open MPI's hardware objects map as slot does; cores, or hwthreads
    with --use-hwthread-cpus, per rank, 0 when not given; :OVERSUBSCRIBE True, :NOOVERSUBSCRIBE
    False, else None; :DISPLAY, as --display-map)."""
    parts = [p for part in value.split(":") for p in part.split(",")]
    head = parts[0].lower() or "slot"  # `:OVERSUBSCRIBE`: the default policy with modifiers
    rest = parts[1:]
    policy = "node" if head == "node" else "slot"
    if head == "ppr":
        if len(rest) < 2 or not rest[0].isdigit() or int(rest[0]) < 1 or rest[1].lower() not in PPR_OBJECTS:
            raise LaunchError(f"--map-by {value!r}: expected ppr:N:node or ppr:N:socket (N at least 1)")
        policy, rest = f"ppr:{int(rest[0])}:{rest[1].lower()}", rest[2:]
    elif head not in MAP_OBJECTS:
        raise LaunchError(
            f"--map-by {value!r}: expected slot, node, socket, core, numa, hwthread, ppr:N:node or ppr:N:socket"
        )
    pe, over, display = 0, None, False
    for modifier in rest:
        word = modifier.upper()
        if word.startswith("PE="):
            count = word[3:]
            if not count.isdigit() or not count.isascii() or not 1 <= int(count) <= 4096:
                raise LaunchError(f"--map-by {value!r}: PE= takes a number of cores from 1 to 4096")
            pe = int(count)
        elif word in ("OVERSUBSCRIBE", "NOOVERSUBSCRIBE"):
            over = word == "OVERSUBSCRIBE"
        elif word in ("DISPLAY", "DISPLAYALLOC"):
            display = True
        elif word != "SPAN":
            raise LaunchError(f"--map-by {value!r}: unknown modifier {modifier!r} (PE=N, OVERSUBSCRIBE, SPAN, DISPLAY)")
    return policy, pe, over, display


def mapping_options(values: dict[str, object], given: set[str]) -> dict[str, object]:
    """--map-by with --npersocket and --cpus-per-proc folded in (--bynode and --byslot set it as
    they are read: cliopts.meant) and --rank-by checked: the Options fields they set."""
    map_by = str(values.pop("map_by"))
    npersocket, cpus = values.pop("npersocket", None), values.pop("cpus_per_proc", None)
    if "map_by" not in given and npersocket:
        map_by = f"ppr:{npersocket}:socket"
    policy, pe, oversubscribe, display = read_map_by(map_by)
    pe = pe or int(cpus or 0)  # type: ignore[call-overload]
    rank_by = values.pop("rank_by")
    if rank_by is not None:
        head = str(rank_by).split(":", 1)[0].lower()
        if head not in RANK_BY:
            raise LaunchError(f"--rank-by {rank_by!r}: expected slot, node, core, socket, hwthread or numa")
        rank_by = "node" if head == "node" else "slot"
    out: dict[str, object] = {"map_by": policy, "rank_by": rank_by, "cpus_per_rank": pe}
    if oversubscribe is not None:
        out["oversubscribe"] = oversubscribe
    if display:
        out["display_map"] = True
    return out


def old_words(values: dict[str, object], given: set[str]) -> tuple[set[str], list[str]]:
    """--bind-to-core and --bind-to-socket as --bind-to (one given wins, or hydra's -binding),
    the rankfile refused, and a note for each flag that means nothing here: (the options so set,
    the notes)."""
    rankfile = values.pop("rankfile", None)
    if rankfile is not None:
        raise LaunchError(
            f"--rankfile {rankfile}: mpilaunch does not read rankfiles; place the ranks with -H or --hostfile "
            "and --map-by, and bind them with --bind-to"
        )
    out: set[str] = set()
    for flag, level in (("bind_to_core", "core"), ("bind_to_socket", "socket")):
        if values.pop(flag, False) and "bind_to" not in given | out:
            values["bind_to"] = level
            out.add("bind_to")
    values.pop("verbose", None)
    return out, said_ignored(values, OPENMPI, "mpirun's {flag} means nothing here: ignored")


def mca_params(values: dict[str, object], env: Mapping[str, str]) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """Every MCA parameter the line gives: -am files, then --tune files, then -mca (the last one
    wins), after OMPI_MCA_orte_abort_on_non_zero_status from the environment; and the -x words of
    the --tune files."""
    exports, tuned = tune_file_words(values.pop("tune", ()))  # type: ignore[arg-type]
    mca = (*mca_file_params(values.pop("am", ())), *tuned, *values.pop("mca"))  # type: ignore[arg-type, misc]
    abort = env.get("OMPI_MCA_orte_abort_on_non_zero_status")
    if abort is not None:  # Open MPI reads MCA parameters from the environment too; -mca wins
        mca = (("orte_abort_on_non_zero_status", abort), *mca)
    return tuple(mca), exports


def _texts(paths: tuple[str, ...], option: str) -> Iterator[tuple[str, str]]:
    """(path, text) of each file the values name (FILE[,FILE] each), read as it is reached."""
    for path in (p for value in paths for p in value.split(",") if p):
        from mpilaunch.plan.textfiles import read_text  # not loaded by a line without such files

        yield path, read_text(path, option, 1 << 20)


def mca_file_params(paths: tuple[str, ...]) -> list[tuple[str, str]]:
    """Open MPI's -am files: `key = value` lines (# comments), as -mca key value each."""
    out: list[tuple[str, str]] = []
    for path, text in _texts(paths, "-am"):
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, eq, value = line.partition("=")
            if not eq or not key.strip():
                raise LaunchError(f"{path}:{number}: expected `name = value`")
            out.append((key.strip(), value.strip()))
    return out


def tune_file_words(paths: tuple[str, ...]) -> tuple[list[str], list[tuple[str, str]]]:
    """Open MPI's --tune files: words of -x and -mca/--mca options (any lines, # comments), as
    the -x words (NAME[=VALUE]) and the MCA (key, value) pairs, each in the files' order."""
    exports: list[str] = []
    mca: list[tuple[str, str]] = []
    for path, text in _texts(paths, "--tune"):
        import shlex  # not loaded by a line without --tune

        try:
            words = shlex.split(text, comments=True)
        except ValueError as exc:
            raise LaunchError(f"--tune {path}: {exc}") from None
        at = 0
        while at < len(words):
            word = words[at]
            if word == "-x" and at + 1 < len(words):
                exports.append(words[at + 1])
                at += 2
            elif word in ("-mca", "--mca") and at + 2 < len(words):
                mca.append((words[at + 1], words[at + 2]))
                at += 3
            else:
                raise LaunchError(f"--tune {path}: {word!r}: a tune file holds -x NAME[=VALUE] and --mca KEY VALUE")
    return exports, mca


def last_mca(mca: tuple[tuple[str, str], ...], key: str, env: Mapping[str, str]) -> str | None:
    """An MCA parameter's value: the last -mca giving it, else OMPI_MCA_key from the environment."""
    value = env.get(f"OMPI_MCA_{key}")
    for name, given in mca:
        if name == key:
            value = given
    return value


MCA_FLAGS = {  # Open MPI's MCA parameters that steer mpirun itself, and the flag each one stands for
    "rmaps_base_oversubscribe": "oversubscribe",
    "orte_tag_output": "tag_output",
    "orte_timestamp_output": "timestamp_output",
    "hwloc_base_use_hwthreads_as_cpus": "use_hwthread_cpus",
}
MCA_VALUES = {  # ... and the options that take their value
    "rmaps_base_mapping_policy": "map_by",
    "rmaps_base_ranking_policy": "rank_by",
    "hwloc_base_binding_policy": "bind_to",
    "plm_rsh_num_concurrent": "ssh_concurrent",
}
MCA_COUNTS = {"plm_rsh_num_concurrent"}  # ... of them, those whose value is a count from 1
MCA_GIVEN = {  # what on the command line wins over each of them
    "oversubscribe": {"oversubscribe", "nooversubscribe"},
    "map_by": {"map_by", "bynode", "byslot", "npersocket"},
}
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "enabled", "t", "y"), ("0", "false", "no", "disabled", "f", "n", "")


def mca_defaults(
    values: dict[str, object], given: set[str], mca: tuple[tuple[str, str], ...], env: Mapping[str, str]
) -> set[str]:
    """The MCA parameters that steer mpirun itself (-mca, or OMPI_MCA_* from the environment, as
    a CI's `OMPI_MCA_rmaps_base_oversubscribe=yes`) set the options they stand for in values,
    unless the command line gave one; returns the options so set."""
    out: set[str] = set()
    for key, name in (*MCA_FLAGS.items(), *MCA_VALUES.items()):
        value = last_mca(mca, key, env)
        if value is None or given & MCA_GIVEN.get(name, {name}):
            continue
        if key in MCA_COUNTS:
            values[name] = mca_count(key, value)
        elif key in MCA_VALUES:
            values[name] = value
        else:
            values[name] = mca_flag(key, value)
        out.add(name)
    no_tree = last_mca(mca, "plm_rsh_no_tree_spawn", env)  # Open MPI tree-spawns unless told not to, as we do
    if no_tree is not None and "ssh_tree_width" not in given and mca_flag("plm_rsh_no_tree_spawn", no_tree):
        values["ssh_tree_width"] = 0
        out.add("ssh_tree_width")
    return out


def mca_flag(key: str, value: str) -> bool:
    """An MCA parameter's yes or no, or one line saying what it got."""
    word = value.strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        raise LaunchError(f"MCA parameter {key}={value!r}: expected 1 or 0, true or false, yes or no")
    return word in TRUE_WORDS


def mca_count(key: str, value: str) -> int:
    """An MCA parameter's count from 1, or one line saying what it got."""
    if not value.strip().isdigit() or not 1 <= int(value) <= 65536:
        raise LaunchError(f"MCA parameter {key}={value!r}: expected a whole number from 1 to 65,536")
    return int(value)


def remote_shell(
    agent: str | None, args: str | None, mca: tuple[tuple[str, str], ...], env: Mapping[str, str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the command in place of `ssh`, more arguments for it): hydra's -bootstrap-exec and
    -bootstrap-exec-args, else Open MPI's plm_rsh_agent and plm_rsh_args (-mca or OMPI_MCA_*).
    Open MPI's agent may list fallbacks (`ssh : rsh`): the first one found on PATH is taken."""
    agent = agent if agent is not None else last_mca(mca, "plm_rsh_agent", env)
    args = args if args is not None else last_mca(mca, "plm_rsh_args", env)
    if not agent and not args:
        return (), ()
    import shlex

    try:
        extra = tuple(shlex.split(args)) if args else ()
        command: tuple[str, ...] = ()
        if agent:
            choices = [shlex.split(choice) for choice in agent.split(" : ")]
            command = tuple(_first_found([c for c in choices if c], env))
    except ValueError as exc:
        raise LaunchError(f"the remote shell {agent or args!r}: {exc}") from None
    return command, extra


def _first_found(choices: list[list[str]], env: Mapping[str, str]) -> list[str]:
    from mpilaunch.host.programs import find_program

    for choice in choices:
        try:
            find_program(choice[0], {"PATH": env.get("PATH", "")})
        except OSError:
            continue
        return choice
    if not choices:
        return []
    raise LaunchError(f"the remote shell {' '.join(choices[0])!r} (plm_rsh_agent / -bootstrap-exec) is not on PATH")
