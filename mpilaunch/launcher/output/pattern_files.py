"""hydra's -outfile-pattern and -errfile-pattern: a stream of each rank of the launched job goes to
a file its pattern names instead of the console (the log tree, if any, still gets it).

Several streams may name one file (`out.%h`, one pattern for both streams, `./x` and `x`, a link):
as under hydra, the file keeps them all. It is opened once (one descriptor, one writer: this
process) and gets whole lines, each writer's partial line held as the console holds it; a file
written by one stream only gets its bytes as they come. A file another job is writing (its flock)
or that is a file of the log tree or the launcher's own stdout/stderr is refused before the job
starts, in one line.
"""

from __future__ import annotations

import fcntl
import os
import re

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.output.log_files import SameFiles, Use, empty, is_null, open_log, write_all
from mpilaunch.launcher.output.whole_lines import WholeLines
from mpilaunch.protocol.wire import STDERR, STDOUT

PATTERN_OPTIONS = {STDOUT: "-outfile-pattern", STDERR: "-errfile-pattern"}
_STREAM_NAMES = {STDOUT: "stdout", STDERR: "stderr"}


def expand_pattern(pattern: str, rank: int, host: str, job: int, proxy: int) -> str:
    """hydra's -outfile-pattern: %r the rank, %h its host, %g its job (0 for the launched one),
    %p its host's place among the job's hosts, %% a percent sign (any other % is kept)."""
    fields = {"r": str(rank), "h": host, "g": str(job - 1), "p": str(proxy), "%": "%"}
    return re.sub("%([rhgp%])", lambda found: fields[found.group(1)], pattern)


class _File(WholeLines):
    """One file of the patterns, with the (rank, stream) writers that share it."""

    def __init__(self, fd: int, path: str) -> None:
        super().__init__()
        self.fd = fd
        self.path = path
        self.writers: list[tuple[int, int]] = []
        self.failed = ""  # why a write failed: the file gets no more

    def write(self, key: tuple[int, int], data: bytes, now: float) -> None:
        if len(self.writers) > 1:
            self.feed(key, data, now)
        else:
            self._emit(key[1], data)

    def _emit(self, stream: int, data: bytes | memoryview) -> None:
        if self.failed:
            return
        try:
            write_all(self.fd, data)
        except OSError as exc:  # a full disk: said once, the rest of this file's output is lost
            self.failed = exc.strerror or str(exc)


class PatternFiles:
    def __init__(self, patterns: dict[int, str], places: list[tuple[str, int]], same: SameFiles) -> None:
        """patterns: stream -> pattern; places: (host name, host's place) of each rank; same: the
        run's files, which these must not be."""
        self.files: dict[tuple[int, int], _File] = {}  # (rank, stream) -> its file
        self.said: set[str] = set()  # files whose failure was said
        by_identity: dict[tuple[int, int], _File] = {}
        try:
            for stream, pattern in patterns.items():
                option = f"{PATTERN_OPTIONS[stream]} {pattern}"
                for rank, (host, proxy) in enumerate(places):
                    path = expand_pattern(pattern, rank, host, 1, proxy)
                    key = (rank, stream)
                    try:
                        fd = open_log(path)
                    except OSError as exc:
                        raise LaunchError(f"{option}: cannot write {path}: {exc.strerror}") from None
                    found = os.fstat(fd)
                    shared = by_identity.get((found.st_dev, found.st_ino))
                    if shared is not None:
                        os.close(fd)
                    else:
                        shared = by_identity[(found.st_dev, found.st_ino)] = _File(fd, path)
                        what = f"rank {rank}'s {_STREAM_NAMES[stream]} file of {option}"
                        same.claim(fd, Use(option, path, what, pattern=True))
                        if not is_null(found):
                            _lock(fd, option, path)
                    shared.writers.append(key)
                    self.files[key] = shared
        except BaseException:
            for file in by_identity.values():
                os.close(file.fd)
            self.files.clear()
            raise

    def start(self) -> None:
        """Every file of the job is its own: empty them."""
        for file in self.distinct():
            empty(file.fd)

    def distinct(self) -> list[_File]:
        return list({id(file): file for file in self.files.values()}.values())

    def write(self, rank: int, stream: int, data: bytes, now: float) -> bool:
        """Write to the rank's file for this stream: False if it has none (the console has it)."""
        file = self.files.get((rank, stream))
        if file is None:
            return False
        file.write((rank, stream), data, now)
        return True

    def failures(self) -> list[tuple[str, str]]:
        """(file, why) of files that could not be written, each once."""
        new = [(f.path, f.failed) for f in self.distinct() if f.failed and f.path not in self.said]
        self.said.update(path for path, _ in new)
        return new

    def next_deadline(self) -> float | None:
        times = [t for t in (f.next_deadline() for f in self.distinct()) if t is not None]
        return min(times) if times else None

    def flush_idle(self, now: float) -> None:
        for file in self.distinct():
            file.flush_idle(now)

    def rank_done(self, rank: int) -> None:
        for stream in (STDOUT, STDERR):
            file = self.files.get((rank, stream))
            if file is not None:
                file.flush((rank, stream))

    def close(self) -> list[tuple[str, str]]:
        """Every partial line held is written, then the files are closed: the failures not said yet."""
        files = self.distinct()
        for file in files:
            file.flush_all()
        failed = self.failures()
        for file in files:
            os.close(file.fd)
        self.files.clear()
        return failed


def _lock(fd: int, option: str, path: str) -> None:
    """One job at a time writes a pattern file: another's lines would be cut and overwritten."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(os.fstat(fd))
        raise LaunchError(
            f"{option}: {path} is being written by {holder}; two jobs in one file lose lines: "
            "wait for it to end, or name another file"
        ) from None


def _holder(found: os.stat_result) -> str:
    """The process that holds a file's flock, as /proc/locks names it."""
    device = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                words = line.split()
                if len(words) > 5 and words[1] == "FLOCK" and words[5] == device and words[4].isdigit():
                    return f"another job (pid {words[4]})"
    except OSError:
        pass
    return "another job"
