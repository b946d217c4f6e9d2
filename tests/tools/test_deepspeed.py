"""DeepSpeed (CPU) starts its jobs through `mpilaunch shims`: `deepspeed --launcher openmpi` and
`--launcher mpich`, with a hostfile of two hosts of the sshd bed, each rank running
`deepspeed.init_distributed()` and an all_reduce (gloo). DeepSpeed lives in a venv built once
(conftest.deepspeed_venv); its runner starts whatever `mpirun` is first on PATH."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.sshbed import SshBed, bed_available
from tests.tools.conftest import free_port, tail, tool_env
from tests.venvs import EXTENSIONS

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
bed, clean_hosts = sshbed_fixtures("dsbed", 2)

# What a DeepSpeed user writes: init_distributed, then torch.distributed (gloo on CPU).
ALLREDUCE = """
import os
import deepspeed
import torch
import torch.distributed as dist

deepspeed.init_distributed(dist_backend="gloo")
rank, size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
where = os.environ.get("SSH_CONNECTION", "- - local").split()[2]
print(f"rank {rank} of {size} sum {int(total.item())} host {where} local {os.environ['LOCAL_RANK']}"
      f" by {'mpilaunch' if os.environ.get('MPILAUNCH_JOB_ID') else 'another launcher'}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def deepspeed_job(
    launcher: Launcher, shims: Path, bed: SshBed, python: Path, tmp_path: Path, which: str, launcher_args: str
) -> subprocess.CompletedProcess:
    """`deepspeed --hostfile HOSTFILE --launcher WHICH` over node1 and node2, one rank each.
    DeepSpeed's .deepspeed_env (in the working directory) is how its users send variables to
    every rank: here the venv's PATH and the op's folder."""
    script = write_script(tmp_path, "ds_allreduce.py", ALLREDUCE)
    (tmp_path / "hostfile").write_text("node1 slots=1\nnode2 slots=1\n")
    (tmp_path / ".deepspeed_env").write_text(
        f"PATH={python.parent}:/usr/local/bin:/usr/bin:/bin\nTORCH_EXTENSIONS_DIR={EXTENSIONS}\n"
    )
    command = [str(python.parent / "deepspeed"), "--hostfile", "hostfile", "--launcher", which]
    # DeepSpeed itself would ssh to node1 (a name only the bed's ssh config knows) to check it
    # and to ask its address: both are given instead.
    command += ["--no_ssh_check", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    command += ["--launcher_args", launcher_args, script]
    env = tool_env(launcher, shims, python.parent)
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def deepspeed_command(out: str) -> str:
    """The launcher's command line DeepSpeed logged (`cmd = mpirun ...`)."""
    found = re.search(r"cmd = (mpirun .*)", out)
    assert found, out[-3000:]
    return found.group(1)


def ranks_on_two_hosts(out: str, bed: SshBed) -> None:
    lines = sorted(line for line in out.splitlines() if line.startswith("rank "))
    assert lines == [
        f"rank 0 of 2 sum 3 host {bed.address('node1')} local 0 by mpilaunch",
        f"rank 1 of 2 sum 3 host {bed.address('node2')} local 0 by mpilaunch",
    ], out[-3000:]


def test_deepspeed_launcher_openmpi_runs_through_the_shims(
    launcher: Launcher, shims: Path, bed: SshBed, deepspeed_venv: Path, tmp_path: Path
) -> None:
    """DeepSpeed's OpenMPIRunner: `ompi_info` found on PATH, then Open MPI's words (-hostfile,
    --mca, -x NAME=VALUE); mpilaunch gives the ranks RANK, MASTER_ADDR... itself."""
    args = f"--ssh-config {bed.config} --mca btl_tcp_if_include lo"
    proc = deepspeed_job(launcher, shims, bed, deepspeed_venv, tmp_path, "openmpi", args)
    assert proc.returncode == 0, tail(proc)
    command = deepspeed_command(proc.stdout)
    assert command.startswith("mpirun -n 2 -hostfile hostfile --mca btl ^openib --ssh-config "), command
    assert f" -x TORCH_EXTENSIONS_DIR={EXTENSIONS} " in command and " -x UCX_TLS=tcp " in command, command
    ranks_on_two_hosts(proc.stdout, bed)


def test_deepspeed_launcher_mpich_runs_through_the_shims(
    launcher: Launcher, shims: Path, bed: SshBed, deepspeed_venv: Path, tmp_path: Path
) -> None:
    """DeepSpeed's MPICHRunner: hydra's words under the name `mpirun` (-ppn, -genv NAME=VALUE and
    -genv NAME VALUE, -hosts), and its launcher_helper.py as each rank, which reads the rank
    from PMI_RANK and the local rank from MPI_LOCALRANKID."""
    proc = deepspeed_job(launcher, shims, bed, deepspeed_venv, tmp_path, "mpich", f"--ssh-config {bed.config}")
    assert proc.returncode == 0, tail(proc)
    command = deepspeed_command(proc.stdout)
    assert command.startswith(f"mpirun -n 2 -ppn 1 --ssh-config {bed.config} -genv "), command
    assert " -genv MASTER_ADDR 127.0.0.1 " in command and " -hosts node1,node2 " in command, command
    assert "launcher_helper.py --launcher mpich " in command, command
    ranks_on_two_hosts(proc.stdout, bed)
