"""What Open MPI's and hydra's less common options mean here, read out of the parsed options:
each becomes mpilaunch's own field, or a note that mpilaunch has no such thing and ignores it.

Pure functions of the parsed values (and, for MCA parameters, the environment Open MPI would
read them from): cli/parse.py calls them once per command line.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpilaunch.errors import LaunchError

MAP_MODIFIERS = ("OVERSUBSCRIBE", "NOOVERSUBSCRIBE", "SPAN", "DISPLAY", "DISPLAYALLOC")
MAP_OBJECTS = ("slot", "node", "core", "hwthread", "socket", "numa", "l3cache", "l2cache", "l1cache", "board")
RANK_BY = (
    "slot",
    "node",
    "core",
    "hwthread",
    "socket",
    "numa",
    "l3cache",
    "l2cache",
    "l1cache",
    "board",
    "fill",
    "span",
)
PPR_OBJECTS = ("node", "socket")


class MapBy:
    """--map-by read whole: the policy, ranks per object for ppr, and the modifiers."""

    __slots__ = ("display", "object", "oversubscribe", "pe", "per", "policy")

    def __init__(self, policy: str, per: int, obj: str, pe: int, oversubscribe: bool | None, display: bool) -> None:
        self.policy = policy  # slot, node or ppr (Open MPI's hardware objects map as slot does)
        self.per = per  # ppr's N
        self.object = obj  # ppr's object (node or socket); for the others the object named
        self.pe = pe  # cores (hwthreads with --use-hwthread-cpus) per rank, 0 when not given
        self.oversubscribe = oversubscribe  # :OVERSUBSCRIBE True, :NOOVERSUBSCRIBE False, else None
        self.display = display  # :DISPLAY (--display-map)


def read_map_by(value: str) -> MapBy:
    """Open MPI 4.1's --map-by: `OBJECT[:MODIFIER[,MODIFIER]...]` or `ppr:N:OBJECT[:...]`, with the
    modifiers PE=M, OVERSUBSCRIBE, NOOVERSUBSCRIBE, SPAN and DISPLAY."""
    parts = [p for part in value.split(":") for p in part.split(",")]
    head = parts[0].lower() or "slot"  # `:OVERSUBSCRIBE`: the default policy with modifiers
    rest = parts[1:]
    per, obj = 0, head
    if head == "ppr":
        if len(rest) < 2 or not rest[0].isdigit() or int(rest[0]) < 1 or rest[1].lower() not in PPR_OBJECTS:
            raise LaunchError(f"--map-by {value!r}: expected ppr:N:node or ppr:N:socket (N at least 1)")
        per, obj, rest = int(rest[0]), rest[1].lower(), rest[2:]
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
    policy = "ppr" if head == "ppr" else "node" if head == "node" else "slot"
    return MapBy(policy, per, obj, pe, over, display)


def mapping_options(values: dict[str, object], given: set[str]) -> dict[str, object]:
    """--map-by with Open MPI's old spellings folded in (--bynode, --byslot, --npersocket,
    --cpus-per-proc) and --rank-by checked: the Options fields they set."""
    map_by = str(values.pop("map_by"))
    bynode, byslot = values.pop("bynode"), values.pop("byslot")
    npersocket, cpus = values.pop("npersocket"), values.pop("cpus_per_proc")
    if "map_by" not in given:
        if bynode:
            map_by = "node"
        elif byslot:
            map_by = "slot"
        elif npersocket:
            map_by = f"ppr:{npersocket}:socket"
    mapping = read_map_by(map_by)
    pe = mapping.pe or int(cpus or 0)  # type: ignore[call-overload]
    rank_by = values.pop("rank_by")
    if rank_by is not None:
        head = str(rank_by).split(":", 1)[0].lower()
        if head not in RANK_BY:
            raise LaunchError(f"--rank-by {rank_by!r}: expected slot, node, core, socket, hwthread or numa")
        rank_by = "node" if head == "node" else "slot"
    out: dict[str, object] = {
        "map_by": mapping.policy if mapping.policy != "ppr" else f"ppr:{mapping.per}:{mapping.object}",
        "rank_by": rank_by,
        "cpus_per_rank": pe,
    }
    if mapping.oversubscribe is not None:
        out["oversubscribe"] = mapping.oversubscribe
    if mapping.display:
        out["display_map"] = True
    return out


def old_open_mpi_words(values: dict[str, object], given: set[str]) -> tuple[set[str], list[str]]:
    """Open MPI's older spellings as the options they stand for (-pernode, --bind-to-core,
    --bind-to-socket; a newer option given wins), its rankfile refused, and a note for each of
    its flags that means nothing here: (the options so set, the notes)."""
    from mpilaunch.cli.cliopts import OPEN_MPI_IGNORED, OPEN_MPI_IGNORED_PREFIX, ignored_param

    rankfile = values.pop("rankfile")
    if rankfile is not None:
        raise LaunchError(
            f"--rankfile {rankfile}: mpilaunch does not read rankfiles; place the ranks with -H or --hostfile "
            "and --map-by, and bind them with --bind-to"
        )
    out: set[str] = set()
    if values.pop("pernode") and "npernode" not in given:
        values["npernode"] = 1
        out.add("npernode")
    for flag, level in (("bind_to_core", "core"), ("bind_to_socket", "socket")):
        if values.pop(flag) and not (given | out) & {"bind_to", "binding"}:
            values["bind_to"] = level
            out.add("bind_to")
    notes = [
        f"mpirun's --{name} means nothing here: ignored"
        for name in OPEN_MPI_IGNORED
        if values.pop(ignored_param(OPEN_MPI_IGNORED_PREFIX, name))
    ]
    return out, notes


def mca_file_params(paths: tuple[str, ...], option: str) -> list[tuple[str, str]]:
    """Open MPI's -am files: `key = value` lines (# comments), as -mca key value each."""
    out: list[tuple[str, str]] = []
    if not paths:
        return out
    from mpilaunch.plan.textfiles import read_text

    for path in (p for value in paths for p in value.split(",") if p):
        text = read_text(path, option, 1 << 20)
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, eq, value = line.partition("=")
            if not eq or not key.strip():
                raise LaunchError(f"{path}:{number}: expected `name = value`")
            out.append((key.strip(), value.strip()))
    return out


def tune_file_words(paths: tuple[str, ...]) -> list[tuple[str, str]]:
    """Open MPI's --tune files: words of -x and -mca/--mca options (any lines, # comments), as
    (kind, value) pairs: ("x", "NAME[=VALUE]") or ("mca", "key\\0value")."""
    import shlex

    from mpilaunch.plan.textfiles import read_text

    out: list[tuple[str, str]] = []
    for path in (p for value in paths for p in value.split(",") if p):
        text = read_text(path, "--tune", 1 << 20)
        try:
            words = shlex.split(text, comments=True)
        except ValueError as exc:
            raise LaunchError(f"--tune {path}: {exc}") from None
        at = 0
        while at < len(words):
            word = words[at]
            if word == "-x" and at + 1 < len(words):
                out.append(("x", words[at + 1]))
                at += 2
            elif word in ("-mca", "--mca") and at + 2 < len(words):
                out.append(("mca", f"{words[at + 1]}\0{words[at + 2]}"))
                at += 3
            else:
                raise LaunchError(f"--tune {path}: {word!r}: a tune file holds -x NAME[=VALUE] and --mca KEY VALUE")
    return out


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
}
MCA_GIVEN = {  # what on the command line wins over each of them
    "oversubscribe": {"oversubscribe", "nooversubscribe"},
    "map_by": {"map_by", "bynode", "byslot", "npersocket"},
    "bind_to": {"bind_to", "binding"},
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
        if key in MCA_VALUES:
            values[name] = value
        elif value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            values[name] = value.strip().lower() in TRUE_WORDS
        else:
            raise LaunchError(f"MCA parameter {key}={value!r}: expected 1 or 0, true or false, yes or no")
        out.add(name)
    return out


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


BINDINGS = {  # hydra's old -binding words (and Open MPI's objects) -> --bind-to
    "none": "none",
    "cpu:cores": "core",
    "cpu:sockets": "socket",
    "cpu:threads": "hwthread",
    "core": "core",
    "cores": "core",
    "socket": "socket",
    "sockets": "socket",
    "hwthread": "hwthread",
    "hwthreads": "hwthread",
    "numa": "numa",
}
IGNORED_RMK = ("ll", "cobalt")  # hydra's resource managers whose host lists mpilaunch does not read


def hydra_options(values: dict[str, object], given: set[str]) -> tuple[dict[str, object], list[str]]:
    """hydra's -binding, -rmk, -demux, -gpus-per-proc and -bootstrap: the fields they set, and
    a note for each word that means nothing here."""
    out: dict[str, object] = {}
    notes: list[str] = []
    binding = values.pop("binding")
    if binding is not None:
        bind = BINDINGS.get(str(binding).lower())
        if bind is None:
            notes.append(f"-binding {binding!r} is not one mpilaunch reads (none, cpu:cores, cpu:sockets): ignored")
        elif "bind_to" not in given:
            out["bind_to"] = bind
    rmk = values.pop("rmk")
    if rmk is not None and str(rmk).lower() in IGNORED_RMK:
        notes.append(f"-rmk {rmk}: mpilaunch does not read that resource manager's hosts: ignored")
    demux = values.pop("demux")
    if demux is not None:
        notes.append(f"-demux {demux}: mpilaunch has one I/O loop of its own: ignored")
    from mpilaunch.cli.cliopts import HYDRA_IGNORED_FLAGS, HYDRA_IGNORED_PREFIX, HYDRA_IGNORED_VALUES, ignored_param

    for name, why in (*HYDRA_IGNORED_VALUES.items(), *HYDRA_IGNORED_FLAGS.items()):
        value = values.pop(ignored_param(HYDRA_IGNORED_PREFIX, name))
        if value:
            notes.append(f"-{name}{'' if value is True else f' {value}'}: {why}: ignored")
    usize = values.pop("usize")
    if usize is not None:
        out["universe_size"] = universe_size(str(usize))
    gpus = values.pop("gpus_per_proc")
    if gpus is not None and values.get("devices_per_rank") is None:
        out["devices_per_rank"] = gpus
    return out, notes


def universe_size(value: str) -> int | None:
    """hydra's -usize: a number of ranks, or SYSTEM (the hosts' slots, None here); INFINITE is
    read as SYSTEM (MPI has no such size to give)."""
    word = value.strip()
    if word.upper() in ("SYSTEM", "INFINITE"):
        return None
    if not (word.isascii() and word.isdigit() and len(word) <= 7 and 1 <= int(word) <= 1 << 20):
        raise LaunchError(f"-usize {value[:40]!r}: expected a number of ranks (1 to {1 << 20}), SYSTEM or INFINITE")
    return int(word)


HOST_WORDS = frozenset({"hosts", "hostfile", "hydra_hosts", "hydra_hostfile"})


def hydra_environment(values: dict[str, object], given: set[str], env: Mapping[str, str]) -> set[str]:
    """hydra's variables, for a line in hydra's words: HYDRA_HOST_FILE (the hostfile when no host
    option is given), HYDRA_BOOTSTRAP or HYDRA_LAUNCHER (-bootstrap), HYDRA_IFACE (-iface); an
    option given wins. The names it set, as given. (HYDRA_ENV=all is hydra's -genvall, the default.)"""
    from mpilaunch.cli.cliopts import RUN_OPTIONS

    out: set[str] = set()
    host_file = env.get("HYDRA_HOST_FILE", "")
    if host_file and not given & HOST_WORDS:
        values["hydra_hostfile"] = host_file
        out.add("hydra_hostfile")
    var = "HYDRA_BOOTSTRAP" if env.get("HYDRA_BOOTSTRAP") else "HYDRA_LAUNCHER"
    launcher = env.get(var, "").strip().lower()
    if launcher and "launcher" not in given:
        choices = next(o.choices for o in RUN_OPTIONS if o.name == "launcher")
        if launcher not in choices:
            raise LaunchError(f"{var}={env[var][:40]!r}: expected one of {', '.join(choices)}")
        values["launcher"] = launcher
        out.add("launcher")
    iface = env.get("HYDRA_IFACE", "")
    if iface and "iface" not in given:
        values["iface"] = iface
        out.add("iface")
    return out
