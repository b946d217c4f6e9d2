"""Rank program for tests: reports each forwarded signal, exits 0 after SIGTERM or the last one asked for."""

import os
import signal
import sys
import time

names = sys.argv[1].split(",")  # signals to report
ready = sys.argv[2]
seen = []


def handler(signum, frame):
    name = signal.Signals(signum).name
    seen.append(name)
    print(f"rank {os.environ['RANK']} got {name}", flush=True)


for name in names:
    signal.signal(getattr(signal, name), handler)
open(f"{ready}.{os.environ['RANK']}", "w").close()
deadline = time.time() + 30
while time.time() < deadline and len(seen) < len(names):
    time.sleep(0.02)
sys.exit(0 if len(seen) == len(names) else 9)
