"""One run at a time in a log tree: two runs writing DIR/1/rank.N at once truncate and interleave
each other's files, and lines are lost without a word.

The run holds a lock on DIR/.mpilaunch.lock, whose lines name the holders (pid and job id) for the
run that is refused. The lock is an open file description's lock (F_OFD_SETLK) on a range of the
file's bytes, byte N standing for rank N: a run locks the whole file (every rank of every job),
while torchrun's launcher of one node (`--nnodes 2 --log-dir DIR`, DIR shared by the nodes) locks
only its own ranks, so the nodes of one job share DIR and two jobs still do not. The kernel drops
the lock with its holder, so a launcher killed with `kill -9` does not block the next run; the
file is removed by the last holder when its run ends.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.output.log_files import not_regular

LOCK_NAME = ".mpilaunch.lock"
_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)  # Linux's numbers, where Python does not name them
_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_FLOCK = "hhqqi4x"  # struct flock: type, whence, start, length (0: to the end), pid (0 for these locks)


class TreeLock:
    def __init__(self, base: str, job_id: str, ranks: tuple[int, int] | None = None) -> None:
        """Take DIR's lock, or refuse the run in one line naming DIR and the run that holds it.
        ranks: (first, count), the only ranks this launcher writes (one node's), else all."""
        start, length = self.ranks = ranks if ranks is not None else (0, 0)
        if not base:
            raise LaunchError("--output-filename: the directory name is empty")
        self.base = base
        self.fd = -1
        self.dir_fd = -1
        where = os.path.abspath(base)
        try:
            os.makedirs(base, exist_ok=True)
            self.dir_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            where = os.path.join(where, LOCK_NAME)
            while self.fd < 0:  # again if the holder removed the file between our open and our lock
                fd = self._open()
                try:
                    _lock(fd, _SETLK, fcntl.F_WRLCK, start, length)
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        os.close(fd)
                        raise
                    holder = _holder(fd, start, length)
                    os.close(fd)
                    raise LaunchError(
                        f"--output-filename {base}: {holder} is writing its rank output there; "
                        "two jobs in one log tree lose lines: wait for it to end, or give another directory"
                    ) from None
                if self._still_there(fd):
                    self.fd = fd
                else:
                    os.close(fd)
            if not length or _lock(self.fd, _GETLK, fcntl.F_WRLCK, 0, 0)[0] == fcntl.F_UNLCK:
                os.ftruncate(self.fd, 0)  # no other holder: their lines are gone
            mine = f"{os.getpid()} {job_id}" + (f" {start} {length}" if length else "")
            os.write(self.fd, f"{mine}\n".encode())  # appended: the file is opened O_APPEND
        except OSError as exc:
            self.release()
            why = "a symbolic link, not followed" if exc.errno == errno.ELOOP else exc.strerror
            raise LaunchError(f"--output-filename {base}: cannot write {where}: {why}") from None
        except BaseException:
            self.release()
            raise

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        fd = os.open(LOCK_NAME, flags, 0o644, dir_fd=self.dir_fd)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise not_regular(mode)
        return fd

    def _still_there(self, fd: int) -> bool:
        """The locked file is the one at LOCK_NAME (not one its last holder removed meanwhile)."""
        try:
            there = os.stat(LOCK_NAME, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self) -> None:
        """The run is over: its ranks are let go; the file goes if no other launcher holds a part
        of it (a lock on the whole file is had only then) and it is still the file at the name;
        then the lock (in this order, see _still_there)."""
        if self.fd >= 0:
            try:
                _lock(self.fd, _SETLK, fcntl.F_UNLCK, *self.ranks)
                _lock(self.fd, _SETLK, fcntl.F_WRLCK, 0, 0)
                if self._still_there(self.fd):
                    os.unlink(LOCK_NAME, dir_fd=self.dir_fd)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = -1
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def _lock(fd: int, command: int, kind: int, start: int, length: int) -> tuple[int, int, int]:
    """Take (F_OFD_SETLK) or look at (F_OFD_GETLK) a lock on bytes start..start+length-1 of the
    file: (type, start, length) of the lock found (F_UNLCK: none in the way)."""
    found = fcntl.fcntl(fd, command, struct.pack(_FLOCK, kind, os.SEEK_SET, start, length, 0))
    kind, _, start, length, _ = struct.unpack(_FLOCK, found)
    return kind, start, length


def _holder(fd: int, start: int, length: int) -> str:
    """The run whose lock is in the way, as it wrote itself into the file: `pid job` (the whole
    tree) or `pid job first count` (one node's ranks)."""
    try:
        _, start, length = _lock(fd, _GETLK, fcntl.F_WRLCK, start, length)
        lines = os.pread(fd, 1 << 16, 0).decode(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):  # the latest holder of that range
        words = line.split()
        if len(words) not in (2, 4) or not all(w.isdigit() for w in words[:1] + words[2:]):
            continue
        held = (int(words[2]), int(words[3])) if len(words) == 4 else (0, 0)
        if held == (start, length):
            return f"job {words[1]} (mpilaunch, pid {words[0]})"
    return "another job"
