"""Agents started while the run goes on, for a spawned job's hosts that have none yet.

Starting and greeting a remote agent waits on its host (an SSH login, up to the greeting's
patience for a host that does not answer), and the controller's loop never waits on a peer: each
start runs in a thread of its own, and its results come back to the loop through a pipe the
loop's selector watches, where `done` is called with them, in the loop's own thread.
"""

from __future__ import annotations

import os
import selectors

from mpilaunch.transport.base import close_and_wait

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from mpilaunch.plan.build import JobPlan
    from mpilaunch.transport.base import HostResult

JOIN_LIMIT = 2.0  # seconds the end of the run waits for a start still under way


class AgentStarts:
    def __init__(
        self, sel: selectors.BaseSelector, start: Callable[[JobPlan, list[int]], dict[int, HostResult]]
    ) -> None:
        """start(job, hosts): greeted agents on these hosts, checked for job, or each one's
        error (it blocks)."""
        self.sel = sel
        self.start_hosts = start
        self.read_fd = self.write_fd = -1
        self.threads: list[threading.Thread] = []
        self.lock: threading.Lock | None = None  # made with the first start
        self.finished: list[tuple[Callable[[dict[int, HostResult]], None], dict[int, HostResult]]] = []
        self.closed = False  # the run ended: results that come later are sent away by their thread

    @property
    def pending(self) -> bool:
        return any(thread.is_alive() for thread in self.threads) or bool(self.finished)

    def start(self, hosts: list[int], job: JobPlan, done: Callable[[dict[int, HostResult]], None]) -> None:
        """Start agents on hosts off the loop; done(results) runs in the loop once they greeted."""
        import threading

        if self.read_fd < 0:
            self.lock = threading.Lock()
            self.read_fd, self.write_fd = os.pipe()
            os.set_blocking(self.read_fd, False)
            self.sel.register(self.read_fd, selectors.EVENT_READ, self.ready)

        def run() -> None:
            try:
                results = self.start_hosts(job, hosts)
            except Exception as exc:  # a transport that cannot even begin: every host's error
                from mpilaunch.transport.base import HostResult, TransportError

                results = {i: HostResult(i) for i in hosts}
                for result in results.values():
                    result.error = TransportError("agent", str(exc) or type(exc).__name__)
            with self.lock:
                if not self.closed:
                    self.finished.append((done, results))
                    os.write(self.write_fd, b"!")
                    return
            close_and_wait(r.link for r in results.values())  # the run ended meanwhile

        thread = threading.Thread(target=run, name="spawn-agents", daemon=True)
        self.threads.append(thread)
        thread.start()

    def ready(self, fd: int) -> None:
        """The loop's turn: hand each finished start's results to its done."""
        try:
            os.read(fd, 512)
        except BlockingIOError:
            pass
        with self.lock:
            finished, self.finished = self.finished, []
        for done, results in finished:
            done(results)

    def close(self) -> None:
        """The run ends: starts still under way get JOIN_LIMIT seconds, and the agents of every
        start not handed over are sent away (a late one's, once it is done, by its own thread)."""
        if self.read_fd < 0:
            return
        for thread in self.threads:
            thread.join(JOIN_LIMIT)
        with self.lock:
            self.closed = True
            finished, self.finished = self.finished, []
        close_and_wait(r.link for _done, results in finished for r in results.values())
        if self.read_fd >= 0:
            self.sel.unregister(self.read_fd)
            os.close(self.read_fd)
            os.close(self.write_fd)
            self.read_fd = self.write_fd = -1
