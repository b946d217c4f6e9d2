"""A job's PMI server in an agent: reads each rank's socket, serves it by its version (PMI-1
lines, or PMI-2 frames once it asked for them), and answers what the controller sends back."""

from __future__ import annotations

from mpilaunch.agent.services.pmi1 import INITIALIZED, LINE_MAX, NEW, ProtocolError
from mpilaunch.agent.services.pmi_job import JobState, PmiClient
from mpilaunch.protocol.messages import PmiError, PmiFenceDone, PmiNameReply, PmiSpawnReply

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType


def serving(version: int) -> ModuleType:
    """How a client of each version is parsed, served and answered (pmi1_serve, pmi2_serve),
    imported when a rank first speaks PMI: a job whose ranks never do (`-n 8 true`) skips them."""
    if version == 1:
        from mpilaunch.agent.services import pmi1_serve as served
    else:
        from mpilaunch.agent.services import pmi2_serve as served
    return served


class JobServer(JobState):
    # -- reading ------------------------------------------------------------------------
    def readable(self, fd: int) -> bool:
        """Handle what a rank sent; False when its socket must be dropped (closed or misbehaving)."""
        client = self.clients[fd]
        if client.stalled:
            return False
        try:
            data = client.sock.recv(LINE_MAX)  # type: ignore[union-attr]
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            if client.state == INITIALIZED and self.on_hangup is not None:
                self.on_hangup(client.ident)  # its peers would wait for it in the next barrier
            return False
        client.buf += data
        was = client.state
        try:
            while not client.stalled and self.next_message(client):
                pass
        except ProtocolError as exc:
            self.send_up(PmiError(proc=client.ident, error=f"PMI protocol error: {exc}"))
            return False
        if was == NEW and client.state == INITIALIZED and self.on_init is not None:
            self.on_init(client.ident, client.rank)
        return not client.stalled

    def next_message(self, client: PmiClient) -> bool:
        """Handle one whole message from the client's buffer; False when more bytes are needed.
        A client that starts with a PMI-2 frame instead of the init line speaks PMI-2 (hydra
        accepts that too)."""
        if client.version == 1 and client.state == NEW:
            from mpilaunch.agent.services.pmi2 import looks_like_frame

            if looks_like_frame(client.buf):
                client.version = 2
        return serving(client.version).next_message(self, client)

    # -- answers from the controller -------------------------------------------------------
    def handle(self, message: PmiFenceDone | PmiNameReply | PmiSpawnReply) -> None:
        """PmiFenceDone, PmiNameReply or PmiSpawnReply from the controller."""
        ANSWERS[type(message)](self, message)

    def fence_done(self, message: PmiFenceDone) -> None:
        self.kvs.update(message.kvs)
        for client in self.by_ident.values():
            if client.in_barrier:
                client.in_barrier = False
                serving(client.version).barrier_out(self, client)

    def answer_request(self, message: PmiNameReply | PmiSpawnReply) -> None:
        entry = self.waiting.pop(message.req, None)
        if entry is not None:
            client, thrid = entry
            serving(client.version).answer(self, client, thrid, message)


ANSWERS = {  # what the controller sends a job's PMI server
    PmiFenceDone: JobServer.fence_done,
    PmiNameReply: JobServer.answer_request,
    PmiSpawnReply: JobServer.answer_request,
}
