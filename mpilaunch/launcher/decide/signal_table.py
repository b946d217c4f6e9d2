"""What the launcher does with each signal that would otherwise end it: one row per signal.

FORWARD: sent on to every rank; the run goes on (the ranks may end it), as mpirun and hydra
    forward SIGUSR1, SIGUSR2 and SIGALRM.
STOP: the run is stopped by it, as by Ctrl-C: the row's signal goes to every rank, the summary
    says `stopped by NAME`, --report-json records it, the status is 128 + the signal; ranks
    still running after the grace are stopped (policy.py), and a second STOP signal of any kind
    kills every rank at once. The rest end the job as SIGTERM does.
STACKS: every rank's stack is taken and printed, grouped, and the run goes on (SIGQUIT, Ctrl-\\);
    the same signal again within STACKS_TWICE seconds is a STOP with the row's signal (Ctrl-\\
    twice is Ctrl-C: SIGINT to every rank, status 128 + SIGQUIT).

Signals whose default action does not end a process (SIGCHLD, SIGCONT, SIGTSTP, SIGWINCH...)
have no row, nor SIGKILL and SIGSTOP, which cannot be caught, nor SIGPIPE and SIGXFSZ, which
Python ignores (a console that went away is an EPIPE, a file past its size limit an EFBIG).
Only `_signal` here: entry.py reads the table before anything else is imported.
"""

from __future__ import annotations

import _signal

FORWARD, STOP, STACKS = "forward", "stop", "stacks"
STACKS_TWICE = 1.0  # seconds within which a second SIGQUIT stops the run instead

# Raised by the kernel for a fault of the launcher's own, not only sent by someone: caught once
# (the handler is reset as it runs), so that a real fault still ends the launcher (signals.py).
FAULTS = frozenset(getattr(_signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE") if hasattr(_signal, n))
_AS_SIGTERM = ("SIGABRT", "SIGTRAP", "SIGSYS", "SIGXCPU", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSTKFLT")


def _rows() -> dict[int, tuple[str, int]]:
    rows = {
        _signal.SIGINT: (STOP, _signal.SIGINT),
        _signal.SIGTERM: (STOP, _signal.SIGTERM),
        _signal.SIGHUP: (STOP, _signal.SIGHUP),
        _signal.SIGQUIT: (STACKS, _signal.SIGINT),  # twice within STACKS_TWICE: as Ctrl-C
        _signal.SIGUSR1: (FORWARD, _signal.SIGUSR1),
        _signal.SIGUSR2: (FORWARD, _signal.SIGUSR2),
        _signal.SIGALRM: (FORWARD, _signal.SIGALRM),
    }
    for sig in (*(getattr(_signal, name) for name in _AS_SIGTERM if hasattr(_signal, name)), *FAULTS):
        rows[sig] = (STOP, _signal.SIGTERM)
    for sig in range(getattr(_signal, "SIGRTMIN", 0), getattr(_signal, "SIGRTMAX", -1) + 1):
        rows[sig] = (STOP, _signal.SIGTERM)  # real-time signals: no meaning here, end the job
    return rows


ACTIONS: dict[int, tuple[str, int]] = _rows()  # signal -> (FORWARD, STOP or STACKS, the signal the ranks get)
# Caught whatever handler they had; the others only where nothing else handles or ignores them (a
# process that runs mpilaunch inside itself keeps its own SIGALRM handler).
ALWAYS = frozenset((_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGUSR1, _signal.SIGUSR2))


LEAVES_WITH: list[int] = []  # set by a run whose launcher leaves with a status of its own (torchrun's 1)


def leave_status(sig: int) -> int:
    """The status a stopping signal ends the launcher with outside the run's own handling (the
    start, a restart's delay): the shell's 128 + signal, or the command line's launcher's."""
    return LEAVES_WITH[0] if LEAVES_WITH else 128 + sig


def name_of(sig: int) -> str:
    """SIGTERM, SIGRTMIN+3, or `signal 99`."""
    import signal

    try:
        return signal.Signals(sig).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1)
        return f"SIGRTMIN+{sig - low}" if low <= sig <= high else f"signal {sig}"
