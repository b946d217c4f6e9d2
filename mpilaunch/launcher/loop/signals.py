"""The launcher's signals, as bytes on a pipe the controller's selector watches.

The Python handlers do nothing; `signal.set_wakeup_fd` writes each signal's number to the pipe,
and the loop reads them there, so a signal is handled between two events, never inside one.
Every signal of signal_table.ACTIONS is caught (what the run does with it is the policy's).
What the run took (handlers, the wake-up fd, the pipe) is given back when it ends: a process
that runs many jobs keeps nothing of them.

SIGSEGV, SIGBUS, SIGILL and SIGFPE are also what the kernel raises for a fault of the launcher's
own, and a handler that returns from one runs the faulting instruction again, for ever: their
handlers are reset to the default as they run (SA_RESETHAND), so a `kill -SEGV` ends the job as
SIGTERM does and a real fault still ends the launcher at once. They are caught once the job
has run FAULTS_AFTER seconds (catch_faults: setting the flag needs ctypes, which a short job does
without); before it, and where that flag cannot be set (a libc layout not known here), they keep
their default action, and the agents end the ranks of a launcher that dies of one.
"""

from __future__ import annotations

import os
import selectors
import signal

from mpilaunch.launcher.decide.signal_table import ACTIONS, ALWAYS, FAULTS

SA_RESETHAND = 0x80000000  # Linux's, on the machines _one_shot knows
FAULTS_AFTER = 0.1  # seconds of the run before the fault signals are caught


class SignalPipe:
    def __init__(self) -> None:
        self.saved: dict[int, object] | None = None
        self.read_fd = self.write_fd = -1
        self.faults_at: float | None = None  # when catch_faults runs (the controller's clock)

    def install(self, sel: selectors.BaseSelector) -> None:
        self.catch()
        sel.register(self.read_fd, selectors.EVENT_READ, "signal")

    def catch(self) -> None:
        """From now on a signal waits in the pipe for the loop. The launch calls it before job 1's
        ranks start (launch.execute), so a Ctrl-C while the controller is still being made is
        the run's (forwarded, then the grace), not the start-up's (leave at once)."""
        if self.saved is not None:
            return
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self.saved = {}
        for sig in ACTIONS:
            handler = signal.getsignal(sig)
            if sig in ALWAYS or handler in (signal.SIG_DFL, signal.default_int_handler) or _start_up(handler):
                self.saved[sig] = handler
        # The wake-up fd first: a signal caught by a do-nothing handler before it is set would be
        # lost (a SIGTERM at start-up, and the job ran to its end with status 0).
        self.saved_wakeup_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        for sig in self.saved:
            if sig not in FAULTS:  # those once the run has started: catch_faults
                signal.signal(sig, _ignore)

    def catch_faults_at(self, when: float) -> None:
        """catch_faults once the loop's clock reaches when (tick)."""
        self.faults_at = when

    def next_deadline(self) -> float | None:
        return self.faults_at

    def tick(self, now: float) -> None:
        if self.faults_at is not None and now >= self.faults_at:
            self.faults_at = None
            self.catch_faults()

    def catch_faults(self) -> None:
        """The fault signals caught too, each once (SA_RESETHAND)."""
        if self.saved is None:
            return
        faults = FAULTS & set(self.saved)
        for sig in faults:
            signal.signal(sig, _ignore)
        for sig in _one_shot(faults):  # not made one-shot: back to their default
            signal.signal(sig, signal.SIG_DFL)
            del self.saved[sig]

    def drain(self) -> bytes:
        """The numbers of the signals received since the last drain."""
        try:
            return os.read(self.read_fd, 512)
        except BlockingIOError:
            return b""

    def restore(self) -> None:
        """The handlers and wake-up fd found at install (restored, not reset to the defaults)."""
        if self.saved is None:  # never installed, or already restored
            return
        signal.set_wakeup_fd(self.saved_wakeup_fd)
        for sig, handler in self.saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]
        self.saved = None

    def release(self) -> None:
        self.restore()
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.write_fd = -1


def _start_up(handler: object) -> bool:
    """entry.py's handler, which ends the launcher until the run handles the signal itself."""
    return getattr(handler, "__module__", None) == "mpilaunch.entry"


def _ignore(signum: int, frame: object) -> None:
    """The wake-up fd has the signal's number; the loop acts on it there."""


def _one_shot(sigs: set[int]) -> set[int]:
    """Add SA_RESETHAND to the handlers of these signals; the ones it could not be added to."""
    if not sigs:
        return set()
    if os.uname().machine not in ("x86_64", "aarch64"):  # glibc's and musl's struct sigaction as below
        return set(sigs)
    import ctypes

    class Sigaction(ctypes.Structure):
        _fields_ = (("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                    ("restorer", ctypes.c_void_p))  # fmt: skip

    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return set(sigs)
    failed = set()
    for sig in sigs:
        action = Sigaction()
        if libc.sigaction(sig, None, ctypes.byref(action)) != 0 or action.handler in (None, 0, 1):
            failed.add(sig)  # 0, 1: SIG_DFL, SIG_IGN; Python's handler is neither
            continue
        action.flags = ctypes.c_int(action.flags | SA_RESETHAND).value  # the flag is the int's sign bit
        if libc.sigaction(sig, ctypes.byref(action), None) != 0:
            failed.add(sig)
    return failed
