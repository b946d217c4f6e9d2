"""How a launcher reaches the nodes' store that another launcher serves (launcher/meeting/rendezvous.py),
and what it says when it cannot: in one line naming the endpoint, with torchrun's status 1.

A store that refuses the connection may not be up yet (its launcher starts later): it is tried
again until the join timeout, said once after NOTICE_AFTER seconds. A host that does not resolve,
or has no route to it, is said at once. The store of the attempt before may still be up, waiting
for the other nodes to hang up: its launcher writes `mpilaunch/<attempt>/serves` before it
serves anyone, so a launcher of the next attempt waits for it to go rather than join there;
a launcher's first meeting under c10d's numbering is whichever round the store serves
(`mpilaunch/round`), so that one that comes late meets the nodes where they are.
Once a launcher joined its attempt's store, that store going away is the end of the meeting.
"""

from __future__ import annotations

import socket
import time

from mpilaunch.errors import LaunchError
from mpilaunch.host import tcpstore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

ROUND = "mpilaunch/round"  # the round the store serves, for a launcher's first meeting under c10d's numbering
NOTICE_AFTER = 5.0  # seconds a store that refuses is tried before the wait is said
STATUS = 1  # torchrun's, for a rendezvous that failed (RendezvousConnectionError, ...Timeout)


def serves(attempt: int) -> str:
    """The key that says the store is this attempt's meeting's, set before it serves anyone."""
    return f"mpilaunch/{attempt}/serves"


def endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(host: str, port: int) -> None:
    """LaunchError now if the endpoint's host has no address at all: no launcher could ever meet there."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        why, final = tcpstore.connect_error(exc)
        if final:
            raise LaunchError(f"cannot reach the rendezvous store at {endpoint(host, port)}: {why}", STATUS) from None


def gone(host: str, port: int, exc: tcpstore.StoreError) -> LaunchError:
    """The store this launcher had joined went away while the nodes met (its launcher was
    killed, its host lost)."""
    return LaunchError(
        f"the rendezvous store at {endpoint(host, port)} went away while the nodes met ({exc.why})", STATUS
    )


def torchruns_key(run_id: str) -> str:
    """The key torchrun's c10d rendezvous keeps its state under, as torch's client writes it
    (with the "/" its TCPStore puts before every key): a store that holds it is a torchrun's."""
    return f"/torch.rendezvous.{run_id or 'none'}"


def not_ours(where: str, key: str) -> LaunchError:
    """A torchrun, not an mpilaunch, is another node of this meeting."""
    return LaunchError(
        f"a torchrun, not an mpilaunch, is a node of the meeting at {where} (its {key} is in the store): start "
        "every node of the job with mpilaunch, or every one with torchrun",
        STATUS,
    )


def reach(
    host: str,
    port: int,
    attempt: int | None,
    deadline: float,
    say: Callable[[str], None],
    take: Callable[[], bool] | None = None,
    timeout: float | None = None,
    theirs: str = "",
) -> tcpstore.StoreClient | None:
    """A connection to the store of this attempt's meeting (None: of any round), once it is up
    (LaunchError at the deadline, or at once when no connection can be made); None if `take()`,
    tried whenever there is no such store yet, took the store here. `timeout`: the deadline's,
    as said; `theirs`: torchrun's key for this job, which means the store is a torchrun's."""
    where = endpoint(host, port)
    total = deadline - time.monotonic() if timeout is None else timeout
    said = total < 2 * NOTICE_AFTER  # a wait that short is not worth a line
    while True:
        if take is not None and take():
            return None
        left = deadline - time.monotonic()
        patience = 0 if take is not None else min(left, NOTICE_AFTER) if not said else left  # take: once
        try:
            client = tcpstore.StoreClient(host, port, max(left, 0.1), patience)
        except tcpstore.StoreUnreachable as exc:
            raise LaunchError(f"cannot reach the rendezvous store at {where}: {exc.why}", STATUS) from None
        except tcpstore.StoreError as exc:
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"cannot connect to the rendezvous store at {where} within {total:g} s: {exc.why}", STATUS
                ) from None
            if take is not None:  # refused: the port is free for this launcher to take, or soon
                time.sleep(0.05)
                continue
            if not said:
                said = True
                say(
                    f"waiting for the rendezvous store at {where} ({exc.why}): its launcher may start later; "
                    f"{total:g} s at most"
                )
            continue
        try:
            if client.check([ROUND if attempt is None else serves(attempt)]):
                return client
            if theirs and client.check([theirs]):
                client.close()
                raise not_ours(where, theirs)
        except tcpstore.StoreError:  # it closed as this one came: the store of the attempt before
            pass
        client.close()
        if time.monotonic() >= deadline:
            raise LaunchError(f"the store at {where} served another attempt's meeting until the timeout", STATUS)
        time.sleep(0.05)
