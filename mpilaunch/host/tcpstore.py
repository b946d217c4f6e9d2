"""A c10d TCPStore server and client in the standard library: torch's ranks meet here.

torchrun's agent hosts the job's TCPStore at MASTER_ADDR:MASTER_PORT and tells its workers so
(TORCHELASTIC_USE_AGENT_STORE=True): their `init_process_group(init_method="env://")` then only
connects to it. mpilaunch's launcher and agents cannot import torch, so StoreServer speaks the
same wire protocol inside their own selector loops: one listening socket and a non-blocking
handler per connection (no thread, no blocking read). Its owner reads and writes keys in this
process and hears when a connection closes (a launcher that said it was there went away);
StoreClient is what launchers use to meet each other through it.

Checked against torch 2.13.0 CPU and 2.14.1, whose one client (TCPStore.cpp) is used both with
its libuv server (`use_libuv=True`, the default) and with the older one (`use_libuv=False`). The wire:
each request is a command byte and its fields; integers are in the machine's byte order
(uint32, int64, or uint64 for lengths and counts); a key or a value is a uint64 length and
its bytes. A connection's first request is VALIDATE with 0x3C85F7CE, then torch's client sends
PING with its pid and expects it back. A torch before 2.2 sends neither: its first request is a
command, numbered from SET = 0 with WATCH_KEY at 7 (BEFORE_VALIDATE), and the connection is
served in that numbering (WATCH_KEY's callbacks are not). That is torch 2.0 to 2.14
(SERVED_TORCH; 2.14 sends what 2.13 does, tests/tools/test_torch_releases.py); a validated
client's command after BARRIER is a newer torch's: it is dropped
and `on_unserved` told at once. WAIT answers one STOP_WAITING byte when every key
exists, later if need be, and CANCEL_WAIT (the client's timeout) answers WAIT_CANCELED. ADD
keeps the value as decimal text. Behaviour follows the libuv server where the two differ
(CHECK and WAIT see a non-empty queue as present; GET of a missing key answers empty), with one
choice of ours: COMPARE_SET wakes waiters only when the key then exists.

Bounds, so that no connection can grow the process that serves it or end its job: replies go
out as they are built, and one connection has at most QUEUED_MAX (16 MiB) of them queued before
the server stops reading it (torch's clients, which wait for each answer, never get there); a
request not yet whole is at most BUFFERED_MAX; a connection that breaks the protocol is dropped
and counted, and `refusals()` sums them in one phrase for the owner to say once.
"""

from __future__ import annotations

import errno
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
# torch up to 2.1 sends no VALIDATE (nor PING): its first request is already a command, numbered
# as below (SET is 0; WATCH_KEY, the key callbacks mpilaunch does not serve, sits where 2.2 put
# GETNUMKEYS's successor). A connection whose first request is not VALIDATE speaks this layout.
BEFORE_VALIDATE = (SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, None, DELETE_KEY, APPEND, MULTI_GET,
                   MULTI_SET, CANCEL_WAIT)  # fmt: skip
WATCH_KEY_BEFORE_VALIDATE = 7
NEWER_MAX = 64  # commands from BARRIER to this are a newer torch's (they are added one at a time)
SERVED_TORCH = "2.0 to 2.14"  # the releases whose commands are served (plan/finalize.STORE_SERVES)
NOT_TORCH = "the first request was neither VALIDATE with torch's number nor a request of torch before 2.2"
READY, NOT_READY = 0, 1  # CHECK
STOP_WAITING, WAIT_CANCELED = 0, 1  # WAIT, BARRIER, CANCEL_WAIT
MAGIC = 0x3C85F7CE

# torch's libuv server refuses more (and drops the client); so does this one.
KEY_MAX = 8 * 1024
VALUE_MAX = 8 * 1024 * 1024
COUNT_MAX = 128 * 1024
BUFFERED_MAX = 64 * 1024 * 1024  # a request not yet whole: past this, the connection is dropped
# What one connection may have queued of replies it has not read. Replies go out as they are
# built; a client that sends requests without reading the answers (pipelining GETs of 8 MiB
# values, say) fills its socket, then this queue: once it holds more than QUEUED_MAX bytes, the
# server reads nothing more from that connection until the client has read it down to
# RESUME_AT. One reply is always queued whole, and a large value is queued as a reference to
# the stored bytes, not a copy. torch's clients wait for each answer, so they never meet it.
QUEUED_MAX = 16 * 1024 * 1024
RESUME_AT = QUEUED_MAX // 2
SEND_AT = 256 * 1024  # replies queued past this go out before the next request is served
COPY_MAX = 64 * 1024  # a reply part up to this is copied into the queue's tail; a larger one is referenced
IOV_BATCH = 64  # reply parts handed to one sendmsg
READ_SIZE = 256 * 1024
ACCEPTS_PER_TURN = 256
CONNECT_TRY = 5.0  # seconds one connect may take

U32 = struct.Struct("=I")
I64 = struct.Struct("=q")
U64 = struct.Struct("=Q")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class StoreError(Exception):
    """The store cannot be reached, closed the connection, or answered what no server would.
    `why` says what happened in a few words, without the store's address."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why or message


class StoreTimeout(StoreError):
    pass


class StoreUnreachable(StoreError):
    """No connection can be made, however long one tries: no such host, no route to it."""


# What connecting may meet that waiting does not cure (EAI_AGAIN, a refusal, a time-out may be).
NO_SUCH_HOST = {getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA", "EAI_FAIL") if hasattr(socket, name)}
NO_ROUTE = {getattr(errno, name) for name in ("ENETUNREACH", "EHOSTUNREACH") if hasattr(errno, name)}


def connect_error(exc: OSError | UnicodeError) -> tuple[str, bool]:
    """What a failed connect met, in a few words, and whether it is for good."""
    if isinstance(exc, UnicodeError):
        return "the host name cannot be encoded", True
    if isinstance(exc, socket.gaierror):
        final = exc.errno in NO_SUCH_HOST
        return (f"no such host ({exc.strerror})" if final else str(exc.strerror)), final
    if isinstance(exc, TimeoutError):  # socket.timeout is TimeoutError
        return "no answer to connecting", False
    return os_words(exc), exc.errno in NO_ROUTE


def os_words(exc: OSError) -> str:
    """An OSError in a few words: "connection refused", not "[Errno 111] Connection refused"."""
    return exc.strerror.lower() if exc.strerror else str(exc) or type(exc).__name__


class ProtocolError(Exception):
    """A connection sent what no TCPStore client sends: it is dropped."""


class UnservedTorch(ProtocolError):
    """A validated client sent a command after the last one served: a newer torch's."""


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
    owner can tell whose connection closed). Its replies wait in `out` until the socket takes
    them: small ones copied together, large values by reference (QUEUED_MAX bounds the lot)."""

    __slots__ = (
        "address", "before_validate", "error", "events", "handler", "ident", "inbuf", "out", "paused", "pending",
        "queued", "sock", "validated", "wrote",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, ident: int, address: object) -> None:
        self.sock = sock
        self.ident = ident
        self.address = address
        self.inbuf = bytearray()
        self.out: deque[bytes | bytearray | memoryview] = deque()
        self.queued = 0  # bytes in out
        self.paused = False  # more than QUEUED_MAX queued: its requests are not read until it reads
        self.events = selectors.EVENT_READ  # what the selector watches it for
        self.validated = False
        self.before_validate = False  # a torch before 2.2: commands numbered as BEFORE_VALIDATE
        self.pending: set[str] = set()  # keys a WAIT or BARRIER still waits for
        self.wrote: set[str] = set()
        self.error = ""  # why the server dropped it, "" when the client closed
        self.handler: Callable[[int], None] | None = None

    def __repr__(self) -> str:
        return f"Peer({self.ident}, {self.address})"

    def queue(self, *parts: bytes) -> None:
        """Queue a reply, made of these parts, to be sent after those before it."""
        out = self.out
        for part in parts:
            if len(part) > COPY_MAX:
                out.append(part)
            elif out and isinstance(out[-1], bytearray) and len(out[-1]) < SEND_AT:
                out[-1] += part
            else:
                out.append(bytearray(part))
            self.queued += len(part)

    def send(self) -> None:
        """Send what the socket takes now, without waiting (OSError: the connection broke)."""
        out = self.out
        while out:
            batch = [out[i] for i in range(min(len(out), IOV_BATCH))]
            try:
                sent = self.sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            self.queued -= sent
            whole = sum(len(part) for part in batch) == sent
            while sent:
                first = out[0]
                if len(first) <= sent:
                    sent -= len(first)
                    out.popleft()
                else:
                    out[0] = memoryview(first)[sent:]
                    sent = 0
            if not whole:
                return


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
        number = delta + as_int(self.values.get(key, b"0"))
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
        count = 1 + as_int(self.values.get(key, b"0"))
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


class Requests:
    """What each command does to the store and answers: one handler per command byte, taking
    the connection and a cursor on its fields; answers go to `reply(peer, *parts)`, a stored
    value as itself (the reply queue references it)."""

    def __init__(self, data: StoreData, reply: Callable[..., None]) -> None:
        self.data = data
        self.reply = reply
        self.table: dict[int, Callable[[Peer, Cursor], None]] = {
            SET: self.set,
            COMPARE_SET: self.compare_set,
            GET: self.get,
            ADD: self.add,
            CHECK: self.check,
            WAIT: self.wait,
            GETNUMKEYS: self.num_keys,
            DELETE_KEY: self.delete,
            APPEND: self.append,
            MULTI_GET: self.multi_get,
            MULTI_SET: self.multi_set,
            CANCEL_WAIT: self.cancel_wait,
            PING: self.ping,
            QUEUE_PUSH: self.queue_push,
            QUEUE_POP: self.queue_pop,
            QUEUE_LEN: self.queue_len,
            LIST_KEYS: self.list_keys,
            BARRIER: self.barrier,
        }

    def first(self, peer: Peer, command: int, buf: bytearray, done: int) -> Cursor:
        """A first request that is not VALIDATE: a torch before 2.2's first command, served so
        (the cursor past it); anything else drops the connection (it never counted as a client)."""
        if command == VALIDATE and Cursor(buf, done + 1).u32() > max(KEY_MAX, COUNT_MAX):  # no key length
            raise ProtocolError(NOT_TORCH)
        peer.before_validate = True
        cursor = Cursor(buf, done + 1)
        try:
            self.handler(peer, command)(peer, cursor)
        except ProtocolError:
            raise ProtocolError(NOT_TORCH) from None
        return cursor

    def handler(self, peer: Peer, command: int) -> Callable[[Peer, Cursor], None]:
        """The handler of a command byte, as the peer's torch numbers them."""
        if peer.before_validate:
            if command == WATCH_KEY_BEFORE_VALIDATE:
                raise ProtocolError("WATCH_KEY (torch before 2.2's key callbacks) is not served")
            if command >= len(BEFORE_VALIDATE):
                raise ProtocolError(f"unknown command {command} (of torch before 2.2)")
            command = BEFORE_VALIDATE[command]  # type: ignore[assignment]
        handler = self.table.get(command)
        if handler is None and BARRIER < command < NEWER_MAX and not peer.before_validate:
            raise UnservedTorch(f"command {command}, which no torch from {SERVED_TORCH} sends")
        if handler is None:
            raise ProtocolError(f"unknown command {command}")
        return handler

    def set(self, peer: Peer, cursor: Cursor) -> None:
        key, value = cursor.key(), cursor.value()
        peer.wrote.add(key)
        self.data.set(key, value)

    def compare_set(self, peer: Peer, cursor: Cursor) -> None:
        key, expected, desired = cursor.key(), cursor.value(), cursor.value()
        peer.wrote.add(key)
        value = self.data.compare_set(key, expected, desired)
        self.reply(peer, U64.pack(len(value)), value)

    def get(self, peer: Peer, cursor: Cursor) -> None:
        value = self.data.values.get(cursor.key(), b"")
        self.reply(peer, U64.pack(len(value)), value)

    def add(self, peer: Peer, cursor: Cursor) -> None:
        key, delta = cursor.key(), cursor.i64()
        peer.wrote.add(key)
        self.reply(peer, I64.pack(self.data.add(key, delta)))

    def check(self, peer: Peer, cursor: Cursor) -> None:
        ready = all(self.data.present(key) for key in cursor.keys())
        self.reply(peer, bytes((READY if ready else NOT_READY,)))

    def wait(self, peer: Peer, cursor: Cursor) -> None:
        if self.data.wait(peer, cursor.keys()):
            self.reply(peer, bytes((STOP_WAITING,)))

    def num_keys(self, peer: Peer, cursor: Cursor) -> None:
        self.reply(peer, I64.pack(len(self.data.values)))

    def delete(self, peer: Peer, cursor: Cursor) -> None:
        self.reply(peer, I64.pack(1 if self.data.delete(cursor.key()) else 0))

    def append(self, peer: Peer, cursor: Cursor) -> None:
        key, value = cursor.key(), cursor.value()
        peer.wrote.add(key)
        self.data.append(key, value)

    def multi_get(self, peer: Peer, cursor: Cursor) -> None:
        values = self.data.values
        parts = []
        for key in cursor.keys():
            value = values.get(key, b"")
            parts += (U64.pack(len(value)), value)
        self.reply(peer, *parts)

    def multi_set(self, peer: Peer, cursor: Cursor) -> None:
        pairs = [(cursor.key(), cursor.value()) for _ in range(cursor.count())]
        for key, value in pairs:
            peer.wrote.add(key)
            self.data.set(key, value)

    def cancel_wait(self, peer: Peer, cursor: Cursor) -> None:
        self.data.cancel(peer)
        self.reply(peer, bytes((WAIT_CANCELED,)))

    def ping(self, peer: Peer, cursor: Cursor) -> None:
        self.reply(peer, U32.pack(cursor.u32()))

    def queue_push(self, peer: Peer, cursor: Cursor) -> None:
        key, value = cursor.key(), cursor.value()
        self.data.queue_push(key, value)

    def queue_pop(self, peer: Peer, cursor: Cursor) -> None:
        length, value = self.data.queue_pop(cursor.key())
        self.reply(peer, I64.pack(length), *(() if value is None else (U64.pack(len(value)), value)))

    def queue_len(self, peer: Peer, cursor: Cursor) -> None:
        queue = self.data.queues.get(cursor.key())
        self.reply(peer, I64.pack(len(queue) if queue else 0))

    def list_keys(self, peer: Peer, cursor: Cursor) -> None:
        keys = list(self.data.values)
        self.reply(peer, I64.pack(len(keys)) + b"".join(blob(key_bytes(key)) for key in keys))

    def barrier(self, peer: Peer, cursor: Cursor) -> None:
        key, world_size = cursor.key(), cursor.i64()
        peer.wrote.add(key)
        if self.data.barrier(peer, key, world_size):
            self.reply(peer, bytes((STOP_WAITING,)))


class StoreServer:
    """A TCPStore server on `selector`, whose keys' data are callables taking the descriptor:
    a selector whose owner calls `key.data(key.fd)`, or anything with a selector's `register`,
    `modify` and `unregister` that calls them so (the agent's loop, agent/loop.Loop). With
    no selector it makes its own and `run` drives it (tests, `python -m`). `sock` is a bound
    socket to listen on (the launcher's chosen MASTER_PORT), else it binds host:port.
    `on_close(peer)` is told of every validated connection that closed or was dropped,
    `on_unserved(why)` of the first that spoke a torch newer than those served."""

    def __init__(
        self,
        selector: selectors.BaseSelector | None = None,
        host: str = "",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        on_close: Callable[[Peer], None] | None = None,
        on_unserved: Callable[[str], None] | None = None,
    ) -> None:
        self.own_selector = selector is None
        self.sel = selectors.DefaultSelector() if selector is None else selector
        self.listener = sock if sock is not None else listening_socket(host, port)
        if sock is not None:
            self.listener.listen(socket.SOMAXCONN)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.on_close = on_close
        self.on_unserved = on_unserved  # told once, at the first client of a torch after those served
        self.peers: dict[int, Peer] = {}  # by descriptor
        self.data = StoreData(self._released)
        self._dirty: dict[Peer, None] = {}  # peers with replies queued and not yet sent
        self._next_ident = 0
        self.connections = 0  # accepted since the start
        self.requests = 0  # served since the start
        self.refused = 0  # connections dropped for breaking the protocol
        self.refusal = ""  # why the first of them was
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.served = Requests(self.data, self._reply)

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

    def refusals(self) -> str:
        """The connections dropped for breaking the protocol, summed in one phrase ("" if none):
        a port scanner or a stray client is said once, and never ends anything."""
        if not self.refused:
            return ""
        many = "s" if self.refused > 1 else ""
        return f"dropped {self.refused} connection{many} that broke TCPStore's protocol (the first: {self.refusal})"

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
            except OSError:  # none waiting; out of descriptors, a connection reset before accept: try later
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
        waits, serve what was held back while it did not read, then read what came."""
        if peer.out and not self._send(peer):
            return
        if peer.paused:
            if peer.queued > RESUME_AT:
                return
            peer.paused = False
            self._take(peer)
            if peer.sock.fileno() < 0:
                return
            self._watch(peer)
            if peer.paused:
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
        self._take(peer)

    def _take(self, peer: Peer) -> None:
        """Serve the peer's buffered requests; a connection that breaks the protocol is dropped
        and counted, nothing more."""
        try:
            self._serve(peer)
        except ProtocolError as exc:
            if isinstance(exc, UnservedTorch) and self.on_unserved is not None:
                self.on_unserved(str(exc))
                self.on_unserved = None
            self.refused += 1
            self.refusal = self.refusal or str(exc)
            self._hang_up(peer, str(exc))
        self._flush_dirty()

    def _serve(self, peer: Peer) -> None:
        """Answer the whole requests in the peer's buffer, in order, sending as it goes; stop
        (paused) once more than QUEUED_MAX waits unread."""
        buf = peer.inbuf
        done = 0
        while done < len(buf):
            cursor = Cursor(buf, done + 1)
            command = buf[done]
            try:
                if peer.validated:
                    self.served.handler(peer, command)(peer, cursor)
                elif command == VALIDATE and cursor.u32() == MAGIC:
                    peer.validated = True
                else:
                    cursor = self.served.first(peer, command, buf, done)
                    peer.validated = True
            except _Short:
                break
            done = cursor.pos
            self.requests += 1
            if peer.queued >= SEND_AT:
                if not self._send(peer):
                    return
                if peer.queued > QUEUED_MAX:
                    peer.paused = True
                    self._watch(peer)
                    break
        del buf[:done]
        if not peer.paused and len(buf) > BUFFERED_MAX:
            raise ProtocolError(f"{len(buf)} bytes without a whole request")

    def _reply(self, peer: Peer, *parts: bytes) -> None:
        peer.queue(*parts)
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
        """Send what the peer has queued and the socket takes; False when it was dropped."""
        try:
            peer.send()
        except OSError as exc:
            self._hang_up(peer, f"write failed: {exc}")
            return False
        self._watch(peer)
        return True

    def _watch(self, peer: Peer) -> None:
        """Watch the peer for reading unless it is paused, and for room while replies wait (a
        paused peer with none left too: its requests are served again then)."""
        events = (0 if peer.paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if peer.out or peer.paused else 0
        )
        if events != peer.events:
            peer.events = events
            self.sel.modify(peer.sock, events, peer.handler)

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


def listen_host(host: str) -> str:
    """Where a store that every client reaches at `host` listens: there, when it is a loopback
    address or localhost (no other machine reaches the store anyway, and no other machine's
    connections reach it then); else "", every address. Another name of this machine may be
    loopback here and a real address elsewhere: it gets every address."""
    import ipaddress

    try:
        if ipaddress.ip_address(host.partition("%")[0]).is_loopback:
            return host
    except ValueError:
        pass
    if host.lower() != "localhost":
        return ""
    try:
        found = [info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]
    except (OSError, UnicodeError):
        return ""
    loopback = [address for address in found if ipaddress.ip_address(address.partition("%")[0]).is_loopback]
    return "127.0.0.1" if "127.0.0.1" in loopback else loopback[0] if loopback else ""


def listening_socket(host: str = "", port: int = 0) -> socket.socket:
    """A listening TCP socket on host:port; "" listens on every address, IPv6 and IPv4 both
    where the machine has IPv6 (as torch's server does), else IPv4."""
    if host:
        candidates = [socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]]
    else:
        candidates = [(socket.AF_INET6, socket.SOCK_STREAM, 0, "", ("::", port))]
        candidates.append((socket.AF_INET, socket.SOCK_STREAM, 0, "", ("0.0.0.0", port)))
    error: OSError | None = None
    for family, kind, proto, _, address in candidates:
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
    own clients put "/" before theirs. `timeout` bounds each answer awaited, and connecting
    unless `patience` says otherwise (the server may not be up yet: a refused connection is
    tried again until then; 0, once). A host that does not resolve or cannot be routed to
    raises StoreUnreachable at once."""

    def __init__(self, host: str, port: int, timeout: float = 300.0, patience: float | None = None) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        deadline = time.monotonic() + (timeout if patience is None else patience)
        delay = 0.01
        while True:
            try:  # each try may take CONNECT_TRY seconds, even past a shorter patience
                left = max(deadline - time.monotonic(), min(timeout, CONNECT_TRY))
                self.sock = socket.create_connection((host, port), timeout=left)
                break
            except (OSError, UnicodeError) as exc:
                why, final = connect_error(exc)
                said = f"cannot connect to the store at {host}:{port}: {why}"
                if final:
                    raise StoreUnreachable(said, why) from exc
                if time.monotonic() + delay > deadline:
                    raise StoreError(said, why) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inbuf = bytearray()
        nonce = os.getpid() & 0xFFFFFFFF
        self._send(bytes((VALIDATE,)) + U32.pack(MAGIC) + bytes((PING,)) + U32.pack(nonce))
        if U32.unpack(self._read(4, self.timeout))[0] != nonce:
            raise StoreError(f"{host}:{port} answered PING with another number: not a TCPStore", "not a TCPStore")

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
            raise self._gone(os_words(exc)) from exc

    def _gone(self, why: str) -> StoreError:
        return StoreError(f"the store at {self.host}:{self.port} is gone: {why}", why)

    def _read(self, size: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.inbuf) < size:
            left = deadline - time.monotonic()
            self.sock.settimeout(max(left, 0.0))  # 0: one look without waiting
            try:
                data = self.sock.recv(max(READ_SIZE, size - len(self.inbuf)))
            except (socket.timeout, BlockingIOError):
                if left <= 0:
                    raise StoreTimeout(f"no answer from the store at {self.host}:{self.port}", "no answer") from None
                continue
            except OSError as exc:
                raise self._gone(os_words(exc)) from exc
            if not data:
                raise StoreError(
                    f"the store at {self.host}:{self.port} closed the connection", "it closed the connection"
                )
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
