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


class HeadReader:
    """Control frames from the head connections during start-up, as (host, message, key): the
    host is the head itself or the one a ROUTED frame came from. A frame the caller does not
    take (keep(key)) goes back to its link, with whatever is left unread of the next one, for
    the controller: a host that said `gone` right after its check is not missed."""

    def __init__(self, heads: Mapping[int, Link]) -> None:
        self.heads = dict(heads)
        self.buffers = {index: bytearray() for index in heads}
        self.kept: dict[int, list[bytes]] = {index: [] for index in heads}
        self.sel = selectors.DefaultSelector()
        for index, link in heads.items():
            self.sel.register(link.fileno(), selectors.EVENT_READ, index)
        self.closed: set[int] = set()

    def read(self, timeout: float) -> list[tuple[int, Record, tuple[int, bytes]]]:
        """Messages that arrived within timeout; a head whose connection ended is added to closed."""
        found: list[tuple[int, Record, tuple[int, bytes]]] = []
        for key, _ in self.sel.select(timeout):
            head = key.data
            data = self.heads[head].recv()
            if data is None:
                continue
            buffer = self.buffers[head]
            buffer += data
            try:
                frames = wire.split(buffer) if data else []
            except wire.FrameError:
                frames = []
                data = b""
            if not data:
                self.sel.unregister(key.fd)
                self.closed.add(head)
            for kind, frame in frames:
                origin, inner = head, frame
                try:
                    if kind == wire.ROUTED:
                        origin, inner = wire.decode_frame(frame)[1]  # type: ignore[misc]
                    inner_kind, value = wire.decode_frame(inner)
                    message = decode(value, UP) if inner_kind == wire.CONTROL else None  # type: ignore[arg-type]
                except wire.FrameError:
                    continue  # the controller would close the head for it; start-up has no use for it
                if message is not None:
                    found.append((origin, message, (head, frame)))
                else:
                    self.keep((head, frame))
        return found

    def keep(self, key: tuple[int, bytes]) -> None:
        head, frame = key
        self.kept[head].append(frame)

    def close(self) -> None:
        for index, link in self.heads.items():
            if index not in self.closed:
                link.unread = b"".join(self.kept[index]) + bytes(self.buffers[index])
        self.sel.close()


def gather(links: Mapping[int, Link], kind: type, timeout: float) -> dict[int, Record]:
    """The next message of this kind from each of these remote agents, read through the
    connections that carry them (a relayed host's comes through its head); a host missing from
    the answer said nothing of the kind in time."""
    heads: dict[int, Link] = {}
    for index, link in links.items():
        if link.head is not None:
            heads[link.head_index] = link.head  # type: ignore[index]
        else:
            heads[index] = link
    reader = HeadReader(heads)
    found: dict[int, Record] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < len(links) and len(reader.closed) < len(heads):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for origin, message, key in reader.read(left):
                if origin in links and origin not in found and isinstance(message, kind):
                    found[origin] = message
                else:
                    reader.keep(key)
    finally:
        reader.close()
    return found
