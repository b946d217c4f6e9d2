"""Hostile bytes on every parser and link, in process: frames in any chunking, PMI-1 lines,
an agent and a controller fed any frames."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mpilaunch.agent.agent import Agent
from mpilaunch.agent.services.pmi1 import ProtocolError, parse_line
from mpilaunch.agent.services.pmi_server import JobServer
from mpilaunch.cli.parse import parse_args
from mpilaunch.launcher.loop.controller import Controller
from mpilaunch.launcher.loop.links import HostLink
from mpilaunch.launcher.output.sink import OutputSink
from mpilaunch.launcher.start.here import ThisMachine
from mpilaunch.plan.build import build_plan
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import PmiJob, encode
from mpilaunch.transport.base import Link

_HEAD = struct.Struct(">IB")


DEEP = _HEAD.pack(100_001, wire.CONTROL) + b"[" * 100_000  # JSON nested deeper than the parser recurses


def raw(kind: int, body: bytes) -> bytes:
    """A frame with any body, valid or not."""
    return _HEAD.pack(len(body) + 1, kind) + body


_frames = st.one_of(
    st.builds(
        wire.output, st.integers(0, 2**32 - 1), st.sampled_from([wire.STDOUT, wire.STDERR]), st.binary(max_size=40)
    ),
    st.builds(wire.stdin, st.integers(0, 2**32 - 1), st.binary(max_size=40)),
    st.builds(
        lambda op, fields: wire.control(op, **fields),
        st.text(max_size=8),
        st.dictionaries(
            st.text(max_size=4).filter(lambda k: k != "op"), st.integers() | st.text(max_size=6), max_size=3
        ),
    ),
    st.binary(max_size=24),  # garbage between frames
    st.builds(raw, st.integers(0, 255), st.binary(max_size=16)),  # any kind, any body
)


def decode_in_pieces(data: bytes, cuts: list[int]) -> tuple[list, bool]:
    """Frames decoded when data arrives cut at these offsets, and whether a FrameError came."""
    decoder = wire.Decoder()
    frames: list = []
    start = 0
    for end in [*sorted(cuts), len(data)]:
        try:
            frames += decoder.feed(data[start:end])
        except wire.FrameError:
            return frames, True
        start = max(start, end)
    return frames, False


@given(st.lists(_frames, max_size=8), st.lists(st.integers(0, 600), max_size=10))
@example([DEEP], [])
@example([DEEP], [3, 50])
@settings(max_examples=400, deadline=None)
def test_fuzz_decoder_any_bytes_any_chunking(pieces: list[bytes], cuts: list[int]) -> None:
    """Any bytes, cut anywhere: whole frames or FrameError, never another exception, and the
    same outcome however the bytes were cut."""
    data = b"".join(pieces)
    whole, whole_failed = decode_in_pieces(data, [])
    cut, cut_failed = decode_in_pieces(data, cuts)
    assert whole_failed == cut_failed
    if not whole_failed:
        assert cut == whole
        assert all(kind in (wire.CONTROL, wire.OUTPUT, wire.STDIN, wire.ROUTED) for kind, _ in whole)


def test_json_nested_too_deep_is_a_frame_error() -> None:
    with pytest.raises(wire.FrameError):
        wire.Decoder().feed(DEEP)


@given(st.binary(max_size=200))
@settings(max_examples=500)
def test_fuzz_pmi1_line_parser_only_raises_protocol_error(data: bytes) -> None:
    try:
        fields = parse_line(data)
    except ProtocolError:
        return
    assert fields["cmd"]


PMI1_JOB = PmiJob(job=1, size=1, universe=1, kvsname="kvs_h_1", mapping="(vector,(0,1,1))", preput={})


PMI1_FIXED = [b"cmd=init pmi_version=1 pmi_subversion=1\n", b"cmd=get_maxes\n", b"cmd=get_appnum\n"]


_pmi1_lines = st.one_of(
    st.sampled_from(PMI1_FIXED),
    st.builds(
        lambda cmd, key, value: f"cmd={cmd} kvsname=kvs_h_1 key={key} value={value}\n".encode(),
        st.sampled_from(["put", "get"]),
        st.sampled_from(["a", "b", "PMI_process_mapping", ""]),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    ),
    st.binary(max_size=30),
)


def _serve_pmi1(pieces: list[bytes]) -> tuple[bytes, list, bool]:
    """What a job's PMI server answers a rank sending these pieces, what it sends up, and if it hung up."""
    sent: list[bytes] = []
    service = JobServer(PMI1_JOB, lambda message: sent.append(encode(message)))
    ours, theirs = service.attach(0, 0, 0)
    theirs.setblocking(False)
    replies = b""
    alive = True
    try:
        for piece in pieces:
            theirs.sendall(piece)
            alive = service.readable(ours.fileno())
            try:
                while chunk := theirs.recv(1 << 16):
                    replies += chunk
            except BlockingIOError:
                pass
            if not alive:
                break
    finally:
        ours.close()
        theirs.close()
    return replies, wire.Decoder().feed(b"".join(sent)), alive


@given(st.lists(_pmi1_lines, min_size=1, max_size=8), st.lists(st.integers(1, 40), max_size=8))
@settings(max_examples=300, deadline=None)
def test_fuzz_pmi1_stream_in_any_chunking(lines: list[bytes], sizes: list[int]) -> None:
    """A PMI-1 stream, sane or not, gets the same replies and reports however it is cut."""
    data = b"".join(lines)
    pieces, pos = [], 0
    for size in [*sizes, len(data)]:
        if pos < len(data):
            pieces.append(data[pos : pos + size])
            pos += size
    assert _serve_pmi1(pieces) == _serve_pmi1([data])


class FakeLink:
    """Stands for the agent's link: recv hands out what a test queued, sendall records."""

    def __init__(self) -> None:
        self.inbox: list[bytes] = []
        self.sent: list[bytes] = []

    def fileno(self) -> int:
        return 0

    def recv(self, size: int) -> bytes:
        return self.inbox.pop(0) if self.inbox else b""

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


_AGENT_OPS = ["signal", "kill", "finish", "ping", "pmi_fence_done", "pmi_name_reply", "pmi_spawn_reply", "x"]


_agent_frames = st.one_of(
    st.builds(
        lambda op, fields: wire.control(op, **fields),
        st.sampled_from(_AGENT_OPS),
        st.dictionaries(st.sampled_from(["sig", "grace", "job", "req", "kvs", "fields", "rc", "msg", "cmd"]), _json),
    ),
    st.builds(wire.stdin, st.integers(0, 2**32 - 1), st.binary(max_size=20)),
    st.binary(max_size=20),
)


@given(st.lists(_agent_frames, min_size=1, max_size=6), st.lists(st.integers(1, 80), max_size=6))
@settings(max_examples=300, deadline=None)
def test_fuzz_agent_link_never_raises(frames: list[bytes], sizes: list[int]) -> None:
    """Whatever the link carries, the agent handles it or stops as if the link were lost."""
    link = FakeLink()
    data = b"".join(frames)
    pos = 0
    for size in [*sizes, len(data)]:
        if pos < len(data):
            link.inbox.append(data[pos : pos + size])
            pos += size
    agent = Agent(link)  # type: ignore[arg-type]
    agent.reaper.adopted = lambda: []  # type: ignore[method-assign]  # this test process's children are not orphans
    try:
        while link.inbox and agent.uplink.open:
            agent.uplink.read(link.fileno())
    finally:
        agent.loop.close()


class FakeAgentLink(Link):
    """A remote agent's link as the controller sees it, replaying queued bytes."""

    def __init__(self) -> None:
        super().__init__("fake")
        self.inbox: list[bytes] = []
        self.sent: list[bytes] = []
        self.closed = False
        self.r, self.w = socket.socketpair()

    def fileno(self) -> int:
        return self.r.fileno()

    def recv(self) -> bytes | None:
        return self.inbox.pop(0) if self.inbox else b""

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.r.close()
            self.w.close()

    def wait(self) -> None:
        pass

    def readable(self) -> bool:
        return False

    def ping_every(self, period: float, frame: bytes) -> None:
        pass


_CONTROLLER_OPS = ["started", "exited", "failed", "stdin_ack", "note", "pmi_fence", "pmi_abort", "pmi_error",
                   "pmi_name", "pmi_spawn", "hello", "ping", "bye", "x"]  # fmt: skip


_proc = st.one_of(st.integers(-3, 5), st.text(max_size=3), st.none())


_controller_frames = st.one_of(
    st.builds(
        lambda op, proc, fields: wire.control(op, proc=proc, **fields),
        st.sampled_from(_CONTROLLER_OPS),
        _proc,
        st.dictionaries(
            st.sampled_from(["pid", "status", "code", "error", "n", "text", "job", "kvs", "message", "req", "apps"]),
            _json,
        ),
    ),
    st.builds(wire.output, st.integers(0, 6), st.sampled_from([wire.STDOUT, wire.STDERR]), st.binary(max_size=20)),
    st.binary(max_size=20),
)


@pytest.fixture(scope="module")
def remote_plan() -> Iterator:
    """A planned job of 2 ranks on each of two remote hosts (nothing is started)."""
    spec = parse_args(["-H", "hosta:2,hostb:2", "-n", "4", "--output-filename", os.devnull + ":nocopy", "true"])
    plan, _ = build_plan(spec, {"PATH": os.defpath}, ThisMachine())
    yield plan


@given(st.lists(_controller_frames, min_size=1, max_size=6))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_controller_survives_any_agent_frames(remote_plan, capfd: pytest.CaptureFixture[str], frames) -> None:
    """An agent's frames, sane or not, never crash the controller: a frame it cannot use (bad
    fields, or a process of another host) counts as a garbled link, which is closed."""
    sink = OutputSink(None, None, False)
    sink.add_job(1, list(range(4)))
    links = {0: FakeAgentLink(), 1: FakeAgentLink()}
    controller = Controller(remote_plan, sink, links)  # type: ignore[arg-type]
    try:
        host = controller.links[1]
        links[1].inbox.append(b"".join(frames))
        while host.open:
            controller.read_link(host, time.monotonic())
            if not links[1].inbox and host.open:
                break
    finally:
        for link in links.values():
            link.close()
        controller.sel.close()
    assert sink.writer.wait_drained(10.0)  # the launcher's lines go out from the console's thread
    err = capfd.readouterr().err
    assert "Traceback" not in err


def test_controller_refuses_a_process_of_another_host(remote_plan, capfd: pytest.CaptureFixture[str]) -> None:
    """hostb's agent speaks of rank 0, which runs on hosta: the link is garbled, rank 0 untouched."""
    sink = OutputSink(None, None, False)
    sink.add_job(1, list(range(4)))
    links = {0: FakeAgentLink(), 1: FakeAgentLink()}
    controller = Controller(remote_plan, sink, links)  # type: ignore[arg-type]
    try:
        host_b: HostLink = controller.links[1]
        links[1].inbox.append(wire.control("exited", proc=0, status=3, pmi="new"))
        controller.read_link(host_b, time.monotonic())
        assert not host_b.open and not controller.procs[0].done
        assert sink.writer.wait_drained(10.0)
        assert "garbled message from the agent of hostb" in capfd.readouterr().err
    finally:
        for link in links.values():
            link.close()
        controller.sel.close()
