"""Which torch a program's ranks would import, read before they start (stdlib only: shipped).

The ranks' store speaks TCPStore in the numbering of the torch the ranks run; the launcher
asks rank 0's host before launch, so a torch it does not serve meets in rank 0's own store
from the start rather than failing at its first request. Read from `torch/version.py` on
the interpreter's default path: no interpreter is started and torch is not imported.
"""

from __future__ import annotations

import os

from mpilaunch.host.mpi_family import script_interpreter, site_folders
from mpilaunch.host.programs import _target

VERSION_LINE = "__version__ = "


def torch_release(program: str, wdir: str, path: str) -> str | None:
    """torch's `__version__` ("2.13.0+cpu") for a Python interpreter or a `#!` script of one,
    from the first torch on its default path; None for another program or no torch."""
    target = _target(program, wdir, path) if os.path.isdir(wdir) else None
    if not target or not os.path.isfile(target):
        return None
    interpreter = script_interpreter(target, path)
    if interpreter:
        target = interpreter
    for folder in site_folders(target):
        release = _written_version(os.path.join(folder, "torch", "version.py"))
        if release is not None:
            return release
    return None


def _written_version(file: str) -> str | None:
    """The quoted value of the `__version__ = '...'` line of a torch/version.py."""
    try:
        with open(file, encoding="utf-8", errors="replace") as text:
            for line in text:
                if line.startswith(VERSION_LINE):
                    return line[len(VERSION_LINE) :].strip().strip("'\"") or None
    except OSError:
        return None
    return None
