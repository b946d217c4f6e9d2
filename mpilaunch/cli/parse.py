"""The run's command line: mpirun's spellings in, a JobSpec out (the fast scanner when it is
sure, click otherwise)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from mpilaunch.cli import argscan, cliopts
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
    by_flag = argscan.BY_FLAG
    eager = {*cliopts.HELP_FLAGS, *cliopts.VERSION_FLAGS}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or len(word) < 2 or word[0] != "-" or word in eager:
            return None
        name, eq, _ = word.partition("=")
        opt = by_flag.get(name)
        if opt is None and word.startswith("--"):
            return None  # click names an unknown long option whole
        if opt is None:
            opt = by_flag.get(word[:2])  # a value glued to a short option: -n4, -xFOO=1, -Hnode1
            numeric = opt is not None and opt.check == cliopts.INT_MIN1
            if opt is None or opt.kind == cliopts.FLAG or (numeric and not word[2:].isdigit()):
                return word
            i += 1
            continue
        taken = {cliopts.FLAG: 0, cliopts.PAIRS: 2}.get(opt.kind, 1)
        i += 1 + max(taken - (1 if eq else 0), 0)
    return None


def _parse_segment(words: list[str]) -> tuple[dict, set[str]]:
    """The fast scanner when it is sure, click otherwise (help, version, every error message)."""
    scanned = argscan.scan(words)
    if scanned is not None:
        return scanned
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


def _checked(pairs: tuple[tuple[str, str | None], ...]) -> tuple[tuple[str, str | None], ...]:
    """-env and -genv names are variable names, as -x's are."""
    return exports_of(tuple(name if value is None else f"{name}={value}" for name, value in pairs))


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
    return _checked(pairs)


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


CONFIGFILE_FLAGS = next(o.flags for o in cliopts.RUN_OPTIONS if o.name == "configfile")


def _with_configfile(words: list[str], path: str) -> list[str]:
    """hydra's -configfile: the file's lines are app contexts (options and program, # comments),
    as if given on the command line after the other options, separated by ' : '."""
    import shlex

    from mpilaunch.plan.textfiles import read_text

    at = next(i for i, w in enumerate(words) if w.split("=", 1)[0] in CONFIGFILE_FLAGS)
    rest = words[:at] + words[at + (1 if "=" in words[at] else 2) :]
    text = read_text(path, "configfile", 1 << 20)
    contexts: list[list[str]] = []
    for number, line in enumerate(text.splitlines(), 1):
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


def exports_of(values: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    from mpilaunch.plan.rank_env import valid_env_name

    out = []
    for item in values:
        name, eq, value = item.partition("=")
        if not valid_env_name(name):
            from mpilaunch.plan.hosts import shown

            raise LaunchError(f"-x {shown(item)}: {shown(name)} is not a variable name")
        out.append((name, value if eq else None))
    return tuple(out)


def parse_args(argv: list[str]) -> JobSpec:
    """argv (without the program name) -> JobSpec; global options may appear in any app context."""
    apps = []
    globals_: dict[str, object] = {}
    given_anywhere: set[str] = set()
    segments = argscan.split_apps(argv)
    for index, words in enumerate(segments):
        params, given = _parse_segment(words)
        if params["configfile"] is not None:
            if len(segments) > 1 or params["argv"]:
                raise LaunchError("-configfile: the file gives the programs; give none on the command line")
            return parse_args(_with_configfile(words, str(params["configfile"])))
        given_anywhere |= given
        if not params["argv"] and not (params["config"] and len(segments) == 1):  # the job file may have it
            where = f" in app context {index + 1}" if index else ""
            raise LaunchError(f"no program given{where}; usage: mpilaunch [options] program [args]")
        if params["wdir"] == "":
            raise LaunchError("--wdir: the directory name is empty")
        own = (*params["app_env"], *((name, None) for name in _names(params["app_envlist"])))
        apps.append(AppContext(argv=tuple(params["argv"]), np=params["np"], wdir=params["wdir"], exports=own))
        for name, value in params.items():
            if name in cliopts.APP_PARAMS:
                continue
            if index == 0 or name in given:
                if name in ("hosts", "mca", "exports") and index and name in globals_:
                    value = tuple(globals_[name]) + tuple(value)  # type: ignore[arg-type]
                globals_[name] = value
    globals_.pop("configfile")
    config = globals_.pop("config")
    if config:  # pyyaml only now: a plain run does not pay for it
        from mpilaunch.cli.command import run_command
        from mpilaunch.cli.jobfile import apply_job_file, read_job_file

        apps = apply_job_file(read_job_file(str(config), run_command().params), globals_, given_anywhere, apps)
    exports = hydra_exports(globals_, os.environ) + exports_of(globals_.pop("exports"))  # type: ignore[arg-type]
    iface = globals_.pop("iface")
    if iface is not None:
        exports = iface_exports(str(iface), os.environ, exports) + exports
    apps = [AppContext(a.argv, a.np, exports + _checked(a.exports), a.wdir) for a in apps]
    env_abort = os.environ.get("OMPI_MCA_orte_abort_on_non_zero_status")
    if env_abort is not None:  # Open MPI reads MCA parameters from the environment too; -mca wins
        globals_["mca"] = (("orte_abort_on_non_zero_status", env_abort), *globals_["mca"])  # type: ignore[misc]
    timeout = globals_.pop("timeout") or _env_timeout()
    map_by = str(globals_.pop("map_by"))
    oversubscribe = bool(globals_.pop("oversubscribe"))
    if map_by.upper().endswith(":OVERSUBSCRIBE"):
        map_by, oversubscribe = map_by[: -len(":OVERSUBSCRIBE")], True
    mpi = str(globals_.pop("mpi")).lower()
    if mpi == "pmi2" and globals_.get("pmi_tcp"):
        raise LaunchError(
            "--mpi pmi2 with --pmi-tcp: MPICH's PMI-2 client skips the PMI_ID handshake over TCP, "
            "so mpilaunch would refuse its connection; drop --pmi-tcp to serve PMI-2 over PMI_FD"
        )
    bind_to = str(globals_.pop("bind_to")).split(":", 1)[0].lower()
    if bind_to == "none" and "bind_to" not in given_anywhere:
        bind_to = ""  # not asked for: each MPI family's launcher default (plan/build.launch_messages)
    if bind_to not in ("", "none", "core", "socket", "hwthread"):
        raise LaunchError(f"--bind-to {bind_to!r}: expected none, core, socket or hwthread")
    hydra_words = {"-hosts", "--hosts", "-ppn", "--ppn"}
    options = Options(
        hydra_spelled=any(word.split("=", 1)[0] in hydra_words for word in argv),
        timeout=timeout,  # type: ignore[arg-type]
        map_by=map_by,
        oversubscribe=oversubscribe,
        bind_to=bind_to,
        mpi=mpi,
        **globals_,  # type: ignore[arg-type]
    )
    return JobSpec(tuple(apps), options)


def check_root(options: Options, env: dict[str, str] | os._Environ[str]) -> None:
    if os.geteuid() != 0 or options.allow_run_as_root:
        return
    if env.get("OMPI_ALLOW_RUN_AS_ROOT") == "1" and env.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1":
        return
    raise LaunchError(
        "refusing to run as root: pass --allow-run-as-root (or set OMPI_ALLOW_RUN_AS_ROOT=1 and "
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1) if you really mean it"
    )
