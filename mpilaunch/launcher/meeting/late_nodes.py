"""torchrun's elastic scale-up (--nnodes MIN:MAX): a node whose launcher comes after the nodes'
meeting closed is taken in at the next restart of the ranks, as torchrun 2.13 takes it.

What torch 2.13 does (torch/distributed/elastic): the late agent joins the rendezvous's wait list
when fewer than MAX nodes run (else its redundancy list: a spare, which nothing restarts for, and
which waits without a time limit); every running agent asks `num_nodes_waiting()` on each
monitor turn while its workers are healthy, and when one waits stops them (SIGTERM, then
SIGKILL after the shutdown timeout) and meets again: the new round takes the late node in, and
the world grows. This restart is not counted against --max-restarts ("membership changes do not
count as retries": TORCHELASTIC_RESTART_COUNT stays, and it happens with --max-restarts 0). A
late node whose job ends first fails with status 1.

Here the late launcher writes `waiting/<arrival>` in the round's store; the store's launcher sees
it as it serves that write (its controller's loop serves the store), and, while no node's ranks
failed or ended, writes `regroup` with the line each launcher says; every other launcher waits
for that key on a connection of its own, in its controller's selector. Each then stops its
ranks as for any restart (`NodesRegroup`). At the end of each round the store's launcher writes
`after` (the nodes meet again, or not) for the late launchers, and keeps the store up until they
have read it (LATE_GRACE seconds at most).
"""

from __future__ import annotations

import selectors
import time

from mpilaunch.host import tcpstore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

WAITING = "waiting"  # fewer than MAX nodes run: the nodes restart to take it in
SPARE = "spare"  # MAX nodes run: it waits, taken in only if a later meeting has room
NEXT, OVER = "next", "over"  # the round's end: the nodes meet again, or the job is over
LATE_GRACE = 5.0  # seconds the store stays up for late launchers to read the round's end
SPARE_LOOK = 3600.0  # a spare's wait has no limit: it asks again after this long


# -- decisions -------------------------------------------------------------------------------------
def late_place(nodes: int, most: int) -> str:
    """Where a node that came after the meeting closed with `nodes` waits."""
    return WAITING if nodes < most else SPARE


def regroup_now(waiting: int, ended: bool) -> bool:
    """Whether the running nodes stop their ranks to meet again with the waiting ones: only while
    no node's ranks failed or ended (torchrun restarts for new nodes from its HEALTHY state)."""
    return waiting > 0 and not ended


def meets_again(regroup: bool, failed: bool, final: bool) -> bool:
    """Whether the nodes meet again after a round: for a late node (no failure: not counted), or
    after a failure, unless a node said it starts no other attempt."""
    return (regroup and not failed) or (failed and not final)


def late_words(where: str, nodes: int, most: int, place: str) -> str:
    if place == WAITING:
        return (
            f"the nodes' meeting at {where} closed with {nodes} nodes before this one came: "
            "it waits to be taken in at their next restart"
        )
    return (
        f"the nodes' meeting at {where} closed with {nodes} of at most {most} nodes before this one came: "
        "it waits as a spare, taken in only if a later meeting has room"
    )


def regroup_words(hosts: Sequence[str], nodes: int) -> str:
    """`node at HOST joined late: restarting the ranks with 3 nodes`."""
    which = f"node at {hosts[0]}" if len(hosts) == 1 else f"nodes at {', '.join(hosts)}"
    return f"{which} joined late: restarting the ranks with {nodes} nodes"


def wait_after(client: tcpstore.StoreClient, key: str, timeout: float | None) -> str:
    """The round's end as the store's launcher says it (`timeout` None: no limit, a spare's)."""
    while True:
        try:
            return client.get(key, SPARE_LOOK if timeout is None else timeout).decode(errors="replace")
        except tcpstore.StoreTimeout:
            if timeout is not None:
                raise


# -- the running nodes' side -------------------------------------------------------------------------
class LateWatch:
    """Late nodes, as the running launchers see them: `key` names a key of the current round."""

    def __init__(self, key: Callable[[str], str]) -> None:
        self.key = key
        self.conn: tcpstore.StoreClient | None = None  # a node's: it waits for `regroup` there (opened as it joins)
        self.sel: selectors.BaseSelector | None = None
        self.heard: Callable[[str], None] | None = None
        self.said = False  # the regroup was said: once a round

    def watch_from(
        self, sel: selectors.BaseSelector, heard: Callable[[str], None], server: tcpstore.StoreServer | None
    ) -> None:
        """From now on `heard(line)` is called, once, when the ranks are to start again with a late node."""
        self.heard, self.sel, self.said = heard, sel, False
        if server is not None or self.conn is None:
            return
        try:
            self.conn.wait_begin([self.key("regroup")])
        except tcpstore.StoreError:
            return  # the store is gone: the nodes' watch says so
        sel.register(self.conn.fileno(), selectors.EVENT_READ, lambda fd: self._woken())

    def look(self, server: tcpstore.StoreServer, slots: Sequence[int], most: int) -> None:
        """The store's launcher, after serving a request: says the regroup if a late node waits
        and every node's ranks still run."""
        if self.said or self.heard is None:
            return
        arrived = int(server.get(self.key("arrivals")) or 0)
        waiting = [server.get(self.key(f"waiting/{slot}")) for slot in range(arrived) if slot not in slots]
        hosts = [value.decode(errors="replace").split()[0] for value in waiting if value]
        keys = [self.key("failed"), *(self.key(f"done/{k}") for k in range(len(slots)))]
        if not regroup_now(len(hosts), any(server.get(key) is not None for key in keys)):
            return
        line = regroup_words(hosts, min(len(slots) + len(hosts), most))
        self.said = True
        server.set(self.key("regroup"), line)
        self.heard(line)

    def _woken(self) -> None:
        assert self.conn is not None and self.sel is not None and self.heard is not None
        self.sel.unregister(self.conn.fileno())
        try:
            self.conn.wait_end(self.conn.timeout)
            line = self.conn.get(self.key("regroup")).decode(errors="replace")
        except tcpstore.StoreError:
            return  # the store went away: the nodes' watch says so
        self.said = True
        self.heard(line)

    def closed(self, server: tcpstore.StoreServer, peer: tcpstore.Peer) -> None:
        """A connection closed: a late launcher that went away waits no more."""
        for key in peer.wrote:
            if key.startswith(self.key("waiting/")):
                server.delete(key)

    def say_after(self, server: tcpstore.StoreServer, again: bool, slots: Sequence[int]) -> None:
        """The store's launcher at the round's end, every node gone: tell the late launchers
        whether the nodes meet again, and keep the store until they read it."""
        server.set(self.key("after"), NEXT if again else OVER)
        prefix, nodes = self.key("joined/"), {self.key(f"joined/{slot}") for slot in slots}
        deadline = time.monotonic() + LATE_GRACE

        def read() -> bool:
            late = any(k.startswith(prefix) and k not in nodes for p in server.peers.values() for k in p.wrote)
            return not late or time.monotonic() > deadline

        server.run(read, 0.05)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
