"""The `mpilaunch` command: the local agent is forked as soon as the command line is read
(cli/cmdline.py: the options table and the scanner), before the parser, the planner and the
launcher are imported.

A short job waits on its local agent's own start (imports, subreaper, guardian, PMI server).
Forked first, the agent does that on the other core while the launcher imports, parses the
command line and plans. Command lines that start no job here (--help, --version, --dry-run,
`check`, `allrun`) skip the early fork; a job that turns out not to need the agent (refused,
or remote-only) ends it.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from mpilaunch.cli.cmdline import CommandLine


LOCAL_AGENT = -1  # early_start: fork this machine's agent


def early_start(line: CommandLine, env: Mapping[str, str] | None = None) -> int:
    """What main starts before anything else is imported: LOCAL_AGENT, this machine's agent; N
    (at least 1), one srun step of N agents over the whole Slurm allocation whose hosts the job
    takes (transport/slurm_step.py); 0, nothing: for a line that starts no job here (help, a
    version, a dry run, a subcommand, a refused line, a removed working directory), or an
    allocation the step cannot be started for."""
    env = os.environ if env is None else env
    if not line.starts_a_job or not _has_working_directory():  # the latter is refused (cli/main.py)
        return 0
    if not env.get("SLURM_JOB_ID") or line.names_hosts:
        return LOCAL_AGENT
    from mpilaunch.host.procfs import has_ancestor

    if has_ancestor("slurmstepd"):  # a batch script: this node's agent is forked, in the batch step
        return LOCAL_AGENT
    from mpilaunch.transport.slurm_step import allocation_nodes

    return allocation_nodes(env)


def _has_working_directory() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


def main(quick_exit: bool = True) -> None:
    """The command. quick_exit=False raises SystemExit instead of leaving with os._exit, for a
    caller that runs mpilaunch inside its own process and has more to do afterwards."""
    if quick_exit:  # mpilaunch/__main__.py left SIGINT at its default action until here
        import _signal
        import gc

        gc.set_threshold(10_000, 10, 10)  # docs/performance.md, "Start-up tricks"

        from mpilaunch.launcher.decide.signal_table import ACTIONS, FAULTS

        for sig in ACTIONS:  # the faults keep their default until the run's one-shot handlers (signals.py)
            if sig not in FAULTS and _signal.getsignal(sig) in (_signal.SIG_DFL, _signal.default_int_handler):
                _signal.signal(sig, _stopped_by)  # ignored stays so (nohup)
    reopen_closed_std_streams()
    console_keeps_bytes()
    here = None  # this machine's agents, the first forked at once
    step = False
    try:
        from mpilaunch.cli.cmdline import read

        line = read(sys.argv[1:], invoked_as(sys.argv[0]))
        start = early_start(line)
        if start == LOCAL_AGENT:
            from mpilaunch.transport.local import LocalTransport

            here = LocalTransport()
            here.prestart(lambda: _pmix_guess(line))
        elif start:  # under salloc, every agent in one srun step: Slurm makes it while we plan
            from mpilaunch.transport import slurm_step

            step = True
            slurm_step.prestart(start)
        from mpilaunch.cli.main import main as run

        run(line, here)
        status = 0
    except SystemExit as done:
        status = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        if not isinstance(done.code, (int, type(None))):
            print(done.code, file=sys.stderr)
    except KeyboardInterrupt:  # Ctrl-C before the run's own signal handling started (or after it ended)
        status = 130
    finally:
        if here is not None:
            here.discard()
        if step:
            from mpilaunch.transport.slurm import discard_early_step

            discard_early_step()  # a step the launch did not take (a refused command line)
    if not quick_exit:
        raise SystemExit(status)
    leave(status)


def invoked_as(argv0: str) -> str:
    """The name mpilaunch was started as: mpirun, mpiexec, ompi_info, ... (`mpilaunch shims`
    writes them), or mpilaunch (also for `python -m mpilaunch`)."""
    name = argv0.rpartition("/")[2]
    return "mpilaunch" if name in ("", "__main__.py", "-c") else name


def _pmix_guess(line: CommandLine) -> tuple[str | None, str | None] | None:
    """In the agent forked early, and only when it has time for it (Agent.warm_pmix): imported
    there, not before the fork, which both processes wait for."""
    from mpilaunch.cli.pmix_guess import pmix_guess

    return pmix_guess(line)


def _stopped_by(signum: int, frame: object) -> None:
    """A signal that would end the launcher (SIGINT, SIGTERM, SIGALRM...: signal_table.ACTIONS)
    before the run's own handling starts (or after it ends): leave
    at once with the shell's 128 + signal, as after it. Not by raising (KeyboardInterrupt): an
    exception raised in the middle of an import is printed and dropped, and the job then ran to
    its end with status 0. Leaving closes every descriptor, so each agent (the early one, those
    behind SSH clients) sees its link end and stops its ranks."""
    from mpilaunch.launcher.decide.signal_table import leave_status

    leave(leave_status(signum))


def reopen_closed_std_streams() -> None:
    """Descriptors 0, 1 and 2 closed at start (`<&-`, `>&-`, `2>&-`) are opened on /dev/null
    before anything else opens one: else the first socket or pipe gets the number, and console
    bytes go down an agent's link, or the rank's stdin feed reads it. The run then goes as it
    would with that stream redirected to /dev/null."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        name = ("stdin", "stdout", "stderr")[fd]
        if getattr(sys, name) is None:  # Python found it closed and left None there
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


def console_keeps_bytes() -> None:
    """Text that came as bytes that are not UTF-8 (an argument, a file name, an environment
    value: Python holds them as surrogate escapes) is printed as those bytes, as `ls` and the
    shell print them, not refused with a UnicodeEncodeError in the middle of a run."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
        except (AttributeError, ValueError):  # not a TextIOWrapper (a caller's own stream)
            pass


def leave(status: int) -> None:
    """Flush and exit without the interpreter's teardown: unloading every module takes time
    that whoever waits for our exit status would wait for. Everything the run opened
    (log files, agents, SSH connections) is closed or ended by the time we get here."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None when the descriptor was closed at start
                stream.flush()
        except (OSError, ValueError):  # a reader that left, or a closed stream: nothing to keep
            pass
    os._exit(status)
