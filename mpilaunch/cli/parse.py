"""The run's command line: mpirun's spellings in, a JobSpec out (the fast scanner when it is
sure, click otherwise)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from mpilaunch.cli import argscan, cliopts
from mpilaunch.cli.cmdline import CommandLine, read
from mpilaunch.errors import LaunchError
from mpilaunch.plan.spec import AppContext, JobSpec, Options


def _env_timeout() -> float | None:
    """MPIEXEC_TIMEOUT (hydra's and Open MPI's): 0 or less is no limit; else what --timeout takes."""
    raw = os.environ.get("MPIEXEC_TIMEOUT")
    if not raw:
        return None
    text = raw.strip()
    try:
        value = float(text) if text.isascii() else float("nan")
    except ValueError:
        value = float("nan")
    if value != value or value > cliopts.MAX_SECONDS:  # nan, inf, or beyond the documented range
        raise LaunchError(
            f"MPIEXEC_TIMEOUT={raw[:40]!r} is not a number of seconds up to {cliopts.MAX_SECONDS:.0f} (a year)"
        )
    return value if value > 0 else None


def unknown_word(words: list[str]) -> str | None:
    """The first single-dash word before the program that is no option: click would read
    `-genvx` as -g -e -n -v -x and name a letter of it."""
    eager = {*cliopts.HELP_FLAGS, *cliopts.VERSION_FLAGS}
    for item in argscan.option_words(words):
        word = item.word
        if word in eager or (item.opt is None and word.startswith("--")):
            return None  # click names an unknown long option whole
        if item.opt is None:
            return word
        glued = word.partition("=")[0] not in item.opt.flags  # -n4, -xFOO=1
        if glued and item.opt.check == cliopts.INT_MIN1 and not word[2:].isdigit():
            return word
        if glued and item.opt.name in ("tee", "redirects") and not _streams_value(word[2:]):
            return word  # -topolib, -rankmap, -rf: not torchrun's -t/-r with a value glued on
    return None


def _streams_value(text: str) -> bool:
    """torchrun's -t/-r value: 0 to 3, or LOCAL_RANK:0-3 pairs joined by commas."""
    import re

    return re.fullmatch(r"[0-3]|[0-9]+:[0-3](,[0-9]+:[0-3])*", text) is not None


def _click_segment(words: list[str]) -> tuple[dict, set[str]]:
    """An app context the fast scanner was not sure of, read by click (help, version, every
    error message)."""
    unknown = unknown_word(words)
    if unknown is not None:
        from mpilaunch.plan.hosts import shown

        raise LaunchError(f"unknown option {shown(unknown)}; `mpilaunch --help` lists them")
    import click
    from click.core import ParameterSource

    from mpilaunch.cli.command import run_command

    try:
        ctx = run_command().make_context("mpilaunch", list(words))
    except click.exceptions.Exit as done:
        raise SystemExit(done.exit_code) from None
    except click.ClickException as exc:
        raise LaunchError(exc.format_message()) from None
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    return ctx.params, given


def _names(values: tuple[str, ...]) -> list[str]:
    """-genvlist A,B -genvlist C -> [A, B, C]."""
    return [name for value in values for name in value.split(",") if name]


def _checked(pairs: tuple[tuple[str, str | None], ...], option: str) -> tuple[tuple[str, str | None], ...]:
    """-env and -genv names are variable names, as -x's are."""
    return exports_of(tuple(name if value is None else f"{name}={value}" for name, value in pairs), option)


NOT_CARRIED = frozenset({"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_"})  # this shell's, not the job's (-genvall)


def hydra_exports(globals_: dict[str, object], env: Mapping[str, str]) -> tuple[tuple[str, str | None], ...]:
    """hydra's -genv, -genvlist and -genvall as the -x exports they mean (taken out of globals_);
    -genvnone is mpilaunch's default already: remote ranks get only what is exported."""
    pairs: tuple[tuple[str, str | None], ...] = tuple(globals_.pop("genv"))  # type: ignore[arg-type]
    pairs += tuple((name, None) for name in _names(globals_.pop("genvlist")))  # type: ignore[arg-type]
    every, none = globals_.pop("genvall"), globals_.pop("genvnone")
    if every and none:
        raise LaunchError("-genvall and -genvnone: give one of them")
    if every:
        from mpilaunch.plan.rank_env import inherited

        names = [n for n in inherited(env) if n not in NOT_CARRIED and not n.startswith("SSH_")]
        pairs = tuple((name, None) for name in names) + pairs
    return _checked(pairs, "-genv")


IFACE_NAMES = (  # what each library reads to pick the network interface of its traffic
    "FI_TCP_IFACE",  # libfabric's tcp provider: MPICH (ch4:ofi) and Intel MPI
    "FI_SOCKETS_IFACE",
    "OMPI_MCA_btl_tcp_if_include",  # Open MPI's byte transfer and out-of-band TCP
    "OMPI_MCA_oob_tcp_if_include",
    "NCCL_SOCKET_IFNAME",  # PyTorch's NCCL and Gloo
    "GLOO_SOCKET_IFNAME",
)


def iface_exports(
    iface: str, env: Mapping[str, str], exports: tuple[tuple[str, str | None], ...]
) -> tuple[tuple[str, str | None], ...]:
    """hydra's -iface IF, as it can mean something here: the ranks' libraries use IF for their
    traffic. A name the user sets (in the environment or with -x) is left to them."""
    from mpilaunch.plan.hosts import shown

    if not iface or not all(c.isalnum() or c in "._-:" for c in iface) or len(iface) > 64:
        raise LaunchError(f"-iface {shown(iface)}: not a network interface name")
    given = {name for name, _ in exports} | set(env)
    return tuple((name, iface) for name in IFACE_NAMES if name not in given)


CONFIGFILE_FLAGS = tuple(f for o in cliopts.RUN_OPTIONS if o.name in ("configfile", "appfile") for f in o.flags)


def _with_configfile(words: list[str], path: str) -> list[str]:
    """hydra's -configfile: the file's lines are app contexts (options and program, # comments),
    as if given on the command line after the other options, separated by ' : '."""
    import shlex

    from mpilaunch.plan.textfiles import read_text

    at = next(i for i, w in enumerate(words) if w.split("=", 1)[0] in CONFIGFILE_FLAGS)
    rest = words[:at] + words[at + (1 if "=" in words[at] else 2) :]
    text = read_text(path, "configfile", 1 << 20)
    contexts: list[list[str]] = []
    for number, line in _joined_lines(text):
        try:
            line_words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise LaunchError(f"{path}:{number}: {exc}") from None
        if any(w.split("=", 1)[0] in CONFIGFILE_FLAGS for w in line_words):
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
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if pending is not None:
            number, line = pending[0], f"{pending[1]} {line}"
        pending = (number, line[:-1]) if line.endswith("\\") else None
        if pending is None:
            out.append((number, line))
    if pending is not None:
        out.append(pending)
    return out


def exports_of(values: tuple[str, ...], option: str = "-x") -> tuple[tuple[str, str | None], ...]:
    from mpilaunch.plan.rank_env import valid_env_name

    out = []
    for item in values:
        name, eq, value = item.partition("=")
        if not valid_env_name(name):
            from mpilaunch.plan.hosts import shown

            raise LaunchError(f"{option} {shown(item)}: {shown(name)} is not a variable name")
        out.append((name, value if eq else None))
    return tuple(out)


def _pairs(values: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """hydra's -genv/-env values, NAME=VALUE each (cli/dialect joined NAME VALUE): as pairs."""
    out: list[tuple[str, str | None]] = []
    for value in values:
        name, eq, text = value.partition("=")
        if not eq:
            raise LaunchError(f"-genv/-env {value!r}: expected NAME=VALUE or NAME VALUE")
        out.append((name, text))
    return tuple(out)


def parse_args(line: CommandLine | list[str], name: str = "mpilaunch", from_file: bool = False) -> JobSpec:
    """The command line (read by cli/cmdline.read, or argv without the program name, started as
    name) -> JobSpec; global options may appear in any app context. from_file: the app contexts
    are an app file's lines, each -x its line's own (the command line's go with the first)."""
    if not isinstance(line, CommandLine):
        line = read(line, name)
    if line.error is not None:
        raise line.error
    side = line.side
    apps = []
    globals_: dict[str, object] = {}
    given_anywhere: set[str] = set()
    segments = argscan.split_apps(line.words)
    for index, words in enumerate(segments):
        scanned = line.segments[index] if line.segments else None  # none read: help, for click
        params, given = scanned if scanned is not None else _click_segment(words)
        path = params["configfile"] if params["configfile"] is not None else params["appfile"]
        if path is not None:
            option = "-configfile" if params["configfile"] is not None else "--app"
            if len(segments) > 1 or params["argv"]:
                raise LaunchError(f"{option}: the file gives the programs; give none on the command line")
            return parse_args(_with_configfile(words, str(path)), line.name, from_file=True)
        given_anywhere |= given
        if not params["argv"] and not (params["config"] and len(segments) == 1):  # the job file may have it
            where = f" in app context {index + 1}" if index else ""
            raise LaunchError(f"no program given{where}; usage: mpilaunch [options] program [args]")
        if params["wdir"] == "":
            raise LaunchError("--wdir: the directory name is empty")
        own = (*_pairs(params["app_env"]), *((name, None) for name in _names(params["app_envlist"])))
        own_x = bool(index) or from_file  # -x after a ' : ' is that program's, as in Open MPI's mpirun
        if own_x and "exports" in given:
            own = (*exports_of(tuple(params["exports"])), *own)
        hosts = tuple(params["hosts"]) if "hosts" in given else ()
        apps.append(AppContext(tuple(params["argv"]), params["np"], own, params["wdir"], hosts))
        for key, value in params.items():
            if key in cliopts.APP_PARAMS:
                continue
            if own_x and key == "exports":
                globals_.setdefault(key, ())  # none job-wide: each program's own
                continue
            if index == 0 or key in given:
                if key in MERGED and index and key in globals_:
                    value = tuple(globals_[key]) + tuple(value)  # type: ignore[arg-type]
                globals_[key] = value
    globals_.pop("configfile")
    globals_.pop("appfile")
    config = globals_.pop("config")
    if config:  # pyyaml only now: a plain run does not pay for it
        from mpilaunch.cli.command import run_command
        from mpilaunch.cli.jobfile import apply_job_file, read_job_file

        apps = apply_job_file(read_job_file(str(config), run_command().params), globals_, given_anywhere, apps)
    if side == "hydra" and not given_anywhere & {"genvall", "genvnone", "genvlist"}:
        globals_["genvall"] = True  # hydra's default: every rank gets the launcher's environment
    if side == "hydra":
        from mpilaunch.cli.launcher_words import hydra_environment

        given_anywhere |= hydra_environment(globals_, given_anywhere, os.environ)
    options = _options(globals_, given_anywhere, apps, line.name, side)  # gives apps their exports too
    return JobSpec(tuple(apps), options)


MERGED = ("hosts", "hydra_hosts", "mca", "exports", "genv", "am", "tune")  # added up over app contexts


def _options(globals_: dict[str, object], given: set[str], apps: list[AppContext], name: str, side: str) -> Options:
    """The job-wide options, and the programs' exports, from what the command line gave."""
    from mpilaunch.cli import launcher_words as words
    from mpilaunch.cli.dialect import HYDRA_PLACEMENT
    from mpilaunch.cli.torchrun_words import torch_options

    torch_fields, notes = torch_options(globals_, given, name, apps, os.environ)
    for key in torch_fields:  # what torchrun's words set wins over the command line's defaults
        globals_.pop(key, None)
    mca = tuple(globals_.pop("mca"))  # type: ignore[arg-type]
    tune = globals_.pop("tune")
    tuned = words.tune_file_words(tune) if tune else []  # type: ignore[arg-type]
    mca = (
        *words.mca_file_params(globals_.pop("am"), "-am"),  # type: ignore[arg-type]
        *((k, v) for kind, text in tuned if kind == "mca" for k, v in [text.split("\0", 1)]),
        *mca,
    )
    globals_["genv"] = _pairs(globals_["genv"])  # type: ignore[arg-type]
    exports = hydra_exports(globals_, os.environ)
    exports += exports_of(tuple(text for kind, text in tuned if kind == "x") + tuple(globals_.pop("exports")))  # type: ignore[arg-type]
    iface = globals_.pop("iface")
    if iface is not None:
        exports = iface_exports(str(iface), os.environ, exports) + exports
    apps[:] = [a._replace(exports=exports + _checked(a.exports, "-env")) for a in apps]
    env_abort = os.environ.get("OMPI_MCA_orte_abort_on_non_zero_status")
    if env_abort is not None:  # Open MPI reads MCA parameters from the environment too; -mca wins
        mca = (("orte_abort_on_non_zero_status", env_abort), *mca)
    agent, extra = words.remote_shell(globals_.pop("rsh_agent"), globals_.pop("rsh_args"), mca, os.environ)  # type: ignore[arg-type]
    timeout = globals_.pop("timeout") or _env_timeout()
    older, older_notes = words.old_open_mpi_words(globals_, given)
    given = given | older | words.mca_defaults(globals_, given | older, mca, os.environ)
    notes += older_notes
    fields = words.mapping_options(globals_, given)
    hydra, hydra_notes = words.hydra_options(globals_, given)
    fields.update(hydra)
    notes += hydra_notes
    oversubscribe = bool(globals_.pop("oversubscribe"))
    refused = bool(globals_.pop("nooversubscribe")) or fields.get("oversubscribe") is False  # asked for in words
    oversubscribe = bool(fields.pop("oversubscribe", oversubscribe)) and not refused  # --map-by ...:OVERSUBSCRIBE
    mpi = str(globals_.pop("mpi")).lower()
    if mpi == "pmi2" and globals_.get("pmi_tcp"):
        raise LaunchError(
            "--mpi pmi2 with --pmi-tcp: MPICH's PMI-2 client skips the PMI_ID handshake over TCP, "
            "so mpilaunch would refuse its connection; drop --pmi-tcp to serve PMI-2 over PMI_FD"
        )
    bind_to, _, qualifier = str(fields.pop("bind_to", None) or globals_.pop("bind_to")).lower().partition(":")
    globals_.pop("bind_to", None)
    if qualifier.isdigit() and qualifier.isascii() and bind_to in ("core", "hwthread") and not fields["cpus_per_rank"]:
        fields["cpus_per_rank"] = min(int(qualifier), 4096) or 1  # hydra's -bind-to core:2: two cores a rank
    if bind_to == "none" and "bind_to" not in given and "binding" not in given:
        bind_to = ""  # not asked for: each MPI family's launcher default (plan/build.launch_messages)
    if bind_to not in BIND_LEVELS:
        raise LaunchError(f"--bind-to {bind_to!r}: expected none, core, socket, numa or hwthread")
    launcher = str(globals_.pop("launcher")).lower()
    if launcher in cliopts.OTHER_HYDRA_LAUNCHERS:
        notes.append(f"-bootstrap {launcher}: mpilaunch starts agents over ssh (or srun in Slurm): read as auto")
        launcher = "auto"
    elif launcher == "rsh":
        launcher = "ssh"
    placement = "hydra" if given & HYDRA_PLACEMENT else "openmpi"
    hosts, hostfile = globals_.pop("hosts"), globals_.pop("hostfile")
    hydra_hosts, hydra_hostfile = globals_.pop("hydra_hosts"), globals_.pop("hydra_hostfile")
    if placement == "hydra":
        hosts, hostfile = hydra_hosts, hydra_hostfile
    for dropped in ("verbose", "rmk", *fields):  # fields: what the launchers' words set instead
        globals_.pop(dropped, None)
    if globals_["restart_delay"] is None:
        globals_["restart_delay"] = 3.0
    if globals_["max_restarts"] is None:
        globals_["max_restarts"] = 0
    return Options(
        timeout=timeout,  # type: ignore[arg-type]
        oversubscribe=oversubscribe,
        nooversubscribe=refused,
        bind_to=bind_to,
        mpi=mpi,
        mca=mca,
        launcher=launcher,
        hosts=hosts,  # type: ignore[arg-type]
        hostfile=hostfile,  # type: ignore[arg-type]
        placement=placement,
        dialect=side,
        rules=_rules(side, name, given),
        rsh_agent=agent,
        rsh_args=extra,
        notes=tuple(notes),
        **torch_fields,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
        **globals_,  # type: ignore[arg-type]
    )


def _rules(side: str, name: str, given: set[str]) -> str:
    """hydra's failure and signal rules for a line in hydra's words, and under the name mpiexec
    for a line with no word only Open MPI has (as mpiexec's ambiguous host words); else Open MPI's."""
    from mpilaunch.cli.dialect import HYDRA, OPENMPI_ONLY

    return HYDRA if side == HYDRA or (name == "mpiexec" and not given & OPENMPI_ONLY) else "openmpi"


BIND_LEVELS = ("", "none", "core", "socket", "numa", "hwthread")
