"""The launcher's stdin, fed to the ranks that get it (--stdin), with flow control.

fd 0 is read in 64 KiB pieces and sent as one STDIN frame per stdin rank still running; each
frame adds its size to the bytes in flight on its connection, and the agent's StdinAck takes
them off. fd 0 is watched only while every stdin rank's connection has less than STDIN_WINDOW
in flight, so a fast writer blocks instead of filling the launcher's memory. A regular file or
/dev/null cannot be polled (epoll refuses it): it is read whenever the window allows.
"""

from __future__ import annotations

import os
import selectors

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

STDIN_WINDOW = 1 << 16  # bytes of stdin in flight per connection before the launcher stops reading


class StdinFeed:
    def __init__(
        self,
        sel: selectors.BaseSelector,
        procs: list[int],
        send: Callable[[int, bytes], None],
        in_flight: Callable[[int], int],
        done: Callable[[int], bool],
    ) -> None:
        self.sel = sel
        self.procs = procs  # the processes that get stdin
        self.send = send  # (proc, data): b"" is the end of file
        self.in_flight = in_flight  # bytes not yet acknowledged on a proc's connection
        self.done = done
        self.open = bool(procs)
        self.registered = False
        self.pollable = True

    def start(self) -> None:
        """Ranks get the end of file at once when the launcher cannot read its stdin."""
        if self.open and not usable():
            self.open = False
            for proc in self.procs:
                self.send(proc, b"")

    def update(self) -> bool:
        """(Un)watch fd 0 by the window; True when it must be read without polling."""
        want = self.open and all(self.in_flight(p) < STDIN_WINDOW for p in self.procs)
        if want and not self.registered and self.pollable:
            try:
                self.sel.register(0, selectors.EVENT_READ, "stdin")
            except PermissionError:  # a regular file or /dev/null: always readable
                self.pollable = False
                return True
        elif not want and self.registered:
            self.sel.unregister(0)
        self.registered = want and self.pollable
        return want and not self.pollable

    def read(self) -> None:
        try:
            data = os.read(0, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.open = False
        for proc in self.procs:
            if not self.done(proc) or not data:
                self.send(proc, data)


def usable() -> bool:
    """Whether the launcher can read its stdin without being stopped (SIGTTIN) or failing."""
    try:
        os.fstat(0)
    except OSError:
        return False
    if os.isatty(0):
        try:
            return os.tcgetpgrp(0) == os.getpgrp()
        except OSError:
            return False
    return True
