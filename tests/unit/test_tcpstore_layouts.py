"""The ranks' store, one transcript per TCPStore layout of torch 2.0 to 2.13, byte for byte
(2.14 sends what 2.13 does: its real client runs in tests/tools/test_torch_releases.py).

Each layout's requests are written here as that release's client (its TCPStore.cpp) sends
them, with its own command numbers, not the server's constants: torch before 2.2 numbers its
commands from SET = 0 with WATCH_KEY at 7, sends no VALIDATE and opens a second, silent
connection for key callbacks; from 2.2 VALIDATE is 0 and opens every connection with the magic
number, WATCH_KEY is gone; later a PING with the client's pid follows it (the server echoes
it), and the commands were only ever added at the end (PING 13, then QUEUE_PUSH 14, QUEUE_POP
15, QUEUE_LEN 16, LIST_KEYS 17, BARRIER 18 in 2.13). Every client's constructor adds 1 to
`init/` (waitForWorkers), and its `get` is a WAIT then a GET. The answers are what torch's
server answers, and nothing more is sent. torch 2.13 itself runs against the store in
tests/local/test_tcpstore_torch.py.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest

from mpilaunch.host import tcpstore
from mpilaunch.plan.finalize import STORE_SERVES, store_serves
from tests.unit.test_tcpstore import Rig, exchange

OLD = dict(SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6, WATCH_KEY=7, DELETE_KEY=8)
OLD.update(APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12)
NEW = dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7, DELETE_KEY=8)
NEW.update(APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12, PING=13)
NEW.update(QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16, LIST_KEYS=17, BARRIER=18)
MAGIC = struct.pack("=I", 0x3C85F7CE)
READY, NOT_READY, STOP_WAITING, WAIT_CANCELED = b"\0", b"\1", b"\0", b"\1"


def u64(n: int) -> bytes:
    return struct.pack("=Q", n)


def i64(n: int) -> bytes:
    return struct.pack("=q", n)


def text(data: bytes) -> bytes:
    """A key or a value as torch sends it: its uint64 length, then its bytes."""
    return u64(len(data)) + data


def request(numbers: dict[str, int], command: str, *fields: bytes) -> bytes:
    return bytes((numbers[command],)) + b"".join(fields)


def common(numbers: dict[str, int]) -> list[tuple[bytes, bytes]]:
    """What every release's client sends for set, get, add, check, compare_set, num_keys and
    delete_key (the Python store's key prefix `/` included), with its server's answers."""
    r = lambda *parts: request(numbers, *parts)  # noqa: E731
    return [
        (r("ADD", text(b"init/"), i64(1)), i64(1)),  # the constructor's waitForWorkers
        (r("SET", text(b"/k"), text(b"v1")), b""),
        (r("WAIT", u64(1), text(b"/k")), STOP_WAITING),  # get("k"): the wait ...
        (r("GET", text(b"/k")), text(b"v1")),  # ... then the value
        (r("ADD", text(b"/n"), i64(5)), i64(5)),
        (r("ADD", text(b"/n"), i64(-2)), i64(3)),
        (r("CHECK", u64(2), text(b"/k"), text(b"/n")), READY),
        (r("CHECK", u64(1), text(b"/none")), NOT_READY),
        (r("COMPARE_SET", text(b"/k"), text(b"v1"), text(b"v2")), text(b"v2")),
        (r("COMPARE_SET", text(b"/k"), text(b"no"), text(b"v3")), text(b"v2")),
        (r("GETNUMKEYS"), i64(3)),  # init/ /k /n
        (r("DELETE_KEY", text(b"/n")), i64(1)),
        (r("DELETE_KEY", text(b"/n")), i64(0)),
    ]


def extended(numbers: dict[str, int]) -> list[tuple[bytes, bytes]]:
    """append, multi_get, multi_set, and a wait's timeout (CANCEL_WAIT), as every release from
    2.1 sends them."""
    r = lambda *parts: request(numbers, *parts)  # noqa: E731
    return [
        (r("APPEND", text(b"/k"), text(b"+a")), b""),
        (r("MULTI_SET", u64(2), text(b"/m1"), text(b"x"), text(b"/m2"), text(b"")), b""),
        (r("MULTI_GET", u64(3), text(b"/k"), text(b"/m1"), text(b"/m2")), text(b"v2+a") + text(b"x") + text(b"")),
        (r("CANCEL_WAIT"), WAIT_CANCELED),
    ]


def queues_and_barrier() -> list[tuple[bytes, bytes]]:
    """torch 2.13's queue_push, queue_len, queue_pop (non-blocking: the length before, then the
    value), list_keys and a barrier of one."""
    r = lambda *parts: request(NEW, *parts)  # noqa: E731
    return [
        (r("QUEUE_PUSH", text(b"/q"), text(b"first")), b""),
        (r("QUEUE_PUSH", text(b"/q"), text(b"second")), b""),
        (r("QUEUE_LEN", text(b"/q")), i64(2)),
        (r("QUEUE_POP", text(b"/q")), i64(2) + text(b"first")),
        (r("LIST_KEYS"), i64(4) + b"".join(text(k) for k in (b"init/", b"/k", b"/m1", b"/m2"))),  # as made
        (r("BARRIER", text(b"/b"), i64(1)), STOP_WAITING),
    ]


PID = struct.pack("=I", os.getpid())
LAYOUTS = {
    "torch 2.0 and 2.1 (no VALIDATE, from SET = 0)": lambda: common(OLD) + extended(OLD),
    "torch 2.2 and 2.3 (VALIDATE)": lambda: [(request(NEW, "VALIDATE", MAGIC), b""), *common(NEW), *extended(NEW)],
    "torch 2.4 on (VALIDATE, PING)": lambda: [
        (request(NEW, "VALIDATE", MAGIC), b""),
        (request(NEW, "PING", PID), PID),
        *common(NEW),
        *extended(NEW),
    ],
    "torch 2.13 (queues, list_keys, barrier)": lambda: [
        (request(NEW, "VALIDATE", MAGIC), b""),
        (request(NEW, "PING", PID), PID),
        *common(NEW),
        *extended(NEW),
        *queues_and_barrier(),
    ],
}


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    made.close()


def nothing_more(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""  # closed: not expected either
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_layouts_client_gets_torchs_answers_byte_for_byte(rig: Rig, layout: str) -> None:
    """Before, a client of torch before 2.2 was refused at its first request and its rank saw a
    timeout."""
    sock = rig.raw()
    callbacks = rig.raw() if "no VALIDATE" in layout else None  # torch 2.0/2.1's silent second connection
    for sent, answer in LAYOUTS[layout]():
        assert exchange(rig, sock, sent, len(answer)) == answer, (layout, sent)
    assert nothing_more(sock)
    assert rig.server.refused == 0 and not rig.closed
    assert len(rig.server.peers) == (2 if callbacks else 1)  # the callback connection is kept, unread
    sock.close()
    if callbacks is not None:
        callbacks.close()


def test_a_command_after_those_served_is_said_once_and_its_connection_closed(rig: Rig) -> None:
    """A newer torch than 2.13 whose release could not be read before launch: its first command
    past BARRIER closes its connection (its rank fails at once, no timeout) and the owner is told
    once, naming the range served; an unknown command of the older numbering is no newer torch."""
    told: list[str] = []
    rig.server.on_unserved = told.append
    for dropped in (1, 2):
        sock = rig.raw()
        exchange(rig, sock, request(NEW, "VALIDATE", MAGIC) + request(NEW, "PING", PID), 4)
        sock.sendall(bytes((19,)) + text(b"/x"))
        rig.turn_until(lambda n=dropped: rig.server.refused == n)
        assert sock.recv(1) == b""  # closed, not left waiting
        sock.close()
    old = rig.raw()
    old.sendall(request(OLD, "SET", text(b"/a"), text(b"1")) + bytes((13,)))
    rig.turn_until(lambda: rig.server.refused == 3)
    old.close()
    assert told == ["command 19, which no torch from 2.0 to 2.14 sends"]


def test_the_range_the_launcher_reads_is_the_one_the_store_serves() -> None:
    first, last = (".".join(map(str, r)) for r in STORE_SERVES)
    assert tcpstore.SERVED_TORCH == f"{first} to {last}"
    served = ["2.0.0", "2.1.2+cpu", "2.2.0+cu121", "2.13.0+cpu", "2.13.1", "2.14.1+cu130"]
    assert [store_serves(r) for r in served] == [True] * 6
    unserved = ["1.13.1+cu117", "2.15.0", "2.15.0.dev20260101+cpu", "3.0.0", "", "two"]
    assert [store_serves(r) for r in unserved] == [False] * 6
