"""Strangers at the --pmi-tcp port (issue 35, "Never silent, never wrong", item 6): anyone on the
host may connect to a port of 127.0.0.1. Connections that send nothing, garbage, a wrong PMI_ID,
or a rank's real PMI_ID from another user's process are closed and counted, in one or two lines
of stderr, while mpi4py ranks (the `mpich` wheel) wait in MPI_Init's PMI barrier for a rank that
has not connected yet; that rank then connects and the job ends well."""

from __future__ import annotations

import os
import random
import re
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import Launcher, write_script
from tests.stackjob import Running, release

pytest.importorskip("mpi4py")
PY = sys.executable
NOBODY = 65534

# Rank 1 waits for the flag before MPI_Init; ranks 0 and 2 are in MPI_Init meanwhile, in the PMI
# barrier that waits for rank 1.
RANK = """
import os, sys, time
print("rank", os.environ["PMI_RANK"], os.environ["PMI_PORT"], os.environ["PMI_ID"], os.getpid(), flush=True)
if os.environ["PMI_RANK"] == "1":
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
print("world", comm.rank, comm.size, comm.allreduce(comm.rank), flush=True)
"""

GARBAGE = [
    b"GET / HTTP/1.0\r\n\r\n",
    b"\x00\xff" * 300,  # past the longest first line, with no newline
    b"cmd=initack pmiid=twelve\n",
    b"cmd=init pmi_version=1 pmi_subversion=1\n",
    b"\n",
]


class Job:
    """The running job, its flag, its PMI port (host, port), and each rank's PMI_ID and pid."""

    def __init__(self, launcher: Launcher, tmp_path: Path) -> None:
        self.flag = tmp_path / "flag"
        script = write_script(tmp_path, "rank.py", RANK)
        self.run = Running(launcher.popen("--pmi-tcp", "-n", "3", PY, script, str(self.flag)))
        self.ids, self.pids, ports = {}, {}, set()
        for line in self.run.wait_out(3):
            _, rank, port, ident, pid = line.split()
            self.ids[int(rank)] = int(ident)
            self.pids[int(rank)] = int(pid)
            ports.add(port)
        (where,) = ports
        host, port = where.split(":")
        self.port = (host, int(port))

    def ended_well(self) -> str:
        """Rank 1 goes on: the job ends 0 with one COMM_WORLD of 3; its stderr."""
        release(self.flag)
        status = self.run.finish(timeout=120)
        err = self.run.err()
        assert status == 0, err[-3000:]
        assert sorted(self.run.out_lines[3:]) == [f"world {r} 3 3\n" for r in range(3)], self.run.out_lines
        return err


@pytest.fixture
def job(launcher: Launcher, tmp_path: Path) -> Iterator[Job]:
    started = Job(launcher, tmp_path)
    yield started
    if started.run.proc.poll() is None:  # the test failed: its agent ends the ranks once the launcher is gone
        started.run.proc.kill()
        started.run.proc.wait()


def wait_answered(pid: int, port: int, timeout: float = 60.0) -> None:
    """Until the agent has answered the rank at the PMI port (`ss` counts the bytes its
    connection received): it was let in, before the strangers come."""
    proc = psutil.Process(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for conn in proc.net_connections("tcp"):
            if conn.raddr and conn.raddr[1] == port and conn.status == "ESTABLISHED":
                ours = f"( sport = :{conn.laddr[1]} and dport = :{port} )"
                info = subprocess.run(["ss", "-tinH", "state", "established", ours], capture_output=True, text=True)
                got = re.search(r"bytes_received:(\d+)", info.stdout)
                if got and int(got.group(1)) > 0:
                    return
        time.sleep(0.02)
    raise AssertionError(f"rank {pid} not answered at the PMI port {port} after {timeout} s")


def closed_unanswered(socks: list[socket.socket], timeout: float = 60.0) -> list[bytes]:
    """Waits until the far end closed each socket; what each was sent before that."""
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {}
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        got[sock] = b""
    open_ = set(socks)
    while open_:
        ready = sel.select(timeout)
        assert ready, f"{len(open_)} connections still open after {timeout} s"
        for key, _ in ready:
            sock = key.fileobj
            try:
                data = sock.recv(4096)  # type: ignore[union-attr]
            except ConnectionResetError:
                data = b""
            got[sock] += data  # type: ignore[index]
            if not data:
                sel.unregister(sock)
                open_.discard(sock)  # type: ignore[arg-type]
                sock.close()  # type: ignore[union-attr]
    sel.close()
    return [got[s] for s in socks]


def refusal_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "PMI" in line and "refused" in line]


def test_strangers_at_the_pmi_port_neither_end_the_job_nor_flood_stderr(job: Job) -> None:
    """80 connections that send nothing (70 held open: more than the 64 that may wait to speak),
    50 that send garbage and 50 with a wrong PMI_ID are all closed unanswered; then, while 70
    more silent ones hold the port, rank 1 connects and the job ends well, with two lines about
    all of them. Before: 16 refusals closed the port and ended the job (`PMI port closed after 16
    connections with a wrong PMI_ID`, status 1), each refusal printed its own line, and a
    connection that sent nothing was held open for ever."""
    port = job.port
    for rank in (0, 2):  # let in before the strangers come, as the test means them to be
        wait_answered(job.pids[rank], port[1])
    wrong = set()
    while len(wrong) < 50:
        guess = random.randrange(2, 1 << 31)
        if guess not in job.ids.values():
            wrong.add(guess)
    silent = [socket.create_connection(port) for _ in range(70)]  # held open, sending nothing
    for _ in range(10):  # opened and closed at once
        socket.create_connection(port).close()
    talkers = []
    for i in range(50):
        sock = socket.create_connection(port)
        sock.sendall(GARBAGE[i % len(GARBAGE)])
        talkers.append(sock)
    for guess in wrong:
        sock = socket.create_connection(port)
        sock.sendall(b"cmd=initack pmiid=%d\n" % guess)
        talkers.append(sock)
    assert closed_unanswered(talkers + silent) == [b""] * 170  # the silent ones too, after a short wait
    holding = [socket.create_connection(port) for _ in range(70)]
    try:
        err = job.ended_well()  # rank 1 connects past them
    finally:
        for sock in holding:
            sock.close()
    said = refusal_lines(err)
    assert len(said) == 2, err
    assert said[0].startswith("mpilaunch: refused a PMI connection that did not present a valid PMI_ID (it "), said
    assert said[1] == (
        f"mpilaunch: refused 250 connections to the PMI port {port[0]}:{port[1]} in all: 150 sent nothing, "
        "50 sent no PMI hello, 50 presented a wrong or used PMI_ID"
    ), said


def connect_as(uid: int, port: tuple[str, int], line: bytes) -> bytes:
    """What a process of user `uid` is sent after it connects and sends `line` (b"": the
    connection was closed unanswered). A forked child, as the interpreter is not readable by
    that user."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.create_connection(port)
            sock.sendall(line)
            sock.settimeout(30)
            os.write(write_end, b"ok " + sock.recv(100))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as got:
        said = got.read()
    os.waitpid(pid, 0)
    assert said.startswith(b"ok "), said
    return said[3:]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_users_process_is_refused_even_with_a_ranks_own_id(job: Job) -> None:
    """The id keeps other users out; one that presents a rank's real id is refused all the same,
    and the id stays the rank's. Before, it was served as that rank, and the rank was refused."""
    port = job.port
    assert connect_as(NOBODY, port, b"cmd=initack pmiid=%d\n" % job.ids[1]) == b""
    assert connect_as(NOBODY, port, b"cmd=initack pmiid=%d\n" % job.ids[1]) == b""
    err = job.ended_well()
    said = refusal_lines(err)
    assert said == [
        f"mpilaunch: refused a PMI connection from a process of another user (uid {NOBODY}); "
        "any more are summed up at the end",
        f"mpilaunch: refused 2 connections to the PMI port {port[0]}:{port[1]} in all: 2 came from another user",
    ], err
    assert not re.search(r"Traceback|PMI port closed", err), err
