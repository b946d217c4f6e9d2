"""`mpilaunch ...`: a run, or the `check` and `allrun` subcommands; bad input is one line and
status 2, never a traceback."""

from __future__ import annotations

import os
import sys

from mpilaunch.cli import cliopts
from mpilaunch.cli.parse import check_root, parse_args
from mpilaunch.errors import LaunchError


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in cliopts.SUBCOMMANDS:
            from mpilaunch.cli.hostcli import run_subcommand

            status = run_subcommand(args[0], args[1:])
        else:
            spec = parse_args(args)
            check_root(spec.options, os.environ)
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
