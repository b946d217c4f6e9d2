"""The PMIx server's start, for services/pmix.py: with the library the job needs, in a folder of
this agent's own, with hwloc reading a kept description of the machine instead of the machine,
and, where the launch is likely to want it, ahead of the first launch on a thread of its own
(`prestart`: PMIx_server_init reads the machine, which takes a while).
"""

from __future__ import annotations

import os
import socket

from mpilaunch.agent.services import pmix_lib as lib
from mpilaunch.agent.services.topology import CachedTopology
from mpilaunch.host.pmix_library import host_library
from mpilaunch.host.shm import SERVER_FOLDER, make_folder, remove_folder

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable


def find_library(requested: str | None, own: str | None = None) -> str:
    """The PMIx library to serve with (host/pmix_library.host_library), or why there is none."""
    found = host_library(requested, own)
    if found:
        return found
    raise lib.LibraryError(
        "no PMIx library (libpmix.so.2, PMIx 4 or 5) found on this host; install one "
        "(Debian and Ubuntu: apt install libpmix2) or name it with --pmix-lib PATH"
    )


class ServerStart:
    def __init__(self, upcalls: Callable[[], dict[int, object]]) -> None:
        """upcalls(): the server's upcall table (made when a server starts)."""
        self.upcalls = upcalls
        self.dir: str | None = None  # the server's folder (the guardian removes it if this agent is killed)
        self.topology: CachedTopology | None = None
        self.warming: tuple[str, threading.Thread, list] | None = None  # (library, thread, [server]): prestart

    def start(self, library: str) -> lib.Server:
        server = lib.Server(library)
        self.dir = make_folder(SERVER_FOLDER.format(pid=os.getpid()))
        topology = CachedTopology()  # hwloc reads a kept description instead of the machine
        topology.before()
        try:
            server.start(
                [
                    ("pmix.srvr.tmpdir", lib.STRING, self.dir),
                    ("pmix.sys.tmpdir", lib.STRING, self.dir),
                    ("pmix.hname", lib.STRING, socket.gethostname()),
                    ("pmix.srv.nspace", lib.STRING, f"mpilaunch-agent-{os.getpid()}"),
                    ("pmix.srv.rank", lib.PROC_RANK, 0),
                    ("pmix.srvr.share", lib.BOOL, True),
                ],
                self.upcalls(),
            )
        except BaseException:  # no server (a limit on threads, say): its folder goes with it
            remove_folder(self.dir)
            self.dir = None
            raise
        finally:
            topology.after()
        self.topology = topology
        return server

    def prestart(self, hint: object) -> None:
        """Start the server on a thread (PMIx_server_init reads the machine with hwloc) with the library
        the launch will likely want: hint is (--pmix-lib, the ranks' own libpmix)."""
        requested, own = hint  # type: ignore[misc]
        try:
            library = find_library(requested, own)
        except lib.LibraryError:
            return  # the launch will say so
        import threading

        started: list[lib.Server | BaseException] = []

        def start() -> None:
            try:
                started.append(self.start(library))
            except BaseException as exc:  # said again when the launch starts one itself
                started.append(exc)

        thread = threading.Thread(target=start, name="pmix-start", daemon=True)
        thread.start()
        self.warming = (library, thread, started)

    def warmed(self, library: str) -> lib.Server | None:
        """The server prestart began, once it is up, if it serves this library; else None (one
        with another library is stopped, and its folder removed)."""
        if self.warming is None:
            return None
        wanted, thread, started = self.warming
        self.warming = None
        thread.join()
        server = started[0] if started else None
        if isinstance(server, lib.Server) and wanted == library:
            return server
        if isinstance(server, lib.Server):
            server.finalize()
        if self.dir is not None:
            remove_folder(self.dir)
            self.dir = None
        return None

    def never_used(self) -> lib.Server | None:
        """A server started ahead for a launch that never came (stopped by the caller)."""
        return self.warmed(self.warming[0]) if self.warming is not None else None

    def close(self) -> None:
        if self.topology is not None:
            self.topology.keep()
            self.topology = None
        if self.dir is not None:
            remove_folder(self.dir)
            self.dir = None
