"""Reading the small text files users give (hostfiles, job files): bounded, UTF-8, and every
failure one line that names the file (and the line, for bad bytes)."""

from __future__ import annotations

from mpilaunch.errors import LaunchError


def read_text(path: str, kind: str, limit: int) -> str:
    """The file's text; kind names it in errors ("hostfile", "job file")."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise LaunchError(f"{path}: cannot read {kind}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise LaunchError(f"{path}: {kind} larger than {limit >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LaunchError(f"{path}:{line}: not UTF-8 text") from None
