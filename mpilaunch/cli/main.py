"""`mpilaunch ...`: a run, or a subcommand (`check`, `allrun`, `shims`, `report`, `stacks`, `top`); bad input is
one line and status 2, never a traceback. Started as `mpirun`, `mpiexec`, `ompi_info`, ... (see
`mpilaunch shims`), the command line is read as that program's."""

from __future__ import annotations

import os
import sys

from mpilaunch.cli.cmdline import HELP, INFO, SINGLETON, SUBCOMMAND, VERSION, CommandLine, read
from mpilaunch.cli.parse import parse_args
from mpilaunch.errors import LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.transport.local import LocalTransport


def main(line: CommandLine | list[str] | None = None, here: LocalTransport | None = None) -> None:
    """Run what the command line (read once, by cli/cmdline.read; or words, as argv without the
    program's name) asks for; leave with its status. here: this machine's agents, one perhaps
    forked already (entry.main)."""
    if not isinstance(line, CommandLine):
        line = read(sys.argv[1:] if line is None else line)
    args = line.args
    try:
        if line.kind not in (INFO, VERSION, HELP):
            require_current_directory()
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
            from mpilaunch.launcher.start.launch import run_job

            status = run_job(spec, here)
    except LaunchError as exc:
        print(f"mpilaunch: {exc}", file=sys.stderr)
        status = exc.status
    except KeyboardInterrupt:
        status = 130
    except BrokenPipeError:  # e.g. `mpilaunch --dry-run ... | head`: the reader left, nothing is wrong here
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = 128 + 13
    except (OSError, RuntimeError) as exc:  # a limit of this host met by the launcher itself (ulimit -n)
        status = _stopped_by_limit(exc)
    sys.exit(status)


def require_current_directory() -> None:
    """A run, `check`, `allrun`, `shims` and `report` read names against the current directory
    (the ranks start there by default): one that was removed while the shell stood in it is one
    line, before anything is started."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise LaunchError("the current directory no longer exists (it was removed): cd to one that does") from None


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


def _stopped_by_limit(exc: OSError | RuntimeError) -> int:
    """Status 2 and one line naming the limit, for a descriptor, a thread or memory the launcher
    could not get (what it started is ended by the way out); anything else is re-raised, a
    failure that is no limit being a defect to be seen whole. EAGAIN is no limit here: a fork
    that meets `ulimit -u` says so where it forks (transport/local.py)."""
    from mpilaunch.host.limits import limit_words

    why = limit_words(exc)
    if why is None or isinstance(exc, BlockingIOError):
        raise exc
    print(f"mpilaunch: stopped by a limit of this host: {why}", file=sys.stderr)
    return 2
