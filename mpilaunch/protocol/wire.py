"""Framed messages between the controller and its agents (stdlib only: shipped to remote hosts).

A frame is a 4-byte big-endian length, a 1-byte kind and a payload. Control messages are JSON
objects with an "op"; rank output and stdin are raw bytes behind a small header, so the hot
path never encodes or copies text.

Tree spawn adds ROUTED frames: a 4-byte host index and a whole inner frame. The controller
addresses a host behind relays with one (ALL: every host of the relay's subtree); a relay
forwards what its children send wrapped in one, so every frame names its host of origin.
"""

from __future__ import annotations

import struct

from mpilaunch.protocol import jsoncodec

CONTROL, OUTPUT, STDIN, ROUTED = 0, 1, 2, 3
STDOUT, STDERR = 1, 2
ALL = 0xFFFFFFFF  # a ROUTED frame for the relay and every host below it
MAX_FRAME = 64 * 1024 * 1024
_HEAD = struct.Struct(">IB")
_RANK = struct.Struct(">IB")
_INDEX = struct.Struct(">I")

# Before its first frame an agent started over SSH writes MARKER: whatever a login script printed
# before it (a banner in ~/.bashrc) is skipped up to there.
MARKER = b"\0mpilaunch-agent\0"
MAX_NOISE = 1 << 16  # bytes of such output tolerated


class FrameError(ValueError):
    """The peer sent something that is not a frame of this protocol."""


def past_marker(inbox: bytearray) -> bool:
    """Cut what a login script printed, and the MARKER after it, from the front of inbox: True
    once the marker came (frames follow in inbox), False while it may still come; FrameError
    when more than MAX_NOISE bytes came first."""
    at = inbox.find(MARKER)
    if at < 0:
        if len(inbox) > MAX_NOISE + len(MARKER):
            raise FrameError(f"the remote shell printed more than {MAX_NOISE} bytes before the agent")
        return False
    del inbox[: at + len(MARKER)]
    return True


def control(op: str, **fields: object) -> bytes:
    body = jsoncodec.dumps({"op": op, **fields}).encode()
    return _HEAD.pack(len(body) + 1, CONTROL) + body


def output(rank: int, stream: int, data: bytes) -> bytes:
    return _HEAD.pack(len(data) + 1 + _RANK.size, OUTPUT) + _RANK.pack(rank, stream) + data


def stdin(rank: int, data: bytes) -> bytes:
    """Bytes for a rank's stdin; empty data means end of file."""
    return _HEAD.pack(len(data) + 1 + _RANK.size, STDIN) + _RANK.pack(rank, 0) + data


def routed(host: int, frame: bytes) -> bytes:
    """frame (a whole frame) for host behind relays, or from it on the way up."""
    return _HEAD.pack(len(frame) + 1 + _INDEX.size, ROUTED) + _INDEX.pack(host) + frame


def _bounds(data: bytes | bytearray) -> tuple[list[tuple[int, int, int]], int]:
    """(kind, start, end) of each whole frame at the front of data, and where the rest begins."""
    found = []
    size = len(data)
    pos = 0
    while size - pos >= _HEAD.size:
        length, kind = _HEAD.unpack_from(data, pos)
        if length < 1 or length > MAX_FRAME:
            raise FrameError(f"frame length {length} out of range")
        end = pos + 4 + length
        if size < end:
            break
        found.append((kind, pos, end))
        pos = end
    return found, pos


def routed_host(frame: bytes) -> int:
    """The host a whole ROUTED frame names (read without decoding the frame inside)."""
    return _INDEX.unpack_from(frame, _HEAD.size)[0]


def split(data: bytearray) -> list[tuple[int, bytes]]:
    """Whole frames, as (kind, the frame's bytes), cut from the front of data (a relay forwards
    them without decoding their payloads); what is left in data is an unfinished frame."""
    bounds, pos = _bounds(data)
    frames = [(kind, bytes(data[start:end])) for kind, start, end in bounds]
    del data[:pos]
    return frames


def decode_frame(frame: bytes) -> tuple[int, object]:
    """One whole frame (the inner frame of a ROUTED one) as (kind, value), like Decoder.feed."""
    if len(frame) < _HEAD.size:
        raise FrameError("short routed frame")
    length, kind = _HEAD.unpack_from(frame)
    if length != len(frame) - 4:
        raise FrameError("routed frame of the wrong length")
    with memoryview(frame) as view:
        return _decode(kind, view[_HEAD.size :])


class Decoder:
    """Accumulates bytes and yields whole frames as (kind, value) tuples.

    value is a dict for CONTROL, (rank, stream, bytes) for OUTPUT and STDIN, and (host, the
    inner frame's bytes) for ROUTED.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, object]]:
        """Frames from what arrived so far. Payloads are cut out of the received bytes once
        (a view, then one copy), and only an unfinished frame is kept for the next call."""
        if self._buf:
            self._buf += data
            data = self._buf  # type: ignore[assignment]
        bounds, pos = _bounds(data)
        with memoryview(data) as view:
            frames = [_decode(kind, view[start + _HEAD.size : end]) for kind, start, end in bounds]
        self._buf = bytearray(data[pos:])
        return frames

    def pending(self) -> bytes:
        """The unfinished frame kept so far (handed on when another reader takes over the link)."""
        return bytes(self._buf)


def _decode(kind: int, payload: memoryview) -> tuple[int, object]:
    if kind == CONTROL:
        try:
            message = jsoncodec.loads(bytes(payload).decode())
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            raise FrameError(f"bad control frame: {exc}") from None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise FrameError("control frame without an op")
        return kind, message
    if kind in (OUTPUT, STDIN):
        if len(payload) < _RANK.size:
            raise FrameError("short data frame")
        rank, stream = _RANK.unpack_from(payload)
        return kind, (rank, stream, bytes(payload[_RANK.size :]))
    if kind == ROUTED:
        if len(payload) < _INDEX.size + _HEAD.size:
            raise FrameError("short routed frame")
        return kind, (_INDEX.unpack_from(payload)[0], bytes(payload[_INDEX.size :]))
    raise FrameError(f"unknown frame kind {kind}")
