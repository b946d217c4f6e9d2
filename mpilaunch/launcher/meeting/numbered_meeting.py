"""c10d's meeting, which numbers the nodes (torchrun without --node-rank, or with --nnodes MIN:MAX),
and the node that comes after it closed: NodeRendezvous's (launcher/meeting/rendezvous.py) for that way.

The launcher on the endpoint's machine (the first there to bind its port; `--rdzv-conf is_host=`
decides otherwise) serves the store; each launcher takes an arrival number and writes
`joined/<arrival>` (host and pid); the store's launcher closes the meeting when MAX joined, or
MIN and then `last_call` seconds passed, and writes the node order (by host, then pid: torch's
order) to `nodes`. A launcher's first meeting is the store's current one (`mpilaunch/round`), so
one that comes while a restart's meeting is open joins it.

A launcher that comes once the meeting closed waits, as torchrun 2.13's does, to be taken in at
the next restart (launcher/meeting/late_nodes.py): with fewer than MAX nodes running it says it waits
(`waiting/<arrival>`), and the running launchers restart their ranks at once to meet again with
it; with MAX running it is a spare, for which nothing restarts. Either way it learns at the end of
the round (`after`) whether the nodes meet again, and then meets with them, or that the job is
over: one line, torchrun's status 1.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time

from mpilaunch.errors import LaunchError
from mpilaunch.host import tcpstore
from mpilaunch.launcher.meeting import late_nodes, store_reach
from mpilaunch.launcher.meeting.store_reach import STATUS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class NumberedMeeting:
    """The meeting that numbers the nodes; mixed into NodeRendezvous, whose state it shares."""

    host: str
    port: int
    attempt: int  # the round of the meeting: the same on every node
    adopt: bool  # a launcher's first meeting: the round the store serves now
    timeout: float
    is_host: bool | None
    nodes: int  # MAX, then the nodes that met
    fewest: int
    most: int  # MAX
    last_call: float
    slot: int
    slots: list[int]
    node: int | None
    host_rank: int
    server: tcpstore.StoreServer | None
    client: tcpstore.StoreClient | None
    watcher: tcpstore.StoreClient | None
    late: late_nodes.LateWatch | None
    say: Callable[[str], None]
    where: str
    theirs: str  # torchrun's key for this job: a torchrun came to the meeting (store_reach.torchruns_key)

    if TYPE_CHECKING:  # NodeRendezvous's

        def key(self, name: str) -> str: ...
        def close(self) -> None: ...
        def _open_store(self) -> tcpstore.StoreServer: ...
        def _gone(self, exc: tcpstore.StoreError) -> LaunchError: ...

    def _meet(self) -> None:
        """Served here if the endpoint is this machine and its port is free (now, or once the
        store of the round before went), else met there; met again, a round later, by a
        launcher that came too late for this one."""
        while True:
            deadline = time.monotonic() + self.timeout
            serve = ends_here(self.host) if self.is_host is None else self.is_host
            client = None
            if not (serve and self._take_store()):
                take = self._take_store if serve else None
                round_ = None if self.adopt else self.attempt
                client = store_reach.reach(
                    self.host, self.port, round_, deadline, self.say, take, self.timeout, self.theirs
                )
            slots, host = self._close(deadline) if client is None else self._arrive(client, deadline)
            if self.slot in slots:
                break
            self._wait_late(len(slots), self.most)
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
            if server.data.present(self.theirs):
                self.close()
                raise store_reach.not_ours(self.where, self.theirs)
            count = len(self._joined())
            now = time.monotonic()
            if count < self.fewest:
                last_call.clear()  # torchrun's deadline too starts again when MIN is reached again
            elif not last_call:
                last_call.append(now + self.last_call)
            return count >= self.most or (bool(last_call) and now >= last_call[0]) or now > deadline

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
            if self.adopt:  # the store's round, whichever it is
                self.attempt, self.adopt = int(client.get(store_reach.ROUND)), False
            self.watcher = tcpstore.StoreClient(self.host, self.port, self.timeout, patience=0)
            if self.late is not None:  # the job may grow: a late node's word reaches this one there
                self.late.conn = tcpstore.StoreClient(self.host, self.port, self.timeout, patience=0)
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

    def _wait_late(self, nodes: int, most: int) -> None:
        """This launcher came after the meeting closed with `nodes`: it waits, in the waiting list
        or as a spare, until the round ends; then it meets the next (LaunchError if there is none)."""
        client = self.client
        assert client is not None
        place = late_nodes.late_place(nodes, most)
        try:
            if place == late_nodes.WAITING:
                client.set(self.key(f"waiting/{self.slot}"), f"{socket.gethostname()} {os.getpid()}")
            self.say(late_nodes.late_words(self.where, nodes, most, place))
            limit = self.timeout if place == late_nodes.WAITING else None  # a spare waits as long as the job runs
            after = late_nodes.wait_after(client, self.key("after"), limit)
        except tcpstore.StoreTimeout:
            self.close()
            raise LaunchError(
                f"the nodes at {self.where} did not take this node in within {self.timeout:g} s", STATUS
            ) from None
        except tcpstore.StoreError as exc:
            self.close()
            raise LaunchError(
                f"the rendezvous store at {self.where} went away while this node waited to be taken in ({exc.why})",
                STATUS,
            ) from None
        self.close()
        if after != late_nodes.NEXT:
            raise LaunchError(f"the job at {self.where} ended before this node was taken in", STATUS)
        self.attempt += 1


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
