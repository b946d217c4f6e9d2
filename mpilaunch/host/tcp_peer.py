"""Who is at the other end of a loopback TCP connection: the user its socket belongs to, as
/proc/net/tcp lists it. A TCP port has no SO_PEERCRED, and anyone on the host may connect to
one on 127.0.0.1; the agent's PMI port serves only processes of its own user (agent/services/pmi_tcp.py)."""

from __future__ import annotations

import sys

TCP_TABLE = "/proc/net/tcp"
TIME_WAIT = "06"  # a closed connection's leftover, listed with uid 0


def table_address(ip: str, port: int) -> str:
    """An IPv4 address and port as /proc/net/tcp writes them: the address's four bytes read as
    one number in the host's byte order, then the port, both in hex."""
    packed = bytes(int(part) for part in ip.split("."))
    return f"{int.from_bytes(packed, sys.byteorder):08X}:{port:04X}"


def owner_in(table: str, local: str, remote: str) -> int | None:
    """The uid of the socket listed with these local and remote addresses (table_address), or None."""
    for line in table.splitlines()[1:]:
        fields = line.split()  # sl, local, remote, state, queues, timer, retransmits, uid, ...
        if len(fields) > 7 and fields[1] == local and fields[2] == remote and fields[3] != TIME_WAIT:
            return int(fields[7])
    return None


def peer_uid(ours: tuple[str, int], peer: tuple[str, int]) -> int | None:
    """The uid of the process end of a connection this process accepted on `ours` from `peer`
    (both on this host); None when the peer's socket is not listed (it has closed). OSError: no
    /proc/net/tcp to read."""
    with open(TCP_TABLE, encoding="ascii", errors="replace") as handle:
        table = handle.read()
    return owner_in(table, table_address(*peer), table_address(*ours))
