"""The PMI-2 wire protocol (MPICH's pmi-2.0): length-prefixed `cmd=NAME;key=value;...;` frames.

A PMI-2 client first sends the PMI-1 line `cmd=init pmi_version=2 pmi_subversion=0` (answered
in PMI-1 format); from then on each message is a frame: 6 ASCII characters giving the length
of the rest in decimal (MPICH pads with spaces, right-aligned today, left-aligned in older
clients), then `key=value;` fields, the first being `cmd=`. A `;` inside a value is doubled.
Every response echoes the request's `thrid` (a multi-threaded client matches replies by it).

Pure functions: how a job's server serves a PMI-2 client is in pmi2_serve.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from mpilaunch.agent.services.pmi1 import ProtocolError

LENGTH_DIGITS = 6
FRAME_MAX = 1 << 16  # MPICH's PMI-2 client never sends more (PMII_MAX_COMMAND_LEN)
KEYLEN_MAX = 64  # PMI2_MAX_KEYLEN
VALLEN_MAX = 1024  # PMI2_MAX_VALLEN
NPROCS_MAX = 1 << 16
_LENGTH = rb"^ *[0-9]{1,6} *$"  # these two compiled by re when a PMI-2 client first speaks
_KEY = r"^[A-Za-z0-9_.-]{1,64}$"

Pairs = list[tuple[str, str]]


def split_frame(buf: bytes | bytearray) -> tuple[bytes, int] | None:
    """The body of the first whole frame in buf and the bytes it used, or None if incomplete.

    Raises ProtocolError for a length prefix that is not a decimal number or is over FRAME_MAX,
    so a hostile length is refused before its body is awaited.
    """
    if len(buf) < LENGTH_DIGITS:
        return None
    prefix = bytes(buf[:LENGTH_DIGITS])
    if not re.match(_LENGTH, prefix):
        raise ProtocolError(f"bad PMI-2 length prefix {prefix!r}")
    length = int(prefix)
    if length > FRAME_MAX:
        raise ProtocolError(f"a PMI-2 frame of {length} bytes (the limit is {FRAME_MAX})")
    end = LENGTH_DIGITS + length
    if len(buf) < end:
        return None
    return bytes(buf[LENGTH_DIGITS:end]), end


def looks_like_frame(buf: bytes | bytearray) -> bool:
    """A client that starts with a PMI-2 frame instead of the PMI-1 init line (hydra accepts it)."""
    return (
        len(buf) >= LENGTH_DIGITS + 4
        and bool(re.match(_LENGTH, bytes(buf[:LENGTH_DIGITS])))
        and (bytes(buf[LENGTH_DIGITS : LENGTH_DIGITS + 4]) == b"cmd=")
    )


def parse_body(body: bytes) -> Pairs:
    """`cmd=kvs-put;key=a;value=x;;y;` -> [("cmd", "kvs-put"), ("key", "a"), ("value", "x;y")].

    Order and repeated keys are kept: a spawn request repeats argv0... once per program.
    """
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("PMI-2 frame is not ASCII") from None
    pairs: Pairs = []
    for field in _fields(text):
        key, eq, value = field.partition("=")
        if not eq:
            raise ProtocolError(f"PMI-2 field without '=': {field[:40]!r}")
        if not re.match(_KEY, key):
            raise ProtocolError(f"bad PMI-2 key {key[:40]!r}")
        pairs.append((key, value))
    if not pairs or pairs[0][0] != "cmd" or not pairs[0][1]:
        raise ProtocolError("PMI-2 frame without cmd=")
    return pairs


def _fields(text: str) -> Iterable[str]:
    """Split at single `;`; `;;` is a literal `;`. The last field's `;` may be missing."""
    field: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == ";" and text[i + 1 : i + 2] == ";":
            field.append(";")
            i += 2
            continue
        if char == ";":
            yield "".join(field)
            field = []
        else:
            field.append(char)
        i += 1
    if field:
        yield "".join(field)


def fields(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """First value of each key (a repeated key only matters in spawn, read with spawn_apps)."""
    out: dict[str, str] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def format_frame(cmd: str, pairs: Iterable[tuple[str, object]] = ()) -> bytes:
    """One frame: the length, then `cmd=...;` and each `key=value;`, with `;` doubled in values."""
    parts = [f"cmd={cmd};"] + [f"{key}={str(value).replace(';', ';;')};" for key, value in pairs]
    body = "".join(parts).encode("ascii", "replace")
    return b"%6d" % len(body) + body


def response(cmd: str, thrid: str | None, rc: int = 0, pairs: Iterable[tuple[str, object]] = ()) -> bytes:
    """The answer to a `cmd` request: `cmd-response`, the request's thrid, rc, then the fields."""
    head: list[tuple[str, object]] = [("thrid", thrid)] if thrid is not None else []
    return format_frame(f"{cmd}-response", [*head, ("rc", rc), *pairs])


def spawn_apps(pairs: Sequence[tuple[str, str]]) -> list[dict]:
    """A PMI-2 `spawn` request as the controller wants it: one {nprocs, argv, preput, info} per program.

    `ncmds`, `preputcount` and `ppkeyN`/`ppvalN` come first; each program starts with
    `subcmd=EXECUTABLE` followed by its `maxprocs`, `argc`, `argvN`, `infokeycount`,
    `infokeyN`/`infovalN`. Raises ValueError (or KeyError) for a request that does not add up.
    """
    head: dict[str, str] = {}
    segments: list[dict[str, str]] = []
    for key, value in pairs[1:]:
        if key == "subcmd":
            segments.append({})
        (segments[-1] if segments else head).setdefault(key, value)
    count = int(head.get("ncmds", len(segments)))
    if count != len(segments) or not 0 < count <= 64:
        raise ValueError(f"ncmds={head.get('ncmds')} but {len(segments)} programs")
    preput = {head[f"ppkey{i}"]: head[f"ppval{i}"] for i in range(int(head.get("preputcount", "0")))}
    apps = []
    for index, seg in enumerate(segments):
        nprocs = int(seg["maxprocs"])
        if not 0 < nprocs <= NPROCS_MAX:
            raise ValueError("maxprocs out of range")
        args = [seg[f"argv{i}"] for i in range(int(seg.get("argc", "0")))]
        info = {seg[f"infokey{i}"]: seg[f"infoval{i}"] for i in range(int(seg.get("infokeycount", "0")))}
        preput_here = preput if index == 0 else {}
        app: dict = {"nprocs": nprocs, "argv": [seg["subcmd"], *args], "preput": preput_here, "info": info}
        if "wdir" in info:
            app["wdir"] = info["wdir"]
        apps.append(app)
    return apps
