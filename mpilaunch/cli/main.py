"""`mpilaunch ...`: a run, or a subcommand (`check`, `allrun`, `shims`, `report`, `stacks`, `top`); bad input is
one line and status 2, never a traceback. Started as `mpirun`, `mpiexec`, `ompi_info`, ... (see
`mpilaunch shims`), the command line is read as that program's."""

from __future__ import annotations

import os
import sys

from mpilaunch.cli.cmdline import HELP, INFO, SINGLETON, SUBCOMMAND, VERSION, CommandLine, read
from mpilaunch.cli.parse import parse_args
from mpilaunch.errors import LaunchError


def main(line: CommandLine | list[str] | None = None) -> None:
    """Run what the command line (read once, by cli/cmdline.read; or words, as argv without the
    program's name) asks for; leave with its status."""
    if not isinstance(line, CommandLine):
        line = read(sys.argv[1:] if line is None else line)
    args = line.args
    try:
        if line.kind == INFO:
            from mpilaunch.cli.names import ompi_info

            status = ompi_info(args)
        elif line.kind == VERSION:
            from mpilaunch.cli.names import version_text

            print(version_text(line.name))
            status = 0
        elif line.kind == HELP:
            from mpilaunch.cli.helptext import help_text

            print(help_text(line.topic))
            status = 0
        elif line.kind == SUBCOMMAND:
            status = subcommand(args[0], args[1:])
        elif line.kind == SINGLETON:
            from mpilaunch.cli.singleton import singleton_start

            singleton_start(args)  # execs hydra, or raises
        else:
            spec = parse_args(line)
            from mpilaunch.launcher.launch import run_job

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


def subcommand(word: str, args: list[str]) -> int:
    """`mpilaunch shims DIR`, `mpilaunch report RUN.json -o OUT`, `mpilaunch stacks [PID]`, or a
    per-host command (`check`, `allrun`)."""
    if word == "shims":
        from mpilaunch.cli.shims import run_shims

        return run_shims(args)
    if word == "report":
        from mpilaunch.cli.reportcli import run_report

        return run_report(args)
    if word == "stacks":
        from mpilaunch.cli.stackscli import run_stacks

        return run_stacks(args)
    if word == "top":
        from mpilaunch.cli.topcli import run_top

        return run_top(args)
    from mpilaunch.cli.check_allrun_cli import run_subcommand

    return run_subcommand(word, args)
