"""Files the launcher and its agents write: a path the user names, and the files kept for later
runs (stdlib only: shipped to remote hosts).

A path the user names (--report-json, --rank-table) that is a regular file, or nothing yet, is
replaced whole, so a rank or another host sharing the file system never reads it half written.
Anything else is written through, never replaced: a terminal, /dev/null, a pipe, a symbolic link
(to the launcher's own stdout, say); a directory, a block device, a socket or a FIFO nobody
reads is refused in one line.

A kept file (a cache) is used only when it is a regular file of a sane size; it is written whole
or not at all, and a write that fails leaves nothing behind and is no error of the job's.
"""

from __future__ import annotations

import os
import stat

_REFUSED = {stat.S_IFDIR: "a directory", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFIFO: "a FIFO", stat.S_IFLNK: "a symbolic link", **_REFUSED}


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def write_file(path: str, data: str) -> str | None:
    """Write the user's file path; None, or why it could not be (one line, naming the path).
    Bytes of the text that were not UTF-8 where they came from are written back as they were."""
    body = data.encode("utf-8", "surrogateescape")
    try:
        found: os.stat_result | None = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        found = None  # nothing there (or a link to nothing: written through, as a shell's `>` does)
    except OSError as exc:
        return _cannot(path, exc)
    stream = console_stream(path, found)
    if stream is not None:  # /dev/stdout and the like: the launcher's own stream, where it is now
        import sys

        for buffered in (sys.stdout, sys.stderr):  # what was printed before comes first
            try:
                if buffered is not None:
                    buffered.flush()
            except (OSError, ValueError):
                pass
        try:
            _write_all(stream, body)
        except OSError as exc:
            return _cannot(path, exc)
        return None
    plain = not os.path.islink(path) and (found is None or stat.S_ISREG(found.st_mode))
    return _replace(path, body) if plain else _write_through(path, body, found)


def console_stream(path: str, found: os.stat_result | None = None) -> int | None:
    """1 or 2 when path names the file this process's stdout or stderr writes to (/dev/stdout,
    /proc/self/fd/2, a link to the terminal), else None."""
    try:
        found = found or os.stat(path)
    except OSError:
        return None
    for fd in (1, 2):
        try:
            mine = os.fstat(fd)
        except OSError:
            continue
        if (mine.st_dev, mine.st_ino) == (found.st_dev, found.st_ino):
            return fd
    return None


def _cannot(path: str, exc: OSError) -> str:
    return f"cannot write {path}: {exc.strerror or exc}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_regular(path: str, body: bytes) -> str | None:
    """A file made for the user (`mpilaunch report -o`): None, or why not (one line). Written
    beside its place and renamed there, so a full disk leaves no empty file and the old one
    whole; a FIFO, a device, a socket or a directory there is refused, never opened (a FIFO
    held the write for ever). A link is followed: the file it names is the one replaced."""
    real = os.path.realpath(path)
    try:
        found = os.stat(real)
    except FileNotFoundError:
        return _replace(real, body, path)
    except OSError as exc:
        return _cannot(path, exc)
    if not stat.S_ISREG(found.st_mode):
        return f"cannot write {path}: {kind_of(found.st_mode)}, not a regular file"
    return _replace(real, body, path)


def _replace(path: str, body: bytes, name: str | None = None) -> str | None:
    """A regular file, written beside its place and renamed there; name: the path said in errors."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(3).hex()}.tmp")
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        return _cannot(name or path, exc)
    return None


def _write_through(path: str, body: bytes, found: os.stat_result | None) -> str | None:
    """A device, a pipe or a link: opened and written, never replaced. A FIFO nobody reads is
    refused (the open does not wait for a reader); a regular file behind a link is truncated
    first, as a shell's `>` would."""
    if found is not None and stat.S_IFMT(found.st_mode) in _REFUSED:
        return f"cannot write {path}: {kind_of(found.st_mode)}, not written"
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if found is not None and stat.S_ISFIFO(found.st_mode):
            return f"cannot write {path}: a FIFO that nobody reads"
        return _cannot(path, exc)
    try:
        opened = os.fstat(fd)
        if stat.S_IFMT(opened.st_mode) in _REFUSED:  # it changed since it was looked at
            return f"cannot write {path}: {kind_of(opened.st_mode)}, not written"
        if stat.S_ISREG(opened.st_mode):
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        _write_all(fd, body)
    except OSError as exc:
        return _cannot(path, exc)
    finally:
        os.close(fd)
    return None


# -- kept files ------------------------------------------------------------------------------------
def read_kept(path: str, limit: int) -> tuple[bytes | None, str | None]:
    """(the bytes of a kept file, None); (None, None) when there is none; (None, why) when what
    is there cannot be used (not a regular file, larger than limit, unreadable). Never waits
    (a FIFO planted there is not opened for reading as a file would be)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):  # nothing kept (or no folder to keep it in)
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return None, f"{kind_of(found.st_mode)}, not a file"
        if found.st_size > limit:
            return None, f"{found.st_size} bytes, more than it can be"
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), None
            chunks.append(chunk)
            size += len(chunk)
        return None, f"more than {limit} bytes"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    finally:
        os.close(fd)


def keep(path: str, data: bytes) -> bool:
    """Write a kept file whole (beside it, then renamed), or leave nothing: a full disk, a
    read-only home or a directory in its place make no partial file and no error. Partial files
    of processes that died while writing this one are removed first."""
    directory = os.path.dirname(path)
    tmp = f"{path}.{os.getpid()}-{os.urandom(3).hex()}.tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        _sweep_partials(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return True
    except OSError:
        _unlink(tmp)
        return False


def discard(path: str) -> None:
    """Remove what is at a kept file's place, so that it can be kept again: a directory too,
    with what it holds (the place is in the launcher's own cache folder, under a name of its
    own; a directory left there was found and "discarded" by every run, and never went).
    A link is removed, not followed."""
    try:
        os.unlink(path)
    except IsADirectoryError:
        from mpilaunch.host.shm import remove_folder  # shutil's rmtree without its imports

        remove_folder(path)
    except OSError:
        pass


def _sweep_partials(path: str) -> None:
    """`NAME.PID...` beside NAME, left by a process PID that is gone (killed while writing it)."""
    directory, name = os.path.split(path)
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if not entry.startswith(name + "."):
            continue
        digits = entry[len(name) + 1 :].split("-", 1)[0].split(".", 1)[0]
        if digits.isdigit() and not _alive(int(digits)):
            _unlink(os.path.join(directory, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
