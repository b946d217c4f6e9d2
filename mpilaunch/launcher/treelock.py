"""One run at a time in a log tree: two runs writing DIR/1/rank.N at once truncate and interleave
each other's files, and lines are lost without a word.

The run holds an flock on DIR/.mpilaunch.lock, which names it (pid and job id) for the run that
is refused. The kernel drops the lock with its holder, so a launcher killed with `kill -9` does
not block the next run; the file is removed when the run ends.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from mpilaunch.errors import LaunchError
from mpilaunch.host.files import kind_of

LOCK_NAME = ".mpilaunch.lock"


class TreeLock:
    def __init__(self, base: str, job_id: str) -> None:
        """Take DIR's lock, or refuse the run in one line naming DIR and the run that holds it."""
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
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _holder(fd)
                    os.close(fd)
                    raise LaunchError(
                        f"--output-filename {base}: {holder} is writing its rank output there; "
                        "two jobs in one log tree lose lines: wait for it to end, or give another directory"
                    ) from None
                if self._still_there(fd):
                    self.fd = fd
                else:
                    os.close(fd)
            os.ftruncate(self.fd, 0)
            os.write(self.fd, f"{os.getpid()} {job_id}\n".encode())
        except OSError as exc:
            self.release()
            why = "a symbolic link, not followed" if exc.errno == errno.ELOOP else exc.strerror
            raise LaunchError(f"--output-filename {base}: cannot write {where}: {why}") from None
        except BaseException:
            self.release()
            raise

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        fd = os.open(LOCK_NAME, flags, 0o644, dir_fd=self.dir_fd)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{kind_of(mode)}, not a regular file")
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
        """The run is over: the file goes, then the lock (in this order, see _still_there)."""
        if self.fd >= 0:
            try:
                os.unlink(LOCK_NAME, dir_fd=self.dir_fd)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = -1
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def _holder(fd: int) -> str:
    """The run that holds the lock, as it wrote itself into the file."""
    try:
        words = os.pread(fd, 256, 0).decode(errors="replace").split()
    except OSError:
        words = []
    if len(words) == 2 and words[0].isdigit():
        return f"job {words[1]} (mpilaunch, pid {words[0]})"
    return "another job"
