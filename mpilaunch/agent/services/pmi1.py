"""The PMI-1 "simple" wire protocol: `cmd=NAME key=value ...` lines (MPICH's pmi-1.1, Flux RFC 13),
and the limits and client states both PMI versions share. Pure functions."""

from __future__ import annotations

NEW, INITIALIZED, FINALIZED = "new", "init", "finalized"  # a client's state, both versions
KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024
LINE_MAX = 4096  # longer than any valid line: init, put of a maximal key and value, ...


class ProtocolError(ValueError):
    """A line that is not PMI-1; the client cannot be trusted to continue."""


def parse_line(line: bytes) -> dict[str, str]:
    """`cmd=put kvsname=k key=a value=b c` -> {"cmd": "put", ..., "value": "b c"}.

    A word without '=' continues the previous value, so values may contain spaces.
    """
    try:
        text = line.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ProtocolError("line is not ASCII") from None
    fields: dict[str, str] = {}
    last = None
    for word in text.split(" "):
        key, eq, value = word.partition("=")
        if eq and key and key.replace("_", "").isalnum():
            fields[key] = value
            last = key
        elif last is not None:
            fields[last] += " " + word
        elif word:
            raise ProtocolError(f"unexpected word {word[:40]!r}")
    command = fields.get("cmd") or fields.get("mcmd")
    if not command:
        raise ProtocolError("line without cmd=")
    fields["cmd"] = command
    return fields


def put_error(key: str, value: str) -> str | None:
    """Why a key and value cannot be put (both versions have the same limits), or None."""
    if not key or len(key) > KEYLEN_MAX:
        return "key_length_out_of_range"
    if len(value) > VALLEN_MAX:
        return "value_too_long"
    return None


def format_reply(cmd: str, **fields: object) -> bytes:
    words = [f"cmd={cmd}"] + [f"{k}={v}" for k, v in fields.items()]
    return (" ".join(words) + "\n").encode()
