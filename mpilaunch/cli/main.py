"""`mpilaunch ...`: a run, or a subcommand (`check`, `allrun`, `shims`); bad input is one line
and status 2, never a traceback. Started as `mpirun`, `mpiexec`, `ompi_info`, ... (see
`mpilaunch shims`), the command line is read as that program's."""

from __future__ import annotations

import os
import sys

from mpilaunch.cli import cliopts
from mpilaunch.cli.parse import parse_args
from mpilaunch.errors import LaunchError


def main(argv: list[str] | None = None, name: str = "mpilaunch") -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if name == "ompi_info":
            from mpilaunch.cli.names import ompi_info

            status = ompi_info(args)
        elif asks_version(args):
            from mpilaunch.cli.names import version_text

            print(version_text(name))
            status = 0
        elif args and args[0] in cliopts.SUBCOMMANDS:
            status = subcommand(args[0], args[1:])
        else:
            spec = parse_args(args, name)
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
    """`mpilaunch shims DIR`, or a per-host command (`check`, `allrun`)."""
    if word == "shims":
        from mpilaunch.cli.shims import run_shims

        return run_shims(args)
    from mpilaunch.cli.hostcli import run_subcommand

    return run_subcommand(word, args)


def asks_version(args: list[str]) -> bool:
    """--version (-V, -version) among the options before the program, as mpirun and mpiexec take it."""
    for word in args:
        if word in cliopts.VERSION_FLAGS:
            return True
        if not word.startswith("-") or word == "--":
            return False
    return False
