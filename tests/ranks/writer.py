"""Rank program for tests: writes LINES distinct lines of 70 bytes to stdout as fast as it can.

It buffers explicitly (64 KiB writes that split lines anywhere), whatever PYTHONUNBUFFERED says,
so launchers are compared on the same input and line reassembly is exercised.
"""

import os
import sys

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
lines = int(sys.argv[1])
with open(1, "wb", buffering=1 << 16, closefd=False) as out:
    for i in range(lines):
        out.write(b"rank %04d line %08d " % (rank, i) + b"x" * 44 + b"\n")
