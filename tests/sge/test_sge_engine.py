"""Grid Engine as the launch engine (issue "Grid Engine: the cluster's own engine starts the
agents"), on a real one-node cell (tests/sgebed.py): inside a parallel job mpilaunch reads its
hosts from PE_HOSTFILE and its ranks from NSLOTS, forks this host's agent as mpirun and hydra
do, and starts it with `qrsh -inherit` when asked in their words (HYDRA_LAUNCHER_AUTOFORK=0,
ras_base_launch_orted_on_hn), where it is a task of the job; MPICH and Open MPI ranks wire up
as under hydra's and Open MPI's own SGE launches; qdel, kill -9 of the launcher and a lost task
leave nothing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.procs import parent_pid, pid_alive, process_name
from tests.sgebed import SgeBed, job_id_of, sge_available, sgebed_fixtures

available, why = sge_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
sge, clean_sge = sgebed_fixtures("sgeengine")
PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
MPILAUNCH = f"{shlex.quote(PY)} -m mpilaunch"
FORCED = {"hydra": "HYDRA_LAUNCHER_AUTOFORK=0 ", "openmpi": "OMPI_MCA_ras_base_launch_orted_on_hn=1 "}
# Each rank's view of COMM_WORLD in a file of its own (hydra does not keep two ranks' lines apart).
MPI_CODE = (
    "import sys; from mpi4py import MPI; c = MPI.COMM_WORLD; r = c.allreduce(c.rank); "
    "open(f'{sys.argv[1]}.{c.rank}', 'w').write(f'{c.rank} {c.size} {r}')"
)

# Each rank: its variables, whether it runs under a qrsh task (qrsh_starter above it), whether
# the agents' secret reached it; it leaves a file named by its pid.
SHOW = """
import os, sys
chain, pid = [], os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/comm") as handle:
        chain.append(handle.read().strip())
    with open(f"/proc/{pid}/stat") as handle:
        pid = int(handle.read().rsplit(")", 1)[1].split()[1])
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "JOB_ID")
print(" ".join(os.environ.get(k, "-") for k in keys), "qrsh_starter" in chain, "MPILAUNCH_AGENT_SECRET" in os.environ)
sys.stderr.write(f"err {os.environ['RANK']}\\n")
if len(sys.argv) > 1:
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    if sys.argv[2] == "sleep":
        import time
        time.sleep(300)
    sys.exit(int(sys.argv[2]) if os.environ["RANK"] == "1" else 0)
"""


def _env(bed: SgeBed) -> dict[str, str]:
    return bed.client_env(
        {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONPATH": str(ROOT)}
    )


def _submit(bed: SgeBed, tmp_path: Path, body: str, slots: int, sync: bool = True) -> tuple[str, str]:
    """A parallel job of `slots` slots running body (sh) with the test's environment (-V): its
    id and, with sync, its output once it ended."""
    script, out = tmp_path / "job.sh", tmp_path / "job.out"
    script.write_text(f"#!/bin/sh\ncd {shlex.quote(str(tmp_path))}\n{body}")
    argv = ["qsub", "-V", "-pe", "mpi", str(slots), "-cwd", "-j", "y", "-o", str(out), "-N", "engine"]
    proc = bed.run([*argv, *(["-sync", "y"] if sync else []), str(script)], env=_env(bed), timeout=180)
    assert proc.returncode == 0 or sync, proc.stdout + proc.stderr
    job = job_id_of(proc.stdout)
    return job, out.read_text() if sync else ""


def _show(tmp_path: Path) -> str:
    (tmp_path / "show.py").write_text(SHOW)
    return f"{shlex.quote(PY)} {tmp_path / 'show.py'}"


def _wait_for_files(folder: Path, count: int, timeout: float = 90.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.name) for p in folder.iterdir()]
    assert len(pids) == count, pids
    return pids


def _in_a_task(pid: int) -> bool:
    """Whether the process runs under a qrsh -inherit task (qrsh_starter is above it)."""
    parent = parent_pid(pid)
    while parent > 1:
        if process_name(parent) == "qrsh_starter":
            return True
        parent = parent_pid(parent)
    return False


def _gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def _rows(out: str) -> list[str]:
    """The job's output without mpilaunch's notes and the ranks' stderr (-j y joins them)."""
    return [line for line in out.splitlines() if not line.startswith(("mpilaunch: ", "err "))]


def _views(folder: Path, launcher: str) -> list[str]:
    """What each rank of a launcher's run saw of COMM_WORLD (MPI_CODE): rank, size, sum of ranks."""
    return [path.read_text() for path in sorted(folder.glob(f"{launcher}.*"))]


def _tasks(records: list[dict[str, str]]) -> list[dict[str, str]]:
    """The job's parallel tasks in its accounting (each qrsh -inherit it ran)."""
    return [r for r in records if r["pe_taskid"] != "NONE"]


def test_a_pe_job_runs_its_slots_as_ranks_with_this_hosts_agent_forked(sge: SgeBed, tmp_path: Path) -> None:
    """No -n: NSLOTS ranks, on PE_HOSTFILE's hosts (this one); the agent is forked, as mpirun's
    and hydra's are on their own host: no qrsh task, nothing of the engine's secret."""
    logs = tmp_path / "logs"
    job, out = _submit(sge, tmp_path, f"{MPILAUNCH} --output-filename {logs} {_show(tmp_path)}\necho status $?\n", 3)
    lines = _rows(out)
    assert sorted(lines[:3]) == [f"{r} 3 {r} 3 {job} False False" for r in range(3)] and lines[3] == "status 0", out
    for rank in range(3):
        assert (logs / "1" / f"rank.{rank}" / "stderr").read_text() == f"err {rank}\n"
    records = sge.wait_job(job)
    assert not _tasks(records) and records[-1]["exit_status"] == "0", records


@pytest.mark.parametrize("words", ["hydra", "openmpi-mca", "openmpi"])
def test_peers_words_start_this_hosts_agent_as_a_task_of_the_job(sge: SgeBed, tmp_path: Path, words: str) -> None:
    """HYDRA_LAUNCHER_AUTOFORK=0, or Open MPI's ras_base_launch_orted_on_hn (-mca or its variable):
    this host's agent starts through `qrsh -inherit`, so every rank runs under the task's
    qrsh_starter, the job's accounting has the task, and the agents' secret stays theirs."""
    line = f"{MPILAUNCH} -n 2 {_show(tmp_path)}"
    if words == "openmpi-mca":
        line = f"{MPILAUNCH} -mca ras_base_launch_orted_on_hn 1 -n 2 {_show(tmp_path)}"
    elif words in FORCED:
        line = FORCED[words] + line
    job, out = _submit(sge, tmp_path, f"{line}\necho status $?\n", 2)
    lines = _rows(out)
    assert sorted(lines[:2]) == [f"{r} 2 {r} 2 {job} True False" for r in range(2)] and lines[2] == "status 0", out
    records = sge.wait_job(job)
    assert len(_tasks(records)) == 1 and _tasks(records)[0]["exit_status"] == "0", records


def test_mpich_ranks_wire_up_as_under_hydras_sge_bootstrap(sge: SgeBed, tmp_path: Path) -> None:
    """mpi4py over the mpich wheel: one COMM_WORLD under mpilaunch, as under hydra's own
    `-bootstrap sge` in the same job (both forced through qrsh: one task each)."""
    pytest.importorskip("mpi4py")
    hydra = Path(sysconfig.get_path("scripts")) / "mpiexec.hydra"
    if not hydra.exists():
        pytest.skip("needs the mpich wheel's mpiexec.hydra")
    code = shlex.quote(MPI_CODE)
    body = (
        f"export HYDRA_LAUNCHER_AUTOFORK=0\n"
        f"{hydra} -bootstrap sge -n 3 {shlex.quote(PY)} -c {code} hydra; echo status $?\n"
        f"{MPILAUNCH} -q -n 3 {shlex.quote(PY)} -c {code} mpilaunch; echo status $?\n"
    )
    job, out = _submit(sge, tmp_path, body, 3)
    assert out.splitlines() == ["status 0", "status 0"], out
    assert _views(tmp_path, "hydra") == _views(tmp_path, "mpilaunch") == ["0 3 3", "1 3 3", "2 3 3"]
    assert len(_tasks(sge.wait_job(job))) == 2


def test_open_mpi_ranks_wire_up_as_under_mpiruns_sge_launch(sge: SgeBed, tmp_path: Path) -> None:
    """Open MPI ranks (Debian's python3-mpi4py): one COMM_WORLD under mpilaunch's PMIx server,
    as under Open MPI's own SGE launch in the same job (its orted forced through qrsh on this
    one node, its peers kept on loopback)."""
    mpirun, python3 = shutil.which("mpirun.openmpi"), "/usr/bin/python3"
    probe = subprocess.run([python3, "-c", "from mpi4py import MPI"], capture_output=True) if mpirun else None
    if probe is None or probe.returncode != 0:
        pytest.skip("needs Debian's openmpi-bin and python3-mpi4py")
    code = shlex.quote(MPI_CODE)
    forced = "--mca ras_base_launch_orted_on_hn 1 --mca oob_tcp_if_include lo"
    body = (
        f"{mpirun} {forced} -n 3 {python3} -c {code} mpirun; echo status $?\n"
        f"{MPILAUNCH} -q {forced} -n 3 {python3} -c {code} mpilaunch; echo status $?\n"
    )
    job, out = _submit(sge, tmp_path, body, 3)
    assert out.splitlines() == ["status 0", "status 0"], out
    assert _views(tmp_path, "mpirun") == _views(tmp_path, "mpilaunch") == ["0 3 3", "1 3 3", "2 3 3"]
    assert len(_tasks(sge.wait_job(job))) == 2


@pytest.mark.parametrize("forced", [False, True], ids=["forked", "qrsh"])
def test_a_failed_rank_ends_the_job_with_its_code(sge: SgeBed, tmp_path: Path, forced: bool) -> None:
    marks = tmp_path / "pids"
    marks.mkdir()
    line = f"{FORCED['hydra'] if forced else ''}exec {MPILAUNCH} {_show(tmp_path)} {marks} 3\n"
    job, out = _submit(sge, tmp_path, line, 3)
    assert "Rank:      1" in out and "Exit code: 3" in out, out
    assert f"1 3 1 3 {job} {forced} False" in _rows(out), out  # the failed rank, one of NSLOTS
    records = sge.wait_job(job)
    assert records[-1]["pe_taskid"] == "NONE" and records[-1]["exit_status"] == "3", records
    assert [r["exit_status"] for r in _tasks(records)] == (["0"] if forced else []), records


def test_a_job_through_qrsh(sge: SgeBed, tmp_path: Path) -> None:
    """An interactive parallel job (`qrsh -pe`): the same, its output back through qrsh."""
    (tmp_path / "show.py").write_text(SHOW)
    argv = ["qrsh", "-now", "no", "-V", "-pe", "mpi", "3", "-cwd", PY, "-m", "mpilaunch", PY, str(tmp_path / "show.py")]
    proc = sge.run(argv, env=_env(sge), timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = sorted(line.split()[:4] for line in proc.stdout.splitlines())
    assert rows == [[str(r), "3", str(r), "3"] for r in range(3)], proc.stdout


def test_a_host_qrsh_refuses_is_one_line_with_qrshs_words(sge: SgeBed, tmp_path: Path) -> None:
    """A host the job was not granted: qrsh's own refusal names it; a user or port given for a
    host: qrsh takes none. One line, status 2, nothing started."""
    body = (
        f"{MPILAUNCH} --launcher sge -H {sge.node}:1,nosuchnode:1 -n 2 true; echo status $?\n"
        f"{MPILAUNCH} --launcher sge -H {sge.node}:1,someone@nosuchnode:1 -n 2 true; echo status $?\n"
    )
    _, out = _submit(sge, tmp_path, body, 2)
    assert [line for line in out.splitlines() if not line.startswith("mpilaunch: nosuchnode: qrsh exited")] == [
        "status 2",
        "mpilaunch: nosuchnode: qrsh takes no user or port: Grid Engine starts the task as the job's user",
        "status 2",
    ], out
    refused = [line for line in out.splitlines() if line.startswith("mpilaunch: nosuchnode: qrsh exited with status ")]
    assert len(refused) == 1 and refused[0].endswith("(before its agent connected back)"), out


@pytest.mark.parametrize("forced", [False, True], ids=["forked", "qrsh"])
def test_qdel_leaves_nothing(sge: SgeBed, tmp_path: Path, forced: bool) -> None:
    """qdel kills the job's process groups with SIGKILL (the launcher, and the agent: forked in
    the job's group, or in its qrsh task's); the ranks run in sessions of their own, so only the
    agent's guardian, in a session of its own too, ends them."""
    marks = tmp_path / "pids"
    marks.mkdir()
    line = f"{FORCED['hydra'] if forced else ''}{MPILAUNCH} {_show(tmp_path)} {marks} sleep\n"
    job, _ = _submit(sge, tmp_path, line, 3, sync=False)
    pids = _wait_for_files(marks, 3)
    assert [_in_a_task(pid) for pid in pids] == [forced] * 3
    assert sge.run(["qdel", job]).returncode == 0
    assert not _gone(pids)
    records = sge.wait_job(job)
    assert records[-1]["failed"] != "0", records  # killed by Grid Engine
    assert not sge.wait_clean(10.0)


def _launcher_of(marks: Path) -> int:
    """The mpilaunch process of the job (the job script wrote its pid, then exec'd it)."""
    pid = int((marks.parent / "launcher.pid").read_text())
    assert "python" in process_name(pid), process_name(pid)
    return pid


@pytest.mark.parametrize("forced", [False, True], ids=["forked", "qrsh"])
def test_kill_9_of_the_launcher_leaves_nothing(sge: SgeBed, tmp_path: Path, forced: bool) -> None:
    marks = tmp_path / "pids"
    marks.mkdir()
    force = FORCED["hydra"] if forced else ""
    line = f"echo $$ > launcher.pid\n{force}exec {MPILAUNCH} {_show(tmp_path)} {marks} sleep\n"
    job, _ = _submit(sge, tmp_path, line, 3, sync=False)
    pids = _wait_for_files(marks, 3)
    assert [_in_a_task(pid) for pid in pids] == [forced] * 3
    os.kill(_launcher_of(marks), signal.SIGKILL)
    assert not _gone(pids)
    sge.wait_job(job)
    assert not sge.wait_clean(10.0)


def test_a_lost_task_ends_the_job_and_says_so(sge: SgeBed, tmp_path: Path) -> None:
    """The qrsh carrying this host's agent is killed: Grid Engine ends the task, the launcher
    loses the host, says why, ends the job with a failure, and nothing is left."""
    marks = tmp_path / "pids"
    marks.mkdir()
    line = f"echo $$ > launcher.pid\n{FORCED['hydra']}exec {MPILAUNCH} {_show(tmp_path)} {marks} sleep\n"
    job, _ = _submit(sge, tmp_path, line, 3, sync=False)
    pids = _wait_for_files(marks, 3)
    launcher = _launcher_of(marks)
    qrsh = [p for p in sge.leftover_pids() if parent_pid(p) == launcher and process_name(p) == "qrsh"]
    assert len(qrsh) == 1, qrsh
    os.kill(qrsh[0], signal.SIGKILL)
    assert not _gone(pids)
    records = sge.wait_job(job)
    out = (tmp_path / "job.out").read_text()
    assert f"mpilaunch: lost the agent of host {sge.node} (its Grid Engine task ended (qrsh exited with" in out, out
    assert records[-1]["exit_status"] not in ("0", ""), records
    assert not sge.wait_clean(10.0)
