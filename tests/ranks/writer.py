"""Rank program for tests: writes LINES distinct lines of 70 bytes to stdout as fast as it can."""

import os
import sys

rank = int(os.environ["RANK"])
lines = int(sys.argv[1])
out = sys.stdout.buffer
for i in range(lines):
    out.write(b"rank %04d line %08d " % (rank, i) + b"x" * 44 + b"\n")
out.flush()
