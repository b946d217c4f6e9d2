"""Rank output: byte-exact log files and a console that only ever shows whole lines per rank."""

from __future__ import annotations

import errno
import os
import time

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.output.console_writer import ConsoleWriter
from mpilaunch.launcher.output.log_files import SameFiles, Use, empty, open_log, subdir, write_all
from mpilaunch.launcher.output.whole_lines import IDLE_FLUSH, MAX_PENDING, WholeLines
from mpilaunch.protocol.wire import STDERR, STDOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.launcher.output.pattern_files import PatternFiles
    from mpilaunch.launcher.output.treelock import TreeLock

__all__ = ["IDLE_FLUSH", "MAX_PENDING", "Console", "LogTree", "OutputSink", "rank_dir_name"]
TAIL_BYTES = 1 << 13  # stderr kept per rank for the failure summary
_STREAM_NAMES = {STDOUT: "stdout", STDERR: "stderr"}


def rank_dir_name(rank: int, np: int) -> str:
    """rank.N zero-padded to the digits of np, as Open MPI 4.1 names them."""
    return f"rank.{rank:0{len(str(np))}d}"


class LogTree:
    """DIR/JOB/rank.N/{stdout,stderr} (JOB is 1, then 2... for spawned jobs).

    DIR is the user's and may be a symbolic link; below it every name is built from numbers and
    created and opened relative to its parent's descriptor without following a symbolic link, so
    a link planted in a shared log directory cannot make the launcher write (or truncate) a file
    elsewhere."""

    def __init__(
        self,
        base: str,
        np: int,
        merge: bool,
        job: int = 1,
        first: int = 0,
        world: int = 0,
        same: SameFiles | None = None,
    ) -> None:
        """first, world: these np ranks are first..first+np-1 of a job of world ranks (one
        node's, torchrun's way); their directories carry those numbers. same: the run's files,
        which no file of the tree may be (a hard link planted in the tree, a pattern naming it)."""
        self.root = os.path.abspath(os.path.join(base, str(job)))
        self.np = np
        self.first, self.world = first, world or np
        self.fds: dict[tuple[int, int], int] = {}
        self.paths: dict[tuple[int, int], str] = {}
        self.failed: list[tuple[str, str]] = []  # (file, why) of writes that failed, each file once
        streams = (STDOUT,) if merge else (STDOUT, STDERR)
        same = same if same is not None else SameFiles(())
        where = os.path.abspath(base)
        held: list[int] = []
        try:
            if not base:
                raise LaunchError("--output-filename: the directory name is empty")
            os.makedirs(base, exist_ok=True)
            held.append(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            where = self.root
            held.append(subdir(held[0], str(int(job))))
            for rank in range(np):
                name = rank_dir_name(first + rank, self.world)
                where = os.path.join(self.root, name)
                rank_fd = subdir(held[1], name)
                try:
                    for stream in streams:
                        where = os.path.join(self.root, name, _STREAM_NAMES[stream])
                        self.fds[(rank, stream)] = open_log(_STREAM_NAMES[stream], rank_fd)
                        self.paths[(rank, stream)] = where
                        what = f"{where} of --output-filename {base}"
                        same.claim(self.fds[(rank, stream)], Use(f"--output-filename {base}", where, what))
                finally:
                    os.close(rank_fd)
            for fd in self.fds.values():  # every file is the tree's own: the old output goes
                empty(fd)
        except OSError as exc:
            self.close()
            why = "a symbolic link, not followed" if exc.errno == errno.ELOOP else exc.strerror
            raise LaunchError(f"--output-filename {base}: cannot write {where}: {why}") from None
        except BaseException:
            self.close()
            raise
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
            write_all(fd, data)
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
                rank_fd = subdir(root, rank_name)
            finally:
                os.close(root)
            try:
                fd = open_log(name, rank_fd)
            finally:
                os.close(rank_fd)
            try:
                empty(fd)
                write_all(fd, data)
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


class Console(WholeLines):
    """Copies rank output to the launcher's stdout/stderr in whole lines (`WholeLines`: a partial
    line waits up to IDLE_FLUSH seconds; two ranks' bytes never share a console line)."""

    def __init__(
        self,
        tag: bool,
        timestamp: bool,
        fds: dict[int, int] | None = None,
        writer: ConsoleWriter | None = None,
        rank_label: bool = False,
    ) -> None:
        super().__init__()
        self.tag = tag
        self.timestamp = timestamp
        self.rank_label = rank_label and not tag  # hydra's -l: "[rank] " ("[job:rank] " for spawned jobs)
        self.writer = writer if writer is not None else ConsoleWriter(fds)
        self.labels: dict[int, tuple[int, int]] = {}  # process id -> (job, rank) for tags
        self.host_tags: dict[int, str] = {}  # process id -> host name, for `allrun`
        self.line_labels: dict[tuple[int, int], bytes] = {}  # (process id, stream) -> torchrun's `[default0]:`

    def feed(self, rank: int, stream: int, data: bytes, now: float) -> None:  # type: ignore[override]
        """Show the whole lines of data (after what was pending), keep the partial one."""
        super().feed((rank, stream), data, now)

    def finish(self) -> None:
        self.flush_all()
        if self.open_line is not None:  # the launcher's own lines follow
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

    def _decorate(self, key: tuple[int, int], data: bytes | memoryview, continuing: bool) -> bytes | memoryview:
        if not (self.tag or self.timestamp or self.rank_label or key in self.line_labels):
            return data
        prefix = self._prefix(*key) + self.line_labels.get(key, b"")
        lines = bytes(data).splitlines(keepends=True)
        return b"".join(line if (continuing and i == 0) else prefix + line for i, line in enumerate(lines))

    def _emit(self, stream: int, data: bytes | memoryview) -> None:
        self.writer.write(stream, data)  # type: ignore[arg-type]  # queued: a console that does not read never stops the loop


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
        self.same = SameFiles()  # every file rank output goes to, by identity
        self.written_at: dict[int, float] = {}  # process id -> when it last wrote (the loop's clock)
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
            from mpilaunch.launcher.output.treelock import TreeLock  # a run with a log tree only

            share = (first, len(procs)) if world > len(procs) else None  # one node's ranks (torchrun's)
            self.lock = TreeLock(self.log_dir, self.owner, share)
        tree = LogTree(self.log_dir, len(procs), self.merged, job, first, world, self.same)
        self.trees[job] = tree
        return tree.root

    def write(self, proc: int, stream: int, data: bytes, now: float) -> None:
        self.written_at[proc] = now  # `mpilaunch top`: time since each rank's last output
        job, rank = self.where[proc]
        tree = self.trees.get(job)
        if tree is not None:
            tree.write(rank, stream, data)
            if tree.failed:  # a write failed (a full disk)
                self._say_failed(tree.failed)
        redirected = job == 1 and self.patterns is not None and self.patterns.write(rank, stream, data, now)
        if redirected:
            self._say_failed(self.patterns.failures())  # type: ignore[union-attr]
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
        if tree is not None:
            self._say_failed(tree.failed)
        return path or ""

    def _say_failed(self, failed: list[tuple[str, str]]) -> None:
        """Each (file, why) said once: the list is emptied."""
        for path, why in failed:
            self.say(f"mpilaunch: cannot write {path}: {why}; the rest of that output is not kept")
        failed.clear()

    def say(self, text: str) -> None:
        """A line of the launcher's own on stderr, in order with the rank output shown there."""
        self.writer.write(STDERR, (text + "\n").encode("utf-8", "surrogateescape"), notice=True)  # bytes as they came

    def last_lines(self, proc: int, count: int = 10) -> list[str]:
        text = bytes(self.tails.get(proc, b"")).decode("utf-8", "replace")
        return [line for line in text.splitlines() if line.strip()][-count:]

    def next_deadline(self) -> float | None:
        console = self.console.next_deadline() if self.console else None
        files = self.patterns.next_deadline() if self.patterns is not None else None
        return console if files is None else files if console is None else min(console, files)

    def flush_idle(self, now: float) -> None:
        if self.console:
            self.console.flush_idle(now)
        if self.patterns is not None:
            self.patterns.flush_idle(now)

    def rank_done(self, proc: int) -> None:
        if self.console:
            self.console.flush_rank(proc)
        job, rank = self.where.get(proc, (0, 0))
        if job == 1 and self.patterns is not None:
            self.patterns.rank_done(rank)

    def close(self) -> None:
        self._close_patterns()
        if self.console:
            self.console.finish()
        for tree in self.trees.values():
            tree.close()
        self.unlock()

    def _close_patterns(self) -> None:
        if self.patterns is not None:
            self._say_failed(self.patterns.close())  # after the partial lines it held
            self.patterns = None

    def unlock(self) -> None:
        """The run's files are free for another run (also on the way out of a run that failed):
        the log tree's lock, and the pattern files (and their locks) once their lines are out."""
        self._close_patterns()
        if self.lock is not None:
            self.lock.release()
            self.lock = None
