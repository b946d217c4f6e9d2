"""Rank output: byte-exact log files and a console that only ever shows whole lines per rank."""

from __future__ import annotations

import errno
import os
import stat
import time

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.console_writer import ConsoleWriter
from mpilaunch.protocol.wire import STDERR, STDOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.launcher.treelock import TreeLock

IDLE_FLUSH = 0.25  # seconds a partial line waits before it is shown anyway
MAX_PENDING = 1 << 16  # a longer partial line is shown at once
TAIL_BYTES = 1 << 13  # stderr kept per rank for the failure summary
_STREAM_NAMES = {STDOUT: "stdout", STDERR: "stderr"}


def rank_dir_name(rank: int, np: int) -> str:
    """rank.N zero-padded to the digits of np, as Open MPI 4.1 names them."""
    return f"rank.{rank:0{len(str(np))}d}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class LogTree:
    """DIR/JOB/rank.N/{stdout,stderr} (JOB is 1, then 2... for spawned jobs).

    DIR is the user's and may be a symbolic link; below it every name is built from numbers and
    created and opened relative to its parent's descriptor without following a symbolic link, so
    a link planted in a shared log directory cannot make the launcher write (or truncate) a file
    elsewhere."""

    def __init__(self, base: str, np: int, merge: bool, job: int = 1, first: int = 0, world: int = 0) -> None:
        """first, world: these np ranks are first..first+np-1 of a job of world ranks (one
        node's, torchrun's way); their directories carry those numbers."""
        self.root = os.path.abspath(os.path.join(base, str(job)))
        self.np = np
        self.first, self.world = first, world or np
        self.fds: dict[tuple[int, int], int] = {}
        self.paths: dict[tuple[int, int], str] = {}
        self.failed: list[tuple[str, str]] = []  # (file, why) of writes that failed, each file once
        streams = (STDOUT,) if merge else (STDOUT, STDERR)
        where = os.path.abspath(base)
        held: list[int] = []
        try:
            if not base:
                raise LaunchError("--output-filename: the directory name is empty")
            os.makedirs(base, exist_ok=True)
            held.append(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            where = self.root
            held.append(_subdir(held[0], str(int(job))))
            for rank in range(np):
                name = rank_dir_name(first + rank, self.world)
                where = os.path.join(self.root, name)
                rank_fd = _subdir(held[1], name)
                try:
                    for stream in streams:
                        where = os.path.join(self.root, name, _STREAM_NAMES[stream])
                        self.fds[(rank, stream)] = _open_log(_STREAM_NAMES[stream], rank_fd)
                        self.paths[(rank, stream)] = where
                finally:
                    os.close(rank_fd)
        except OSError as exc:
            self.close()
            why = "a symbolic link, not followed" if exc.errno == errno.ELOOP else exc.strerror
            raise LaunchError(f"--output-filename {base}: cannot write {where}: {why}") from None
        finally:
            for fd in held:
                os.close(fd)

    def write(self, rank: int, stream: int, data: bytes) -> None:
        """Append to the rank's file. A write that fails (a full disk) is not the job's failure:
        the file is closed and named in `failed`, the console still shows the output."""
        key = (rank, stream) if (rank, stream) in self.fds else (rank, STDOUT)
        fd = self.fds.get(key)
        if fd is None:  # its file failed before
            return
        try:
            _write_all(fd, data)
        except OSError as exc:
            os.close(self.fds.pop(key))
            self.failed.append((self.paths[key], exc.strerror or str(exc)))

    def keep(self, rank: int, name: str, data: bytes) -> str | None:
        """A file of the rank's beside its output (its error file): its path, or None if it
        could not be written (said in `failed`)."""
        rank_name = rank_dir_name(self.first + rank, self.world)
        path = os.path.join(self.root, rank_name, name)
        try:
            root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                rank_fd = _subdir(root, rank_name)
            finally:
                os.close(root)
            try:
                fd = _open_log(name, rank_fd)
            finally:
                os.close(rank_fd)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            self.failed.append((path, exc.strerror or str(exc)))
            return None
        return path

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _not_regular(mode: int) -> OSError:
    from mpilaunch.host.files import kind_of  # only for a log file refused

    return OSError(errno.EINVAL, f"{kind_of(mode)}, not a regular file")


def _is_null(found: os.stat_result) -> bool:
    """The null device (under any name): the one special file output may be sent to."""
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(found.st_mode) and found.st_rdev == null.st_rdev


def _open_log(name: str, parent: int | None = None) -> int:
    """Create or truncate a regular log file, never waiting: a FIFO planted there would block
    the open (or the writes) for ever, a device would take the output somewhere else, so
    anything but a regular file is refused. In `parent` (the log tree): a link is not followed
    either; a path of the user's own (hydra's -outfile-pattern) may be one."""
    follow = parent is None
    try:
        found = os.stat(name, dir_fd=parent, follow_symlinks=follow)
    except FileNotFoundError:
        found = None
    null = follow and found is not None and _is_null(found)  # hydra's -outfile-pattern /dev/null: thrown away
    if found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISLNK(found.st_mode) and not null:
        raise _not_regular(found.st_mode)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(name, flags, 0o644, dir_fd=parent)
    try:
        opened = os.fstat(fd)
        if null and _is_null(opened):
            return fd
        if not stat.S_ISREG(opened.st_mode):  # put there since it was looked at
            raise _not_regular(opened.st_mode)
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd


def _subdir(parent: int, name: str) -> int:
    """Create (if needed) and open directory `name` in `parent`, refusing a symbolic link."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except NotADirectoryError:  # also what a symbolic link gives here: say which
        if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP)) from None
        raise


def expand_pattern(pattern: str, rank: int, host: str, job: int, proxy: int) -> str:
    """hydra's -outfile-pattern: %r the rank, %h its host, %g its job (0 for the launched one),
    %p its host's place among the job's hosts, %% a percent sign."""
    out, at = [], 0
    while at < len(pattern):
        char = pattern[at]
        if char == "%" and at + 1 < len(pattern):
            code = pattern[at + 1]
            fields = {"r": str(rank), "h": host, "g": str(job - 1), "p": str(proxy), "%": "%"}
            if code in fields:
                out.append(fields[code])
                at += 2
                continue
        out.append(char)
        at += 1
    return "".join(out)


PATTERN_OPTIONS = {STDOUT: "-outfile-pattern", STDERR: "-errfile-pattern"}


class PatternFiles:
    """hydra's -outfile-pattern and -errfile-pattern: a stream of each rank of the launched job
    goes to its own file instead of the console (the log tree, if any, still gets it)."""

    def __init__(self, patterns: dict[int, str], places: list[tuple[str, int]]) -> None:
        """patterns: stream -> pattern; places: (host name, host's place) of each rank."""
        self.fds: dict[tuple[int, int], int] = {}
        self.paths: dict[tuple[int, int], str] = {}
        try:
            for stream, pattern in patterns.items():
                for rank, (host, proxy) in enumerate(places):
                    path = expand_pattern(pattern, rank, host, 1, proxy)
                    fd = self.fds.get((rank, STDOUT)) if stream == STDERR and self._same(rank, path) else None
                    self.fds[(rank, stream)] = fd if fd is not None else _open_log(path)
                    self.paths[(rank, stream)] = path
        except OSError as exc:
            self.close()
            option = PATTERN_OPTIONS[stream]
            raise LaunchError(f"{option} {pattern}: cannot write {path}: {exc.strerror}") from None

    def _same(self, rank: int, path: str) -> bool:
        return self.paths.get((rank, STDOUT)) == path

    def write(self, rank: int, stream: int, data: bytes) -> bool:
        """Write to the rank's file for this stream: False if it has none (the console has it)."""
        fd = self.fds.get((rank, stream))
        if fd is None:
            return False
        try:
            _write_all(fd, data)
        except OSError:
            pass  # a full disk: what does not fit is lost from this file, as hydra loses it
        return True

    def close(self) -> None:
        for fd in set(self.fds.values()):
            os.close(fd)
        self.fds.clear()


class Console:
    """Copies rank output to the launcher's stdout/stderr in whole lines.

    A partial line is held until its newline comes or it has been idle IDLE_FLUSH seconds;
    when another rank's line must be shown after a flushed partial line, a newline is put
    in first, so two ranks' bytes never share a console line.
    """

    def __init__(
        self,
        tag: bool,
        timestamp: bool,
        fds: dict[int, int] | None = None,
        writer: ConsoleWriter | None = None,
        rank_label: bool = False,
    ) -> None:
        self.tag = tag
        self.timestamp = timestamp
        self.rank_label = rank_label and not tag  # hydra's -l: "[rank] " ("[job:rank] " for spawned jobs)
        self.writer = writer if writer is not None else ConsoleWriter(fds)
        self.pending: dict[tuple[int, int], bytearray] = {}
        self.since: dict[tuple[int, int], float] = {}
        self.open_line: tuple[int, int] | None = None  # whose partial line the console ends with
        self.labels: dict[int, tuple[int, int]] = {}  # process id -> (job, rank) for tags
        self.host_tags: dict[int, str] = {}  # process id -> host name, for `allrun`
        self.line_labels: dict[tuple[int, int], bytes] = {}  # (process id, stream) -> torchrun's `[default0]:`

    def feed(self, rank: int, stream: int, data: bytes, now: float) -> None:
        """Show the whole lines of data (after what was pending), keep the partial one. The
        lines go out as a view of the chunk, not a copy: this runs once per chunk of output."""
        key = (rank, stream)
        pending = self.pending.pop(key, None)
        if pending:
            pending += data
            data = pending  # type: ignore[assignment]
        cut = data.rfind(b"\n") + 1
        if len(data) - cut >= MAX_PENDING:  # a partial line this long is shown at once
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

    def flush(self, key: tuple[int, int]) -> None:
        buf = self.pending.get(key)
        self.since.pop(key, None)
        if buf:
            data = bytes(buf)
            buf.clear()
            self._show(key, data)

    def flush_rank(self, rank: int) -> None:
        for stream in (STDOUT, STDERR):
            self.flush((rank, stream))

    def finish(self) -> None:
        for key in list(self.pending):
            self.flush(key)
        if self.open_line is not None:
            self._emit(self.open_line[1], b"\n")
            self.open_line = None

    def _prefix(self, proc: int, stream: int) -> bytes:
        parts = []
        if self.timestamp:
            parts.append(time.strftime("%a %b %e %H:%M:%S %Y"))
        if self.tag and proc in self.host_tags:
            parts.append(f"[{self.host_tags[proc]}]<{_STREAM_NAMES[stream]}>:")
        elif self.tag:
            job, rank = self.labels.get(proc, (1, proc))
            parts.append(f"[{job},{rank}]<{_STREAM_NAMES[stream]}>:")
        elif self.rank_label:
            job, rank = self.labels.get(proc, (1, proc))
            parts.append(f"[{rank}] " if job == 1 else f"[{job}:{rank}] ")
        elif self.timestamp:
            parts.append(f"<{_STREAM_NAMES[stream]}>:")
        return "".join(parts).encode("utf-8", "surrogateescape")

    def _show(self, key: tuple[int, int], data: bytes) -> None:
        continuing = self.open_line == key
        if self.open_line is not None and not continuing:
            self._emit(self.open_line[1], b"\n")
        if self.tag or self.timestamp or self.rank_label or key in self.line_labels:
            prefix = self._prefix(*key) + self.line_labels.get(key, b"")
            lines = bytes(data).splitlines(keepends=True)
            data = b"".join(line if (continuing and i == 0) else prefix + line for i, line in enumerate(lines))
        self._emit(key[1], data)
        self.open_line = None if data[-1] == 0x0A else key

    def _emit(self, stream: int, data: bytes) -> None:
        self.writer.write(stream, data)  # queued: a console that does not read never stops the loop


class OutputSink:
    """Everything a rank writes: to its log files, to the console, and a stderr tail for reports.

    Ranks are known by process id (unique over all jobs of the run); add_job says which job
    and rank each id is.
    """

    def __init__(self, console: Console | None, log_dir: str | None, merged: bool, owner: str = "") -> None:
        """owner: the run's job id, which the log tree's lock names to a run it refuses."""
        self.console = console
        self.owner = owner
        self.lock: TreeLock | None = None
        self.writer = console.writer if console is not None else ConsoleWriter()  # the launcher's own lines
        self.writer.logs = log_dir is not None
        self.log_dir = log_dir
        self.merged = merged
        self.trees: dict[int, LogTree] = {}
        self.where: dict[int, tuple[int, int]] = {}
        self.tails: dict[int, bytearray] = {}
        self.patterns: PatternFiles | None = None  # hydra's -outfile-pattern/-errfile-pattern (job 1)
        self.off_console: set[tuple[int, int]] = set()  # (rank, stream) of job 1 kept in files only (torchrun's)

    def add_job(self, job: int, procs: list[int], first: int = 0, world: int = 0) -> str | None:
        """Register a job's process ids (rank order); returns its log directory, if any.
        first, world: one node's ranks of a larger job (torchrun's way), named by their
        job-wide numbers on the console and in the log tree."""
        for rank, proc in enumerate(procs):
            self.where[proc] = (job, rank)
            if self.console is not None:
                self.console.labels[proc] = (job, first + rank)
        if self.log_dir is None:
            return None
        if self.lock is None:  # before any file of the tree is opened (and truncated)
            from mpilaunch.launcher.treelock import TreeLock  # a run with a log tree only

            self.lock = TreeLock(self.log_dir, self.owner)
        tree = LogTree(self.log_dir, len(procs), self.merged, job, first, world)
        self.trees[job] = tree
        return tree.root

    def write(self, proc: int, stream: int, data: bytes, now: float) -> None:
        job, rank = self.where[proc]
        tree = self.trees.get(job)
        if tree is not None:
            tree.write(rank, stream, data)
            if tree.failed:
                for path, why in tree.failed:
                    self.say(f"mpilaunch: cannot write {path}: {why}; the rest of that output is not kept")
                tree.failed.clear()
        redirected = job == 1 and self.patterns is not None and self.patterns.write(rank, stream, data)
        if self.console is not None and not redirected and (job != 1 or (rank, stream) not in self.off_console):
            self.console.feed(proc, stream, data, now)
        if stream == STDERR or self.merged:
            tail = self.tails.setdefault(proc, bytearray())
            tail += data
            if len(tail) > TAIL_BYTES:
                del tail[: len(tail) - TAIL_BYTES]

    def keep_error(self, proc: int, text: str) -> str:
        """A failed rank's error file (torch's @record), kept in its log directory as error.json
        (the agent's copy goes with the agent): its path there, or "" with no log tree."""
        return self.keep(proc, "error.json", text.encode("utf-8", "surrogateescape"))

    def keep(self, proc: int, name: str, data: bytes) -> str:
        """A file of the rank's beside its output (error.json, stack.K): its path, or "" with no
        log tree (or when it could not be written: said once)."""
        job, rank = self.where[proc]
        tree = self.trees.get(job)
        path = tree.keep(rank, name, data) if tree else None
        if tree is not None and tree.failed:
            for failed, why in tree.failed:
                self.say(f"mpilaunch: cannot write {failed}: {why}; the rest of that output is not kept")
            tree.failed.clear()
        return path or ""

    def say(self, text: str) -> None:
        """A line of the launcher's own on stderr, in order with the rank output shown there."""
        self.writer.write(STDERR, (text + "\n").encode("utf-8", "surrogateescape"), notice=True)  # bytes as they came

    def last_lines(self, proc: int, count: int = 10) -> list[str]:
        text = bytes(self.tails.get(proc, b"")).decode("utf-8", "replace")
        return [line for line in text.splitlines() if line.strip()][-count:]

    def next_deadline(self) -> float | None:
        return self.console.next_deadline() if self.console else None

    def flush_idle(self, now: float) -> None:
        if self.console:
            self.console.flush_idle(now)

    def rank_done(self, proc: int) -> None:
        if self.console:
            self.console.flush_rank(proc)

    def close(self) -> None:
        if self.console:
            self.console.finish()
        for tree in self.trees.values():
            tree.close()
        if self.patterns is not None:
            self.patterns.close()
        self.unlock()

    def unlock(self) -> None:
        """The log tree is free for another run (also on the way out of a run that failed)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
