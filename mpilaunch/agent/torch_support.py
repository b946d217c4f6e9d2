"""What torchrun's agent gives its workers, given by this agent to the ranks of its host: each
rank's error file (TORCHELASTIC_ERROR_FILE, where torch's @record writes the exception that
ended it; ranks.py reads it when the rank fails) and, on rank 0's host of a job started as
torchrun's, the ranks' store (TORCHELASTIC_USE_AGENT_STORE: their init_process_group connects
to it). Stdlib only: shipped with the agent."""

from __future__ import annotations

import os

from mpilaunch.host.shm import SERVER_FOLDER, make_folder, remove_folder
from mpilaunch.protocol.messages import Note

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.loop import Loop
    from mpilaunch.host.tcpstore import StoreServer
    from mpilaunch.protocol.record import Record


class TorchSupport:
    def __init__(self, loop: Loop, send: Callable[[Record], None], host: str) -> None:
        self.loop = loop
        self.send = send
        self.host = host
        self.folder: str | None = None  # of the error files, made on first use
        self.store: StoreServer | None = None

    def error_file(self, job: int, rank: int) -> str:
        """Where a rank's exception goes: a file in this agent's folder, which has the PMIx
        server's prefix so the guardian removes it if the agent dies."""
        if self.folder is None:
            self.folder = make_folder(SERVER_FOLDER.format(pid=os.getpid()) + "errors-")
        return os.path.join(self.folder, f"{job}.{rank}.json")

    def serve_store(self, port: int, host: str = "") -> None:
        """A TCPStore on this port, served by this agent's loop, for the ranks of this launch,
        which reach it at `host`: only there when that is a loopback address (every rank is on
        this host), else on every address."""
        if self.store is not None:
            return
        from mpilaunch.host.tcpstore import StoreServer, listen_host

        try:
            self.store = StoreServer(self.loop, listen_host(host), port, on_unserved=self.unserved)
        except OSError as exc:
            said = f"mpilaunch: agent on {self.host}: cannot serve the ranks' store on port {port}: {exc}"
            self.send(Note(text=said))

    def unserved(self, why: str) -> None:
        """A rank's torch speaks commands the store does not serve (its release could not be
        read before launch): said at once, not when its rank times out; it is dropped."""
        from mpilaunch.host.tcpstore import SERVED_TORCH  # loaded with the store

        self.send(
            Note(
                text=f"mpilaunch: agent on {self.host}: the ranks' store closed a rank's connection: it sent {why}; "
                f"a torch read before launch outside {SERVED_TORCH} meets in rank 0's own store instead"
            )
        )

    def close(self) -> None:
        if self.folder is not None:
            remove_folder(self.folder)
            self.folder = None
        if self.store is not None:
            refused = self.store.refusals()
            if refused:  # connections that were no torch client, summed once: they ended nothing
                self.send(
                    Note(text=f"mpilaunch: agent on {self.host}: the ranks' store on port {self.store.port} {refused}")
                )
            self.store.close()
            self.store = None
