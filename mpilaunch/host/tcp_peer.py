"""Who is at the other end of a loopback TCP connection: the user its socket belongs to. A TCP
port has no SO_PEERCRED, and anyone on the host may connect to one on 127.0.0.1; the agent's PMI
port serves only processes of its own user (agent/services/pmi_tcp.py).

The kernel is asked for that one socket (sock_diag over netlink: what `ss` uses, tens of
microseconds); where it cannot be, /proc/net/tcp is read (every socket of the host: milliseconds
on a busy one). A socket that no process holds any more (inode 0: closed, or in TIME_WAIT) has no
owner: its connection is gone.
"""

from __future__ import annotations

import _socket
import struct
import sys

TCP_TABLE = "/proc/net/tcp"
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
ENOENT = 2
ANY_STATE = 0xFFFFFFFF
NO_COOKIE = 0xFFFFFFFF
UID_AT = 16 + 4 + 48 + 12  # in the answer: netlink header, family/state/timer/retrans, socket id, expires/queues
DIAG_WAIT = 1.0  # seconds the kernel has to answer


def table_address(ip: str, port: int) -> str:
    """An IPv4 address and port as /proc/net/tcp writes them: the address's four bytes read as
    one number in the host's byte order, then the port, both in hex."""
    packed = bytes(int(part) for part in ip.split("."))
    return f"{int.from_bytes(packed, sys.byteorder):08X}:{port:04X}"


def owner_in(table: str, local: str, remote: str) -> int | None:
    """The uid of the socket listed with these local and remote addresses (table_address), or
    None when no process holds such a socket."""
    for line in table.splitlines()[1:]:
        fields = line.split()  # sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode
        if len(fields) > 9 and fields[1] == local and fields[2] == remote and fields[9] != "0":
            return int(fields[7])
    return None


def diag_request(local: tuple[str, int], remote: tuple[str, int]) -> bytes:
    """A netlink message asking for the one TCP socket with these local and remote ends."""
    body = struct.pack("=BBBxI", _socket.AF_INET, _socket.IPPROTO_TCP, 0, ANY_STATE)
    body += struct.pack("!HH", local[1], remote[1])
    body += _socket.inet_aton(local[0]) + bytes(12) + _socket.inet_aton(remote[0]) + bytes(12)
    body += struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)  # any interface; no cookie to match
    return struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body


def diag_owner(answer: bytes) -> int | None:
    """The uid in the kernel's answer to diag_request; None when no process holds that socket.
    OSError: the kernel could not answer (no sock_diag)."""
    if len(answer) < 20:
        raise OSError("short sock_diag answer")
    kind = struct.unpack_from("=H", answer, 4)[0]
    if kind == NLMSG_ERROR:
        error = -struct.unpack_from("=i", answer, 16)[0]
        if error == ENOENT:
            return None
        raise OSError(error, "sock_diag")
    if kind != SOCK_DIAG_BY_FAMILY or len(answer) < UID_AT + 8:
        raise OSError("unexpected sock_diag answer")
    uid, inode = struct.unpack_from("=II", answer, UID_AT)
    return uid if inode else None


def peer_uid(ours: tuple[str, int], peer: tuple[str, int]) -> int | None:
    """The uid of the process end of a connection this process accepted on `ours` from `peer`
    (both IPv4 addresses of this host); None when no process holds it any more. OSError: neither
    the kernel nor /proc/net/tcp could say."""
    try:
        link = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        try:
            link.settimeout(DIAG_WAIT)
            link.send(diag_request(peer, ours))
            return diag_owner(link.recv(4096))
        finally:
            link.close()
    except OSError:
        pass  # no sock_diag here (an old or a restricted kernel): the table
    with open(TCP_TABLE, encoding="ascii", errors="replace") as handle:
        table = handle.read()
    return owner_in(table, table_address(*peer), table_address(*ours))
