"""Data-parallel SGD with mpi4py and numpy: mpilaunch -n 4 python examples/sgd_mpi.py

A linear regression trained by gradient descent. Every rank holds a shard of the data and
computes its part of the gradient; MPI_Allreduce sums the parts, so every rank takes the same
step and ends with the same weights (it prints a digest of them). MPI runs over mpilaunch's PMI:
use an mpi4py built on MPICH (the `mpich` wheel), see docs/mpi.md.
"""

from __future__ import annotations

import hashlib

import numpy as np
from mpi4py import MPI

FEATURES, SAMPLES, STEPS, LEARNING_RATE = 10, 512, 300, 0.1


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    data = np.random.default_rng(0)  # the same data set on every rank; each keeps its shard
    x = data.normal(size=(SAMPLES, FEATURES))
    truth = data.normal(size=FEATURES)
    y = x @ truth + 0.01 * data.normal(size=SAMPLES)
    xs, ys = x[rank::size], y[rank::size]

    weights = np.random.default_rng(1 + rank).normal(size=FEATURES)  # different on each rank...
    comm.Bcast(weights, root=0)  # ...until rank 0's are sent to all
    for step in range(STEPS):
        grad = 2 * xs.T @ (xs @ weights - ys) / SAMPLES  # this shard's part of the full gradient
        comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        weights -= LEARNING_RATE * grad
        if step % 100 == 0:
            loss = comm.allreduce(np.sum((xs @ weights - ys) ** 2)) / SAMPLES
            if rank == 0:
                print(f"step {step}: loss {loss:.6f}", flush=True)
    loss = comm.allreduce(np.sum((xs @ weights - ys) ** 2)) / SAMPLES
    digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    print(f"rank {rank} of {size}: loss {loss:.6f} weights {digest}", flush=True)
    if rank == 0:
        print(f"largest error against the true weights: {np.abs(weights - truth).max():.4f}", flush=True)


if __name__ == "__main__":
    main()
