"""Rank program for tests: mpi4py collectives over the whole COMM_WORLD (allreduce, bcast,
gather, a barrier); rank 0 prints `collectives ok SIZE` once every one agreed. Run with the
Python whose mpi4py is the MPI family tried (tests/mpi/conftest.family_python)."""

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert comm.allreduce(rank + 1) == size * (size + 1) // 2
data = comm.bcast({"from": 0, "size": size} if rank == 0 else None, root=0)
assert data == {"from": 0, "size": size}
gathered = comm.gather(rank * rank, root=0)
comm.Barrier()
if rank == 0:
    assert gathered == [r * r for r in range(size)], gathered
    print("collectives ok", size, flush=True)
