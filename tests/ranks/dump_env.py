"""Rank program for tests: writes its environment, argv and cwd to OUTDIR/RANK.json."""

import json
import os
import sys

out = sys.argv[1]
record = {
    "env": dict(os.environ),
    "argv": sys.argv[2:],
    "cwd": os.getcwd(),
    "affinity": sorted(os.sched_getaffinity(0)),
}
with open(os.path.join(out, f"{os.environ['RANK']}.json"), "w") as handle:
    json.dump(record, handle)
