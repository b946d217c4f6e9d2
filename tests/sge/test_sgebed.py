"""The one-node Grid Engine cell itself (tests/sgebed.py): it starts from nothing within a
minute, runs parallel jobs as a real cell does (PE_HOSTFILE, NSLOTS, `qrsh -inherit` tasks
counted in the accounting, their exit codes passed back), and its close leaves no process."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from tests.procs import pid_alive
from tests.sgebed import SgeBed, job_id_of, sge_available, sgebed_fixtures

available, why = sge_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
sge, clean_sge = sgebed_fixtures("sgebedself")


def test_a_parallel_job_sees_its_hosts_slots_and_cell(sge: SgeBed, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        'cat "$PE_HOSTFILE"\n'
        'echo "$NSLOTS $JOB_ID $SGE_ROOT $ARC"\n'
        f"qrsh -inherit -nostdin -V {sge.node} 'exit 7'\n"
        "echo task $?\n"
        f"qrsh -inherit -nostdin -V {sge.node} 'echo in a task'\n"
    )
    out = tmp_path / "job.out"
    argv = ["qsub", "-pe", "mpi", "3", "-sync", "y", "-j", "y", "-o", str(out), str(script)]
    proc = sge.run(argv, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = job_id_of(proc.stdout)
    assert out.read_text().splitlines() == [
        f"{sge.node} 3 all.q@{sge.node} UNDEFINED",
        f"3 {job} {sge.root} lx-amd64",
        "task 7",
        "in a task",
    ]
    records = sge.wait_job(job)
    assert [r["pe_taskid"] != "NONE" for r in records] == [True, True, False], records
    assert [r["exit_status"] for r in records] == ["7", "0", "0"], records


def test_a_process_that_leaves_its_tasks_session_survives_qdel(sge: SgeBed, tmp_path: Path) -> None:
    """What the agent's guardian is for: qdel SIGKILLs a task's process group and session, and
    what `setsid` took out of them lives on (killed here by the pid it wrote)."""
    mark = tmp_path / "escaped"
    script = tmp_path / "job.sh"
    task = f"setsid sh -c 'echo $$ > {mark}; exec sleep 300' & sleep 300"
    script.write_text(f"#!/bin/sh\nqrsh -inherit -nostdin -V {sge.node} {shlex.quote(task)}\n")
    proc = sge.run(["qsub", "-pe", "mpi", "1", "-j", "y", "-o", "/dev/null", str(script)], timeout=60)
    job = job_id_of(proc.stdout)
    deadline = time.monotonic() + 60
    while not (mark.exists() and mark.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    escaped = int(mark.read_text())
    assert sge.run(["qdel", job]).returncode == 0
    sge.wait_job(job)
    try:
        assert pid_alive(escaped)
    finally:
        sge.kill_leftovers()


def test_the_cell_starts_within_a_minute_and_its_close_leaves_nothing(tmp_path: Path) -> None:
    bed = SgeBed(tmp_path / "cell", slots=2).start()
    try:
        daemons = list(bed.daemon_pids().values())
        assert len(daemons) == 2 and bed.start_seconds < 60
        proc = bed.run(["qsub", "-pe", "mpi", "2", "-sync", "y", "-b", "y", "-o", "/dev/null", "-j", "y", "true"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        bed.close()
    assert not [pid for pid in daemons if pid_alive(pid)]
    assert not bed.leftover_pids()
