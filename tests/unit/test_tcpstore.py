"""The TCPStore server in this process, through StoreClient and raw sockets on loopback.

One thread drives the server (as an agent's or the launcher's loop would) and owns it: the
owner's calls happen there too, between turns. Clients block in worker threads; `ask` runs
one call there and turns the server's loop until it is answered. Torch's own clients are in
tests/local/test_tcpstore_torch.py.
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from mpilaunch.host import tcpstore
from mpilaunch.host.tcpstore import Peer, StoreClient, StoreData, StoreError, StoreServer, StoreTimeout

HANG = 20.0  # a guard against a hang, never a measure


class Rig:
    def __init__(self) -> None:
        self.closed: list[Peer] = []
        self.server = StoreServer(host="127.0.0.1", on_close=self.closed.append)
        self.pool = ThreadPoolExecutor(8)

    def turn_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + HANG
        self.server.run(until=lambda: done() or time.monotonic() > deadline, poll=0.01)
        assert done(), "the server loop never got there"

    def start(self, call: Callable, *args: object) -> Future:
        return self.pool.submit(call, *args)

    def ask(self, call: Callable, *args: object) -> object:
        future = self.start(call, *args)
        self.turn_until(future.done)
        return future.result()

    def client(self, timeout: float = HANG) -> StoreClient:
        return self.ask(StoreClient, "127.0.0.1", self.server.port, timeout)  # type: ignore[return-value]

    def raw(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        sock.settimeout(HANG)
        return sock

    def waiting_for(self, key: str) -> bool:
        return key in self.server.data.waiting

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.server.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    made.close()


def validate() -> bytes:
    return bytes((tcpstore.VALIDATE,)) + struct.pack("=I", tcpstore.MAGIC)


def field(data: bytes) -> bytes:
    return struct.pack("=Q", len(data)) + data


def receive(rig: Rig, sock: socket.socket, size: int, served: int = -1) -> bytes:
    """The size bytes the server sends next on sock, turning its loop (and, with served, not
    before it served more requests than that)."""
    got = bytearray()
    sock.setblocking(False)

    def read() -> bool:
        try:
            got.extend(sock.recv(65536))
        except BlockingIOError:
            pass
        return len(got) >= size and rig.server.requests > served

    rig.turn_until(read)
    sock.setblocking(True)
    return bytes(got)


def exchange(rig: Rig, sock: socket.socket, request: bytes, size: int) -> bytes:
    """Send one request; the size bytes of its answer (once served, when it has none)."""
    served = rig.server.requests
    sock.sendall(request)
    return receive(rig, sock, size, served)


def test_the_requests_a_launcher_makes_answer_as_torchs_server_does(rig: Rig) -> None:
    client = rig.client()
    rig.ask(client.set, "a", b"1")
    assert rig.ask(client.get, "a") == b"1"
    assert rig.ask(client.add, "n", 5) == 5
    assert rig.ask(client.add, "n", -7) == -2
    assert rig.server.get("n") == b"-2"  # kept as decimal text
    assert rig.ask(client.check, ["a", "n"]) is True
    assert rig.ask(client.check, ["a", "nothing"]) is False
    assert rig.ask(client.compare_set, "a", b"1", b"2") == b"2"
    assert rig.ask(client.compare_set, "a", b"1", b"3") == b"2"  # not what was expected: unchanged
    assert rig.ask(client.compare_set, "new", b"", b"v") == b"v"  # missing and nothing expected: set
    assert rig.ask(client.compare_set, "gone", b"x", b"y") == b"x"  # missing: answers what was expected
    assert rig.server.get("gone") is None
    assert rig.ask(client.num_keys) == 3
    assert rig.ask(client.delete, "new") is True
    assert rig.ask(client.delete, "new") is False
    assert sorted(rig.server.keys()) == ["a", "n"]
    client.close()


def test_a_wait_is_held_until_its_keys_exist_and_one_set_releases_every_waiter(rig: Rig) -> None:
    first, second, setter = rig.client(), rig.client(), rig.client()
    both = rig.start(first.wait, ["k", "j"])
    one = rig.start(second.wait, ["k"])
    rig.turn_until(lambda: len(rig.server.data.waiting.get("k", ())) == 2)
    rig.ask(setter.set, "k", b"x")
    rig.turn_until(one.done)
    assert one.result() is None
    assert not both.done()  # still waits for j
    assert set(rig.server.data.waiting) == {"j"}
    rig.ask(setter.add, "j", 1)
    rig.turn_until(both.done)
    assert both.result() is None
    assert rig.server.data.waiting == {}
    assert rig.ask(first.get, "k") == b"x"  # the connection goes on after its wait


def test_a_wait_times_out_with_the_server_told_and_the_connection_still_works(rig: Rig) -> None:
    client = rig.client()
    with pytest.raises(StoreTimeout):
        rig.ask(client.wait, ["never"], 0.2)
    assert rig.server.data.waiting == {}  # CANCEL_WAIT reached it
    assert rig.ask(client.check, ["never"]) is False
    rig.ask(client.set, "never", b"now")
    assert rig.ask(client.get, "never", 1.0) == b"now"


def test_a_client_that_disconnects_while_waiting_is_forgotten_and_its_owner_told(rig: Rig) -> None:
    leaver, stayer, setter = rig.client(), rig.client(), rig.client()
    rig.ask(leaver.set, "launcher/2", b"host-b")
    leaver.wait_begin(["k"])
    stays = rig.start(stayer.wait, ["k"])
    rig.turn_until(lambda: len(rig.server.data.waiting.get("k", ())) == 2)
    leaver.close()
    rig.turn_until(lambda: len(rig.closed) == 1)
    peer = rig.closed[0]
    assert peer.wrote == {"launcher/2"} and peer.error == ""
    assert len(rig.server.data.waiting["k"]) == 1  # only the one still there
    rig.ask(setter.set, "k", b"1")
    rig.turn_until(stays.done)
    assert stays.result() is None
    assert len(rig.server.peers) == 2


def test_the_owner_reads_writes_and_clears_keys_in_its_own_process(rig: Rig) -> None:
    client = rig.client()
    waiting = rig.start(client.get, "go")
    rig.turn_until(lambda: rig.waiting_for("go"))
    rig.server.set("go", "now")  # between turns of the loop, as its owner would
    rig.turn_until(waiting.done)
    assert waiting.result() == b"now"
    assert rig.server.add("count", 2) == 2
    assert rig.ask(client.add, "count", 1) == 3
    rig.ask(client.set, "/default_pg/0//cpu//0/0", b"addr")
    rig.ask(client.set, "mpilaunch/node/0", b"up")
    assert rig.server.clear("/") == 1
    assert sorted(rig.server.keys()) == ["count", "go", "mpilaunch/node/0"]
    assert rig.server.delete("go") is True
    assert rig.server.clear() == 2
    assert rig.ask(client.num_keys) == 0


def test_wait_begin_leaves_the_connection_readable_when_released_or_when_the_store_goes(rig: Rig) -> None:
    client = rig.client()
    client.wait_begin(["abort"])
    rig.turn_until(lambda: rig.waiting_for("abort"))
    with selectors.DefaultSelector() as sel:
        sel.register(client, selectors.EVENT_READ)
        assert sel.select(0) == []
        rig.server.set("abort", b"node 1 failed")
        assert sel.select(HANG)
    client.wait_end(0)
    client.wait_begin(["again"])
    rig.turn_until(lambda: rig.waiting_for("again"))
    rig.server.close()
    with pytest.raises(StoreError, match="closed the connection"):
        client.wait_end(HANG)
    rig.server = StoreServer(host="127.0.0.1")  # for the fixture's close


def test_requests_cut_into_single_bytes_or_sent_together_are_answered_in_order(rig: Rig) -> None:
    sock = rig.raw()
    requests = validate() + bytes((tcpstore.PING,)) + struct.pack("=I", 77)
    requests += bytes((tcpstore.SET,)) + field(b"/k") + field(b"v" * 300)
    requests += bytes((tcpstore.ADD,)) + field(b"/n") + struct.pack("=q", 41)
    requests += bytes((tcpstore.GET,)) + field(b"/k")
    requests += bytes((tcpstore.MULTI_GET,)) + struct.pack("=Q", 2) + field(b"/n") + field(b"/missing")
    rig.turn_until(lambda: len(rig.server.peers) == 1)
    for byte in requests:  # the server reads each byte alone
        sock.sendall(bytes((byte,)))
        for key, _ in rig.server.sel.select(HANG):
            key.data(key.fd)
    sock.sendall(requests[len(validate()) :])  # and all of them again in one piece
    expected = b"".join(
        struct.pack("=I", 77) + struct.pack("=q", total) + field(b"v" * 300) + field(b"%d" % total) + field(b"")
        for total in (41, 82)
    )
    assert receive(rig, sock, len(expected)) == expected
    sock.close()


def test_values_larger_than_the_socket_buffers_go_through_whole(rig: Rig) -> None:
    client = rig.client()
    value = bytes(range(256)) * (tcpstore.VALUE_MAX // 256)
    rig.ask(client.set, "big", value)
    assert rig.ask(client.get, "big") == value
    assert rig.ask(client.compare_set, "big", value, b"small") == b"small"


@pytest.mark.parametrize(
    "opening, reason",
    [
        (b"GET / HTTP/1.1\r\n\r\n", None),  # neither VALIDATE nor a command of torch before 2.2
        (bytes((tcpstore.VALIDATE,)) + struct.pack("=I", 0x12345678), None),  # not torch's number
        (bytes((7,)) + field(b"k"), None),  # WATCH_KEY of torch before 2.2 first: not served
        (validate() + bytes((99,)), "unknown command 99"),
        (validate() + bytes((tcpstore.GET,)) + struct.pack("=Q", tcpstore.KEY_MAX + 1), "bytes (at most"),
        (validate() + bytes((tcpstore.WAIT,)) + struct.pack("=Q", tcpstore.COUNT_MAX + 1), "keys in one request"),
    ],
)
def test_a_connection_that_is_no_torch_client_is_dropped(rig: Rig, opening: bytes, reason: str | None) -> None:
    sock = rig.raw()
    sock.sendall(opening)
    rig.turn_until(lambda: rig.server.connections == 1 and not rig.server.peers)
    assert sock.recv(100) == b""
    # only a connection that said it was a store client counts as one that went away
    assert len(rig.closed) == (0 if reason is None else 1)
    if reason is not None:
        assert reason in rig.closed[0].error
    sock.close()


def test_adding_to_a_value_that_is_no_number_drops_that_client_only(rig: Rig) -> None:
    client, other = rig.client(), rig.client()
    rig.ask(client.set, "text", b"abc")
    rig.ask(client.set, "padded", b"  12xyz")
    assert rig.ask(client.add, "padded", 1) == 13  # read as torch reads it (std::stoll)
    with pytest.raises(StoreError):
        rig.ask(client.add, "text", 1)
    assert "is not a number" in rig.closed[0].error
    assert rig.ask(other.get, "padded") == b"13"


def test_replies_a_client_does_not_read_are_held_back_and_all_arrive_once_it_reads(rig: Rig) -> None:
    """64 GETs of an 8 MiB value pipelined (512 MiB asked) by a client that reads nothing yet:
    the server sends as it goes, stops serving that connection once more than QUEUED_MAX waits
    (its other requests stay unread), and keeps each value by reference, not a copy; once the
    client reads, every reply arrives, in order, and the requests held back are served."""
    sock = rig.raw()
    value = bytes(range(256)) * (tcpstore.VALUE_MAX // 256)
    gets = 64
    requests = validate() + bytes((tcpstore.SET,)) + field(b"big") + field(value)
    requests += (bytes((tcpstore.GET,)) + field(b"big")) * gets + bytes((tcpstore.PING,)) + struct.pack("=I", 5)
    sending = rig.start(sock.sendall, requests)
    rig.turn_until(lambda: sending.done() and rig.server.peers and next(iter(rig.server.peers.values())).paused)
    peer = next(iter(rig.server.peers.values()))
    held = sum(len(part) for part in peer.out)
    assert held <= tcpstore.QUEUED_MAX + len(value) + 8
    assert sum(1 for part in peer.out if part is rig.server.get("big")) >= 1  # referenced, not copied
    assert rig.server.requests < 2 + gets  # the rest waits, unread

    def read_all() -> bytes:
        want = gets * (8 + len(value)) + 4
        got = bytearray()
        while len(got) < want:
            chunk = sock.recv(4 * 1024 * 1024)
            assert chunk, f"the server closed the connection after {len(got)} bytes"
            got += chunk
        return bytes(got)

    got = rig.ask(read_all)
    answer = field(value)
    assert all(got[i * len(answer) : (i + 1) * len(answer)] == answer for i in range(gets))
    assert got[gets * len(answer) :] == struct.pack("=I", 5)
    assert len(rig.server.peers) == 1 and rig.server.refused == 0
    sock.close()


def test_connections_that_break_the_protocol_are_dropped_counted_and_summed_in_one_phrase(rig: Rig) -> None:
    assert rig.server.refusals() == ""
    client = rig.client()
    openings = [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", validate() + bytes((99,)), validate() + bytes((tcpstore.ADD,))]
    for count, opening in enumerate(openings, 2):
        sock = rig.raw()
        sock.sendall(opening)
        if count == 4:  # half a request, then gone: a client that went away, no refusal
            rig.turn_until(lambda: rig.server.requests == 2 + 1 + 1)  # the client's two, two VALIDATEs
            sock.close()
        rig.turn_until(lambda n=count: rig.server.connections == n and len(rig.server.peers) == 1)
        sock.close()
    assert rig.server.refused == 2
    assert rig.server.refusals() == (
        "dropped 2 connections that broke TCPStore's protocol (the first: the first request was neither VALIDATE "
        "with torch's number nor a request of torch before 2.2)"
    )
    assert rig.ask(client.add, "still", 1) == 1  # the others are served on


@pytest.mark.parametrize(
    "host, listens",
    [("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"), ("localhost", "127.0.0.1"), ("10.1.2.3", ""), ("", "")],
)
def test_a_store_whose_clients_reach_it_on_loopback_listens_there_only(host: str, listens: str) -> None:
    assert tcpstore.listen_host(host) == listens
    if listens:
        server = StoreServer(host=listens)
        assert server.listener.getsockname()[0] == listens
        server.close()


def test_this_machines_own_name_is_no_loopback_to_listen_on() -> None:
    """It may be loopback here (/etc/hosts) and a real address on the other nodes."""
    assert tcpstore.listen_host(socket.gethostname()) == ""


def test_a_host_that_does_not_resolve_is_said_at_once_not_tried_until_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(tcpstore.StoreUnreachable) as caught:
        StoreClient("nosuchhost.invalid", 29400, timeout=HANG)
    assert caught.value.why.startswith("no such host")
    assert time.monotonic() - started < HANG / 2


def served(server: StoreServer, future: Future) -> object:
    """Turn the server's loop until the call in another thread is done: its result."""
    deadline = time.monotonic() + HANG
    server.run(until=lambda: future.done() or time.monotonic() > deadline, poll=0.01)
    return future.result(0)


def test_a_client_finds_a_server_that_starts_after_it_and_gives_up_on_none() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(StoreError, match="cannot connect"):
        StoreClient("127.0.0.1", port, timeout=0.3)
    with ThreadPoolExecutor(1) as pool:
        connecting = pool.submit(StoreClient, "127.0.0.1", port, HANG)
        time.sleep(0.1)  # the client is refused at least once first
        server = StoreServer(host="127.0.0.1", port=port)
        client = served(server, connecting)
        assert served(server, pool.submit(client.add, "k", 2)) == 2
        client.close()
        server.close()


def test_a_server_on_every_address_takes_clients_of_ipv4_and_of_ipv6() -> None:
    """As torch's server does: "::" with IPv4 mapped where the machine has IPv6, else 0.0.0.0."""
    server = StoreServer()
    hosts = ["127.0.0.1", "localhost"] + (["::1"] if server.listener.family == socket.AF_INET6 else [])
    with ThreadPoolExecutor(1) as pool:
        for count, host in enumerate(hosts, 1):
            assert served(server, pool.submit(add_once, server.port, host)) == 3 * count
    server.close()


def add_once(port: int, host: str = "127.0.0.1") -> int:
    with StoreClient(host, port, HANG) as client:
        return client.add("x", 3)


def test_a_server_in_another_selector_serves_when_its_keys_are_dispatched() -> None:
    """As agent/loop.Loop does: key.data(key.fd) for every ready key, next to other descriptors."""
    sel = selectors.DefaultSelector()
    server = StoreServer(sel, host="127.0.0.1")
    other_read, other_write = socket.socketpair()
    seen = []
    sel.register(other_read, selectors.EVENT_READ, lambda fd: seen.append(other_read.recv(10)))
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(add_once, server.port)
        other_write.send(b"tick")
        deadline = time.monotonic() + HANG
        while not result.done() and time.monotonic() < deadline:
            for key, _ in sel.select(0.01):
                key.data(key.fd)
        assert result.result() == 3
    assert seen == [b"tick"]
    server.close()
    assert set(sel.get_map().values()) == {sel.get_key(other_read)}  # the server left the rest alone
    sel.close()
    other_read.close()
    other_write.close()


# -- the store without its sockets ----------------------------------------------------------------


def peer(ident: int) -> Peer:
    return Peer(None, ident, ("test", ident))  # type: ignore[arg-type]


def test_a_queue_push_releases_one_blocked_pop_and_queues_count_as_present_keys() -> None:
    released: list[int] = []
    data = StoreData(lambda p: released.append(p.ident))
    a, b = peer(1), peer(2)
    assert data.wait(a, ["q"]) is False and data.wait(b, ["q"]) is False
    data.queue_push("q", b"one")
    assert released == [1]
    assert data.wait(peer(3), ["q"]) is True  # a non-empty queue is there
    assert data.queue_pop("q") == (1, b"one")
    assert data.queue_pop("q") == (0, None)
    data.queue_push("q", b"two")
    assert released == [1, 2]
    assert data.waiting == {}


def test_a_barrier_holds_each_arrival_until_the_last_one() -> None:
    released: list[int] = []
    data = StoreData(lambda p: released.append(p.ident))
    assert data.barrier(peer(1), "b", 3) is False
    assert data.barrier(peer(2), "b", 3) is False
    assert released == []
    assert data.barrier(peer(3), "b", 3) is True
    assert released == [1, 2] and data.values["b"] == b"3"


def old_request(command: int, *fields: bytes) -> bytes:
    """A request of torch before 2.2 (its TCPStore.cpp, the QueryType that starts at SET and has
    WATCH_KEY at 7): the command byte, then each key or value as a uint64 length and its bytes."""
    return bytes((command,)) + b"".join(fields)


def test_a_torch_before_2_2_is_served_in_its_own_numbering(rig: Rig) -> None:
    """torch up to 2.1 sends no VALIDATE and numbers its commands from SET = 0 (GET 2, ADD 3,
    CHECK 4, WAIT 5, GETNUMKEYS 6, WATCH_KEY 7, DELETE_KEY 8, APPEND 9, MULTI_GET 10, MULTI_SET
    11, CANCEL_WAIT 12): before, its first request was refused and its rank saw only a timeout.
    Its client's session, byte for byte, beside a torch 2.13 client on the same store."""
    new = rig.client()
    sock = rig.raw()
    u64, i64 = (lambda n: struct.pack("=Q", n)), (lambda n: struct.pack("=q", n))
    transcript = [  # (request, the answer's bytes)
        (old_request(0, field(b"/init/"), field(b"1")), b""),  # SET
        (old_request(3, field(b"/n"), i64(5)), i64(5)),  # ADD
        (old_request(5, u64(1), field(b"/init/")), bytes((tcpstore.STOP_WAITING,))),  # WAIT, as get() starts
        (old_request(2, field(b"/init/")), field(b"1")),  # GET
        (old_request(4, u64(2), field(b"/n"), field(b"/none")), bytes((tcpstore.NOT_READY,))),  # CHECK
        (old_request(1, field(b"/cas"), field(b""), field(b"x")), field(b"x")),  # COMPARE_SET of a new key
        (old_request(9, field(b"/cas"), field(b"y")), b""),  # APPEND
        (old_request(10, u64(2), field(b"/cas"), field(b"/n")), field(b"xy") + field(b"5")),  # MULTI_GET
        (old_request(11, u64(1), field(b"/m"), field(b"v")), b""),  # MULTI_SET
        (old_request(6), i64(5)),  # GETNUMKEYS: /init/ /n /cas /m (and the new client's a)
        (old_request(8, field(b"/m")), i64(1)),  # DELETE_KEY
        (old_request(12), bytes((tcpstore.WAIT_CANCELED,))),  # CANCEL_WAIT
    ]
    rig.ask(new.set, "a", b"from 2.13")
    for request, answer in transcript:
        assert exchange(rig, sock, request, len(answer)) == answer, request
    assert rig.ask(new.get, "/cas") == b"xy" and rig.ask(new.add, "/n", 1) == 6  # one store for both
    assert not rig.closed and rig.server.refused == 0
    sock.sendall(old_request(7, field(b"/n")))  # WATCH_KEY: torch 2.1's key callbacks are not served
    rig.turn_until(lambda: rig.server.refused == 1)
    assert "WATCH_KEY" in rig.closed[0].error
    sock.close()
