"""Can this program start here? Asked by the launcher for its own host and by each remote
agent for its host, before anything starts (stdlib only: shipped to remote hosts)."""

from __future__ import annotations

import os

# host/mpi_family (with the message records, json and re behind it) is imported by the
# functions that read a program's libraries: entry.main looks up srun here before any import.


def find_program(program: str, env: dict[str, str]) -> str:
    """What execvpe would run: the first executable file on env's PATH (the rank's, not ours).

    Not shutil.which: importing shutil loads the compression modules on every run."""
    if "/" in program:
        return program
    denied = None
    search = env.get("PATH")  # not os.get_exec_path: it imports `warnings` for bytes keys
    for folder in (os.defpath if search is None else search).split(os.pathsep):
        path = os.path.join(folder or ".", program)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = denied or path
    if denied is not None:
        raise PermissionError(13, os.strerror(13), denied)
    raise FileNotFoundError(2, os.strerror(2), program)


def _target(program: str, wdir: str, path: str) -> str | None:
    """The file `program` names, run in `wdir` with this PATH (None: none is found)."""
    if os.sep in program:
        return program if os.path.isabs(program) else os.path.join(wdir, program)
    try:
        return find_program(program, {"PATH": path})
    except OSError:
        return None


def program_family(program: str, wdir: str, path: str) -> tuple[str, str] | None:
    """The MPI family and library the program is linked with, or for a Python interpreter the
    one its mpi4py is built for, or ("unknown", name) for a program that may start either
    (host/mpi_family.py) on a host that has a PMIx library; None for none. A `#!` script is its
    interpreter."""
    from mpilaunch.host.mpi_family import mpi_family, opaque_program, python_family, refined_family, script_interpreter
    from mpilaunch.host.pmix_library import host_library
    from mpilaunch.protocol.messages import UNKNOWN

    target = _target(program, wdir, path) if os.path.isdir(wdir) else None
    if not target or not os.path.isfile(target):
        return None
    interpreter = script_interpreter(target, path)
    if interpreter == "" or (interpreter and not os.path.isfile(interpreter)):
        return UNKNOWN, os.path.basename(target)  # a script whose interpreter cannot be looked at
    if interpreter is not None:
        target = interpreter
    found = mpi_family(target) or python_family(target) or opaque_program(target)
    if found is not None and found[0] == UNKNOWN and host_library() is None:
        return None  # whatever it starts can be served PMI only here (no PMIx library)
    return refined_family(target, found, os.environ.get("LD_LIBRARY_PATH", ""))


def program_problem(program: str, wdir: str, path: str, mpi: bool) -> str | None:
    """None when `program` would start in `wdir` with this PATH; else one line saying why not.
    mpi: a program linked with Open MPI is a problem too (the job is served PMI-1 only)."""
    if not os.path.isdir(wdir):
        if not os.path.exists(wdir):
            return f"working directory {wdir!r} does not exist"
        return f"working directory {wdir!r} is not a directory"
    if not os.access(wdir, os.X_OK):
        return f"working directory {wdir!r} cannot be entered (permission denied)"
    target = _target(program, wdir, path)
    if not target or not os.path.isfile(target):
        return f"program {program!r} not found (PATH and working directory {wdir})"
    if not os.access(target, os.X_OK):
        return f"program {program!r} is not executable"
    from mpilaunch.host.mpi_family import open_mpi_library

    library = open_mpi_library(target) if mpi else None
    if library:
        return (
            f"program {program!r} is linked with Open MPI ({library}); Open MPI ranks need a PMIx server, "
            "without which each would run alone as a singleton of size 1. Pass --mpi pmix to serve them PMIx, "
            "or --mpi none to start them as singletons anyway"
        )
    return None


PATH_LISTS = ("PATH", "LD_LIBRARY_PATH")
PREFIXES = ("VIRTUAL_ENV", "CONDA_PREFIX")


def carried_environment(env: dict[str, str]) -> dict[str, str]:
    """What a remote host's agent gets from the launcher's environment so that `python` means
    the same interpreter there (where its path exists)."""
    return {name: env[name] for name in (*PATH_LISTS, *PREFIXES) if env.get(name)}


def merge_host_environment(own: dict[str, str], carried: dict[str, str]) -> dict[str, str]:
    """The host's environment with the launcher's search paths in front, keeping only the
    directories that exist on this host; a virtualenv or conda prefix only if it exists here."""
    merged = dict(own)
    for name in PATH_LISTS:
        if name not in carried:
            continue
        ours = [d for d in carried[name].split(os.pathsep) if d and os.path.isdir(d)]
        theirs = [d for d in own.get(name, "").split(os.pathsep) if d and d not in ours]
        if ours or theirs:
            merged[name] = os.pathsep.join(ours + theirs)
    for name in PREFIXES:
        if name in carried and os.path.isdir(carried[name]):
            merged[name] = carried[name]
    return merged


def probe_port(port: int) -> tuple[int, bool]:
    """(port, whether it can be bound here); port 0 picks a free one (for MASTER_PORT).
    _socket, the C module under socket: every launcher start picks a port, and importing
    socket.py (its enums) would be on that path."""
    import _socket

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        sock.bind(("", port))
        return sock.getsockname()[1], True
    except OSError:
        return port, False
    finally:
        sock.close()
