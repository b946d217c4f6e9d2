"""A torchrun and an mpilaunch started as two nodes of one c10d job (issue "Drop-in II"): before,
both waited in silence until the join timeout. Now the mpilaunch says at once, whichever of the
two serves the store, that another node is a torchrun, and exits with torchrun's status 1. The
real torchrun 2.13 (`python -m torch.distributed.run`) is the other node, stopped by its pid."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher

pytest.importorskip("torch")
HOST = "127.0.0.1"
LINE = (
    "mpilaunch: a torchrun, not an mpilaunch, is a node of the meeting at {endpoint} (its /torch.rendezvous.job7 "
    "is in the store): start every node of the job with mpilaunch, or every one with torchrun\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


@pytest.mark.parametrize("first", ["torchrun", "mpilaunch"])
def test_a_torchrun_as_the_other_node_is_said_at_once(launcher: Launcher, tmp_path: Path, first: str) -> None:
    port = _free_port()
    endpoint = f"{HOST}:{port}"
    words = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    words += ["--rdzv-id", "job7", "--no-python", "true"]
    argv = {"torchrun": [sys.executable, "-m", "torch.distributed.run", *words], "mpilaunch": launcher.argv(*words)}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for who in (first, *({"torchrun", "mpilaunch"} - {first})):
            procs[who] = subprocess.Popen(
                argv[who], cwd=tmp_path, env=launcher.env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while who == first and not _listening(port):  # the first serves the store
                assert time.monotonic() < deadline and procs[who].poll() is None, f"{who} never served {endpoint}"
                time.sleep(0.05)
        started = time.monotonic()
        _, err = procs["mpilaunch"].communicate(timeout=60)
        assert (procs["mpilaunch"].returncode, err.decode()) == (1, LINE.format(endpoint=endpoint))
        assert time.monotonic() - started < 20  # at once, not at the join timeout (600 s)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
