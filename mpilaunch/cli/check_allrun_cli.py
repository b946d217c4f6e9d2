"""Command lines of `mpilaunch check` and `mpilaunch allrun`: per-host commands, not jobs.

Their options are rows of the run command's table (cliopts), so a host is spelled the same way
everywhere; click is imported only when one of them runs.
"""

from __future__ import annotations

from mpilaunch.cli.cliopts import all_rows
from mpilaunch.cli.command import click_option
from mpilaunch.cli.parse import exports_of
from mpilaunch.errors import LaunchError
from mpilaunch.plan.spec import Options

_ROWS = {opt.name: opt for opt in all_rows()}
HOST_KEYS = ("config", "hosts", "hostfile", "ssh_config", "ssh_accept_new", "ssh_client")
ALLRUN_KEYS = ("exports", "wdir", "timeout", "allow_run_as_root")


def _commands():  # type: ignore[no-untyped-def]
    import click

    hosts = [click_option(_ROWS[name]) for name in HOST_KEYS]
    check = click.Command(
        "mpilaunch check",
        params=[
            *hosts,
            click.Option(
                ["--port"],
                type=click.IntRange(0, 65535),
                help="MASTER_PORT to check (default $MASTER_PORT, else that a free port can be taken).",
            ),
            click.Argument(["program"], required=False),
        ],
        help="Preflight: can every host be reached, and can it run PROGRAM? One row per host.",
        context_settings={"help_option_names": ["--help", "-h"]},
    )
    allrun = click.Command(
        "mpilaunch allrun",
        params=[
            *hosts,
            *(click_option(_ROWS[name]) for name in ALLRUN_KEYS),
            click_option(_ROWS["output_filename"], help="Per-host files DIR/1/rank.N/."),
            click.Argument(["argv"], nargs=-1, required=True, type=click.UNPROCESSED),
        ],
        help="Run a command once on every host (not once per slot), e.g. a pip install.",
        context_settings={"allow_interspersed_args": False, "help_option_names": ["--help", "-h"]},
    )
    return check, allrun


def run_subcommand(name: str, args: list[str]) -> int:
    """`mpilaunch check ...` or `mpilaunch allrun ...` -> exit status."""
    import click

    from mpilaunch.launcher.start import check_allrun

    check, allrun = _commands()
    command = check if name == "check" else allrun
    try:
        ctx = command.make_context(command.name, args)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as exc:
        raise LaunchError(exc.format_message()) from None
    params = ctx.params
    if params["config"]:
        _with_job_file(params, ctx)
    options = Options(
        hosts=params["hosts"],
        hostfile=params["hostfile"],
        ssh_config=params["ssh_config"],
        ssh_accept_new=bool(params["ssh_accept_new"]),
        ssh_client=str(params["ssh_client"]).lower(),
        allow_run_as_root=bool(params.get("allow_run_as_root")),
        output_filename=params.get("output_filename"),
        timeout=params.get("timeout"),
    )
    if name == "check":
        return check_allrun.run_check(options, params["program"], params["port"])
    return check_allrun.run_allrun(options, tuple(params["argv"]), params["wdir"], exports_of(params["exports"]))


def _with_job_file(params: dict, ctx) -> None:  # type: ignore[no-untyped-def]
    """--config JOB.yaml: the job file's hosts, SSH settings (and for allrun its variables,
    working directory and timeout), under what the command line gives."""
    from click.core import ParameterSource

    from mpilaunch.cli.command import run_command
    from mpilaunch.cli.jobfile import merge_options, read_job_file

    job = read_job_file(str(params["config"]), run_command().params)
    given = {name for name in params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    merge_options({name: value for name, value in job.options.items() if name in params}, params, given)
    if "wdir" in params and params["wdir"] is None and job.wdir:
        params["wdir"] = job.wdir
