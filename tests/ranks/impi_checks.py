"""An mpi4py rank for tests/mpi/test_impi.py, run by the Intel MPI venv's python (not the test's).

Usage: impi_checks.py MODE [TAG]
  collectives  size, allreduce, bcast, gather and a barrier, asserted; prints one line per rank
               saying which MPI library it loaded (Intel's, not the `mpich` wheel's)
  abort        a barrier, then rank 1 calls MPI_Abort(7) while the others sleep
  names        rank 0 publishes a name, every rank looks it up (the PMI name service)
"""

from __future__ import annotations

import sys
import time

from mpi4py import MPI


def collectives(comm: MPI.Comm, tag: str) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    assert comm.allreduce(rank + 1) == size * (size + 1) // 2
    assert comm.bcast({"from": 0, "size": size} if rank == 0 else None, root=0) == {"from": 0, "size": size}
    gathered = comm.gather(rank * rank, root=0)
    if rank == 0:
        assert gathered == [r * r for r in range(size)], gathered
    comm.Barrier()
    library = MPI.Get_library_version().split(" for ")[0].strip()
    print(f"rank {rank} of {size} app {comm.Get_attr(MPI.APPNUM)} tag {tag} lib {library}", flush=True)


def abort(comm: MPI.Comm) -> None:
    comm.Barrier()
    if comm.Get_rank() == 1:
        comm.Abort(7)
    time.sleep(60)


def names(comm: MPI.Comm) -> None:
    if comm.Get_rank() == 0:
        MPI.Publish_name("impi-svc", "port-0-impi")
    comm.Barrier()
    print(comm.Get_rank(), MPI.Lookup_name("impi-svc"), flush=True)
    comm.Barrier()
    if comm.Get_rank() == 0:
        MPI.Unpublish_name("impi-svc", "port-0-impi")


if __name__ == "__main__":
    mode, tag = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "-")
    world = MPI.COMM_WORLD
    if mode == "collectives":
        collectives(world, tag)
    elif mode == "abort":
        abort(world)
    elif mode == "names":
        names(world)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
