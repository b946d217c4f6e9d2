"""Replies read from agents' links before the controller runs: through the connections that
carry them (a host behind relays answers through its head's), other frames kept for later."""

from __future__ import annotations

import selectors
import time
from collections.abc import Mapping

from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import UP, decode
from mpilaunch.protocol.record import Record
from mpilaunch.transport.base import Link


def gather(links: Mapping[int, Link], kind: type, timeout: float) -> dict[int, Record]:
    """The next message of this kind from each of these remote agents, read through the
    connections that carry them (a relayed host's comes through its head, in a ROUTED frame); a
    host missing from the answer said nothing of the kind in time. Every other frame goes back
    to its head's link, with whatever is left unread of the next one, for the controller: a host
    that said `gone` right after its check is not missed."""
    heads: dict[int, Link] = {}
    for index, link in links.items():
        if link.head is not None:
            heads[link.head_index] = link.head  # type: ignore[index]
        else:
            heads[index] = link
    buffers = {index: bytearray() for index in heads}
    kept: dict[int, list[bytes]] = {index: [] for index in heads}
    closed: set[int] = set()
    sel = selectors.DefaultSelector()
    for index, link in heads.items():
        sel.register(link.fileno(), selectors.EVENT_READ, index)
    found: dict[int, Record] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < len(links) and len(closed) < len(heads):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                head = key.data
                frames, ended = _new_frames(heads[head], buffers[head])
                if ended:
                    sel.unregister(key.fd)
                    closed.add(head)
                for frame_kind, frame in frames:
                    try:
                        origin, message = _origin_and_message(head, frame_kind, frame)
                    except wire.FrameError:
                        continue  # the controller would close the head for it; start-up has no use for it
                    if origin in links and origin not in found and isinstance(message, kind):
                        found[origin] = message
                    else:
                        kept[head].append(frame)
    finally:
        for index, link in heads.items():
            if index not in closed:
                link.unread = b"".join(kept[index]) + bytes(buffers[index])
        sel.close()
    return found


def _new_frames(link: Link, buffer: bytearray) -> tuple[list[tuple[int, bytes]], bool]:
    """The whole frames a head's connection brought (buffer keeps the rest), and whether the
    connection ended or garbled."""
    data = link.recv()
    if data is None:
        return [], False
    if not data:
        return [], True
    buffer += data
    try:
        return wire.split(buffer), False
    except wire.FrameError:
        return [], True


def _origin_and_message(head: int, kind: int, frame: bytes) -> tuple[int, Record | None]:
    """The host a frame of this head's connection is from (a ROUTED frame names it) and the
    control message it carries, None for any other frame; FrameError for a bad one."""
    origin, inner = head, frame
    if kind == wire.ROUTED:
        origin, inner = wire.decode_frame(frame)[1]  # type: ignore[misc]
    inner_kind, value = wire.decode_frame(inner)
    return origin, decode(value, UP) if inner_kind == wire.CONTROL else None  # type: ignore[arg-type]
