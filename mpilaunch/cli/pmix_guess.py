"""Whether a command line's ranks on this machine will be served PMIx, guessed before it is
parsed: the agent forked at start-up (transport/local.prestart_local_agent) then starts its
PMIx server (15 to 30 ms, mostly hwloc's look at the machine) while the launcher parses and
plans, instead of after the launch arrives. Only a guess: the launch decides, and a server
started for nothing is stopped (agent/services/pmix.PmixService.prestart)."""

from __future__ import annotations

import os

from mpilaunch.cli.argscan import scan, split_apps
from mpilaunch.host.mpi_family import UNKNOWN, own_open_mpi
from mpilaunch.host.programs import find_program, program_family


def pmix_guess(words: list[str]) -> tuple[str | None, str | None] | None:
    """(--pmix-lib, the programs' own libpmix) when the job will likely be served PMIx: --mpi
    pmix, a program linked with Open MPI (or a Python whose mpi4py is), or with --mpi auto a
    program that may start either MPI (a shell, a script); else None, also for anything the
    fast scanner leaves to click."""
    scanned = [scan(context) for context in split_apps(words)]
    if any(s is None or not s[0]["argv"] for s in scanned):
        return None
    first = scanned[0][0]  # type: ignore[index]
    mpi = str(first["mpi"]).lower()
    if mpi not in ("auto", "pmi1", "pmix"):
        return None
    path = os.environ.get("PATH", os.defpath)
    families, own = [], None
    for params, _ in scanned:  # type: ignore[misc]
        wdir = str(params["wdir"] or os.getcwd())
        found = program_family(str(params["argv"][0]), wdir, path)
        families.append(found[0] if found else None)
        if found and found[0] == "openmpi" and own is None:
            try:
                target = find_program(str(params["argv"][0]), {"PATH": path})
            except OSError:
                continue
            own = own_open_mpi(os.path.join(wdir, target), os.environ.get("LD_LIBRARY_PATH", ""))[1]
    linked_mpich = any(f in ("mpich", "impi") for f in families)
    wanted = (
        mpi == "pmix"
        or ("openmpi" in families and not linked_mpich)
        or (mpi == "auto" and UNKNOWN in families and not linked_mpich)
    )
    return (str(first["pmix_lib"]) if first["pmix_lib"] else None, own) if wanted else None
