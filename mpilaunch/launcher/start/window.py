"""Which remote hosts' connections are opened next: a window of hosts in flight, the next opened
as soon as an earlier one greets or fails (Open MPI's plm_rsh_num_concurrent; hydra waits).

Each host's patience counts from its own start, so a busy machine starting hundreds of hosts is
slow, not failed; and a slow host holds only its own place in the window, never a whole batch.
A host whose connection its sshd dropped before the banner (MaxStartups under a burst of logins)
goes back to the front of the queue, to be opened again after a short wait. Pure: the caller
says what happened and when.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class StartWindow:
    """The queue of hosts not yet opened, the ones in flight, and each host's tries."""

    def __init__(self, order: Iterable[int], size: int | None, retries: int) -> None:
        self.queue: deque[int] = deque(order)
        self.size = size or len(self.queue) or 1  # None: every host at once
        self.retries = retries
        self.in_flight: set[int] = set()
        self.tries: dict[int, int] = {}
        self.not_before: dict[int, float] = {}  # a host started again waits until then

    @property
    def finished(self) -> bool:
        return not self.queue and not self.in_flight

    def take(self, now: float, least: int = 1) -> list[int]:
        """The hosts to open now: as many as the window has room for, in queue order, skipping
        none (a host waiting to be tried again holds back the ones behind it only while the
        window is full anyway: it is at the front, and only its own wait is ahead). Nothing
        while fewer than least places are free and more hosts than that wait (a transport
        whose start waits for its connections opens them a few at a time, not one by one)."""
        taken: list[int] = []
        if self.size - len(self.in_flight) < min(least, len(self.queue)):
            return taken
        while self.queue and len(self.in_flight) < self.size:
            index = self.queue[0]
            if self.not_before.get(index, 0.0) > now:
                break
            self.queue.popleft()
            self.in_flight.add(index)
            self.tries[index] = self.tries.get(index, 0) + 1
            taken.append(index)
        return taken

    def greeted(self, index: int) -> None:
        """The host answered (or it was given up for good): its place is free."""
        self.in_flight.discard(index)

    def failed(self, index: int, retryable: bool, now: float, wait: float) -> bool:
        """The host's start failed; True when it is to be opened again (after wait seconds),
        False when its failure is its result."""
        self.in_flight.discard(index)
        if not retryable or self.tries.get(index, 0) > self.retries:
            return False
        self.queue.appendleft(index)
        self.not_before[index] = now + wait
        return True

    def next_wake(self, now: float) -> float | None:
        """Seconds until a waiting host may be opened, when that is what the window waits for."""
        if not self.queue or len(self.in_flight) >= self.size:
            return None
        return max(0.0, self.not_before.get(self.queue[0], 0.0) - now)
