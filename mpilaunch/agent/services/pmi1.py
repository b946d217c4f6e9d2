"""The PMI-1 "simple" wire protocol: `cmd=NAME key=value ...` lines (MPICH's pmi-1.1, Flux RFC 13)."""

from __future__ import annotations

from collections.abc import Sequence

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


def format_reply(cmd: str, **fields: object) -> bytes:
    words = [f"cmd={cmd}"] + [f"{k}={v}" for k, v in fields.items()]
    return (" ".join(words) + "\n").encode()


def process_mapping(node_of_rank: Sequence[int]) -> str:
    """PMI_process_mapping in the vector format: (vector,(first_node,node_count,ranks_per_node),...).

    Ranks 0..n-1 are grouped into runs on one node; consecutive runs of equal length on
    consecutive nodes fold into one block, e.g. 2 nodes x 4 by slot -> (vector,(0,2,4)).
    """
    runs: list[list[int]] = []
    for node in node_of_rank:
        if runs and runs[-1][0] == node:
            runs[-1][1] += 1
        else:
            runs.append([node, 1])
    blocks: list[list[int]] = []
    for node, length in runs:
        if blocks and blocks[-1][2] == length and blocks[-1][0] + blocks[-1][1] == node:
            blocks[-1][1] += 1
        else:
            blocks.append([node, 1, length])
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"
