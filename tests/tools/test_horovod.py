"""Horovod's own `mpirun` lines, from the real `horovod/runner/mpi_run.py` (the horovod 0.28.1
sdist, downloaded once and imported from its source: nothing is built), run through the shims
over two hosts of the sshd bed.

`horovodrun -p PORT -i KEY` becomes `-mca plm_rsh_args "-p PORT -i KEY"` on Open MPI's line and
`-bootstrap=ssh -bootstrap-exec-args "-p PORT -i KEY"` on MPICH's. The ssh config given to
mpilaunch (Horovod's --mpi-args) names the hosts and their keys but has neither port nor
identity: only Horovod's arguments reach the bed.
"""

from __future__ import annotations

import importlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.sshbed import SshBed, bed_available
from tests.tools.conftest import tool_env
from tests.venvs import cached_sdist

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
bed, clean_hosts = sshbed_fixtures("hvdbed", 2)
OPEN_MPI_PYTHON = "/usr/bin/python3"  # Debian's python3-mpi4py: Open MPI 4.1 ranks

RANK = (
    "import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
    "print('rank', c.rank, 'of', c.size, 'sum', c.allreduce(c.rank), 'host', os.environ['SSH_CONNECTION'].split()[2],"
    " MPI.get_vendor()[0], os.environ.get('NCCL_SOCKET_IFNAME'),"
    " flush=True)\n"
)


@pytest.fixture(scope="module")
def horovod() -> Iterator[tuple[ModuleType, ModuleType]]:
    """(horovod.runner.mpi_run, horovod.runner.common.util.settings), imported from the sdist."""
    tree, reason = cached_sdist("horovod-0.28.1")
    if tree is None:
        pytest.skip(reason)
    sys.path.insert(0, str(tree))
    try:
        yield (
            importlib.import_module("horovod.runner.mpi_run"),
            importlib.import_module("horovod.runner.common.util.settings"),
        )
    finally:
        sys.path.remove(str(tree))
        for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
            del sys.modules[name]


def config_without_port_and_identity(bed: SshBed, tmp_path: Path) -> Path:
    """The bed's ssh config less its Port and IdentityFile: ssh reaches the bed only with
    Horovod's -p and -i."""
    lines = bed.config.read_text().splitlines()
    kept = [line for line in lines if line.split()[:1] not in (["Port"], ["IdentityFile"])]
    path = tmp_path / "ssh_config"
    path.write_text("\n".join(kept) + "\n")
    return path


def horovod_job(
    horovod: tuple[ModuleType, ModuleType],
    env: dict[str, str],
    bed: SshBed,
    tmp_path: Path,
    python: str,
    capsys: pytest.CaptureFixture[str],
    ssh: bool = True,
) -> tuple[str, str, str]:
    """Horovod's mpi_run for 4 ranks on node1:2,node2:2 as `horovodrun -p PORT -i KEY` calls it
    (run_func_mode: Horovod runs the line with /bin/sh and waits). (its line, the job's output,
    Horovod's error: '' when the job succeeded)."""
    mpi_run, settings = horovod
    config = config_without_port_and_identity(bed, tmp_path)
    given = settings.Settings(
        verbose=2,  # Horovod prints its mpirun line
        num_proc=4,
        hosts="node1:2,node2:2",
        ssh_port=bed.port if ssh else None,
        ssh_identity_file=str(bed.identity) if ssh else None,
        extra_mpi_args=f"--ssh-config {config}",
        run_func_mode=True,
    )
    script = write_script(tmp_path, "rank.py", RANK)
    out, error = io.StringIO(), ""
    try:
        mpi_run.mpi_run(given, {"lo"}, env, [python, script], stdout=out, stderr=out)
    except RuntimeError as exc:  # Horovod's "mpirun failed with exit code N"
        error = str(exc)
    return capsys.readouterr().out.strip(), out.getvalue(), error


def test_horovods_detection_reads_the_shim_as_open_mpi(
    horovod: tuple[ModuleType, ModuleType], launcher: Launcher, shims: Path
) -> None:
    mpi_run, _ = horovod
    env = tool_env(launcher, shims)
    assert mpi_run._get_mpi_implementation(env) == mpi_run._OMPI_IMPL
    assert mpi_run.mpi_available(env) and mpi_run.is_open_mpi(env)


@pytest.mark.skipif(not Path(OPEN_MPI_PYTHON).exists(), reason="needs Debian's python3-mpi4py (Open MPI 4.1)")
def test_horovods_open_mpi_line_runs_a_job_over_ssh_with_its_port_and_key(
    horovod: tuple[ModuleType, ModuleType],
    launcher: Launcher,
    shims: Path,
    bed: SshBed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = tool_env(launcher, shims)
    line, out, error = horovod_job(horovod, env, bed, tmp_path, OPEN_MPI_PYTHON, capsys)
    assert not error, out[-3000:]
    rsh_args = f'-mca plm_rsh_args "-p {bed.port} -i {bed.identity}"'
    assert line.startswith(
        "mpirun --allow-run-as-root --tag-output -np 4 -H node1:2,node2:2 -bind-to none -map-by slot "
        f"-mca pml ob1 -mca btl ^openib {rsh_args} -mca btl_tcp_if_include lo -x NCCL_SOCKET_IFNAME=lo "
    ), line
    assert " -x PATH " in line and " -x HOME " in line, line  # Horovod's -x for each variable
    ranks = sorted(text for text in out.splitlines() if "<stdout>:rank" in text)
    assert ranks == [
        f"[1,{r}]<stdout>:rank {r} of 4 sum 6 host {bed.address(f'node{r // 2 + 1}')} Open MPI lo" for r in range(4)
    ], out[-3000:]


def test_horovods_open_mpi_line_without_port_and_key_does_not_reach_the_bed(
    horovod: tuple[ModuleType, ModuleType],
    launcher: Launcher,
    shims: Path,
    bed: SshBed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The control: the same line without `horovodrun -p -i` fails, so the job above went by them."""
    line, out, error = horovod_job(horovod, tool_env(launcher, shims), bed, tmp_path, sys.executable, capsys, ssh=False)
    assert "plm_rsh_args" not in line, line
    assert error.startswith("mpirun failed with exit code"), out[-3000:]
    assert "mpilaunch: node1: " in out and "rank 0 of 4" not in out, out[-3000:]  # ssh refused on port 22


def test_horovods_mpich_line_runs_a_job_over_ssh_with_its_port_and_key(
    horovod: tuple[ModuleType, ModuleType],
    launcher: Launcher,
    shims: Path,
    bed: SshBed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Horovod chooses MPICH's line when `mpirun --version` says MPICH: its detection is made to
    answer that here (Horovod is patched, not mpilaunch), and the shim named `mpirun` reads the
    line in hydra's words (-l, -ppn, -hosts, -genv, -bootstrap=ssh, -bootstrap-exec-args)."""
    mpi_run, _ = horovod
    monkeypatch.setattr(mpi_run, "_get_mpi_implementation", lambda env=None: mpi_run._MPICH_IMPL)
    line, out, error = horovod_job(horovod, tool_env(launcher, shims), bed, tmp_path, sys.executable, capsys)
    assert not error, out[-3000:]
    assert line.startswith(
        "mpirun -l -np 4 -ppn 2 -hosts node1,node2 -bind-to none -map-by slot  -bootstrap=ssh "
        f'-bootstrap-exec-args "-p {bed.port} -i {bed.identity}"  -genv NCCL_SOCKET_IFNAME=lo '
    ), line
    ranks = sorted(text for text in out.splitlines() if "] rank" in text)
    assert ranks == [f"[{r}] rank {r} of 4 sum 6 host {bed.address(f'node{r // 2 + 1}')} MPICH lo" for r in range(4)], (
        out[-3000:]
    )
