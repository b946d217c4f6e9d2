"""Output held back to whole lines per writer: the rule of the console, and of a file that several
ranks' streams share (hydra's -outfile-pattern without %r), so two writers' bytes never share a line."""

from __future__ import annotations

from mpilaunch.protocol.wire import STDERR, STDOUT

IDLE_FLUSH = 0.25  # seconds a partial line waits before it is shown anyway
MAX_PENDING = 1 << 16  # a longer partial line is shown at once

Key = tuple[int, int]  # (process id or rank, stream)


class WholeLines:
    """Each writer's whole lines go out as they come; its partial line is held until its newline
    comes or it has been idle IDLE_FLUSH seconds (or MAX_PENDING long). When another writer's
    line must go out after a partial line that was let go, a newline is put in first."""

    def __init__(self) -> None:
        self.pending: dict[Key, bytearray] = {}
        self.since: dict[Key, float] = {}
        self.open_line: Key | None = None  # whose partial line the output ends with

    def feed(self, key: Key, data: bytes, now: float) -> None:
        """Let the whole lines of data (after what was pending) go, keep the partial one. The
        lines go out as a view of the chunk, not a copy: this runs once per chunk of output."""
        pending = self.pending.pop(key, None)
        if pending:
            pending += data
            data = pending  # type: ignore[assignment]
        cut = data.rfind(b"\n") + 1
        if len(data) - cut >= MAX_PENDING:  # a partial line this long goes at once
            cut = len(data)
        if cut:
            self._show(key, data if cut == len(data) else memoryview(data)[:cut])
            self.since.pop(key, None)
        if cut == len(data):
            return
        self.pending[key] = bytearray(data[cut:])
        self.since.setdefault(key, now)

    def next_deadline(self) -> float | None:
        return min(self.since.values()) + IDLE_FLUSH if self.since else None

    def flush_idle(self, now: float) -> None:
        for key, started in list(self.since.items()):
            if now - started >= IDLE_FLUSH:
                self.flush(key)

    def flush(self, key: Key) -> None:
        buf = self.pending.get(key)
        self.since.pop(key, None)
        if buf:
            data = bytes(buf)
            buf.clear()
            self._show(key, data)

    def flush_rank(self, rank: int, streams: tuple[int, ...] = (STDOUT, STDERR)) -> None:
        for stream in streams:
            self.flush((rank, stream))

    def flush_all(self) -> None:
        for key in list(self.pending):
            self.flush(key)

    def _show(self, key: Key, data: bytes | memoryview) -> None:
        continuing = self.open_line == key
        if self.open_line is not None and not continuing:
            self._emit(self.open_line[1], b"\n")
        out = self._decorate(key, data, continuing)
        self._emit(key[1], out)
        self.open_line = None if out[-1] == 0x0A else key

    def _decorate(self, key: Key, data: bytes | memoryview, continuing: bool) -> bytes | memoryview:
        """The lines as they go out (the console puts its tags before each)."""
        return data

    def _emit(self, stream: int, data: bytes | memoryview) -> None:
        raise NotImplementedError
