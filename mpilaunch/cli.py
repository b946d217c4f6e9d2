"""Command line: mpirun's spellings in, a JobSpec and then a LaunchPlan out."""

from __future__ import annotations

import os
import sys

import click
from click.core import ParameterSource

from mpilaunch import __version__
from mpilaunch.errors import LaunchError
from mpilaunch.spec import AppContext, JobSpec, Options

EPILOG = """\b
Examples:
  mpilaunch -n 8 python net.py
  mpilaunch -n 16 -H host1:8,host2:8 python net.py
  mpilaunch -np 16 --hostfile hostfile --output-filename log_output \\
            --merge-stderr-to-stdout python net.py
  mpilaunch -n 1 python server.py : -n 3 python worker.py
  mpilaunch --dry-run -n 4 --map-by node -H a:2,b:2 python t.py

Everything after the program name goes to the program:
  mpilaunch -n 2 python t.py -n 5   (t.py gets its own -n 5)
"""

APP_PARAMS = ("np", "wdir", "argv")


def _stdin_choice(value: str) -> str:
    value = value.strip().lower()
    if value in ("all", "none") or value.isdigit():
        return value
    raise click.BadParameter(f"expected a rank number, all or none, not {value!r}")


def _env_timeout() -> float | None:
    raw = os.environ.get("MPIEXEC_TIMEOUT")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise LaunchError(f"MPIEXEC_TIMEOUT={raw!r} is not a number of seconds") from None
    return value if value > 0 else None


@click.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["--help", "-help", "-h"]},
    epilog=EPILOG,
)
@click.option("--config", "-config", metavar="JOB.yaml", help="Job file: options, env, command; the command line wins.")
@click.option(
    "-n", "-np", "--np", "-c", "np", type=click.IntRange(min=1), help="Number of ranks (default: every slot)."
)
@click.option("-H", "--host", "-host", "hosts", multiple=True, metavar="h1:N,h2:N", help="Hosts and their slots.")
@click.option(
    "--hostfile", "-hostfile", "--machinefile", "-machinefile", "-f", "hostfile", metavar="PATH", help="Hostfile."
)
@click.option("--map-by", "-map-by", "map_by", default="slot", metavar="slot|node|ppr:N:node", help="Placement policy.")
@click.option("--npernode", "-npernode", "npernode", type=click.IntRange(min=1), help="Ranks per node (ppr:N:node).")
@click.option("--oversubscribe", "-oversubscribe", is_flag=True, help="Allow more ranks than slots.")
@click.option("--display-map", "-display-map", is_flag=True, help="Print the rank map, then launch.")
@click.option("--dry-run", "-dry-run", is_flag=True, help="Print the map and every rank's variables; start nothing.")
@click.option("-x", "exports", multiple=True, metavar="VAR[=value]", help="Export a variable to every rank.")
@click.option("--wdir", "-wdir", "--wd", "-wd", "wdir", metavar="DIR", help="Working directory of the ranks.")
@click.option(
    "--output-filename", "-output-filename", metavar="DIR", help="Per-rank files DIR/1/rank.N/{stdout,stderr}."
)
@click.option("--merge-stderr-to-stdout", "-merge-stderr-to-stdout", is_flag=True, help="One stream per rank.")
@click.option("--tag-output", "-tag-output", is_flag=True, help="Prefix console lines with [1,rank]<stream>:.")
@click.option("--timestamp-output", "-timestamp-output", is_flag=True, help="Prefix console lines with a time stamp.")
@click.option(
    "--stdin",
    "-stdin",
    "stdin",
    default="0",
    callback=lambda c, p, v: _stdin_choice(v),
    help="Rank that gets stdin: N, all or none.",
)
@click.option(
    "--mca",
    "-mca",
    "mca",
    nargs=2,
    multiple=True,
    metavar="KEY VALUE",
    help="MCA parameter (exported as OMPI_MCA_KEY).",
)
@click.option(
    "--bind-to", "-bind-to", "bind_to", default="none", metavar="none|core|socket|hwthread", help="CPU binding."
)
@click.option("--report-bindings", "-report-bindings", is_flag=True, help="Print each rank's CPU binding.")
@click.option("--timeout", "-timeout", type=click.FloatRange(min=0, min_open=True), help="End the job after S seconds.")
@click.option(
    "--kill-timeout",
    "-kill-timeout",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@click.option(
    "--mpi",
    "-mpi",
    "mpi",
    type=click.Choice(["pmi1", "pmi2", "none"], case_sensitive=False),
    default="pmi1",
    help="PMI for MPICH-family ranks: pmi1 (PMI-1 and PMI-2 served), pmi2 (also tell MPICH to use PMI-2) or none.",
)
@click.option(
    "--pmi-tcp",
    "-pmi-tcp",
    is_flag=True,
    help="Serve PMI over loopback TCP (PMI_PORT + a secret PMI_ID) for ranks that cannot inherit PMI_FD.",
)
@click.option(
    "--devices-per-rank",
    "-devices-per-rank",
    type=click.IntRange(min=1),
    metavar="N",
    help="Each rank sees only its N devices: CUDA_VISIBLE_DEVICES (or the ASCEND_RT_/HIP_ list you set) narrowed.",
)
@click.option("--rank-table", "-rank-table", metavar="PATH", help="Write the job's HCCL rank table (MindSpore/Ascend).")
@click.option("--ssh-config", "-ssh-config", "ssh_config", metavar="PATH", help="SSH config (default ~/.ssh/config).")
@click.option(
    "--ssh-accept-new",
    "-ssh-accept-new",
    is_flag=True,
    help="Accept and record unknown host keys (a changed key is always refused).",
)
@click.option("--allow-run-as-root", "-allow-run-as-root", is_flag=True, help="Allow running as root.")
@click.version_option(__version__, "--version", "-V", "-version", prog_name="mpilaunch", message="%(prog)s %(version)s")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def command(**params: object) -> None:
    """Launch a parallel job, mpirun style."""


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
    try:
        ctx = command.make_context("mpilaunch", list(words))
    except click.exceptions.Exit as done:
        raise SystemExit(done.exit_code) from None
    except click.ClickException as exc:
        raise LaunchError(exc.format_message()) from None
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    return ctx.params, given


def _exports(values: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    from mpilaunch.rank_env import valid_env_name

    out = []
    for item in values:
        name, eq, value = item.partition("=")
        if not valid_env_name(name):
            raise LaunchError(f"-x {item!r}: {name!r} is not a variable name")
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
        from mpilaunch.jobfile import apply_job_file, read_job_file

        apps = apply_job_file(read_job_file(str(config), command.params), globals_, given_anywhere, apps)
    exports = _exports(globals_.pop("exports"))  # type: ignore[arg-type]
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


HOST_OPTIONS = (
    click.option("-H", "--host", "-host", "hosts", multiple=True, metavar="h1,h2", help="Hosts."),
    click.option("--hostfile", "-hostfile", "--machinefile", "-machinefile", "-f", "hostfile", metavar="PATH"),
    click.option("--ssh-config", "-ssh-config", "ssh_config", metavar="PATH", help="SSH config."),
    click.option("--ssh-accept-new", "-ssh-accept-new", is_flag=True, help="Accept and record unknown host keys."),
)


def _host_options(func):  # type: ignore[no-untyped-def]
    for option in reversed(HOST_OPTIONS):
        func = option(func)
    return func


@click.command(name="mpilaunch check", context_settings={"help_option_names": ["--help", "-h"]})
@_host_options
@click.option("--port", type=click.IntRange(0, 65535), help="MASTER_PORT to check (default $MASTER_PORT or 29500).")
@click.argument("program", required=False)
def check_command(**params: object) -> None:
    """Preflight: can every host be reached, and can it run PROGRAM? One row per host."""


@click.command(
    name="mpilaunch allrun",
    context_settings={"allow_interspersed_args": False, "help_option_names": ["--help", "-h"]},
)
@_host_options
@click.option("-x", "exports", multiple=True, metavar="VAR[=value]", help="Export a variable.")
@click.option("--wdir", "-wdir", "wdir", metavar="DIR", help="Working directory.")
@click.option("--output-filename", "-output-filename", metavar="DIR", help="Per-host files DIR/1/rank.N/.")
@click.option("--timeout", "-timeout", type=click.FloatRange(min=0, min_open=True), help="End after S seconds.")
@click.option("--allow-run-as-root", "-allow-run-as-root", is_flag=True, help="Allow running as root.")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def allrun_command(**params: object) -> None:
    """Run a command once on every host (not once per slot), e.g. a pip install."""


def _subcommand(name: str, args: list[str]) -> int:
    """`mpilaunch check ...` and `mpilaunch allrun ...`: per-host commands, not jobs."""
    from mpilaunch import hostcmds

    command_ = check_command if name == "check" else allrun_command
    try:
        params = command_.make_context(command_.name, args).params
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as exc:
        raise LaunchError(exc.format_message()) from None
    options = Options(
        hosts=params["hosts"],  # type: ignore[arg-type]
        hostfile=params["hostfile"],  # type: ignore[arg-type]
        ssh_config=params["ssh_config"],  # type: ignore[arg-type]
        ssh_accept_new=bool(params["ssh_accept_new"]),
        allow_run_as_root=bool(params.get("allow_run_as_root")),
        output_filename=params.get("output_filename"),  # type: ignore[arg-type]
        timeout=params.get("timeout"),  # type: ignore[arg-type]
    )
    if name == "check":
        return hostcmds.run_check(options, params["program"], params["port"])  # type: ignore[arg-type]
    check_root(options, os.environ)
    exports = _exports(params["exports"])  # type: ignore[arg-type]
    return hostcmds.run_allrun(options, tuple(params["argv"]), params["wdir"], exports)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in ("check", "allrun"):
            status = _subcommand(args[0], args[1:])
        else:
            spec = parse_args(args)
            check_root(spec.options, os.environ)
            from mpilaunch.launch import run_job

            status = run_job(spec)
    except LaunchError as exc:
        print(f"mpilaunch: {exc}", file=sys.stderr)
        status = exc.status
    except KeyboardInterrupt:
        status = 130
    except BrokenPipeError:  # e.g. `mpilaunch --dry-run ... | head`: the reader left, nothing is wrong here
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = 128 + 13
    sys.exit(status)
