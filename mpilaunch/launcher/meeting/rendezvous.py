"""torchrun's way across nodes: a launcher on each node, meeting at the endpoint
(`--master-addr:--master-port`, or `--rdzv-endpoint`), as torchrun's rendezvous does.

With `--node-rank K` (static, or c10d with a fixed --nnodes N), node 0's launcher serves a
TCPStore there (host/tcpstore.py); each launcher writes `mpilaunch/joined/K` and waits until
every node's is there. Under c10d without a node rank (or with --nnodes MIN:MAX), the meeting
numbers the nodes, as torchrun's c10d rendezvous does, and takes in a node that comes late at
the next restart (meeting/numbered_meeting.py, meeting/late_nodes.py). Either way the store is
also the ranks' (TORCHELASTIC_USE_AGENT_STORE=True), as torchrun's agent's is.

While the ranks run, a node that ends badly says so (`mpilaunch/failed`), which stops every other
node's job; a launcher that goes away is seen by the store's end of its connection, or by the
end of the connection to the store. At the end each node writes `mpilaunch/done/K`; the store's
launcher keeps it up until every other node's launcher has hung up, having read whether any node
said it was the last attempt (`mpilaunch/final`, which it writes before its own done: a failed
node waits for that before it reads it).

Never silent: a store that cannot be reached, or that goes away once a launcher joined it, ends
that launcher's meeting in one line naming the endpoint, with torchrun's status 1
(launcher/meeting/store_reach.py); a node's watching connection is opened while the store still serves
the meeting, so its going away later reads as the end of that connection. The store listens on
the endpoint's own address when that is a loopback one (every node is this machine), else on
every address.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time

from mpilaunch.errors import LaunchError
from mpilaunch.host import tcpstore
from mpilaunch.launcher.meeting import late_nodes, store_reach
from mpilaunch.launcher.meeting.numbered_meeting import NumberedMeeting
from mpilaunch.launcher.meeting.store_reach import STATUS, endpoint
from mpilaunch.plan.spec import TorchRun

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

PREFIX = "mpilaunch/"


class NodeRendezvous(NumberedMeeting):
    """This node's side of the meeting: one launcher serves the store, the others are its clients.
    attempt: the round of the meeting, the same on every node; None, a launcher's first: round 0,
    or under c10d's numbering the store's current round."""

    def __init__(
        self,
        torch: TorchRun,
        attempt: int | None = 0,
        timeout: float | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        assert torch.nnodes is not None and torch.endpoint is not None
        self.node, self.nodes = torch.node_rank, torch.nnodes  # node None: the meeting numbers it
        self.fewest, self.most = torch.min_nodes or torch.nnodes, torch.nnodes
        self.last_call = torch.last_call
        self.is_host = torch.is_host
        self.host, self.port = torch.endpoint
        self.timeout = torch.join_timeout if timeout is None else timeout
        self.attempt, self.adopt = attempt or 0, attempt is None and self.node is None
        self.slots = list(range(self.nodes))  # each node's arrival number, by node rank
        self.slot = -1 if self.node is None else self.node  # this node's
        self.host_rank = 0  # the node whose launcher serves the store
        self.server: tcpstore.StoreServer | None = None
        self.client: tcpstore.StoreClient | None = None
        self.watcher: tcpstore.StoreClient | None = None  # a node's connection that waits for the end
        self.lost: Callable[[str], None] | None = None  # told why the other nodes' job is over
        self.sel: selectors.BaseSelector | None = None  # the controller's, watched from
        self.over = False
        self.elsewhere = ""  # after finish: why the job failed on another node while this one's ended well
        self.say = say or _stderr  # a note for the user, one line
        self.late = late_nodes.LateWatch(self.key) if self.node is None else None  # c10d's numbering: late nodes
        self.grows = self.fewest < self.most  # a late node may be taken in (--nnodes MIN:MAX)
        self.regroup = False  # after finish: the nodes meet again for a late node (no failure, not counted)
        self.theirs = store_reach.torchruns_key(torch.run_id)  # in the store: a torchrun is a node too

    def key(self, name: str) -> str:
        return f"{PREFIX}{self.attempt}/{name}"

    # -- meeting -----------------------------------------------------------------------------
    @property
    def where(self) -> str:
        return endpoint(self.host, self.port)

    def join(self) -> None:
        """Say this node is here; return once every node is (LaunchError after the timeout)."""
        store_reach.resolve(self.host, self.port)
        if self.node is None:
            return self._meet()
        keys = [self.key(f"joined/{k}") for k in range(self.nodes)]
        if self.node == 0:
            try:
                server = self._open_store()
            except OSError as exc:
                raise LaunchError(
                    f"node 0 cannot serve the rendezvous on port {self.port}: {exc.strerror}", STATUS
                ) from None
            server.set(keys[0], socket.gethostname())
            deadline = time.monotonic() + self.timeout
            server.run(lambda: all(server.get(k) is not None for k in keys) or time.monotonic() > deadline)
            missing = [k for k, key in enumerate(keys) if server.get(key) is None]
        else:
            missing = self._join_as_client(keys)
        if missing:
            self.close()
            raise LaunchError(
                f"node {self.node}: nodes {', '.join(map(str, missing))} of {self.nodes} did not join at "
                f"{self.where} within {self.timeout:g} s",
                STATUS,
            )

    def _open_store(self) -> tcpstore.StoreServer:
        """Serve the meeting's store (OSError: the port is taken), saying which attempt's it is
        before anyone is served."""
        server = tcpstore.StoreServer(None, tcpstore.listen_host(self.host), self.port, on_close=self._closed)
        server.set(store_reach.serves(self.attempt), "1")
        if self.late is not None:  # c10d's numbering: a launcher's first meeting is the store's round
            server.set(store_reach.ROUND, str(self.attempt))
        self.server, self.adopt = server, False
        return server

    def _join_as_client(self, keys: list[str]) -> list[int]:
        """The nodes missing at the timeout."""
        deadline = time.monotonic() + self.timeout
        self.client = store_reach.reach(self.host, self.port, self.attempt, deadline, self.say, timeout=self.timeout)
        try:
            self.watcher = tcpstore.StoreClient(self.host, self.port, self.timeout, patience=0)
            self.client.set(keys[self.node], socket.gethostname())  # type: ignore[index]
            try:
                self.client.wait(keys, max(deadline - time.monotonic(), 0.1))
                return []
            except tcpstore.StoreTimeout:
                return [k for k, key in enumerate(keys) if not self.client.check([key])]
        except tcpstore.StoreError as exc:
            raise self._gone(exc) from None

    def _gone(self, exc: tcpstore.StoreError) -> LaunchError:
        """The store this launcher joined went away during the meeting: so is the meeting."""
        self.close()
        return store_reach.gone(self.host, self.port, exc)

    # -- while the ranks run ------------------------------------------------------------------
    def watch_from(
        self, sel: selectors.BaseSelector, lost: Callable[[str], None], regroup: Callable[[str], None] | None = None
    ) -> None:
        """From now on `lost(why)` is called, once, when another node's job ended badly or its
        launcher went away, and `regroup(line)` when the ranks are to start again with a late
        node: the controller's loop serves the store (its launcher) or waits on it."""
        self.lost, self.sel = lost, sel
        if self.late is not None and regroup is not None and self.grows:
            self.late.watch_from(sel, regroup, self.server)
        if self.server is not None:
            self.server.set(self.key("running"), "1")
            sel.register(self.server.sel, selectors.EVENT_READ, lambda fd: self._serve())
            self._look()  # a late node may have come before the ranks started
            return
        watcher = self.watcher
        assert watcher is not None  # opened as this node joined, while the store served the meeting
        try:
            watcher.wait_begin([self.key("failed")])
        except tcpstore.StoreError:
            pass  # the store is gone already: the connection reads as ended, and _woken says so
        sel.register(watcher.fileno(), selectors.EVENT_READ, lambda fd: self._woken())

    def _serve(self) -> None:
        assert self.server is not None
        for key, _ in self.server.sel.select(0):
            key.data(key.fd)
        failed = self.server.get(self.key("failed"))
        if failed is not None:
            self._lose(failed.decode(errors="replace"))
        self._look()

    def _look(self) -> None:
        if self.late is not None and self.server is not None and not self.over:
            self.late.look(self.server, self.slots, self.most)

    def _woken(self) -> None:
        """The watching connection spoke: another node failed, or the store's launcher is gone."""
        assert self.watcher is not None and self.client is not None and self.sel is not None
        self.sel.unregister(self.watcher.fileno())  # it said what it had to; its end later is no news
        try:
            self.watcher.wait_end(self.timeout)
            why = self.client.get(self.key("failed")).decode(errors="replace")
        except tcpstore.StoreError as exc:
            why = f"the rendezvous store at {self.where} went away with node {self.host_rank}'s launcher ({exc.why})"
        self._lose(why)

    def _closed(self, peer: tcpstore.Peer) -> None:
        """The store's launcher: a connection closed; one that said a node joined is that node's
        launcher. While the nodes still meet, that node has not joined after all: the others
        wait for it again (another launcher of that node may come) and, at the timeout, name it."""
        if self.server is None:
            return
        if self.late is not None:
            self.late.closed(self.server, peer)
        if self.over:
            return
        if self.lost is None:  # meeting (the store is served only then before watch_from)
            for key in peer.wrote:
                if key.startswith(self.key("joined/")):
                    self.server.delete(key)
            return
        for k, slot in enumerate(self.slots):
            if (
                k != self.node
                and self.key(f"joined/{slot}") in peer.wrote
                and self.server.get(self.key(f"done/{k}")) is None
            ):
                self._lose(f"node {k}'s launcher went away")

    def _lose(self, why: str) -> None:
        if not self.over and self.lost is not None:
            self.over = True
            self.lost(why)

    # -- the end ------------------------------------------------------------------------------
    def finish(self, status: int, last: bool = False) -> bool:
        """Say how this node's job ended (a failure stops the others'), and, with last, that it
        starts no other attempt (a user's signal, the time limit: --max-restarts then restarts
        no node). A node waits until the job has ended everywhere, or failed somewhere and the
        store's launcher has said whether that was the last attempt; the store stays until every
        other node's launcher has hung up. So a node whose ranks ended well learns in `elsewhere`
        that the job failed on another, and starts the next attempt with it; and in `regroup`
        that the nodes meet again for a late node. Whether any node said it was the last."""
        self.over = True
        why = f"node {self.node}'s job ended with status {status}"
        final, failed = self.key("final"), self.key("failed")
        keys = [self.key(f"done/{k}") for k in range(self.nodes)]
        said_last, regroup = last, False
        told: bytes | None = None
        try:
            if self.server is not None:
                if last:
                    self.server.set(final, "1")
                if status and self.server.get(failed) is None:
                    self.server.set(failed, why)
                self.server.set(keys[self.node], str(status))
                nodes = {self.key(f"joined/{slot}") for k, slot in enumerate(self.slots) if k != self.node}
                # each node's launcher hangs up once it has read what it needs (or is gone)
                self.server.run(lambda: not any(peer.wrote & nodes for peer in self.server.peers.values()), 0.05)
                said_last = self.server.get(final) is not None
                told = self.server.get(failed)
                regroup = self.server.get(self.key("regroup")) is not None
                if self.late is not None:  # and the late nodes hear whether the nodes meet again
                    again = late_nodes.meets_again(regroup, told is not None, said_last)
                    self.late.say_after(self.server, again, self.slots)
            elif self.client is not None:
                if last:
                    self.client.set(final, "1")
                if status and not self.client.check([failed]):
                    self.client.set(failed, why)
                self.client.set(keys[self.node], str(status))
                while not (self.client.check(keys) or self.client.check([failed, keys[self.host_rank]])):
                    time.sleep(0.05)  # the others still run: the store answers while they do
                said_last = said_last or self.client.check([final])
                told = self.client.get(failed) if self.client.check([failed]) else None
                regroup = self.client.check([self.key("regroup")])
            self.regroup = regroup and told is None
            if not status and told is not None:
                self.elsewhere = told.decode(errors="replace")
        except (tcpstore.StoreError, OSError) as exc:
            said_last = True  # the store's launcher is gone: no attempt can meet again
            if self.server is None and not status:  # this node's ranks ended well; the job did not
                self.elsewhere = f"the rendezvous store at {self.where} went away before every node's job ended"
                if isinstance(exc, tcpstore.StoreError):
                    self.elsewhere += f" ({exc.why})"
        finally:
            self.close()
        return said_last

    def close(self) -> None:
        if self.server is not None and self.server.refusals():
            self.say(f"the rendezvous store at {self.where} {self.server.refusals()}")
        for thing in (self.watcher, self.client, self.server, self.late):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self.watcher = self.client = self.server = None


def _stderr(note: str) -> None:
    sys.stderr.write(f"mpilaunch: {note}\n")
