"""The launcher's signals, as bytes on a pipe the controller's selector watches.

The Python handlers do nothing; `signal.set_wakeup_fd` writes each signal's number to the pipe,
and the loop reads them there, so a signal is handled between two events, never inside one.
What the run took (handlers, the wake-up fd, the pipe) is given back when it ends: a process
that runs many jobs keeps nothing of them.
"""

from __future__ import annotations

import os
import selectors
import signal

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class SignalPipe:
    def __init__(self) -> None:
        self.saved: dict[int, object] | None = None
        self.read_fd = self.write_fd = -1

    def install(self, sel: selectors.BaseSelector) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self.saved = {sig: signal.getsignal(sig) for sig in FORWARDED}
        # The wake-up fd first: a signal caught by a do-nothing handler before it is set would be
        # lost (a SIGTERM at start-up, and the job ran to its end with status 0).
        self.saved_wakeup_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        for sig in FORWARDED:
            signal.signal(sig, lambda *_: None)
        sel.register(self.read_fd, selectors.EVENT_READ, "signal")

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
