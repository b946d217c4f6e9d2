"""A stand-in for the net.py of the MindSpore mpirun sample (data-parallel MNIST), in plain Python.

It reads what a training script reads from the launcher (RANK, LOCAL_RANK, DEVICE_ID, RANK_SIZE,
DATA_PATH), says who it is, and trains a small linear model by SGD on its shard of a synthetic
data set, printing its loss the way the sample does. No framework, no GPU:

    mpilaunch -n 4 --oversubscribe --output-filename log_output --merge-stderr-to-stdout python net.py
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="steps per epoch")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", os.environ.get("RANK_ID", "0")))
    size = int(os.environ.get("RANK_SIZE", os.environ.get("WORLD_SIZE", "1")))
    local_rank = os.environ.get("LOCAL_RANK", "0")
    device_id = os.environ.get("DEVICE_ID", local_rank)
    print(
        f"rank {rank} of {size}: RANK={rank} LOCAL_RANK={local_rank} DEVICE_ID={device_id} "
        f"MASTER_ADDR={os.environ.get('MASTER_ADDR', '-')} on {socket.gethostname()}",
        flush=True,
    )
    data_path = os.environ.get("DATA_PATH", "")
    if not os.path.isdir(data_path):
        warning = f"[WARNING] DATA_PATH={data_path!r} is not a directory: using synthetic data"
        print(warning, file=sys.stderr, flush=True)

    # y = 3x + 1 + noise; every rank draws the same data set and keeps its own shard,
    # as DistributedSampler(num_shards=RANK_SIZE, shard_id=RANK) would.
    data = random.Random(1)
    points = [(x, 3 * x + 1 + data.gauss(0, 0.1)) for x in (data.uniform(-1, 1) for _ in range(64 * size))]
    shard = points[rank::size]
    order = random.Random(rank)
    w = b = 0.0
    for epoch in range(args.epochs):
        for step in range(args.steps):
            batch = order.sample(shard, 8)
            loss = sum((w * x + b - y) ** 2 for x, y in batch) / len(batch)
            grad_w = sum(2 * (w * x + b - y) * x for x, y in batch) / len(batch)
            grad_b = sum(2 * (w * x + b - y) for x, y in batch) / len(batch)
            w, b = w - args.lr * grad_w, b - args.lr * grad_b
            if step % 10 == 0:
                print(f"epoch: {epoch}, step: {step}, loss is {loss:.7f}", flush=True)
    print(f"rank {rank} done: w={w:.3f} b={b:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
