"""A rank whose doings --report-json must report: it records its pid and times in DIR/RANK.json,
spends CPU_SECONDS of CPU and holds MIB MiB, then does what ACTIONS says for its rank:
an exit code, `sleep` (until killed), or `wait` (until a signal; a SIGINT ends it as Python does).

usage: accounted.py DIR CPU_SECONDS MIB ACTION0,ACTION1,...
"""

import json
import os
import sys
import time

out, burn, mib, actions = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
rank = int(os.environ["RANK"])
record = {"pid": os.getpid(), "t0": time.time()}
held = bytearray(mib << 20)
for page in range(0, len(held), 4096):  # touched: resident
    held[page] = 1
until = time.process_time() + burn
while time.process_time() < until:
    pass
record["cpu"] = time.process_time()
action = actions[rank]
print(f"rank {rank} {action}", file=sys.stderr, flush=True)
record["t1"] = time.time()
with open(os.path.join(out, f"{rank}.json.tmp"), "w") as handle:
    json.dump(record, handle)
os.replace(os.path.join(out, f"{rank}.json.tmp"), os.path.join(out, f"{rank}.json"))
if action in ("sleep", "wait"):
    time.sleep(120)
while sum(name.endswith(".json") for name in os.listdir(out)) < len(actions):
    time.sleep(0.01)  # every rank's record is written before this one's end can abort the others
sys.exit(int(action))
