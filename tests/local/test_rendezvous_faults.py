"""torchrun's launchers per node when their meeting goes wrong ("Never silent, never wrong"):
the store's launcher killed while the others meet or while their ranks run, an endpoint that
does not resolve or is no endpoint at all. Every launcher says so in one line naming the
endpoint, within seconds, with torchrun's status (1 for a rendezvous that failed, as torchrun
2.13's RendezvousConnectionError; 2 for an option refused before anything starts). And the
meeting's store on a loopback endpoint listens there only, and sums what it refused in one line.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from mpilaunch.host import tcpstore
from tests.conftest import Launcher, write_script
from tests.procs import listening_addresses

HANG = 120.0  # a guard against a hang, never a measure
FEW_SECONDS = 15.0  # the "within a few seconds" (torchrun: about 2 s), asserted generously
HOST = "127.0.0.1"

WAITS = """
import os, pathlib, sys, time
folder = pathlib.Path(sys.argv[1])
(folder / ("up." + os.environ["RANK"])).touch()
while not (folder / "go").exists():
    time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def c10d(launcher: Launcher, nnodes: int, port: int, *args: str) -> subprocess.Popen:
    """One node's launcher, as torchrun's c10d users start it on every node alike."""
    words = ("--nnodes", str(nnodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d")
    return launcher.popen(*words, "--rdzv-endpoint", f"{HOST}:{port}", *args)


def store_launcher(procs: list[subprocess.Popen], port: int) -> subprocess.Popen:
    """The launcher whose process listens on the endpoint's port."""
    for proc in procs:
        if any(
            c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in psutil.Process(proc.pid).net_connections()
        ):
            return proc
    raise AssertionError("no launcher serves the store")


def wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def end(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(HANG)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("when", ["meeting", "running"])
def test_the_stores_launcher_killed_ends_every_other_launcher_in_seconds_in_one_line(
    launcher: Launcher, tmp_path: Path, when: str
) -> None:
    """Three launchers. While they meet (a fourth is awaited) or while their ranks run, the one
    that serves the store is killed with SIGKILL: the two others exit 1, as torchrun's do, each
    with one line naming the store, within seconds (they waited silently for minutes)."""
    port = free_port()
    script = write_script(tmp_path, "waits.py", WAITS)
    nnodes = 4 if when == "meeting" else 3
    procs = [c10d(launcher, nnodes, port, script, str(tmp_path)) for _ in range(3)]
    try:
        if when == "meeting":
            with tcpstore.StoreClient(HOST, port, HANG) as look:
                look.wait([f"mpilaunch/0/joined/{slot}" for slot in range(3)], HANG)
        else:
            wait_for(lambda: len(list(tmp_path.glob("up.*"))) == 3, "the ranks never started")
        host = store_launcher(procs, port)
        host.kill()
        killed = time.monotonic()
        others = [proc for proc in procs if proc is not host]
        for proc in others:
            proc.wait(HANG)
            took = time.monotonic() - killed
            err = proc.stderr.read().decode()  # type: ignore[union-attr]
            print(f"[fault] store's launcher killed while {when}: another launcher ended {took:.3f} s after")
            assert proc.returncode == 1, err
            assert took < FEW_SECONDS, f"{took:.1f} s: {err}"
            assert len(err.splitlines()) == 1, err
            assert err.startswith(f"mpilaunch: the rendezvous store at {HOST}:{port} went away"), err
    finally:
        (tmp_path / "go").touch()
        end(procs)


@pytest.mark.parametrize(
    "words",
    [
        ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "nosuchhost.invalid:29400"),
        ("--nnodes", "2", "--node-rank", "1", "--master-addr", "nosuchhost.invalid", "--master-port", "29400"),
        ("--nnodes", "2", "--node-rank", "0", "--master-addr", "nosuchhost.invalid", "--master-port", "29400"),
    ],
    ids=["c10d", "static-node-1", "static-node-0"],
)
def test_an_endpoint_that_does_not_resolve_is_one_line_in_seconds(launcher: Launcher, words: tuple[str, ...]) -> None:
    started = time.monotonic()
    proc = launcher.run(*words, "--nproc-per-node", "1", "true", timeout=HANG)
    took = time.monotonic() - started
    err = proc.stderr.decode()
    print(f"[fault] an endpoint that does not resolve: the launcher ended {took:.2f} s after its start")
    assert proc.returncode == 1 and took < FEW_SECONDS, (took, err)
    port = words[-1].rpartition(":")[2]
    assert err.startswith(f"mpilaunch: cannot reach the rendezvous store at nosuchhost.invalid:{port}: no such host")
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "words",
    [
        ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", b"ho\xffst:29400"),
        ("--nnodes", "2", "--node-rank", "1", "--master-addr", b"ho\xffst"),
        ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:-1"),
    ],
    ids=["endpoint-not-utf8", "master-addr-not-utf8", "negative-port"],
)
def test_an_endpoint_that_is_none_is_refused_in_one_line_before_anything_starts(
    launcher: Launcher, words: tuple[str | bytes, ...]
) -> None:
    """A byte that is not UTF-8 in the endpoint (a UnicodeError traceback from getaddrinfo) or in
    --master-addr (a silent wait), a negative port (taken as no port at all): refused as bad input."""
    proc = launcher.run(*words, "--nproc-per-node", "1", "true", timeout=HANG)  # type: ignore[arg-type]
    err = proc.stderr
    assert proc.returncode == 2 and b"Traceback" not in err, err
    assert len(err.splitlines()) == 1 and err.startswith(b"mpilaunch: --"), err
    assert b"expected HOST[:PORT]" in err or b"expected a host name or an address" in err, err


def test_the_meetings_store_on_a_loopback_endpoint_listens_there_only_and_sums_what_it_refused(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Two launchers meet at 127.0.0.1: the store listens on 127.0.0.1 alone (it listened on
    every address). Connections that are no TCPStore client reach it meanwhile: the job runs on
    and ends well, and the store's launcher says what it dropped in one line."""
    port = free_port()
    script = write_script(tmp_path, "waits.py", WAITS)
    procs = [c10d(launcher, 2, port, script, str(tmp_path)) for _ in range(2)]
    try:
        wait_for(lambda: len(list(tmp_path.glob("up.*"))) == 2, "the ranks never started")
        assert listening_addresses(port) == {HOST}
        for garbage in (b"GET / HTTP/1.0\r\n\r\n", b"\x00" + struct.pack("=I", tcpstore.MAGIC) + b"\x63"):
            with socket.create_connection((HOST, port), timeout=HANG) as sock:
                sock.sendall(garbage)
                assert sock.recv(100) == b""  # dropped
        (tmp_path / "go").touch()
        errs = {}
        for proc in procs:
            proc.wait(HANG)
            errs[proc.pid] = proc.stderr.read().decode()  # type: ignore[union-attr]
            assert proc.returncode == 0, errs[proc.pid]
        said = [line for err in errs.values() for line in err.splitlines()]
        assert said == [
            f"mpilaunch: the rendezvous store at {HOST}:{port} dropped 2 connections that broke TCPStore's "
            "protocol (the first: the first request was neither VALIDATE with torch's number nor a request of "
            "torch before 2.2)"
        ]
    finally:
        (tmp_path / "go").touch()
        end(procs)
