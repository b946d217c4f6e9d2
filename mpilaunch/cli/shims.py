"""`mpilaunch shims DIR`: small programs named as other launchers (mpirun, mpiexec, orterun,
mpiexec.hydra, ompi_info, torchrun) that run mpilaunch, for the tools that look for those names on PATH:

    export PATH="$(mpilaunch shims ~/.mpilaunch/bin):$PATH"

Each is a Python script for this interpreter that starts mpilaunch's entry point, which reads
the name it was started as (entry.invoked_as). Installing the package puts none of them on
PATH; a file of that name that is not one of these is never overwritten.
"""

from __future__ import annotations

import os
import stat
import sys

from mpilaunch import __version__
from mpilaunch.errors import LaunchError

NAMES = ("mpirun", "mpiexec", "orterun", "mpiexec.hydra", "ompi_info", "torchrun")
MARK = "# written by `mpilaunch shims`"
USAGE = "usage: mpilaunch shims DIR  (writes mpirun, mpiexec, orterun, mpiexec.hydra, ompi_info, torchrun into DIR)"


def script(name: str, python: str) -> str:
    return (
        f"#!{python}\n"
        f"{MARK} (mpilaunch {__version__}): mpilaunch started as {name}; delete this file to undo\n"
        "from mpilaunch.__main__ import main\n"
        "\n"
        "main()\n"
    )


def run_shims(args: list[str]) -> int:
    """Write the shims into DIR (made if missing), then print DIR for PATH."""
    if args in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    if len(args) != 1 or not args[0] or args[0].startswith("-"):
        raise LaunchError(USAGE)
    folder = os.path.abspath(os.path.expanduser(args[0]))
    python = sys.executable
    if not python or not os.access(python, os.X_OK):
        raise LaunchError("shims: this Python's own path is unknown; run mpilaunch with a Python that has one")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"shims: cannot make {folder}: {exc.strerror}") from None
    for name in NAMES:
        write_shim(os.path.join(folder, name), script(name, python))
    print(folder)
    return 0


def is_shim(path: str) -> bool:
    """Whether the file at path is one of these shims (OSError if it cannot be read). Opened
    without waiting, and only a regular file is read: a FIFO of that name held `open` for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return MARK.encode() in os.read(fd, 4096)
    finally:
        os.close(fd)


def first_real(name: str, path: str) -> str | None:
    """The first program of this name on path that is no mpilaunch shim: the real one, when a
    shim of that name stands before it."""
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        try:
            if not is_shim(candidate):
                return candidate
        except OSError:
            continue
    return None


def exec_real(name: str, args: list[str]) -> None:
    """Become the real program of this name (first_real on PATH) with args; return when there is
    none, or it is not runnable after all."""
    real = first_real(name, os.environ.get("PATH", os.defpath))
    if real is not None:
        try:
            os.execv(real, [real, *args])
        except OSError:
            pass


def _not_a_file(path: str) -> str | None:
    """`is a FIFO, not a file` for what is no regular file at path (a link is followed)."""
    from mpilaunch.host.files import kind_of

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else f"is {kind_of(mode)}, not a file"


def write_shim(path: str, text: str) -> None:
    """One shim, replacing an older one of ours but nothing else."""
    try:
        ours = is_shim(path)
    except FileNotFoundError:
        ours = True
    except OSError as exc:  # a socket there cannot be opened at all
        ours = False
        if _not_a_file(path) is None:
            raise LaunchError(f"shims: cannot read {path}: {exc.strerror}") from None
    if not ours:
        what = _not_a_file(path) or "is not an mpilaunch shim"
        raise LaunchError(f"shims: {path} exists and {what}; it is left as it is")
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
        os.fchmod(fd, 0o755)
        with open(fd, "w") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except OSError as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise LaunchError(f"shims: cannot write {path}: {exc.strerror}") from None
