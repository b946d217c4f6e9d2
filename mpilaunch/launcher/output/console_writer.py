"""The console, written from threads of its own: the controller's loop never waits for it.

A console that stops reading (`mpilaunch ... | less`, left paused; a full pipe; a terminal held
with Ctrl-S) would block a write, and with it the loop that acts on failures, signals and
timeouts. So the loop only queues what the console should show; a thread per destination
writes it. A console that is slower than the ranks but reading slows them down, as it would
without a launcher between: while a destination is more than BACKLOG_LIMIT bytes behind and
took something in the last STALL seconds, the controller stops reading its links (the ranks'
pipes fill), and signals and timers are served as ever. One that took nothing for STALL seconds
is stalled: rank output for it is dropped until it has caught up, said once on stderr (the
log files keep every byte), and the links are read again. stdout and stderr that are one file
(a terminal, `2>&1`) share one queue, so their lines stay in the order they were shown.

`threading` is imported with the first line shown: a job whose ranks print nothing skips it.
Where the host's limit on processes (`ulimit -u`, which counts threads) leaves no thread for a
destination, the lines for it are written as they come, by the caller: slower, nothing lost.
"""

from __future__ import annotations

import errno
import os
import time

from mpilaunch.launcher.output.log_files import write_all
from mpilaunch.protocol.wire import STDERR, STDOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections import deque

BACKLOG_LIMIT = 4 << 20  # bytes a destination may be behind before the links wait for it
STALL = 1.0  # seconds without taking anything, while behind, after which a destination is stalled
HARD_LIMIT = 4 * BACKLOG_LIMIT  # never more queued for one destination than this
PIECE = 1 << 16  # bytes per write: progress is seen at least this often
GONE = (errno.EPIPE, errno.EBADF, errno.EIO)  # the reader left: nothing more can be shown there


def _destination(fd: int) -> tuple[int, int] | int:
    """What fd writes to (device and inode), so that two descriptors of one file share a queue."""
    try:
        st = os.fstat(fd)
    except OSError:
        return fd
    return (st.st_dev, st.st_ino)


class _Queue:
    """One destination's backlog and the thread that writes it."""

    def __init__(self, lock: threading.Condition) -> None:
        from collections import deque

        self.chunks: deque[tuple[int, bytes]] = deque()
        self.size = 0
        self.refusing = False  # stalled: rank output for it is dropped until it has caught up
        self.cut = False  # something was dropped since the last byte taken: a line may be cut short
        self.line_open = False  # the last byte queued was not a newline
        self.gone = False
        self.inline = False  # no thread could be started for it (ulimit -u): written by the caller
        self.progress = 0.0  # when it last took bytes (or got some to take after having none)
        self.lock = lock

    def stalled(self, limit: int, now: float) -> bool:
        return self.size > limit and now - self.progress >= STALL


class ConsoleWriter:
    def __init__(self, fds: dict[int, int] | None = None, limit: int = BACKLOG_LIMIT, logs: bool = False) -> None:
        self.fds = fds if fds is not None else {STDOUT: 1, STDERR: 2}
        self.limit = limit
        self.logs = logs  # the log files have what the console drops (said in the notice)
        self.dropped = 0
        self.lock: threading.Condition | None = None
        self.queues: dict[tuple[int, int] | int, _Queue] = {}

    # -- the loop's side ----------------------------------------------------------------------
    def write(self, stream: int, data: bytes, notice: bool = False) -> None:
        """Queue data for STDOUT or STDERR; never blocks (but where no thread could be started for
        the destination: written here, at once). notice: the launcher's own line, queued
        even when the destination is behind (one line, where rank output is dropped)."""
        if not data:
            return
        fd = self.fds[stream]
        queue = self._queue(fd)
        assert self.lock is not None
        with self.lock:
            if queue.gone:
                return
            now = time.monotonic()
            if not notice and (queue.refusing or queue.size > HARD_LIMIT or queue.stalled(self.limit, now)):
                queue.refusing = queue.cut = True
                first = self.dropped == 0
                self.dropped += len(data)
                if not first:
                    return
                data, fd, notice = self._notice(), self.fds[STDERR], True
                queue = self._queue_locked(fd)
                if queue.gone:
                    return
            if queue.line_open and (notice or queue.cut):  # never glued to a line cut short, or to a rank's
                data = b"\n" + bytes(data)
            if not notice:
                queue.cut = False
            queue.line_open = not bytes(data[-1:]) == b"\n"
            if queue.inline:
                direct = bytes(data)
            else:
                if not queue.chunks:
                    queue.progress = now  # the clock of a stall starts when there is something to take
                queue.chunks.append((fd, bytes(data)))
                queue.size += len(data)
                self.lock.notify_all()
                return
        self._write_now(queue, fd, direct)

    def _notice(self) -> bytes:
        kept = "the log files keep every byte" if self.logs else "use --output-filename DIR to keep it in files"
        return (
            f"mpilaunch: the console is not reading: rank output is dropped from it while it is more than "
            f"{self.limit >> 20} MiB behind ({kept})\n"
        ).encode()

    def holding_back(self) -> bool:
        """Some destination is behind but still taking output: the links should wait for it."""
        if self.lock is None:
            return False
        now = time.monotonic()
        with self.lock:
            return any(
                q.size > self.limit and not q.refusing and not q.gone and not q.stalled(self.limit, now)
                for q in self.queues.values()
            )

    def wait_drained(self, timeout: float) -> bool:
        """Wait up to timeout seconds for every queue to be written out; True when it is."""
        if self.lock is None:
            return True
        with self.lock:
            return self.lock.wait_for(lambda: all(q.gone or (not q.size) for q in self.queues.values()), timeout)

    # -- the writers' side --------------------------------------------------------------------
    def _queue(self, fd: int) -> _Queue:
        if self.lock is None:
            import threading

            self.lock = threading.Condition()
        with self.lock:
            return self._queue_locked(fd)

    def _queue_locked(self, fd: int) -> _Queue:
        where = _destination(fd)
        queue = self.queues.get(where)
        if queue is None:
            import threading

            assert self.lock is not None
            queue = self.queues[where] = _Queue(self.lock)
            try:
                threading.Thread(target=self._drain, args=(queue,), name=f"console-{fd}", daemon=True).start()
            except RuntimeError:  # this host's limit on processes (threads count): written as it comes
                queue.inline = True
        return queue

    def _write_now(self, queue: _Queue, fd: int, data: bytes) -> None:
        """Write to a destination that has no thread, here and whole (a console that does not
        read holds the caller, as it holds ranks that write to it themselves)."""
        try:
            write_all(fd, data)
        except OSError as exc:
            self._lost(queue, fd, exc)

    def _lost(self, queue: _Queue, fd: int, exc: OSError) -> None:
        """Nothing more is shown at this destination; the log files get everything."""
        lock = queue.lock
        with lock:
            queue.gone = True
            queue.chunks.clear()
            queue.size = 0
            lock.notify_all()
        if exc.errno not in GONE:  # not a reader that left: say why it stopped (a full disk)
            name = "stdout" if fd == self.fds[STDOUT] else "stderr"
            self.write(STDERR, f"mpilaunch: cannot write to {name}: {exc.strerror}\n".encode(), notice=True)

    def _drain(self, queue: _Queue) -> None:
        lock = queue.lock
        while True:
            with lock:
                lock.wait_for(lambda: bool(queue.chunks))
                fd, data = queue.chunks[0]
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view[:PIECE]) :]
                    queue.progress = time.monotonic()  # a float store: no lock needed
            except OSError as exc:
                self._lost(queue, fd, exc)
                return
            with lock:
                queue.chunks.popleft()
                queue.size -= len(data)
                if not queue.chunks:
                    queue.refusing = False  # caught up: show rank output again
                lock.notify_all()
