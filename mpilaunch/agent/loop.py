"""The agent's event loop: epoll (poll where there is none) with a handler per descriptor, and
timers. Not `selectors`: it imports `collections` and `math` on every agent's start
(docs/performance.md, "Start-up tricks"); the loop offers `register`, `modify` and
`unregister` as a selector does, so the ranks' store (host/tcpstore.py) can share it.

One small handler per descriptor (a rank's pipe, a PMI socket, the link, a relayed child's
stream), driven by a loop that knows none of them. Timers are objects that say when they
next want a turn (`next_deadline`, None: only when something else wakes the loop) and take it
(`tick`); every timer ticks after every wake-up, in the order they were added.
"""

from __future__ import annotations

import select
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Handler = Callable[[int], None]

READ, WRITE = 1, 2  # selectors.EVENT_READ and EVENT_WRITE
_EPOLL = hasattr(select, "epoll")
_MASK = {READ: select.POLLIN, WRITE: select.POLLOUT, READ | WRITE: select.POLLIN | select.POLLOUT}


def _fd(fileobj: object) -> int:
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()  # type: ignore[attr-defined]


class Timer:
    """Something the loop gives a turn after every wake-up, and wakes up for at its deadline."""

    def next_deadline(self) -> float | None:
        return None

    def tick(self, now: float) -> None:
        pass


class Loop:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.poller = select.epoll() if _EPOLL else select.poll()
        self.handlers: dict[int, tuple[object, Handler]] = {}  # by descriptor: what was watched, its handler
        self.timers: list[Timer] = []
        self.clock = clock

    def watch(self, fd: object, handler: Handler, events: int = READ) -> None:
        """Call handler(fd) whenever fd (a descriptor or an object with fileno) is ready."""
        self.register(fd, events, handler)

    def unwatch(self, fd: object) -> None:
        try:
            self.unregister(fd)
        except (KeyError, ValueError):
            pass

    def watched(self, fd: object) -> bool:
        try:
            self._key(fd)
        except KeyError:
            return False
        return True

    # -- what a selector offers -------------------------------------------------------------
    def register(self, fileobj: object, events: int, data: Handler) -> None:
        fd = _fd(fileobj)
        if fd in self.handlers:
            raise KeyError(f"{fileobj!r} is already registered")
        self.poller.register(fd, _MASK[events])
        self.handlers[fd] = (fileobj, data)

    def modify(self, fileobj: object, events: int, data: Handler) -> None:
        fd = self._key(fileobj)
        self.poller.modify(fd, _MASK[events])
        self.handlers[fd] = (fileobj, data)

    def unregister(self, fileobj: object) -> None:
        fd = self._key(fileobj)
        del self.handlers[fd]
        try:
            self.poller.unregister(fd)
        except OSError:  # closed already: the kernel forgot it
            pass

    def add_timer(self, timer: Timer) -> None:
        self.timers.append(timer)

    def turn(self) -> None:
        """Wait for a descriptor or the nearest deadline, run the handlers, then every timer."""
        deadlines = [when for when in (t.next_deadline() for t in self.timers) if when is not None]
        timeout = max(0.0, min(deadlines) - self.clock()) if deadlines else None
        for fd, _ in self._ready(timeout):
            entry = self.handlers.get(fd)
            if entry is not None:  # an earlier handler of this turn may have unwatched it
                entry[1](fd)
        now = self.clock()
        for timer in self.timers:
            timer.tick(now)

    def _key(self, fileobj: object) -> int:
        """The descriptor fileobj is watched under. An object closed since (its fileno fails or
        is -1) is looked for by itself, as selectors looks for it; a descriptor is not."""
        try:
            fd = _fd(fileobj)
        except ValueError:
            fd = -1
        if fd < 0:
            for known, (watched, _) in self.handlers.items():
                if watched is fileobj:
                    return known
        elif fd in self.handlers:
            return fd
        raise KeyError(f"{fileobj!r} is not registered")

    def _ready(self, timeout: float | None) -> list[tuple[int, int]]:
        try:
            if _EPOLL:
                return self.poller.poll(-1 if timeout is None else timeout)
            return self.poller.poll(None if timeout is None else int(timeout * 1000 + 0.999))
        except InterruptedError:
            return []

    def close(self) -> None:
        if _EPOLL:
            self.poller.close()
