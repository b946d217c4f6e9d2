"""torchrun's way across nodes: a launcher on each node (`--nnodes N --node-rank K`), meeting
at the endpoint (`--master-addr:--master-port`, or `--rdzv-endpoint`), as torchrun's static
rendezvous does.

Node 0's launcher serves a TCPStore there (host/tcpstore.py); it is also the ranks' store
(TORCHELASTIC_USE_AGENT_STORE=True), as torchrun's node 0 agent's is. Each launcher writes
`mpilaunch/joined/K` and waits until every node's is there; then each starts its node's ranks.
While they run, a node that ends badly says so (`mpilaunch/failed`), which stops every other
node's job; a launcher that goes away is seen by the store's end of its connection (node 0),
or by the end of the connection to node 0 (the others). At the end each node writes
`mpilaunch/done/K`; node 0 keeps the store up until every other node's launcher has hung up,
having read whether any node said it was the last attempt (`mpilaunch/final`, which node 0
writes before its own done: a failed node waits for that before it reads it).
"""

from __future__ import annotations

import selectors
import socket
import time

from mpilaunch.errors import LaunchError
from mpilaunch.host import tcpstore
from mpilaunch.plan.spec import TorchRun

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

JOIN_TIMEOUT = 600.0  # seconds a launcher waits for the other nodes' (torchrun's join_timeout)
PREFIX = "mpilaunch/"


class NodeRendezvous:
    """This node's side of the meeting: node 0 serves the store, the others are its clients."""

    def __init__(self, torch: TorchRun, attempt: int = 0, timeout: float = JOIN_TIMEOUT) -> None:
        assert torch.node_rank is not None and torch.nnodes is not None and torch.endpoint is not None
        self.node, self.nodes = torch.node_rank, torch.nnodes
        self.host, self.port = torch.endpoint
        self.timeout = timeout
        self.attempt = attempt
        self.server: tcpstore.StoreServer | None = None
        self.client: tcpstore.StoreClient | None = None
        self.watcher: tcpstore.StoreClient | None = None  # a node's connection that waits for the end
        self.lost: Callable[[str], None] | None = None  # told why the other nodes' job is over
        self.sel: selectors.BaseSelector | None = None  # the controller's, watched from
        self.over = False
        self.elsewhere = ""  # after finish: why the job failed on another node while this one's ended well

    def key(self, name: str) -> str:
        return f"{PREFIX}{self.attempt}/{name}"

    # -- meeting -----------------------------------------------------------------------------
    def join(self) -> None:
        """Say this node is here; return once every node is (LaunchError after the timeout)."""
        keys = [self.key(f"joined/{k}") for k in range(self.nodes)]
        if self.node == 0:
            try:
                self.server = tcpstore.StoreServer(None, "", self.port, on_close=self._closed)
            except OSError as exc:
                raise LaunchError(f"node 0 cannot serve the rendezvous on port {self.port}: {exc.strerror}") from None
            self.server.set(keys[0], socket.gethostname())
            deadline = time.monotonic() + self.timeout
            self.server.run(lambda: all(self.server.get(k) is not None for k in keys) or time.monotonic() > deadline)
            missing = [k for k, key in enumerate(keys) if self.server.get(key) is None]
        else:
            missing = self._join_as_client(keys)
        if missing:
            self.close()
            raise LaunchError(
                f"node {self.node}: nodes {', '.join(map(str, missing))} of {self.nodes} did not join at "
                f"{self.host}:{self.port} within {self.timeout:g} s"
            )

    def _join_as_client(self, keys: list[str]) -> list[int]:
        """The nodes missing at the timeout. Node 0's store of the attempt before may still be
        up, waiting for the others to finish it: a store that goes away is met again."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.client = tcpstore.StoreClient(self.host, self.port, max(deadline - time.monotonic(), 0.1))
                self.client.set(keys[self.node], socket.gethostname())
                self.client.wait(keys, max(deadline - time.monotonic(), 0.1))
                return []
            except tcpstore.StoreTimeout:
                try:
                    return [k for k, key in enumerate(keys) if self.client is None or not self.client.check([key])]
                except tcpstore.StoreError:
                    return [k for k in range(self.nodes) if k != self.node]
            except tcpstore.StoreError as exc:
                if self.client is not None:
                    self.client.close()
                    self.client = None
                if time.monotonic() >= deadline:
                    raise LaunchError(f"node {self.node}: {exc}") from None
                time.sleep(0.05)

    # -- while the ranks run ------------------------------------------------------------------
    def watch_from(self, sel: selectors.BaseSelector, lost: Callable[[str], None]) -> None:
        """From now on `lost(why)` is called, once, when another node's job ended badly or its
        launcher went away: the controller's loop serves the store (node 0) or waits on it."""
        self.lost, self.sel = lost, sel
        if self.server is not None:
            self.server.set(self.key("running"), "1")
            sel.register(self.server.sel, selectors.EVENT_READ, lambda fd: self._serve())
            return
        watcher = self.watcher = tcpstore.StoreClient(self.host, self.port, self.timeout)
        watcher.wait_begin([self.key("failed")])
        sel.register(watcher.fileno(), selectors.EVENT_READ, lambda fd: self._woken())

    def _serve(self) -> None:
        assert self.server is not None
        for key, _ in self.server.sel.select(0):
            key.data(key.fd)
        failed = self.server.get(self.key("failed"))
        if failed is not None:
            self._lose(failed.decode(errors="replace"))

    def _woken(self) -> None:
        """The watching connection spoke: another node failed, or node 0's launcher is gone."""
        assert self.watcher is not None and self.client is not None and self.sel is not None
        self.sel.unregister(self.watcher.fileno())  # it said what it had to; its end later is no news
        try:
            self.watcher.wait_end(self.timeout)
            why = self.client.get(self.key("failed")).decode(errors="replace")
        except tcpstore.StoreError:
            why = f"node 0's launcher at {self.host}:{self.port} went away"
        self._lose(why)

    def _closed(self, peer: tcpstore.Peer) -> None:
        """Node 0: a connection closed; one that said a node joined is that node's launcher.
        While the nodes still meet, that node has not joined after all: the others wait for it
        again (another launcher of that node may come) and, at the timeout, name it."""
        if self.server is None or self.over:
            return
        for k in range(1, self.nodes):
            joined, done = self.key(f"joined/{k}"), self.key(f"done/{k}")
            if joined in peer.wrote and self.server.get(done) is None:
                if self.lost is None:  # meeting (node 0's store is served only then before watch_from)
                    self.server.delete(joined)
                self._lose(f"node {k}'s launcher went away")

    def _lose(self, why: str) -> None:
        if not self.over and self.lost is not None:
            self.over = True
            self.lost(why)

    # -- the end ------------------------------------------------------------------------------
    def finish(self, status: int, last: bool = False) -> bool:
        """Say how this node's job ended (a failure stops the others'), and, with last, that it
        starts no other attempt (a user's signal, the time limit: --max-restarts then restarts
        no node). A node waits until the job has ended everywhere, or failed somewhere and node
        0 has said whether that was the last attempt; node 0's store stays until every other
        node's launcher has hung up. So a node whose ranks ended well learns in `elsewhere`
        that the job failed on another, and starts the next attempt with it. Whether any node
        said it was the last."""
        self.over = True
        why = f"node {self.node}'s job ended with status {status}"
        final, failed = self.key("final"), self.key("failed")
        keys = [self.key(f"done/{k}") for k in range(self.nodes)]
        said_last = last
        told: bytes | None = None
        try:
            if self.server is not None:
                if last:
                    self.server.set(final, "1")
                if status and self.server.get(failed) is None:
                    self.server.set(failed, why)
                self.server.set(keys[0], str(status))
                nodes = {self.key(f"joined/{k}") for k in range(1, self.nodes)}
                # each node's launcher hangs up once it has read what it needs (or is gone)
                self.server.run(lambda: not any(peer.wrote & nodes for peer in self.server.peers.values()), 0.05)
                said_last = self.server.get(final) is not None
                told = self.server.get(failed)
            elif self.client is not None:
                if last:
                    self.client.set(final, "1")
                if status and not self.client.check([failed]):
                    self.client.set(failed, why)
                self.client.set(keys[self.node], str(status))
                while not (self.client.check(keys) or self.client.check([failed, keys[0]])):
                    time.sleep(0.05)  # the others still run: node 0's store answers while they do
                said_last = said_last or self.client.check([final])
                told = self.client.get(failed) if self.client.check([failed]) else None
            if not status and told is not None:
                self.elsewhere = told.decode(errors="replace")
        except (tcpstore.StoreError, OSError):
            said_last = True  # node 0 is gone: no attempt can meet again
        finally:
            self.close()
        return said_last

    def close(self) -> None:
        for thing in (self.watcher, self.client, self.server):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self.watcher = self.client = self.server = None
