"""Data-parallel training with PyTorch DDP on CPU (gloo): mpilaunch -n 4 python examples/ddp_cpu.py

init_method="env://" reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which mpilaunch sets
(on one machine or over SSH). Each rank starts from different random weights and trains on its
own quarter of the data; DDP broadcasts rank 0's weights and averages the gradients, so every
rank ends with the same parameters, and with the parameters one process would reach on the
whole data set (rank 0 checks that by training a copy alone).
"""

from __future__ import annotations

import copy
import hashlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "60"))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """The same data set on every rank (same seed): y = X w + noise."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 0.05 * torch.randn(256, 1, generator=gen)
    return x, y


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, log: bool) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.tensor(0.0)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if log and step % 20 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    return loss.item()


def main() -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100 + rank)  # different on each rank: DDP must broadcast rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    alone = copy.deepcopy(model)  # rank 0's copy trains alone on all the data, for comparison
    ddp = DistributedDataParallel(model)
    x, y = data()
    loss = train(ddp, x[rank::size], y[rank::size], log=rank == 0)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]
    print(f"rank {rank} of {size} on {os.uname().nodename}: loss on its shard {loss:.4f}, params {digest}", flush=True)
    if rank == 0:
        train(alone, x, y, log=False)
        reference = torch.cat([p.detach().flatten() for p in alone.parameters()])
        print(f"largest difference from one process on all the data: {(params - reference).abs().max():.2e}")
    dist.barrier()  # every rank is done with gloo
    # Then leave at once: gloo's teardown (destroy_process_group, then the interpreter's exit)
    # now and then aborted a rank with "terminate called without an active exception" when
    # rank 0, which holds the rendezvous store, had left first (PyTorch 2.13, over the SSH bed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
