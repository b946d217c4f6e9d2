"""Opening the files rank output goes to, and knowing which of them are one file.

A log file is opened without waiting and must be a regular file (or, for a path of the user's own,
the null device). It is emptied only once every file of the job was opened and found to be a file
of its own: two names may be one file (`./x` and `x`, a symbolic link, a hard link), and two
descriptors writing one file at their own offsets overwrite each other's lines without a word.
`SameFiles` knows each file by its identity (st_dev, st_ino), so one file is written through one
descriptor, or refused in one line.
"""

from __future__ import annotations

import errno
import os
import stat

from mpilaunch.errors import LaunchError


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def not_regular(mode: int) -> OSError:
    from mpilaunch.host.files import kind_of  # only for a log file refused

    return OSError(errno.EINVAL, f"{kind_of(mode)}, not a regular file")


def is_null(found: os.stat_result) -> bool:
    """The null device (under any name): the one special file output may be sent to."""
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(found.st_mode) and found.st_rdev == null.st_rdev


def open_log(name: str, parent: int | None = None) -> int:
    """Create (not empty: `empty` does, once the job's files are known) a regular log file, never
    waiting: a FIFO planted there would block the open (or the writes) for ever, a device would
    take the output somewhere else, so anything but a regular file is refused. In `parent` (the
    log tree): a link is not followed either; a path of the user's own (hydra's -outfile-pattern)
    may be one, and may be the null device."""
    follow = parent is None
    try:
        found = os.stat(name, dir_fd=parent, follow_symlinks=follow)
    except FileNotFoundError:
        found = None
    null = follow and found is not None and is_null(found)  # hydra's -outfile-pattern /dev/null: thrown away
    if found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISLNK(found.st_mode) and not null:
        raise not_regular(found.st_mode)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(name, flags, 0o644, dir_fd=parent)
    try:
        opened = os.fstat(fd)
        if null and is_null(opened):
            return fd
        if not stat.S_ISREG(opened.st_mode):  # put there since it was looked at
            raise not_regular(opened.st_mode)
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd


def empty(fd: int) -> None:
    """A log file starts empty (the null device has nothing to empty)."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.ftruncate(fd, 0)


def subdir(parent: int, name: str) -> int:
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


class Use:
    """Who writes a file: the option and value that named it (the words of a refusal), the path,
    and what it is in words."""

    def __init__(self, option: str, path: str, what: str, pattern: bool = False) -> None:
        self.option, self.path, self.what, self.pattern = option, path, what, pattern


class SameFiles:
    """The files a run writes rank output to, by identity. The launcher's own stdout and stderr,
    when they are regular files, are among them: a log file that is one of them would overwrite
    the launcher's lines (and they its)."""

    def __init__(self, streams: tuple[int, ...] = (1, 2)) -> None:
        self.known: dict[tuple[int, int], Use] = {}
        for fd, name in zip(streams, ("stdout", "stderr")):
            try:
                mine = os.fstat(fd)
            except OSError:
                continue
            if stat.S_ISREG(mine.st_mode):
                self.known.setdefault((mine.st_dev, mine.st_ino), Use("", name, f"this launcher's own {name}"))

    def claim(self, fd: int, use: Use) -> None:
        """Note fd's file as written by `use`, or refuse the run in one line if another use writes
        it: the line blames the user's pattern, if one of the two is."""
        found = os.fstat(fd)
        if is_null(found):
            return  # thrown away, whoever writes it
        key = (found.st_dev, found.st_ino)
        earlier = self.known.get(key)
        if earlier is None:
            self.known[key] = use
            return
        blamed, other = (earlier, use) if earlier.pattern and not use.pattern else (use, earlier)
        raise LaunchError(
            f"{blamed.option}: {blamed.path} is the same file as {other.what}; two writers of one file "
            "overwrite each other's lines: name another file"
        )
