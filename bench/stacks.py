"""How long every rank's stack takes to be printed (Ctrl-\\, SIGQUIT to the launcher), with py-spy,
and that taking stacks does not change a job's result.

Run by hand:  python -m bench.stacks [--ranks 64] [--rounds 5] [--work 150000]
Two jobs of --ranks Python ranks (mpi4py, MPICH) on this machine:
- idle: every rank sleeps in a function until a file appears (a job that hangs waiting);
- busy: every rank hashes (--work rounds of sha256, all cores busy), then one allreduce of
  what each found; rank 0 prints the sum. Run once untouched and once with a SIGQUIT every
  1.5 s: the printed sum and the exit status must be the same.
Each SIGQUIT's time is from the signal to the snapshot's lines on the launcher's stderr (they
come in one write). mpilaunch is the one `pip install` gives (bench/installed.py), its ranks that
venv's Python (mpi4py over the `mpich` wheel), py-spy beside them.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench import TAG, tagged

IDLE = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
def wait_for(flag):
    while not os.path.exists(flag):
        time.sleep(0.05)
print("up", flush=True)
wait_for(sys.argv[1])
"""
BUSY = """
import hashlib, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
def work(rounds):
    digest = comm.rank.to_bytes(8, "big")
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return int.from_bytes(digest[:4], "big")
print("up", flush=True)
total = comm.allreduce(work(int(sys.argv[1])))
if comm.rank == 0:
    print("sum", total, flush=True)
"""


class Job:
    """A launcher whose stderr lines are stamped with the time they came."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        self.err: list[tuple[float, str]] = []
        self.out: list[str] = []
        self.threads = [
            threading.Thread(target=self._read_err, daemon=True),
            threading.Thread(target=self._read_out, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            self.err.append((time.monotonic(), line.decode(errors="replace")))

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.out.append(line.decode(errors="replace"))

    def wait_up(self, ranks: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while sum(line == "up\n" for line in self.out) < ranks:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("the ranks did not start:\n" + "".join(line for _, line in self.err))
            time.sleep(0.02)

    def stacks(self) -> float:
        """SIGQUIT, then the seconds until the snapshot is printed."""
        seen = sum("mpilaunch: stacks of" in line for _, line in self.err)
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGQUIT)
        while True:
            printed = [when for when, line in self.err if "mpilaunch: stacks of" in line]
            if len(printed) > seen:
                return printed[seen] - sent
            if time.monotonic() - sent > 60 or self.proc.poll() is not None:
                raise SystemExit("no stacks:\n" + "".join(line for _, line in self.err[-40:]))
            time.sleep(0.005)

    def finish(self) -> int:
        status = self.proc.wait(timeout=600)
        for thread in self.threads:
            thread.join(5)
        return status


def run(ranks: int, rounds: int, work: int) -> None:
    from bench.installed import clean_env, installed

    venv = installed()
    python = str(venv / "python")
    py_spy = venv / "py-spy"
    if not os.access(py_spy, os.X_OK):
        raise SystemExit(f"no py-spy in {venv}")
    tag = uuid.uuid4().hex
    env = {**clean_env(), TAG: tag, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as folder:
        idle, busy, flag = Path(folder, "idle.py"), Path(folder, "busy.py"), Path(folder, "flag")
        idle.write_text(IDLE)
        busy.write_text(BUSY)
        common = [str(venv / "mpilaunch"), "-n", str(ranks), "--oversubscribe"]

        job = Job([*common, python, str(idle), str(flag)], env)
        job.wait_up(ranks)
        time.sleep(1.0)
        idle_times = []
        for _ in range(rounds):
            idle_times.append(job.stacks())
            time.sleep(1.2)  # a second SIGQUIT within 1 s would stop the job
        lines = [line for _, line in job.err if line.startswith("mpilaunch: stacks of")]
        flag.write_text("")
        idle_status = job.finish()

        started = time.monotonic()
        plain = Job([*common, python, str(busy), str(work)], env)
        plain_status = plain.finish()
        plain_wall = time.monotonic() - started

        started = time.monotonic()
        job = Job([*common, python, str(busy), str(work)], env)
        job.wait_up(ranks)
        busy_times = []
        while job.proc.poll() is None and len(busy_times) < rounds:
            try:
                busy_times.append(job.stacks())
            except SystemExit:
                break  # the job ended meanwhile
            time.sleep(1.2)
        busy_status = job.finish()
        busy_wall = time.monotonic() - started
        busy_lines = [line for _, line in job.err if line.startswith("mpilaunch: stacks of")]
    left = tagged(tag)
    same = plain.out == job.out and plain_status == busy_status == 0
    print(f"{ranks} ranks on {os.cpu_count()} cores, py-spy at {py_spy}")
    print(f"idle ranks (sleeping):  {describe(idle_times)}; status {idle_status}")
    print(f"  {lines[0].strip() if lines else '(none)'}")
    print(f"busy ranks (hashing):   {describe(busy_times)}")
    print(f"  {busy_lines[0].strip() if busy_lines else '(none)'}")
    print(f"busy job: {plain_wall:.1f} s untouched, {busy_wall:.1f} s with {len(busy_times)} snapshots")
    print(f"result unchanged: {'yes' if same else 'NO'} ({''.join(plain.out).split()[-1:]} status {busy_status})")
    if left:
        print(f"processes left: {left}")


def describe(times: list[float]) -> str:
    if not times:
        return "no snapshot"
    shown = ", ".join(f"{t:.2f}" for t in times)
    return f"median {statistics.median(times):.2f} s, max {max(times):.2f} s ({shown})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=int, default=150000, help="sha256 rounds per rank in the busy job")
    args = parser.parse_args()
    run(args.ranks, args.rounds, args.work)


if __name__ == "__main__":
    main()
