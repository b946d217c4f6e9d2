"""Whether a command line's ranks on this machine will be served PMIx, guessed before it is
parsed: the agent forked at start-up (transport/local.LocalTransport.prestart) then starts its
PMIx server (mostly hwloc's look at the machine) while the launcher parses and
plans, instead of after the launch arrives. Only a guess: the launch decides, and a server
started for nothing is stopped (agent/services/pmix.PmixService.prestart)."""

from __future__ import annotations

import os

from mpilaunch.errors import LaunchError
from mpilaunch.host.mpi_family import own_open_mpi
from mpilaunch.host.programs import find_program, program_family
from mpilaunch.plan.wireup import BOTH, served_mpi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.cli.cmdline import CommandLine


def pmix_guess(line: CommandLine) -> tuple[str | None, str | None] | None:
    """(--pmix-lib, the programs' own libpmix) when the job will likely be served PMIx, as the
    launch will decide it (plan/wireup.served_mpi) from this machine's programs; else None, also
    for anything the fast scanner leaves to click."""
    scanned = line.segments
    if line.error is not None or not scanned or any(s is None or not s[0]["argv"] for s in scanned):
        return None
    first = scanned[0][0]  # type: ignore[index]
    mpi = str(first["mpi"]).lower()
    path = os.environ.get("PATH", os.defpath)
    found, own = [], None
    for params, _ in scanned:  # type: ignore[misc]
        program, wdir = str(params["argv"][0]), str(params["wdir"] or os.getcwd())
        family = program_family(program, wdir, path)
        if family is None:
            continue
        found.append((program, *family))
        if family[0] == "openmpi" and own is None:
            try:
                target = find_program(program, {"PATH": path})
            except OSError:
                continue
            own = own_open_mpi(os.path.join(wdir, target), os.environ.get("LD_LIBRARY_PATH", ""))[1]
    try:
        wanted = served_mpi(mpi, found) in ("pmix", BOTH)
    except LaunchError:  # refused: the launch says so
        return None
    return (str(first["pmix_lib"]) if first["pmix_lib"] else None, own) if wanted else None
