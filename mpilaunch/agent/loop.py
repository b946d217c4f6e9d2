"""The agent's event loop: a selector whose keys carry their handlers, and timers.

One small handler per descriptor (a rank's pipe, a PMI socket, the link, a relayed child's
stream), driven by a loop that knows none of them. Timers are objects that say when they
next want a turn (`next_deadline`, None: only when something else wakes the loop) and take it
(`tick`); every timer ticks after every wake-up, in the order they were added.
"""

from __future__ import annotations

import selectors
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Handler = Callable[[int], None]


class Timer:
    """Something the loop gives a turn after every wake-up, and wakes up for at its deadline."""

    def next_deadline(self) -> float | None:
        return None

    def tick(self, now: float) -> None:
        pass


class Loop:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.sel = selectors.DefaultSelector()
        self.timers: list[Timer] = []
        self.clock = clock

    def watch(self, fd: object, handler: Handler, events: int = selectors.EVENT_READ) -> None:
        """Call handler(fd) whenever fd (a descriptor or an object with fileno) is ready."""
        self.sel.register(fd, events, handler)  # type: ignore[arg-type]

    def unwatch(self, fd: object) -> None:
        try:
            self.sel.unregister(fd)  # type: ignore[arg-type]
        except (KeyError, ValueError):
            pass

    def watched(self, fd: object) -> bool:
        return fd in self.sel.get_map()

    def add_timer(self, timer: Timer) -> None:
        self.timers.append(timer)

    def turn(self) -> None:
        """Wait for a descriptor or the nearest deadline, run the handlers, then every timer."""
        deadlines = [when for when in (t.next_deadline() for t in self.timers) if when is not None]
        timeout = max(0.0, min(deadlines) - self.clock()) if deadlines else None
        for key, _ in self.sel.select(timeout):
            key.data(key.fd)
        now = self.clock()
        for timer in self.timers:
            timer.tick(now)

    def close(self) -> None:
        self.sel.close()
