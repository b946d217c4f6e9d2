"""Hydra's singleton start. An MPICH program run without a launcher that asks for one (for
MPI_Comm_spawn, or the universe size) execs `mpiexec -pmi_args PORT INTERFACE KEY PID` and
waits, for ever, for that mpiexec to connect back to PORT and serve it PMI-1.

mpilaunch does not serve that start. Started so (as the `mpiexec` shim first on PATH), it
hands the request to hydra's own `mpiexec.hydra` when one is on PATH; else it answers the
program's handshake with a refusal, so that the program's call fails at once, and says why.
"""

from __future__ import annotations

from mpilaunch.errors import LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

FLAG = "-pmi_args"
HANDSHAKE_TIMEOUT = 5.0  # seconds to connect to the program and read its singinit
OURS = b"cmd=singinit pmi_version=1 pmi_subversion=1 stdio=no authtype=none\n"
REFUSAL = b"cmd=singinit_info versionok=no stdio=no kvsname=singinit\n"


def singleton_start(argv: list[str]) -> NoReturn:
    """Exec hydra's mpiexec with these words, or refuse the program's handshake and raise."""
    from mpilaunch.cli.shims import exec_real

    exec_real("mpiexec.hydra", argv)  # else refused below
    port = _port(argv)
    refuse(port)
    raise LaunchError(
        "hydra's singleton start (mpiexec -pmi_args: an MPICH program started without a launcher "
        "asked for one, for MPI_Comm_spawn or the universe size) is not served by mpilaunch and no "
        "mpiexec.hydra is on PATH; start the program under the launcher (mpilaunch -n 1 PROGRAM)"
    )


def _port(argv: list[str]) -> int:
    words = argv[argv.index(FLAG) + 1 :]
    if len(words) < 4 or not words[0].isdigit() or not 0 < int(words[0]) < 65536:
        raise LaunchError(f"{FLAG}: expected PORT INTERFACE KEY PID, got {' '.join(words[:4]) or 'nothing'}")
    return int(words[0])


def refuse(port: int) -> None:
    """The process manager's half of MPICH's singleton handshake (src/pmi: PMII_singinit), with
    versionok=no: the program's PMI call then fails instead of waiting."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_TIMEOUT) as conn:
            conn.sendall(OURS)
            theirs = b""
            while b"\n" not in theirs:
                chunk = conn.recv(1024)
                if not chunk:
                    return
                theirs += chunk
            conn.sendall(REFUSAL)
    except OSError:
        pass  # gone, or not listening: nothing waits there
