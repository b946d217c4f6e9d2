"""torchrun's way across nodes: a launcher on each node, meeting at the endpoint
(`--master-addr:--master-port`, or `--rdzv-endpoint`), as torchrun's rendezvous does.

With `--node-rank K` (static, or c10d with a fixed --nnodes N), node 0's launcher serves a
TCPStore there (host/tcpstore.py); each launcher writes `mpilaunch/joined/K` and waits until
every node's is there. Under c10d without a node rank (or with --nnodes MIN:MAX), the meeting
numbers the nodes, as torchrun's c10d rendezvous does: the launcher on the endpoint's machine
(the first there to bind its port; `--rdzv-conf is_host=` decides otherwise) serves the store;
each launcher takes an arrival number and writes `joined/<arrival>` (host and pid); the store's
launcher closes the meeting when MAX joined, or MIN and then `last_call` seconds passed, and
writes the node order (by host, then pid: torch's order) to `nodes`. Either way the store is
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

import ipaddress
import json
import os
import selectors
import socket
import sys
import time

from mpilaunch.errors import LaunchError
from mpilaunch.host import tcpstore
from mpilaunch.launcher.meeting import store_reach
from mpilaunch.launcher.meeting.store_reach import STATUS, endpoint
from mpilaunch.plan.spec import TorchRun

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

JOIN_TIMEOUT = 600.0  # seconds a launcher waits for the other nodes' (torchrun's join_timeout)
PREFIX = "mpilaunch/"


class NodeRendezvous:
    """This node's side of the meeting: one launcher serves the store, the others are its clients."""

    def __init__(
        self, torch: TorchRun, attempt: int = 0, timeout: float | None = None, say: Callable[[str], None] | None = None
    ) -> None:
        assert torch.nnodes is not None and torch.endpoint is not None
        self.node, self.nodes = torch.node_rank, torch.nnodes  # node None: the meeting numbers it
        self.fewest = torch.min_nodes or torch.nnodes
        self.last_call = torch.last_call
        self.is_host = torch.is_host
        self.host, self.port = torch.endpoint
        self.timeout = torch.join_timeout if timeout is None else timeout
        self.attempt = attempt
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

    def key(self, name: str) -> str:
        return f"{PREFIX}{self.attempt}/{name}"

    @property
    def name(self) -> str:
        return "this node" if self.node is None else f"node {self.node}"

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
        self.server = server
        return server

    def _meet(self) -> None:
        """c10d's meeting, which numbers the nodes: served here if the endpoint is this machine
        and its port is free (now, or once the store of the attempt before went), else met there."""
        deadline = time.monotonic() + self.timeout
        serve = ends_here(self.host) if self.is_host is None else self.is_host
        client = None
        if not (serve and self._take_store()):
            take = self._take_store if serve else None
            client = store_reach.reach(self.host, self.port, self.attempt, deadline, self.say, take, self.timeout)
        slots, host = self._close(deadline) if client is None else self._arrive(client, deadline)
        if self.slot not in slots:
            self.close()
            raise LaunchError(
                f"the nodes' meeting at {self.where} closed with {len(slots)} nodes before this one "
                "joined (a node that comes late is not taken in)",
                STATUS,
            )
        self.slots, self.nodes = slots, len(slots)
        self.node, self.host_rank = slots.index(self.slot), slots.index(host)

    def _take_store(self) -> bool:
        """Serve the meeting's store; False if another launcher of this machine already does."""
        try:
            self._open_store()
            return True
        except OSError as exc:
            if self.is_host:
                raise LaunchError(f"cannot serve the rendezvous on port {self.port}: {exc.strerror}", STATUS) from None
            return False

    def _close(self, deadline: float) -> tuple[list[int], int]:
        """The store's side: close the meeting with MAX nodes, or MIN after the last call."""
        server = self.server
        assert server is not None
        self.slot = server.add(self.key("arrivals"), 1) - 1
        server.set(self.key(f"joined/{self.slot}"), f"{socket.gethostname()} {os.getpid()}")
        last_call: list[float] = []

        def closed() -> bool:
            count = len(self._joined())
            now = time.monotonic()
            if count < self.fewest:
                last_call.clear()  # torchrun's deadline too starts again when MIN is reached again
            elif not last_call:
                last_call.append(now + self.last_call)
            return count >= self.nodes or (bool(last_call) and now >= last_call[0]) or now > deadline

        server.run(closed, 0.05)
        joined = self._joined()
        if len(joined) < self.fewest:
            self.close()
            raise LaunchError(
                f"{len(joined)} of at least {self.fewest} nodes joined at {self.where} within {self.timeout:g} s",
                STATUS,
            )
        slots = sorted(joined, key=lambda slot: (joined[slot][0], int(joined[slot][1]), slot))
        server.set(self.key("nodes"), json.dumps({"slots": slots, "host": self.slot}))
        return slots, self.slot

    def _joined(self) -> dict[int, list[str]]:
        """The launchers that arrived and are still there (arrival: host and pid)."""
        assert self.server is not None
        arrived = int(self.server.get(self.key("arrivals")) or 0)
        values = {slot: self.server.get(self.key(f"joined/{slot}")) for slot in range(arrived)}
        return {slot: value.decode().split() for slot, value in values.items() if value is not None}

    def _arrive(self, client: tcpstore.StoreClient, deadline: float) -> tuple[list[int], int]:
        """A client's side: arrive, and read the nodes' order once the meeting closed."""
        self.client = client
        try:
            self.watcher = tcpstore.StoreClient(self.host, self.port, self.timeout, patience=0)
            self.slot = client.add(self.key("arrivals"), 1) - 1
            client.set(self.key(f"joined/{self.slot}"), f"{socket.gethostname()} {os.getpid()}")
            said = json.loads(client.get(self.key("nodes"), max(deadline - time.monotonic(), 0.1)))
            return [int(slot) for slot in said["slots"]], int(said["host"])
        except tcpstore.StoreTimeout:
            self.close()
            raise LaunchError(
                f"the nodes' meeting at {self.where} did not close within {self.timeout:g} s (fewer "
                f"than {self.fewest} nodes joined)",
                STATUS,
            ) from None
        except tcpstore.StoreError as exc:
            raise self._gone(exc) from None

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
    def watch_from(self, sel: selectors.BaseSelector, lost: Callable[[str], None]) -> None:
        """From now on `lost(why)` is called, once, when another node's job ended badly or its
        launcher went away: the controller's loop serves the store (its launcher) or waits on it."""
        self.lost, self.sel = lost, sel
        if self.server is not None:
            self.server.set(self.key("running"), "1")
            sel.register(self.server.sel, selectors.EVENT_READ, lambda fd: self._serve())
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
        if self.server is None or self.over:
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
                self.server.set(keys[self.node], str(status))
                nodes = {self.key(f"joined/{slot}") for k, slot in enumerate(self.slots) if k != self.node}
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
                while not (self.client.check(keys) or self.client.check([failed, keys[self.host_rank]])):
                    time.sleep(0.05)  # the others still run: the store answers while they do
                said_last = said_last or self.client.check([final])
                told = self.client.get(failed) if self.client.check([failed]) else None
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
        for thing in (self.watcher, self.client, self.server):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self.watcher = self.client = self.server = None


def ends_here(host: str) -> bool:
    """Whether the endpoint is this machine, as torch's c10d backend decides whether it hosts
    the store: localhost, a loopback address, this machine's name or one of its addresses."""
    if host == "localhost" or host in (socket.gethostname(), socket.gethostname().split(".")[0]):
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    try:
        theirs = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
        ours = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return False
    return bool(theirs & ours)


def _stderr(note: str) -> None:
    sys.stderr.write(f"mpilaunch: {note}\n")
