"""What the agent's start takes instead of `json` and `selectors` (docs/performance.md, "Start-up
tricks"): control frames through json's C codec write and read exactly what `json` does, and
the loop serves descriptors alike over epoll and over poll (the fallback of a Python without
epoll)."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from mpilaunch.agent import loop as loop_module
from mpilaunch.agent.loop import READ, WRITE, Loop
from mpilaunch.host.tcpstore import StoreServer
from mpilaunch.protocol import jsoncodec

VALUES = [
    {"op": "launch", "env": {"PATH": "/usr/bin", "É": 'ünïcode\n\t"q"\\'}, "ranks": [1, 2, 3]},
    {"op": "x", "n": [0, -1, 2**70, 1.5, -0.0, 1e300, None, True, False, "", [], {}]},
    {"op": "nested", "a": [[[{"b": [None]}]]]},
]


@pytest.mark.parametrize("value", VALUES)
def test_the_codec_writes_and_reads_what_json_does(value: dict) -> None:
    text = jsoncodec.dumps(value)
    assert text == json.dumps(value, separators=(",", ":"))
    assert jsoncodec.loads(text) == json.loads(text) == value


def test_the_codec_is_the_c_one_here() -> None:
    """On CPython the C codec is taken (the fallback is json's own functions)."""
    assert jsoncodec.loads is not json.loads
    assert jsoncodec._from_c() is not None


@pytest.mark.parametrize("text", ["", "{", "{x}", "[1,", '{"a":1} x', " {}", "nope", '{"a":}', '"\\ud800'])
@pytest.mark.parametrize("loaded", ["json loaded", "json not loaded"])
def test_what_is_not_one_json_value_is_a_value_error(text: str, loaded: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also in an agent, where nothing has imported json (the C scanner names its errors with
    json.decoder's, and cannot without it)."""
    if loaded == "json not loaded":
        for name in [name for name in sys.modules if name == "json" or name.startswith("json.")]:
            monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ValueError):
        jsoncodec.loads(text)


def test_what_json_cannot_write_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        jsoncodec.dumps({"op": "x", "raw": b"bytes"})


@pytest.fixture(params=["epoll", "poll"])
def loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Loop:
    monkeypatch.setattr(loop_module, "_EPOLL", request.param == "epoll")
    made = Loop()
    yield made
    made.close()


def test_a_readable_descriptor_calls_its_handler_and_an_unwatched_one_does_not(loop: Loop) -> None:
    first_r, first_w = os.pipe()
    second_r, second_w = os.pipe()
    called: list[int] = []
    loop.watch(first_r, called.append)
    loop.watch(second_r, called.append)
    assert loop.watched(first_r) and loop.watched(second_r)
    os.write(second_w, b"x")
    loop.turn()
    assert called == [second_r]
    loop.unwatch(second_r)
    loop.unwatch(second_r)  # twice: nothing
    os.write(first_w, b"x")
    loop.turn()
    assert called == [second_r, first_r] and not loop.watched(second_r)
    for fd in (first_r, first_w, second_r, second_w):
        os.close(fd)


def test_a_descriptor_watched_for_writing_then_modified_to_reading(loop: Loop) -> None:
    ends = socket.socketpair()
    called: list[str] = []
    loop.register(ends[0], WRITE, lambda fd: called.append("write"))
    loop.turn()  # an empty socket buffer is writable
    assert called == ["write"]
    loop.modify(ends[0], READ, lambda fd: called.append("read"))
    ends[1].sendall(b"x")
    loop.turn()
    assert called == ["write", "read"]
    with pytest.raises(KeyError):
        loop.register(ends[0], READ, called.append)
    loop.unwatch(ends[0])
    for end in ends:
        end.close()


def test_a_closed_descriptor_is_unwatched_without_error(loop: Loop) -> None:
    r, w = os.pipe()
    loop.watch(r, lambda fd: None)
    os.close(r)
    os.close(w)
    loop.unwatch(r)
    assert not loop.watched(r)


def test_a_timer_alone_wakes_the_loop(loop: Loop) -> None:
    class Soon(loop_module.Timer):
        def __init__(self) -> None:
            self.ticks = 0

        def next_deadline(self) -> float | None:
            return loop.clock() + 0.01

        def tick(self, now: float) -> None:
            self.ticks += 1

    timer = Soon()
    loop.add_timer(timer)
    loop.turn()
    assert timer.ticks == 1


def test_the_ranks_store_serves_from_the_agents_loop(loop: Loop) -> None:
    """The store registers its listener and each connection on the loop as on a selector: a
    client is accepted, and forgotten when it goes (its protocol: tests/unit/test_tcpstore.py)."""
    store = StoreServer(loop, "127.0.0.1", 0)
    client = socket.create_connection(("127.0.0.1", store.port))
    try:
        loop.turn()  # the listener is readable: accepted
        assert store.connections == 1 and len(store.peers) == 1
        client.close()
        loop.turn()  # the peer's socket is readable: its end is read, it is forgotten
        assert not store.peers
    finally:
        client.close()
        store.close()


def test_a_socket_closed_before_it_is_unwatched_frees_its_descriptor(loop: Loop) -> None:
    """As with selectors: the closed object is found by itself, so a descriptor the kernel
    hands out again can be watched anew."""
    first = socket.socketpair()
    loop.watch(first[0], lambda fd: None)
    number = first[0].fileno()
    first[0].close()
    loop.unwatch(first[0])
    assert not loop.watched(first[0]) and not loop.watched(number)
    second = socket.socketpair()
    reused = second[0] if second[0].fileno() == number else second[1]
    assert reused.fileno() == number  # the lowest free descriptor
    called: list[int] = []
    loop.watch(reused, called.append)
    (second[1] if reused is second[0] else second[0]).sendall(b"x")
    loop.turn()
    assert called == [number]
    for end in (first[1], *second):
        end.close()
