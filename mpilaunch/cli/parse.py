"""The run's command line: the words read (cli/cmdline.py) in, a JobSpec out (the fast scanner
when it is sure, click otherwise). mpilaunch's own options are read here; another launcher's
words by its module (cliopts.LAUNCHERS), which a plain line does not load."""

from __future__ import annotations

import os
import sys

from mpilaunch.cli import cliopts, openmpi_words
from mpilaunch.cli.cliopts import ADDS_UP, CONTEXTS, HYDRA, INT_MIN1, OPENMPI, PER_APP, STREAMS, TORCHRUN
from mpilaunch.cli.cmdline import CommandLine, read
from mpilaunch.cli.tokens import Token, render
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


def unknown_word(toks: list[Token]) -> str | None:
    """The first single-dash word before the program that is no option: click would read
    `-genvx` as -g -e -n -v -x and name a letter of it."""
    for t in toks:
        if t.opt is None:
            return None if t.word.startswith("--") else t.word  # click names an unknown long option whole
        if t.glued and t.opt.check == INT_MIN1 and not t.word[2:].isdigit():  # -n4, -xFOO=1
            return t.word
        if t.glued and t.opt.check == STREAMS and not cliopts.load(TORCHRUN).streams_value(t.word[2:]):
            return t.word  # -topolib, -rankmap, -rf: not torchrun's -t/-r with a value glued on
    return None


def _click_segment(words: list[str], toks: list[Token]) -> tuple[dict, set[str]]:
    """An app context the fast scanner was not sure of, read by click (every error message)."""
    unknown = unknown_word(toks)
    if unknown is not None:
        from mpilaunch.plan.hosts import shown

        raise LaunchError(f"unknown option {shown(unknown)}; `mpilaunch --help` lists them")
    import click
    from click.core import ParameterSource

    from mpilaunch.cli.command import run_command

    try:
        ctx = run_command().make_context("mpilaunch", render(toks, words))
    except click.BadParameter as exc:  # a value: said with the option as written, in plain words
        name = exc.param.name if exc.param is not None else None
        written = [t.head for t in toks if t.opt is not None and t.opt.name == name]
        if not written or not exc.message.startswith("takes "):
            raise LaunchError(exc.format_message()) from None
        raise LaunchError(f"{written[-1]} {exc.message}") from None
    except click.ClickException as exc:
        raise LaunchError(exc.format_message()) from None
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    return ctx.params, given


def _checked(pairs: tuple[tuple[str, str | None], ...], option: str) -> tuple[tuple[str, str | None], ...]:
    """-env and -genv names are variable names, as -x's are."""
    return exports_of(tuple(name if value is None else f"{name}={value}" for name, value in pairs), option)


def python_program(argv: tuple[str, ...], wdir: str | None) -> tuple[str, ...]:
    """A `.py` file named as the program that is not a program to run (not executable, or not on
    PATH): run with this interpreter, as torchrun runs its script."""
    program = argv[0]
    if not program.endswith(".py") or ("/" not in program and _on_path(program)):
        return argv
    path = os.path.join(wdir or os.getcwd(), program)
    if os.path.isfile(path) and not os.access(path, os.X_OK):
        return (sys.executable, "-u", *argv)
    return argv


def _on_path(program: str) -> bool:
    return any(os.access(os.path.join(d, program), os.X_OK) for d in os.environ.get("PATH", "").split(":") if d)


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


def parse_args(line: CommandLine | list[str], name: str = "mpilaunch", from_file: bool = False) -> JobSpec:
    """The command line (read by cli/cmdline.read, or argv without the program name, started as
    name) -> JobSpec; global options may appear in any app context. from_file: the app contexts
    are an app file's lines, each -x its line's own (the command line's go with the first)."""
    if not isinstance(line, CommandLine):
        line = read(line, name)
    if line.error is not None:
        raise line.error
    apps = []
    globals_: dict[str, object] = {}
    given_anywhere: set[str] = set()
    for index, (words, toks) in enumerate(zip(line.contexts, line.tokens)):
        scanned = line.segments[index]
        params, given = scanned if scanned is not None else _click_segment(words, toks)
        files = [o for o in reversed(cliopts.rows()) if CONTEXTS in o.roles and params.get(o.name) is not None]
        if files:  # hydra's -configfile or Open MPI's --app
            option = files[0].flags[0]
            if len(line.contexts) > 1 or params["argv"]:
                raise LaunchError(f"{option}: the file gives the programs; give none on the command line")
            flags = tuple(f for o in cliopts.rows() if CONTEXTS in o.roles for f in o.flags)
            path = str(params[files[0].name])
            return parse_args(cliopts.load(HYDRA).with_configfile(render(toks, words), path, flags), line.name, True)
        given_anywhere |= given
        if not params["argv"] and not (params["config"] and len(line.contexts) == 1):  # the job file may have it
            where = f" in app context {index + 1}" if index else ""
            raise LaunchError(f"no program given{where}; usage: mpilaunch [options] program [args]")
        if params["wdir"] == "":
            raise LaunchError("--wdir: the directory name is empty")
        own = cliopts.load(HYDRA).app_env(params) if cliopts.loaded(HYDRA) else ()
        own_x = bool(index) or from_file  # -x after a ' : ' is that program's, as in Open MPI's mpirun
        if own_x and "exports" in given:
            own = (*exports_of(tuple(params["exports"])), *own)
        hosts = tuple(params["hosts"]) if "hosts" in given else ()
        apps.append(AppContext(tuple(params["argv"]), params["np"], own, params["wdir"], hosts))
        per_app, adds_up = cliopts.named(PER_APP), cliopts.named(ADDS_UP)
        for key, value in params.items():
            if key in per_app or key == "argv":
                continue
            if own_x and key == "exports":
                globals_.setdefault(key, ())  # none job-wide: each program's own
                continue
            if index == 0 or key in given:
                if key in adds_up and index and key in globals_:
                    value = tuple(globals_[key]) + tuple(value)  # type: ignore[arg-type]
                globals_[key] = value
    for key in cliopts.named(CONTEXTS):
        globals_.pop(key, None)
    config = globals_.pop("config")
    if config:  # pyyaml only now: a plain run does not pay for it
        from mpilaunch.cli.command import run_command
        from mpilaunch.cli.jobfile import apply_job_file, read_job_file

        apps = apply_job_file(read_job_file(str(config), run_command().params), globals_, given_anywhere, apps)
    if line.side == HYDRA:
        given_anywhere |= cliopts.load(HYDRA).line_defaults(globals_, given_anywhere, os.environ)
    options = _options(globals_, given_anywhere, apps, line.name, line.side)  # gives apps their exports too
    return JobSpec(tuple(apps), options)


def _options(globals_: dict[str, object], given: set[str], apps: list[AppContext], name: str, side: str) -> Options:
    """The job-wide options, and the programs' exports, from what the command line gave: each
    other launcher's words read by its module, when loaded."""
    hydra = cliopts.load(HYDRA) if cliopts.loaded(HYDRA) else None
    torch = cliopts.load(TORCHRUN) if name == "torchrun" or cliopts.loaded(TORCHRUN) else None
    given = given | cliopts.meant(globals_, given)  # -pernode is -N 1, -skip-launch-node --nolocal, ...
    torch_fields, notes = torch.torch_options(globals_, given, name, apps, os.environ) if torch else ({}, [])
    for key in torch_fields:  # what torchrun's words set wins over the command line's defaults
        globals_.pop(key, None)
    if "torch" not in torch_fields:
        apps[:] = [a._replace(argv=python_program(a.argv, a.wdir)) for a in apps]
    mca, tuned = openmpi_words.mca_params(globals_, os.environ)
    exports = _checked(hydra.genv_exports(globals_, os.environ), "-genv") if hydra else ()
    exports += exports_of((*tuned, *globals_.pop("exports")))  # type: ignore[misc]
    if hydra:
        exports = hydra.iface_exports(globals_, os.environ, exports) + exports
    apps[:] = [a._replace(exports=exports + _checked(a.exports, "-env")) for a in apps]
    shell = (globals_.pop("rsh_agent", None), globals_.pop("rsh_args", None))  # hydra's -bootstrap-exec(-args)
    agent, extra = openmpi_words.remote_shell(*shell, mca, os.environ)  # type: ignore[arg-type]
    timeout = globals_.pop("timeout") or _env_timeout()
    fields, bound, hydra_notes = hydra.binding(globals_, given) if hydra else ({}, set(), [])
    given = given | bound
    older, older_notes = openmpi_words.old_words(globals_, given)
    given = given | older | openmpi_words.mca_defaults(globals_, given | older, mca, os.environ)
    notes += older_notes
    fields.update(openmpi_words.mapping_options(globals_, given))
    if hydra:
        more, more_notes = hydra.options(globals_)
        fields.update(more)
        hydra_notes += more_notes
    notes += hydra_notes
    oversubscribe = bool(globals_.pop("oversubscribe"))
    refused = bool(globals_.pop("nooversubscribe", False)) or fields.get("oversubscribe") is False  # asked for in words
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
    if bind_to == "none" and "bind_to" not in given:
        bind_to = ""  # not asked for: each MPI family's launcher default (plan/build.launch_messages)
    if bind_to not in BIND_LEVELS:
        raise LaunchError(f"--bind-to {bind_to!r}: expected none, core, socket, numa or hwthread")
    launcher = str(globals_.pop("launcher")).lower()
    if launcher in cliopts.OTHER_HYDRA_LAUNCHERS:
        notes.append(f"-bootstrap {launcher}: mpilaunch starts agents over ssh (or srun in Slurm): read as auto")
        launcher = "auto"
    elif launcher == "rsh":
        launcher = "ssh"
    hosts, hostfile = globals_.pop("hosts"), globals_.pop("hostfile")
    placement, hosts, hostfile = (
        hydra.hosts_of(globals_, given, hosts, hostfile) if hydra else (OPENMPI, hosts, hostfile)
    )
    for dropped in fields:  # what the launchers' words set instead
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
        rules=_rules(side, name, given, "torch" in torch_fields),
        rsh_agent=agent,
        rsh_args=extra,
        notes=tuple(notes),
        **torch_fields,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
        **globals_,  # type: ignore[arg-type]
    )


def _rules(side: str, name: str, given: set[str], torch: bool) -> str:
    """The failure and signal rules the words select: hydra's for a line in hydra's words, and under
    the name mpiexec for a line with no word only Open MPI has (as mpiexec's ambiguous host words);
    torchrun's under its words; else Open MPI's."""
    if side == HYDRA or (name == "mpiexec" and not given & cliopts.only(OPENMPI)):
        return cliopts.load(HYDRA).RULES  # type: ignore[no-any-return]
    return cliopts.load(TORCHRUN).RULES if torch else openmpi_words.RULES  # type: ignore[no-any-return]


BIND_LEVELS = ("", "none", "core", "socket", "numa", "hwthread")
