"""hydra's `mpiexec` (MPICH, Intel MPI) words, end to end: the rows only hydra has, the HYDRA_*
variables it reads, its exit-status rules, and what each word means here (hydra's placement,
its environment words, its configfile), or a note that it means nothing here.

Loaded for a line that uses one of these words, or that speaks hydra (cli/dialect.py): a plain
run never reads them. Pure functions of the parsed values and the environment.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpilaunch.cli import cliopts
from mpilaunch.cli.cliopts import (
    ADDS_UP,
    CONTEXTS,
    ENV,
    FLAG,
    HOSTS,
    HYDRA,
    IGNORED,
    INT_MIN1,
    MAX_RANKS,
    MULTI,
    NO_KEY,
    OPENMPI,
    PER_APP,
    PLACES,
    Opt,
    ignored,
    named,
    placing,
    said_ignored,
)
from mpilaunch.errors import LaunchError

RULES = "hydra"  # a plain non-zero exit ends only that rank; the status is the ranks' OR (launcher/decide/policy.py)
MINE = (HYDRA,)
# fmt: off
ROWS: tuple[Opt, ...] = (
    Opt("hydra_hosts", "-hosts --hosts", MULTI, metavar="h1:N,h2", whose=MINE, roles=(HOSTS, PLACES, ADDS_UP, NO_KEY),
        help="Hosts: round-robin, no slot limit."),
    Opt("hydra_hostfile", "-f", metavar="PATH", whose=MINE, roles=(HOSTS, PLACES, NO_KEY),
        help="Hostfile (host:N lines): round-robin, no slot limit."),
    Opt("ppn", "-ppn --ppn", check=INT_MIN1, maximum=MAX_RANKS, whose=MINE, roles=(PLACES, NO_KEY),
        help="Ranks per host: blocks of N on each host in turn, wrapping."),
    Opt("genv", "-genv --genv", ENV, metavar="VAR=VALUE", whose=MINE, roles=(ADDS_UP, NO_KEY),
        help="-x VAR=VALUE (also as two words)."),
    Opt("genvlist", "-genvlist --genvlist", MULTI, metavar="A,B", whose=MINE, roles=(NO_KEY,), help="-x A -x B."),
    Opt("genvall", "-genvall --genvall", FLAG, whose=MINE,
        help="Every variable of the launcher's to every rank, remote ones too (hydra's default)."),
    Opt("genvnone", "-genvnone --genvnone", FLAG, whose=MINE, roles=(NO_KEY,),
        help="Only -x/-genv variables to remote ranks (mpilaunch's default)."),
    Opt("app_env", "-env --env", ENV, metavar="VAR=VALUE", whose=MINE, roles=(PER_APP, NO_KEY),
        help="VAR=VALUE (also as two words) for this app context's ranks."),
    Opt("app_envlist", "-envlist --envlist", MULTI, metavar="A,B", whose=MINE, roles=(PER_APP, NO_KEY),
        help="These variables for this app context."),
    Opt("iface", "-iface --iface", metavar="IF", whose=MINE, roles=(NO_KEY,),
        help="The ranks' MPI, NCCL and Gloo use network interface IF."),
    Opt("configfile", "-configfile --configfile", metavar="FILE", whose=MINE, roles=(CONTEXTS, NO_KEY),
        help="A file of app contexts: one per line, as between ' : '."),
    Opt("prepend_rank", "-l --prepend-rank -prepend-rank", FLAG, whose=MINE, help="Prefix console lines with [rank]."),
    Opt("prepend_pattern", "-prepend-pattern --prepend-pattern", metavar="PATTERN", whose=MINE,
        help="This before each console line (%r rank, %h host, %g 0, %p its host's index)."),
    Opt("outfile_pattern", "-outfile-pattern --outfile-pattern", metavar="PATTERN", whose=MINE, roles=(NO_KEY,),
        help="Each rank's stdout also to this file (as -prepend-pattern)."),
    Opt("errfile_pattern", "-errfile-pattern --errfile-pattern", metavar="PATTERN", whose=MINE, roles=(NO_KEY,),
        help="Each rank's stderr also to this file."),
    Opt("print_rank_map", "-print-rank-map --print-rank-map", FLAG, whose=MINE, roles=(NO_KEY,),
        help="Print which host has which ranks."),
    Opt("skip_launch_node", "-skip-launch-node --skip-launch-node", FLAG, whose=MINE, means=("nolocal", True),
        help="--nolocal: no rank on this machine."),
    Opt("rsh_agent", "-bootstrap-exec --bootstrap-exec -launcher-exec --launcher-exec", metavar="COMMAND",
        whose=MINE, roles=(NO_KEY,), help="A command in place of ssh for other hosts."),
    Opt("rsh_args", "-bootstrap-exec-args --bootstrap-exec-args -launcher-exec-args --launcher-exec-args",
        metavar="ARGS", whose=MINE, roles=(NO_KEY,), help="More arguments for ssh."),
    Opt("gpus_per_proc", "-gpus-per-proc --gpus-per-proc", check=INT_MIN1, maximum=1024, metavar="N", whose=MINE,
        roles=(NO_KEY,), means=("devices_per_rank", None), help="--devices-per-rank N."),
    Opt("binding", "-binding --binding", metavar="cpu:cores|...", whose=MINE, roles=(NO_KEY,),
        help="The older -bind-to."),
    Opt("rmk", "-rmk --rmk", metavar="user|slurm|pbs|lsf", whose=MINE, roles=(NO_KEY,),
        help="Where hosts come from (Slurm's, PBS's and LSF's are read anyway)."),
    Opt("usize", "-usize --usize", metavar="N|SYSTEM|INFINITE", whose=MINE,
        help="The universe size (MPI_UNIVERSE_SIZE; SYSTEM: the hosts' slots)."),
    Opt("demux", "-demux --demux", metavar="poll|select", whose=MINE, roles=(IGNORED, NO_KEY),
        help="mpilaunch has one I/O loop of its own"),
    *ignored("localhost=the launcher's own host name is found here; order-nodes=hosts are taken in the order "
             "given; nameserver=mpilaunch serves published names itself", HYDRA),
    *ignored("disable-x=no X forwarding here; enable-x=no X forwarding here; disable-auto-cleanup=mpilaunch "
             "always ends the ranks of a failed job; disable-hostname-propagation=the ranks find their host names "
             "themselves; print-all-exitcodes=the summary names every rank that failed and its status; "
             "envall=a line in hydra's words sends every program the launcher's environment already; "
             "envnone=local ranks inherit the launcher's environment here; "
             "pmi-port=PMI is served over PMI_FD (--pmi-tcp for a port); profile=no profiling here", HYDRA, FLAG),
)
# fmt: on
ENVIRONMENT = (
    ("HYDRA_HOST_FILE", "the hostfile (-f), when the line names no hosts"),
    ("HYDRA_BOOTSTRAP", "-bootstrap, when not given (also HYDRA_LAUNCHER)"),
    ("HYDRA_IFACE", "-iface, when not given"),
    ("HYDRA_ENV", "all is -genvall, the default already"),
    ("MPIEXEC_TIMEOUT", "--timeout, when not given"),
)
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
IFACE_NAMES = (  # what each library reads to pick the network interface of its traffic
    "FI_TCP_IFACE",  # libfabric's tcp provider: MPICH (ch4:ofi) and Intel MPI
    "FI_SOCKETS_IFACE",
    "OMPI_MCA_btl_tcp_if_include",  # Open MPI's byte transfer and out-of-band TCP
    "OMPI_MCA_oob_tcp_if_include",
    "NCCL_SOCKET_IFNAME",  # PyTorch's NCCL and Gloo
    "GLOO_SOCKET_IFNAME",
)
NOT_CARRIED = frozenset({"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_"})  # this shell's, not the job's (-genvall)


def line_defaults(values: dict[str, object], given: set[str], env: Mapping[str, str]) -> set[str]:
    """A line in hydra's words: -genvall unless -genvnone or -genvlist is given (hydra's default),
    and hydra's variables: HYDRA_HOST_FILE (the hostfile when no host option is given),
    HYDRA_BOOTSTRAP or HYDRA_LAUNCHER (-bootstrap), HYDRA_IFACE (-iface); an option given wins.
    The names it set, as given. (HYDRA_ENV=all is hydra's -genvall, the default.)"""
    if not given & {"genvall", "genvnone", "genvlist"}:
        values["genvall"] = True
    out: set[str] = set()
    host_file = env.get("HYDRA_HOST_FILE", "")
    if host_file and not given & named(HOSTS):
        values["hydra_hostfile"] = host_file
        out.add("hydra_hostfile")
    var = "HYDRA_BOOTSTRAP" if env.get("HYDRA_BOOTSTRAP") else "HYDRA_LAUNCHER"
    launcher = env.get(var, "").strip().lower()
    if launcher and "launcher" not in given:
        choices = next(o.choices for o in cliopts.ROWS if o.name == "launcher")
        if launcher not in choices:
            raise LaunchError(f"{var}={env[var][:40]!r}: expected one of {', '.join(choices)}")
        values["launcher"] = launcher
        out.add("launcher")
    iface = env.get("HYDRA_IFACE", "")
    if iface and "iface" not in given:
        values["iface"] = iface
        out.add("iface")
    return out


def app_env(params: Mapping[str, object]) -> tuple[tuple[str, str | None], ...]:
    """-env and -envlist of one app context, as (name, value) pairs (None: the launcher's value)."""
    return _pairs(params.get("app_env", ())) + _listed(params.get("app_envlist", ()))  # type: ignore[arg-type]


def genv_exports(values: dict[str, object], env: Mapping[str, str]) -> tuple[tuple[str, str | None], ...]:
    """-genv, -genvlist and -genvall as the -x exports they mean (taken out of values); -genvnone
    is mpilaunch's default already: remote ranks get only what is exported."""
    pairs = _pairs(values.pop("genv", ())) + _listed(values.pop("genvlist", ()))  # type: ignore[arg-type]
    every, none = values.pop("genvall", False), values.pop("genvnone", False)
    if every and none:
        raise LaunchError("-genvall and -genvnone: give one of them")
    if every:
        from mpilaunch.plan.rank_env import inherited

        names = [n for n in inherited(env) if n not in NOT_CARRIED and not n.startswith("SSH_")]
        pairs = tuple((name, None) for name in names) + pairs
    return pairs


def iface_exports(
    values: dict[str, object], env: Mapping[str, str], exports: tuple[tuple[str, str | None], ...]
) -> tuple[tuple[str, str | None], ...]:
    """-iface IF, as it can mean something here: the ranks' libraries use IF for their traffic.
    A name the user sets (in the environment or with -x) is left to them."""
    iface = values.pop("iface", None)
    if iface is None:
        return ()
    from mpilaunch.plan.hosts import shown

    iface = str(iface)
    if not iface or not all(c.isalnum() or c in "._-:" for c in iface) or len(iface) > 64:
        raise LaunchError(f"-iface {shown(iface)}: not a network interface name")
    given = {name for name, _ in exports} | set(env)
    return tuple((name, iface) for name in IFACE_NAMES if name not in given)


def _listed(values: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """-genvlist A,B -genvlist C -> (A, None), (B, None), (C, None): each with the launcher's value."""
    return tuple((name, None) for value in values for name in value.split(",") if name)


def _pairs(values: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """-genv/-env values, NAME=VALUE each (cli/dialect joined NAME VALUE): as pairs."""
    out: list[tuple[str, str | None]] = []
    for value in values:
        name, eq, text = value.partition("=")
        if not eq:
            raise LaunchError(f"-genv/-env {value!r}: expected NAME=VALUE or NAME VALUE")
        out.append((name, text))
    return tuple(out)


def binding(values: dict[str, object], given: set[str]) -> tuple[dict[str, object], set[str], list[str]]:
    """-binding, the older -bind-to: the field it sets (--bind-to given wins), what it counts as
    given (it wins over Open MPI's older words and MCA parameters), and a note for a value not
    read here."""
    value = values.pop("binding", None)
    if value is None:
        return {}, set(), []
    bind = BINDINGS.get(str(value).lower())
    if bind is None:
        note = f"-binding {value!r} is not one mpilaunch reads (none, cpu:cores, cpu:sockets): ignored"
        return {}, {"bind_to"}, [note]
    return ({} if "bind_to" in given else {"bind_to": bind}), {"bind_to"}, []


def options(values: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    """-rmk and -usize: the fields they set, and a note for each word that means nothing here."""
    out: dict[str, object] = {}
    notes: list[str] = []
    rmk = values.pop("rmk", None)
    if rmk is not None and str(rmk).lower() in IGNORED_RMK:
        notes.append(f"-rmk {rmk}: mpilaunch does not read that resource manager's hosts: ignored")
    notes += said_ignored(values, HYDRA, "{flag}{value}: {why}: ignored")
    usize = values.pop("usize", None)
    if usize is not None:
        out["universe_size"] = universe_size(str(usize))
    return out, notes


def universe_size(value: str) -> int | None:
    """-usize: a number of ranks, or SYSTEM (the hosts' slots, None here); INFINITE is read as
    SYSTEM (MPI has no such size to give)."""
    word = value.strip()
    if word.upper() in ("SYSTEM", "INFINITE"):
        return None
    if not (word.isascii() and word.isdigit() and len(word) <= 7 and 1 <= int(word) <= 1 << 20):
        raise LaunchError(f"-usize {value[:40]!r}: expected a number of ranks (1 to {1 << 20}), SYSTEM or INFINITE")
    return int(word)


def hosts_of(values: dict[str, object], given: set[str], hosts: object, hostfile: object) -> tuple[str, object, object]:
    """(placement, hosts, hostfile): hydra's round-robin over -hosts or -f when a hydra placement
    word was given, else Open MPI's over -H or --hostfile."""
    hydra_hosts, hydra_hostfile = values.pop("hydra_hosts", ()), values.pop("hydra_hostfile", None)
    if given & placing(HYDRA):
        return HYDRA, hydra_hosts, hydra_hostfile
    return OPENMPI, hosts, hostfile


def with_configfile(words: list[str], path: str, flags: tuple[str, ...]) -> list[str]:
    """-configfile (and Open MPI's --app): the file's lines are app contexts (options and program,
    # comments), as if given on the command line after the other options, separated by ' : '."""
    import shlex

    from mpilaunch.plan.textfiles import read_text

    at = next(i for i, w in enumerate(words) if w.split("=", 1)[0] in flags)
    rest = words[:at] + words[at + (1 if "=" in words[at] else 2) :]
    text = read_text(path, "configfile", 1 << 20)
    contexts: list[list[str]] = []
    for number, line in _joined_lines(text):
        try:
            line_words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise LaunchError(f"{path}:{number}: {exc}") from None
        if any(w.split("=", 1)[0] in flags for w in line_words):
            raise LaunchError(f"{path}:{number}: a configfile cannot name another one")
        if line_words:
            contexts.append(line_words)
    if not contexts:
        raise LaunchError(f"{path}: configfile with no app context in it")
    out = rest + contexts[0]
    for context in contexts[1:]:
        out += [":", *context]
    return out


def _joined_lines(text: str) -> list[tuple[int, str]]:
    """A configfile's lines, one ending in a backslash joined to the next (as hydra reads
    them), each with the number of its first line."""
    out: list[tuple[int, str]] = []
    joined = False  # the last line ended in a backslash
    for number, line in enumerate(text.splitlines(), 1):
        if joined:
            number, head = out.pop()
            line = f"{head} {line}"
        joined = line.endswith("\\")
        out.append((number, line[:-1] if joined else line))
    return out
