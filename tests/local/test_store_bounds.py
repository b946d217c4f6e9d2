"""The ranks' store that rank 0's agent serves under torchrun's words, with real torch 2.13
ranks on it ("Never silent, never wrong"): on one host it listens on loopback only; a client
that pipelines large GETs and never reads leaves the agent's memory bounded; connections that
break the protocol are dropped, end nothing, and are said once, in one line.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpilaunch.host import tcpstore
from tests.conftest import Launcher, write_script
from tests.procs import listening_addresses, peak_rss_kib

HANG = 120.0  # a guard against a hang, never a measure
MIB = 1024 * 1024

RANKS = """
import json, os, pathlib, sys, time
import torch.distributed as dist
folder = pathlib.Path(sys.argv[1])
dist.init_process_group("gloo")  # its ranks meet in the agent's store
rank = dist.get_rank()
said = {"addr": os.environ["MASTER_ADDR"], "port": int(os.environ["MASTER_PORT"]), "agent": os.getppid()}
(folder / f"up.{rank}.tmp").write_text(json.dumps(said))
(folder / f"up.{rank}.tmp").rename(folder / f"up.{rank}")
while not (folder / "go").exists():
    time.sleep(0.05)
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
store.set(f"after/{rank}", "here")  # the store still serves its ranks after what it went through
store.wait([f"after/{1 - rank}"])
dist.barrier()
dist.destroy_process_group()
"""


class Job:
    """Two torch ranks on this machine under torchrun's words; what rank 0 said of its store."""

    def __init__(self, launcher: Launcher, folder: Path) -> None:
        self.folder = folder
        script = write_script(folder, "ranks.py", RANKS)
        self.proc = launcher.popen("--nproc-per-node", "2", script, str(folder))
        deadline = time.monotonic() + HANG
        while not all((folder / f"up.{rank}").exists() for rank in (0, 1)):
            assert self.proc.poll() is None, self.proc.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the ranks never met"
            time.sleep(0.05)
        said = json.loads((folder / "up.0").read_text())
        self.addr, self.port, self.agent = said["addr"], said["port"], said["agent"]

    def finish(self) -> tuple[int, str]:
        """Let the ranks end: the job's status and the launcher's stderr."""
        (self.folder / "go").touch()
        self.proc.wait(HANG)
        return self.proc.returncode, self.proc.stderr.read().decode()  # type: ignore[union-attr]


@pytest.fixture
def job(launcher: Launcher, tmp_path: Path) -> Iterator[Job]:
    made = Job(launcher, tmp_path)
    try:
        yield made
    finally:
        (tmp_path / "go").touch()
        if made.proc.poll() is None:
            made.proc.kill()
        made.proc.wait(HANG)
        made.proc.stdout.close()  # type: ignore[union-attr]
        made.proc.stderr.close()  # type: ignore[union-attr]


def request(command: int, *fields: bytes) -> bytes:
    return bytes((command,)) + b"".join(struct.pack("=Q", len(f)) + f for f in fields)


def ping(number: int) -> bytes:
    return bytes((tcpstore.PING,)) + struct.pack("=I", number)


def read_exactly(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = sock.recv(min(size - len(got), 4 * MIB))
        assert chunk, f"the store closed the connection after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)


def test_a_one_host_jobs_store_listens_on_loopback_only(job: Job) -> None:
    """Every rank is on this host (MASTER_ADDR localhost, as torchrun gives it): no other
    machine has any business with the store, and none can reach it (it listened on every address)."""
    assert job.addr == "localhost"
    assert listening_addresses(job.port) == {"127.0.0.1"}
    status, err = job.finish()
    assert status == 0, err


def test_a_client_that_pipelines_large_gets_and_never_reads_leaves_the_agent_bounded(job: Job) -> None:
    """One raw client sets an 8 MiB value, then asks for it 256 times (2 GiB) without reading
    a byte: the agent that serves the store stays under 200 MiB more than before (it built every
    reply first: 2.7 GB), and once the client reads, every reply comes, whole and in order."""
    before = peak_rss_kib(job.agent)
    value = bytes(range(256)) * (tcpstore.VALUE_MAX // 256)
    gets = 256
    with socket.create_connection((job.addr, job.port), timeout=HANG) as flood:
        flood.sendall(bytes((tcpstore.VALIDATE,)) + struct.pack("=I", tcpstore.MAGIC))
        flood.sendall(request(tcpstore.SET, b"big", value) + ping(1))
        assert read_exactly(flood, 4) == struct.pack("=I", 1)  # the value is stored
        flood.sendall(request(tcpstore.GET, b"big") * gets + ping(2))
        with tcpstore.StoreClient(job.addr, job.port, HANG) as other:  # two turns of the agent's loop
            other.add("turns", 1)  # later than the flood's bytes, which it read by then
            other.add("turns", 1)
        grown = peak_rss_kib(job.agent) - before
        print(
            f"[load] 2 GiB of GETs never read: the agent's peak RSS {before // 1024} -> {(before + grown) // 1024} MiB"
        )
        assert grown < 200 * 1024, f"the agent grew by {grown // 1024} MiB for 2 GiB asked"
        answer = struct.pack("=Q", len(value)) + value
        for index in range(gets):
            assert read_exactly(flood, len(answer)) == answer, f"reply {index}"
        assert read_exactly(flood, 4) == struct.pack("=I", 2)
    status, err = job.finish()
    assert status == 0 and "store" not in err, err


def test_connections_that_break_the_protocol_end_nothing_and_are_said_in_one_line(job: Job) -> None:
    """A port scanner's probe, an HTTP request, torch's VALIDATE followed by an unknown command
    or an oversized key, a connection that says nothing: each is dropped (or just closes), the
    job's ranks still use their store and end well, and the launcher says once what was dropped."""
    validate = bytes((tcpstore.VALIDATE,)) + struct.pack("=I", tcpstore.MAGIC)
    refused = [
        b"\x16\x03\x01\x02\x00\x01",  # a TLS hello's first bytes
        b"GET / HTTP/1.1\r\nHost: store\r\n\r\n",
        validate + bytes((200,)),
        validate + bytes((tcpstore.GET,)) + struct.pack("=Q", 1 << 40),
    ]
    for garbage in refused:
        with socket.create_connection((job.addr, job.port), timeout=HANG) as sock:
            sock.sendall(garbage)
            assert sock.recv(100) == b""  # the store dropped it
    with socket.create_connection((job.addr, job.port), timeout=HANG):
        pass  # a connection that says nothing and goes
    status, err = job.finish()
    assert status == 0, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mpilaunch: agent on ") and lines[0].endswith(
        f": the ranks' store on port {job.port} dropped 4 connections that broke TCPStore's protocol (the first: "
        "the first request was neither VALIDATE with torch's number nor a request of torch before 2.2)"
    ), err


def test_a_newer_torchs_command_is_said_at_once_and_its_connection_closed(job: Job) -> None:
    """A client that opens as torch does and then sends a command after BARRIER, as a torch
    after 2.13 whose release was not read before launch would: its connection is closed (its
    rank fails at once rather than waiting) and the launcher says so while the job still runs;
    the job's own ranks go on using their store."""
    opening = bytes((tcpstore.VALIDATE,)) + struct.pack("=I", tcpstore.MAGIC) + ping(7)
    with socket.create_connection((job.addr, job.port), timeout=HANG) as sock:
        sock.sendall(opening)
        assert read_exactly(sock, 4) == struct.pack("=I", 7)
        sock.sendall(request(19, b"/newer"))
        assert sock.recv(100) == b""
    assert select.select([job.proc.stderr], [], [], HANG)[0], "nothing was said while the job ran"
    line = job.proc.stderr.readline().decode()  # type: ignore[union-attr]
    assert not (job.folder / "go").exists()  # said before the job ends
    assert line.startswith("mpilaunch: agent on ") and line.endswith(
        ": the ranks' store closed a rank's connection: it sent command 19, which no torch from 2.0 to 2.14 sends; "
        "a torch read before launch outside 2.0 to 2.14 meets in rank 0's own store instead\n"
    ), line
    host = line[len("mpilaunch: agent on ") :].split(":")[0]
    status, err = job.finish()
    assert status == 0, err
    assert err.splitlines() == [
        f"mpilaunch: agent on {host}: the ranks' store on port {job.port} dropped 1 connection that broke "
        "TCPStore's protocol (the first: command 19, which no torch from 2.0 to 2.14 sends)"
    ], err
