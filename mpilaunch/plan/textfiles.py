"""Reading the small text files users give (hostfiles, job files, a run's report): bounded,
UTF-8, and every failure one line that names the file (and the line, for bad bytes).

What is read must be a regular file or a pipe that someone writes (`--hostfile <(...)`): a
directory, a device, a socket or a FIFO nobody writes is refused in one line. The file is
opened without waiting (a FIFO with no writer would hold `open` for ever) and its kind is
taken from the opened descriptor, so nothing can be swapped in between.
"""

from __future__ import annotations

import os
import stat

from mpilaunch.errors import LaunchError

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}  # fmt: skip


def read_text(path: str, kind: str, limit: int) -> str:
    """The file's text; kind names it in errors ("hostfile", "job file")."""
    data = read_bytes(path, kind, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LaunchError(f"{path}:{line}: not UTF-8 text") from None


def read_bytes(path: str, kind: str, limit: int) -> bytes:
    """At most limit bytes of a regular file or a pipe (more: one line saying so)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise LaunchError(f"{path}: cannot read {kind}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_IFMT(mode) in _KINDS:
            raise LaunchError(f"{path}: cannot read {kind}: {_KINDS[stat.S_IFMT(mode)]}, not a file")
        data = _read_pipe(fd, path, kind, limit) if stat.S_ISFIFO(mode) else _read_all(fd, limit)
    except OSError as exc:
        raise LaunchError(f"{path}: cannot read {kind}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise LaunchError(f"{path}: {kind} larger than {limit >> 20} MiB")
    return data


def _read_all(fd: int, limit: int) -> bytes:
    """Up to limit + 1 bytes (one more than allowed says the file is too large)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _read_pipe(fd: int, path: str, kind: str, limit: int) -> bytes:
    """A pipe or FIFO: read while a writer holds it (a shell's `<(...)` does until its command
    ends); one that nobody writes, and that holds nothing, is refused rather than waited on."""
    try:
        first = os.read(fd, 1 << 16)
    except BlockingIOError:  # a writer has it open and has written nothing yet: wait for it
        first = None
    if first == b"":
        raise LaunchError(f"{path}: cannot read {kind}: a FIFO or pipe with nothing to read (nobody writes it)")
    os.set_blocking(fd, True)
    return (first or b"") + _read_all(fd, limit - len(first or b""))
