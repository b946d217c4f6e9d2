"""What each start-up trick of the code saves, measured: the table of docs/performance.md,
"Start-up tricks".

Run by hand:  python -m bench.imports [--runs 30]
Each import is timed as a whole interpreter, `python -S -c "import X"`, against `python -S -c
pass`, alternating, run by run (the median difference); -S as the agent's and the Slurm
step's interpreters start, and without this machine's site hooks, which import some of these
modules already. The rest is timed in one process: a record class made three ways, the
agent's payload built (and compressed at two levels) against read from its cache.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import timeit
import zlib

IMPORTS = (
    ("typing", "import typing"),
    ("dataclasses (and inspect)", "import dataclasses"),
    ("subprocess", "import subprocess"),
    ("shutil", "import shutil"),
    ("socket (beside _socket)", "import socket"),
    ("re", "import re"),
    ("importlib.util", "import importlib.util"),
    ("tempfile", "import tempfile"),
    ("warnings", "import warnings"),
    ("json", "import json"),
    ("ctypes", "import ctypes"),
    ("_ctypes, the C module under ctypes", "import _ctypes"),
)


def _wall(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-S", "-c", code], check=True)
    return time.perf_counter() - start


def import_costs(runs: int) -> list[tuple[str, float]]:
    """(module, median ms more than an empty start), each against an empty start run next to it."""
    out = []
    for name, code in IMPORTS:
        _wall(code)
        deltas = []
        for index in range(runs):
            if index % 2:
                b, a = _wall(code), _wall("pass")
            else:
                a, b = _wall("pass"), _wall(code)
            deltas.append((b - a) * 1000)
        out.append((name, statistics.median(deltas)))
    return out


def record_costs() -> list[tuple[str, float]]:
    """µs to make one class of five fields, three ways."""
    from collections import namedtuple

    from mpilaunch.protocol.record import Record

    def ours() -> None:
        type("Five", (Record,), {"__annotations__": dict.fromkeys("abcde", "int"), "__module__": __name__})

    def collections_way() -> None:
        namedtuple("Five", "a b c d e")

    def typing_way() -> None:
        import typing

        typing.NamedTuple("Five", [(name, int) for name in "abcde"])

    def dataclass_way() -> None:
        import dataclasses

        dataclasses.make_dataclass("Five", [(name, int) for name in "abcde"], frozen=True)

    rows = []
    for name, make in (
        ("Record (protocol/record.py)", ours),
        ("collections.namedtuple", collections_way),
        ("typing.NamedTuple", typing_way),
        ("dataclass(frozen=True)", dataclass_way),
    ):
        make()
        rows.append((name, min(timeit.repeat(make, number=200, repeat=5)) / 200 * 1e6))
    return rows


def payload_costs() -> list[tuple[str, float]]:
    """ms to build the agent's payload, to read it back from its cache, and an agent's side of it:
    the bundle unmarshalled, each module's code decompressed (a plain job's agent imports about
    half of them)."""
    import importlib.util
    import marshal
    import os
    import tempfile

    from mpilaunch.transport import bootstrap

    magic = importlib.util.MAGIC_NUMBER
    payload = bootstrap._build_payload(magic)
    at = 10 + int(payload[:10])
    bundle = payload[at + 10 :]
    modules = marshal.loads(bundle)["modules"]
    rows = []
    built = min(timeit.repeat(lambda: bootstrap._build_payload(magic), number=1, repeat=3))
    rows.append((f"build the payload (compile and compress every module; {len(payload) // 1024} KiB)", built * 1e3))
    unmarshal = min(timeit.repeat(lambda: marshal.loads(bundle), number=20, repeat=5)) / 20
    rows.append(("unmarshal the bundle (the agent's side)", unmarshal * 1e3))

    def undo() -> None:
        for _, _, code in modules.values():
            zlib.decompress(code)

    undone = min(timeit.repeat(undo, number=10, repeat=3)) / 10
    rows.append((f"decompress all {len(modules)} modules' code", undone * 1e3))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "payload")
        with open(path, "wb") as out:
            out.write(payload)

        def read() -> bytes:
            with open(path, "rb") as handle:
                return handle.read()

        rows.append(("read it from the cache", min(timeit.repeat(read, number=20, repeat=5)) / 20 * 1e3))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    print("| import, in `python -S` | ms more than an empty start |\n|---|---|")
    for name, ms in import_costs(args.runs):
        print(f"| `{name}` | {ms:.1f} |")
    print("\n| a record class of five fields | µs |\n|---|---|")
    for name, us in record_costs():
        print(f"| {name} | {us:.0f} |")
    print("\n| the agent's payload | ms |\n|---|---|")
    for name, ms in payload_costs():
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
