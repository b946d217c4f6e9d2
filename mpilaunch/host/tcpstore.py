"""A c10d TCPStore server and client in the standard library: torch's ranks meet here.

torchrun's agent hosts the job's TCPStore at MASTER_ADDR:MASTER_PORT and tells its workers so
(TORCHELASTIC_USE_AGENT_STORE=True): their `init_process_group(init_method="env://")` then only
connects to it. mpilaunch's launcher and agents cannot import torch, so StoreServer speaks the
same wire protocol inside their own selector loops: one listening socket and a non-blocking
handler per connection (no thread, no blocking read). Its owner reads and writes keys in this
process and hears when a connection closes (a launcher that said it was there went away);
StoreClient is what launchers use to meet each other through it.

Checked against torch 2.13.0 CPU, whose one client (TCPStore.cpp) is used both with its libuv
server (`use_libuv=True`, the default) and with the older one (`use_libuv=False`). The wire:
each request is a command byte and its fields; integers are in the machine's byte order
(uint32, int64, or uint64 for lengths and counts); a key or a value is a uint64 length and
its bytes. A connection's first request is VALIDATE with 0x3C85F7CE, then torch's client sends
PING with its pid and expects it back. WAIT answers one STOP_WAITING byte when every key
exists, later if need be, and CANCEL_WAIT (the client's timeout) answers WAIT_CANCELED. ADD
keeps the value as decimal text. Behaviour follows the libuv server where the two differ
(CHECK and WAIT see a non-empty queue as present; GET of a missing key answers empty), with one
choice of ours: COMPARE_SET wakes waiters only when the key then exists.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

# The request's command byte (c10d::detail::QueryType) and the one-byte answers.
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND = range(10)
MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS, BARRIER = range(10, 19)
READY, NOT_READY = 0, 1  # CHECK
STOP_WAITING, WAIT_CANCELED = 0, 1  # WAIT, BARRIER, CANCEL_WAIT
MAGIC = 0x3C85F7CE

# torch's libuv server refuses more (and drops the client); so does this one.
KEY_MAX = 8 * 1024
VALUE_MAX = 8 * 1024 * 1024
COUNT_MAX = 128 * 1024
BUFFERED_MAX = 64 * 1024 * 1024  # a request not yet whole, or replies left unread: past this, dropped
READ_SIZE = 256 * 1024
ACCEPTS_PER_TURN = 256

U32 = struct.Struct("=I")
I64 = struct.Struct("=q")
U64 = struct.Struct("=Q")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class StoreError(Exception):
    """The store cannot be reached, closed the connection, or answered what no server would."""


class StoreTimeout(StoreError):
    pass


class ProtocolError(Exception):
    """A connection sent what no TCPStore client sends: it is dropped."""


class _Short(Exception):
    """The buffer ends inside the message: wait for more bytes."""


def key_text(raw: bytes) -> str:
    """Keys are bytes on the wire; str here, losslessly (what is not UTF-8 round-trips)."""
    return raw.decode("utf-8", "surrogateescape")


def key_bytes(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def as_int(value: bytes) -> int:
    """A stored number as torch reads one (std::stoll): leading blanks, a sign, digits, the rest
    ignored; ProtocolError when there is none or it is out of int64's range."""
    text = value.lstrip(b" \t\n\v\f\r")
    digits = 1 if text[:1] in (b"+", b"-") else 0
    while digits < len(text) and 48 <= text[digits] <= 57:
        digits += 1
    if digits == 0 or not text[:digits].lstrip(b"+-"):
        raise ProtocolError(f"stored value {value[:40]!r} is not a number")
    number = int(text[:digits])
    if not INT64_MIN <= number <= INT64_MAX:
        raise ProtocolError(f"stored value {value[:40]!r} is out of range")
    return number


class Cursor:
    """Reads one request's fields from a buffer; _Short when they are not all there yet."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytearray, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def consume(self, size: int) -> int:
        start = self.pos
        if start + size > len(self.buf):
            raise _Short
        self.pos = start + size
        return start

    def u32(self) -> int:
        return U32.unpack_from(self.buf, self.consume(4))[0]

    def i64(self) -> int:
        return I64.unpack_from(self.buf, self.consume(8))[0]

    def count(self) -> int:
        number = U64.unpack_from(self.buf, self.consume(8))[0]
        if number > COUNT_MAX:
            raise ProtocolError(f"{number} keys in one request (at most {COUNT_MAX})")
        return number

    def blob(self, limit: int) -> bytes:
        size = U64.unpack_from(self.buf, self.consume(8))[0]
        if size > limit:
            raise ProtocolError(f"a field of {size} bytes (at most {limit})")
        start = self.consume(size)
        return bytes(self.buf[start : start + size])

    def key(self) -> str:
        return key_text(self.blob(KEY_MAX))

    def value(self) -> bytes:
        return self.blob(VALUE_MAX)

    def keys(self) -> list[str]:
        return [self.key() for _ in range(self.count())]


def blob(data: bytes) -> bytes:
    return U64.pack(len(data)) + data


class Peer:
    """One client connection: its buffers, what it waits for, and the keys it wrote (so the
    owner can tell whose connection closed)."""

    __slots__ = (
        "address", "error", "handler", "ident", "inbuf", "out", "pending", "sock", "validated", "writing", "wrote",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, ident: int, address: object) -> None:
        self.sock = sock
        self.ident = ident
        self.address = address
        self.inbuf = bytearray()
        self.out = bytearray()
        self.writing = False  # watched for EVENT_WRITE too: replies wait for room in the socket
        self.validated = False
        self.pending: set[str] = set()  # keys a WAIT or BARRIER still waits for
        self.wrote: set[str] = set()
        self.error = ""  # why the server dropped it, "" when the client closed
        self.handler: Callable[[int], None] | None = None

    def __repr__(self) -> str:
        return f"Peer({self.ident}, {self.address})"


class StoreData:
    """The keys, the queues and who waits for what: the store without its sockets. `release`
    is called with each waiter whose keys all arrived (it answers STOP_WAITING)."""

    def __init__(self, release: Callable[[Peer], None]) -> None:
        self.values: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = {}
        self.waiting: dict[str, dict[Peer, None]] = {}  # key -> its waiters, in arrival order
        self.release = release

    def present(self, key: str) -> bool:
        return key in self.values or bool(self.queues.get(key))

    def touched(self, key: str) -> None:
        """The key was written: every waiter for it has one key less to wait for."""
        for peer in self.waiting.pop(key, ()):
            peer.pending.discard(key)
            if not peer.pending:
                self.release(peer)

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value
        self.touched(key)

    def add(self, key: str, delta: int) -> int:
        old = self.values.get(key)
        number = delta + (as_int(old) if old is not None else 0)
        if not INT64_MIN <= number <= INT64_MAX:
            raise ProtocolError(f"adding {delta} to {key!r} leaves int64's range")
        self.set(key, str(number).encode())
        return number

    def append(self, key: str, value: bytes) -> None:
        self.set(key, self.values.get(key, b"") + value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """The value after the call; a missing key with a non-empty `expected` answers
        `expected` and stays missing, as torch's servers do."""
        current = self.values.get(key)
        if current is None and expected:
            return expected
        if current is None or current == expected:
            self.set(key, desired)
            return desired
        self.touched(key)
        return current

    def delete(self, key: str) -> bool:
        return self.values.pop(key, None) is not None

    def wait(self, peer: Peer, keys: list[str]) -> bool:
        """True when every key is there now; else the peer waits for those that are not."""
        self.cancel(peer)
        if all(self.present(key) for key in keys):
            return True
        peer.pending = {key for key in keys if not self.present(key)}
        for key in peer.pending:
            self.waiting.setdefault(key, {})[peer] = None
        return False

    def cancel(self, peer: Peer) -> None:
        for key in peer.pending:
            waiters = self.waiting.get(key)
            if waiters is not None:
                waiters.pop(peer, None)
                if not waiters:
                    del self.waiting[key]
        peer.pending = set()

    def barrier(self, peer: Peer, key: str, world_size: int) -> bool:
        """One more arrival at the key's count: True (and every earlier arrival released) when
        it reaches world_size, else the peer waits for the last one."""
        old = self.values.get(key)
        count = 1 + (as_int(old) if old is not None else 0)
        self.values[key] = str(count).encode()
        if count >= world_size:
            self.touched(key)
            return True
        self.cancel(peer)
        peer.pending = {key}
        self.waiting.setdefault(key, {})[peer] = None
        return False

    def queue_push(self, key: str, value: bytes) -> None:
        """Queue a value; the first waiter for the key (a blocking pop) has it to itself."""
        self.queues.setdefault(key, deque()).append(value)
        waiters = self.waiting.get(key)
        if waiters:
            peer = next(iter(waiters))
            del waiters[peer]
            if not waiters:
                del self.waiting[key]
            peer.pending.discard(key)
            if not peer.pending:
                self.release(peer)

    def queue_pop(self, key: str) -> tuple[int, bytes | None]:
        """(the queue's length before, its first value or None when it is empty)."""
        queue = self.queues.get(key)
        if not queue:
            return 0, None
        length = len(queue)
        value = queue.popleft()
        if not queue:
            del self.queues[key]
        return length, value

    def clear(self, prefix: str) -> int:
        """Delete every key and queue whose name starts with prefix; how many keys went."""
        gone = [key for key in self.values if key.startswith(prefix)]
        for key in gone:
            del self.values[key]
        for key in [key for key in self.queues if key.startswith(prefix)]:
            del self.queues[key]
        return len(gone)


class StoreServer:
    """A TCPStore server on `selector`, whose keys' data are callables taking the descriptor
    (agent/loop.Loop calls `key.data(key.fd)`; any loop that does the same can host it). With
    no selector it makes its own and `run` drives it (tests, `python -m`). `sock` is a bound
    socket to listen on (the launcher's chosen MASTER_PORT), else it binds host:port.
    `on_close(peer)` is told of every validated connection that closed or was dropped."""

    def __init__(
        self,
        selector: selectors.BaseSelector | None = None,
        host: str = "",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        on_close: Callable[[Peer], None] | None = None,
    ) -> None:
        self.own_selector = selector is None
        self.sel = selectors.DefaultSelector() if selector is None else selector
        self.listener = sock if sock is not None else listening_socket(host, port)
        if sock is not None:
            self.listener.listen(socket.SOMAXCONN)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.on_close = on_close
        self.peers: dict[int, Peer] = {}  # by descriptor
        self.data = StoreData(self._released)
        self._dirty: dict[Peer, None] = {}  # peers with replies queued and not yet sent
        self._next_ident = 0
        self.connections = 0  # accepted since the start
        self.requests = 0  # served since the start
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.handlers: dict[int, Callable[[Peer, Cursor], None]] = {
            SET: self._set,
            COMPARE_SET: self._compare_set,
            GET: self._get,
            ADD: self._add,
            CHECK: self._check,
            WAIT: self._wait,
            GETNUMKEYS: self._num_keys,
            DELETE_KEY: self._delete,
            APPEND: self._append,
            MULTI_GET: self._multi_get,
            MULTI_SET: self._multi_set,
            CANCEL_WAIT: self._cancel_wait,
            PING: self._ping,
            QUEUE_PUSH: self._queue_push,
            QUEUE_POP: self._queue_pop,
            QUEUE_LEN: self._queue_len,
            LIST_KEYS: self._list_keys,
            BARRIER: self._barrier,
        }

    # -- the owner's side -------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return self.data.values.get(key)

    def set(self, key: str, value: bytes | str) -> None:
        """Set a key as a client would: its waiters are answered."""
        self.data.set(key, value.encode() if isinstance(value, str) else value)
        self._flush_dirty()

    def add(self, key: str, delta: int) -> int:
        number = self.data.add(key, delta)
        self._flush_dirty()
        return number

    def delete(self, key: str) -> bool:
        return self.data.delete(key)

    def keys(self) -> list[str]:
        return list(self.data.values)

    def clear(self, prefix: str = "") -> int:
        """Forget every key (and queue) under prefix, all of them by default. A restarted job
        needs it: its gloo ranks would read their predecessors' addresses and fail to connect
        (torch's own server, kept across attempts, fails the second job so). Waiters wait on."""
        return self.data.clear(prefix)

    def run(self, until: Callable[[], bool] = lambda: False, poll: float = 0.5) -> None:
        """Serve on the server's own selector until `until()` is true (looked at every `poll`
        seconds at least)."""
        while not until():
            for key, _ in self.sel.select(poll):
                key.data(key.fd)

    def close(self) -> None:
        """Drop every connection (without telling on_close) and stop listening."""
        for peer in list(self.peers.values()):
            self._forget(peer)
        self._unwatch(self.listener)
        self.listener.close()
        if self.own_selector:
            self.sel.close()

    # -- sockets ----------------------------------------------------------------------------
    def _accept(self, fd: int) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a connection reset before accept: try later
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self._next_ident += 1
            self.connections += 1
            peer = Peer(sock, self._next_ident, address)
            peer.handler = lambda fd, peer=peer: self._ready(peer)
            self.peers[sock.fileno()] = peer
            self.sel.register(sock, selectors.EVENT_READ, peer.handler)

    def _ready(self, peer: Peer) -> None:
        """The connection is readable or writable (the loop does not say which): send what
        waits, then read what came."""
        if peer.out and not self._send(peer):
            return
        try:
            data = peer.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._hang_up(peer, f"read failed: {exc}")
            return
        if not data:
            self._hang_up(peer, "")
            return
        peer.inbuf += data
        try:
            self._serve(peer)
        except ProtocolError as exc:
            self._hang_up(peer, str(exc))
        self._flush_dirty()

    def _serve(self, peer: Peer) -> None:
        """Answer every whole request in the peer's buffer, in order."""
        buf = peer.inbuf
        done = 0
        while done < len(buf):
            cursor = Cursor(buf, done + 1)
            command = buf[done]
            try:
                if not peer.validated:
                    if command != VALIDATE or cursor.u32() != MAGIC:
                        raise ProtocolError("the first request was not VALIDATE with torch's number")
                    peer.validated = True
                else:
                    handler = self.handlers.get(command)
                    if handler is None:
                        raise ProtocolError(f"unknown command {command}")
                    handler(peer, cursor)
            except _Short:
                break
            done = cursor.pos
            self.requests += 1
        del buf[:done]
        if len(buf) > BUFFERED_MAX:
            raise ProtocolError(f"{len(buf)} bytes without a whole request")

    def _reply(self, peer: Peer, data: bytes) -> None:
        peer.out += data
        self._dirty[peer] = None

    def _released(self, peer: Peer) -> None:
        self._reply(peer, bytes((STOP_WAITING,)))

    def _flush_dirty(self) -> None:
        while self._dirty:
            peer = next(iter(self._dirty))
            del self._dirty[peer]
            if peer.sock.fileno() >= 0:
                self._send(peer)

    def _send(self, peer: Peer) -> bool:
        """Send what the peer has queued; False when it was dropped."""
        try:
            sent = peer.sock.send(peer.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._hang_up(peer, f"write failed: {exc}")
            return False
        del peer.out[:sent]
        if len(peer.out) > BUFFERED_MAX:
            self._hang_up(peer, f"{len(peer.out)} bytes of replies left unread")
            return False
        if peer.writing != bool(peer.out):
            peer.writing = bool(peer.out)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.writing else 0)
            self.sel.modify(peer.sock, events, peer.handler)
        return True

    def _hang_up(self, peer: Peer, error: str) -> None:
        peer.error = error
        validated = peer.validated
        self._forget(peer)
        if validated and self.on_close is not None:
            self.on_close(peer)

    def _forget(self, peer: Peer) -> None:
        self.data.cancel(peer)
        self._dirty.pop(peer, None)
        self.peers.pop(peer.sock.fileno(), None)
        self._unwatch(peer.sock)
        peer.sock.close()

    def _unwatch(self, sock: socket.socket) -> None:
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass

    # -- requests ---------------------------------------------------------------------------
    def _set(self, peer: Peer, cursor: Cursor) -> None:
        key, value = cursor.key(), cursor.value()
        peer.wrote.add(key)
        self.data.set(key, value)

    def _compare_set(self, peer: Peer, cursor: Cursor) -> None:
        key, expected, desired = cursor.key(), cursor.value(), cursor.value()
        peer.wrote.add(key)
        self._reply(peer, blob(self.data.compare_set(key, expected, desired)))

    def _get(self, peer: Peer, cursor: Cursor) -> None:
        self._reply(peer, blob(self.data.values.get(cursor.key(), b"")))

    def _add(self, peer: Peer, cursor: Cursor) -> None:
        key, delta = cursor.key(), cursor.i64()
        peer.wrote.add(key)
        self._reply(peer, I64.pack(self.data.add(key, delta)))

    def _check(self, peer: Peer, cursor: Cursor) -> None:
        ready = all(self.data.present(key) for key in cursor.keys())
        self._reply(peer, bytes((READY if ready else NOT_READY,)))

    def _wait(self, peer: Peer, cursor: Cursor) -> None:
        if self.data.wait(peer, cursor.keys()):
            self._released(peer)

    def _num_keys(self, peer: Peer, cursor: Cursor) -> None:
        self._reply(peer, I64.pack(len(self.data.values)))

    def _delete(self, peer: Peer, cursor: Cursor) -> None:
        self._reply(peer, I64.pack(1 if self.data.delete(cursor.key()) else 0))

    def _append(self, peer: Peer, cursor: Cursor) -> None:
        key, value = cursor.key(), cursor.value()
        peer.wrote.add(key)
        self.data.append(key, value)

    def _multi_get(self, peer: Peer, cursor: Cursor) -> None:
        values = self.data.values
        self._reply(peer, b"".join(blob(values.get(key, b"")) for key in cursor.keys()))

    def _multi_set(self, peer: Peer, cursor: Cursor) -> None:
        pairs = [(cursor.key(), cursor.value()) for _ in range(cursor.count())]
        for key, value in pairs:
            peer.wrote.add(key)
            self.data.set(key, value)

    def _cancel_wait(self, peer: Peer, cursor: Cursor) -> None:
        self.data.cancel(peer)
        self._reply(peer, bytes((WAIT_CANCELED,)))

    def _ping(self, peer: Peer, cursor: Cursor) -> None:
        self._reply(peer, U32.pack(cursor.u32()))

    def _queue_push(self, peer: Peer, cursor: Cursor) -> None:
        key, value = cursor.key(), cursor.value()
        self.data.queue_push(key, value)

    def _queue_pop(self, peer: Peer, cursor: Cursor) -> None:
        length, value = self.data.queue_pop(cursor.key())
        self._reply(peer, I64.pack(length) + (blob(value) if value is not None else b""))

    def _queue_len(self, peer: Peer, cursor: Cursor) -> None:
        queue = self.data.queues.get(cursor.key())
        self._reply(peer, I64.pack(len(queue) if queue else 0))

    def _list_keys(self, peer: Peer, cursor: Cursor) -> None:
        keys = list(self.data.values)
        self._reply(peer, I64.pack(len(keys)) + b"".join(blob(key_bytes(key)) for key in keys))

    def _barrier(self, peer: Peer, cursor: Cursor) -> None:
        key, world_size = cursor.key(), cursor.i64()
        peer.wrote.add(key)
        if self.data.barrier(peer, key, world_size):
            self._released(peer)


def listening_socket(host: str = "", port: int = 0) -> socket.socket:
    """A listening TCP socket on host:port; "" listens on every address, IPv6 and IPv4 both
    where the machine has IPv6 (as torch's server does), else IPv4."""
    if host:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        candidates = [(family, kind, proto, address)]
    else:
        candidates = [(socket.AF_INET6, socket.SOCK_STREAM, 0, ("::", port))]
        candidates.append((socket.AF_INET, socket.SOCK_STREAM, 0, ("0.0.0.0", port)))
    error: OSError | None = None
    for family, kind, proto, address in candidates:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            error = exc
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and not host:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
            sock.listen(socket.SOMAXCONN)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error if error is not None else OSError(f"cannot listen on {host}:{port}")


class StoreClient:
    """A blocking client of any TCPStore server (this one or torch's). Keys go as given: torch's
    own clients put "/" before theirs. `timeout` bounds connecting (the server may not be up
    yet: it is tried again until then) and each answer awaited."""

    def __init__(self, host: str, port: int, timeout: float = 300.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=max(0.01, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise StoreError(f"cannot connect to the store at {host}:{port}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inbuf = bytearray()
        nonce = os.getpid() & 0xFFFFFFFF
        self._send(bytes((VALIDATE,)) + U32.pack(MAGIC) + bytes((PING,)) + U32.pack(nonce))
        if U32.unpack(self._read(4, self.timeout))[0] != nonce:
            raise StoreError(f"{host}:{port} answered PING with another number: not a TCPStore")

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        self._send(bytes((SET,)) + _key(key) + blob(_bytes(value)))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The key's value, once it is set (StoreTimeout after `timeout`, default the client's)."""
        self.wait([key], timeout)
        self._send(bytes((GET,)) + _key(key))
        return self._blob()

    def add(self, key: str, delta: int) -> int:
        self._send(bytes((ADD,)) + _key(key) + I64.pack(delta))
        return I64.unpack(self._read(8))[0]

    def check(self, keys: Iterable[str]) -> bool:
        self._send(bytes((CHECK,)) + _keys(keys))
        return self._read(1)[0] == READY

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        self._send(bytes((COMPARE_SET,)) + _key(key) + blob(_bytes(expected)) + blob(_bytes(desired)))
        return self._blob()

    def delete(self, key: str) -> bool:
        self._send(bytes((DELETE_KEY,)) + _key(key))
        return I64.unpack(self._read(8))[0] == 1

    def num_keys(self) -> int:
        self._send(bytes((GETNUMKEYS,)))
        return I64.unpack(self._read(8))[0]

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> None:
        """Return once every key is set; StoreTimeout after `timeout` seconds."""
        self.wait_begin(keys)
        self.wait_end(self.timeout if timeout is None else timeout)

    def wait_begin(self, keys: Iterable[str]) -> None:
        """Ask for a wait and return at once: the connection turns readable (fileno) when the
        keys are all there, or the store went away; wait_end then reads the answer."""
        self._send(bytes((WAIT,)) + _keys(keys))

    def wait_end(self, timeout: float) -> None:
        """The answer to wait_begin, awaited `timeout` seconds at most, else the wait is
        cancelled (the server says so) and StoreTimeout raised."""
        try:
            answer = self._read(1, timeout)[0]
        except StoreTimeout:
            self._send(bytes((CANCEL_WAIT,)))
            answer = self._read(1)[0]
            if answer == STOP_WAITING:  # the keys came as the cancel went out
                answer = self._read(1)[0]
            if answer != WAIT_CANCELED:
                raise StoreError(f"the store answered {answer} to CANCEL_WAIT") from None
            raise StoreTimeout(f"the keys were not all set within {timeout:g} s") from None
        if answer != STOP_WAITING:
            raise StoreError(f"the store answered {answer} to WAIT")

    # -- the wire ---------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self.sock.settimeout(self.timeout)
            self.sock.sendall(data)
        except OSError as exc:
            raise StoreError(f"the store at {self.host}:{self.port} is gone: {exc}") from exc

    def _read(self, size: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.inbuf) < size:
            left = deadline - time.monotonic()
            self.sock.settimeout(max(left, 0.0))  # 0: one look without waiting
            try:
                data = self.sock.recv(max(READ_SIZE, size - len(self.inbuf)))
            except (socket.timeout, BlockingIOError):
                if left <= 0:
                    raise StoreTimeout(f"no answer from the store at {self.host}:{self.port}") from None
                continue
            except OSError as exc:
                raise StoreError(f"the store at {self.host}:{self.port} is gone: {exc}") from exc
            if not data:
                raise StoreError(f"the store at {self.host}:{self.port} closed the connection")
            self.inbuf += data
        answer = bytes(self.inbuf[:size])
        del self.inbuf[:size]
        return answer

    def _blob(self) -> bytes:
        return self._read(U64.unpack(self._read(8))[0])


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _key(key: str) -> bytes:
    return blob(key_bytes(key))


def _keys(keys: Iterable[str]) -> bytes:
    listed = [_key(key) for key in keys]
    return U64.pack(len(listed)) + b"".join(listed)


def main(argv: list[str] | None = None) -> int:
    """`python -m mpilaunch.host.tcpstore [--host H] [--port P]`: serve until killed; the
    port is printed first, alone on a line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mpilaunch.host.tcpstore", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = StoreServer(host=args.host, port=args.port)
    print(server.port, flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
