"""The run's command line: mpirun's spellings in, a JobSpec out (the fast scanner when it is
sure, click otherwise)."""

from __future__ import annotations

import os

from mpilaunch.cli import argscan, cliopts
from mpilaunch.errors import LaunchError
from mpilaunch.plan.spec import AppContext, JobSpec, Options

APP_PARAMS = ("np", "wdir", "argv")


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


def split_apps(argv: list[str]) -> list[list[str]]:
    """MPMD: ' : ' separates app contexts."""
    segments: list[list[str]] = [[]]
    for word in argv:
        if word == ":":
            segments.append([])
        else:
            segments[-1].append(word)
    return segments


def _parse_segment(words: list[str]) -> tuple[dict, set[str]]:
    """The fast scanner when it is sure, click otherwise (help, version, every error message)."""
    scanned = argscan.scan(words)
    if scanned is not None:
        return scanned
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
    segments = split_apps(argv)
    for index, words in enumerate(segments):
        params, given = _parse_segment(words)
        given_anywhere |= given
        if not params["argv"] and not (params["config"] and len(segments) == 1):  # the job file may have it
            where = f" in app context {index + 1}" if index else ""
            raise LaunchError(f"no program given{where}; usage: mpilaunch [options] program [args]")
        if params["wdir"] == "":
            raise LaunchError("--wdir: the directory name is empty")
        apps.append(AppContext(argv=tuple(params["argv"]), np=params["np"], wdir=params["wdir"]))
        for name, value in params.items():
            if name in APP_PARAMS:
                continue
            if index == 0 or name in given:
                if name in ("hosts", "mca", "exports") and index and name in globals_:
                    value = tuple(globals_[name]) + tuple(value)  # type: ignore[arg-type]
                globals_[name] = value
    config = globals_.pop("config")
    if config:  # pyyaml only now: a plain run does not pay for it
        from mpilaunch.cli.command import run_command
        from mpilaunch.cli.jobfile import apply_job_file, read_job_file

        apps = apply_job_file(read_job_file(str(config), run_command().params), globals_, given_anywhere, apps)
    exports = exports_of(globals_.pop("exports"))  # type: ignore[arg-type]
    apps = [AppContext(a.argv, a.np, exports, a.wdir) for a in apps]
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
    if bind_to not in ("none", "core", "socket", "hwthread"):
        raise LaunchError(f"--bind-to {bind_to!r}: expected none, core, socket or hwthread")
    options = Options(
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
