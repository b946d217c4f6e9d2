"""The job the stack tests run (issue 30), here and over the sshd bed and with Open MPI ranks:
three Python ranks, two waiting in an MPI barrier and one sleeping in `stuck_here` until a flag
file appears; what a snapshot of their stacks must show; a running launcher whose stderr is read
as it comes."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

MPI4PY_RANK = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
def stuck_here(flag):
    while not os.path.exists(flag):
        time.sleep(0.5)  # long: a native snapshot finds it in nanosleep
print("up", comm.rank, flush=True)
if comm.rank == 2:
    stuck_here(sys.argv[1])
comm.Barrier()
print("done", comm.rank, flush=True)
"""

# Debian's Open MPI 4.1 loaded with ctypes (as tests/mpi/test_openmpi_ranks.py does), served PMIx.
OPEN_MPI_RANK = """
import ctypes, os, sys, time
lib = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
lib.MPI_Init(None, None)
world = ctypes.c_void_p(ctypes.addressof(ctypes.c_void_p.in_dll(lib, "ompi_mpi_comm_world")))
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
def stuck_here(flag):
    while not os.path.exists(flag):
        time.sleep(0.5)  # long: a native snapshot finds it in nanosleep
print("up", rank, flush=True)
if rank == 2:
    stuck_here(sys.argv[1])
lib.MPI_Barrier(world)
print("done", rank, flush=True)
lib.MPI_Finalize()
"""


class Running:
    """A started launcher: its stdout and stderr read by threads, line by line, as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.out: queue.Queue[str] = queue.Queue()
        self.err_lines: list[str] = []
        self.out_lines: list[str] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, args=(proc.stdout, self.out_lines, True), daemon=True).start()
        threading.Thread(target=self._read, args=(proc.stderr, self.err_lines, False), daemon=True).start()

    def _read(self, stream, into: list[str], tell: bool) -> None:  # type: ignore[no-untyped-def]
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            with self.lock:
                into.append(line)
            if tell:
                self.out.put(line)

    def wait_out(self, count: int, timeout: float = 60.0) -> list[str]:
        """The next count lines of stdout; a launcher that ends first fails the test with its stderr."""
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        while len(lines) < count:
            try:
                lines.append(self.out.get(timeout=0.1))
            except queue.Empty:
                ended = self.proc.poll() is not None
                if ended or time.monotonic() > deadline:
                    time.sleep(0.1)  # the readers take the last lines
                    why = f"ended with status {self.proc.returncode}" if ended else f"still running after {timeout} s"
                    said = f"{len(lines)} of {count} lines on stdout, launcher {why}"
                    raise AssertionError(f"{said}:\n{self.err()[-4000:]}") from None
        return lines

    def wait_err(self, pattern: str, count: int = 1, timeout: float = 60.0) -> str:
        """stderr so far, once it holds count lines that match pattern."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.err()
            if len(re.findall(pattern, text, re.M)) >= count:
                return text
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"no {count} lines like {pattern!r} on stderr:\n{text[-4000:]}")
            time.sleep(0.05)

    def err(self) -> str:
        with self.lock:
            return "".join(self.err_lines)

    def finish(self, timeout: float = 60.0) -> int:
        try:
            status = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.1)  # the readers take the last lines
        return status


def snapshot(text: str, number: int = 1) -> list[str]:
    """The lines of the number-th snapshot printed on stderr: its header, then its own lines."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"mpilaunch: (stacks of|no stack of)", line)]
    assert len(starts) >= number, text[-4000:]
    start = starts[number - 1]
    body = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        body.append(line)
    return body


def two_groups(lines: list[str], why: str = "SIGQUIT", script: str = "rank.py") -> None:
    """ranks 0-1 in the barrier, one group; rank 2 in stuck_here, a group of its own, whole."""
    assert lines[0].startswith(f"mpilaunch: stacks of 3 of 3 running ranks ({why}): 2 groups"), lines
    assert re.fullmatch(rf"  ranks 0-1 \(2\): {script}:\d+ in <module>", lines[1]), lines
    assert re.fullmatch(rf"  rank 2 \(1\): {script}:\d+ in <module> > stuck_here", lines[2]), lines
    assert lines[3] == "  rank 2, whole:" and re.fullmatch(rf"    {script}:\d+ in stuck_here", lines[-1]), lines


def python_without_py_spy(where: Path) -> str:
    """A venv's interpreter with no py-spy beside it, that sees this interpreter's packages (click,
    mpi4py, mpilaunch as installed): the launcher, and the agents it starts, run with it."""
    venv = [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(where)]
    subprocess.run(venv, check=True, timeout=120)
    return str(where / "bin" / "python")


def release(flag: Path) -> None:
    flag.write_text("")
