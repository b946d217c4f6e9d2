"""A torch other than the one installed, for real, against the ranks' store: torch 2.14.1 (the
newest release this machine's pip may install), in a venv of its own over this interpreter's
packages (built once, tests/venvs.py). Its TCPStore clients of both flavours get from
mpilaunch's server the answers its own server gives them, request for request, and a torchrun
job of its ranks meets in the store rank 0's agent serves (TORCHELASTIC_USE_AGENT_STORE=True),
where a torch outside the served range would meet in rank 0's own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher
from tests.local.test_tcpstore_torch import HANG, OWN_STORE_RANK
from tests.venvs import TORCH_RELEASE as RELEASE
from tests.venvs import venv_or_skip

# Run by the venv's Python: the scenario of tests/local/test_tcpstore_torch.py against torch's
# own server and against `python -m mpilaunch.host.tcpstore` (started by this test, port in argv).
COMPARE = """
import sys, torch, torch.distributed as dist
from tests.local.test_tcpstore_torch import client, scenario
port, libuv = int(sys.argv[1]), sys.argv[2] == "libuv"
torchs = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=libuv, wait_for_workers=False)
expected = scenario(client(torchs.port, libuv))
ours = scenario(client(port, libuv))
print(torch.__version__, ours == expected, ours[:4])
"""


@pytest.fixture(scope="module")
def torch_python() -> Path:
    return venv_or_skip(f"torch-{RELEASE}")


def environment(launcher: Launcher) -> dict[str, str]:
    return {**launcher.env, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("flavour", ["libuv", "legacy"])
def test_its_clients_get_the_answers_its_own_server_gives(launcher: Launcher, torch_python: Path, flavour: str) -> None:
    server = subprocess.Popen(
        [str(torch_python), "-m", "mpilaunch.host.tcpstore", "--host", "127.0.0.1"],
        env=environment(launcher),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        port = server.stdout.readline().strip()  # type: ignore[union-attr]
        done = subprocess.run(
            [str(torch_python), "-c", COMPARE, port, flavour],
            env=environment(launcher),
            capture_output=True,
            text=True,
            timeout=HANG,
        )
    finally:
        server.terminate()
        server.wait(HANG)
        server.stdout.close()  # type: ignore[union-attr]
    assert done.returncode == 0, done.stderr[-3000:]
    version, same, first = done.stdout.split(maxsplit=2)
    assert version.startswith(RELEASE) and same == "True", done.stdout
    assert first.strip() == "[b'1', 5, -2, b'-2']"  # the scenario did run


def test_a_torchrun_job_of_it_meets_in_the_agents_store(launcher: Launcher, torch_python: Path) -> None:
    """Its release is read before launch and served: no line about it, and the ranks meet in
    the store of rank 0's agent, as under torchrun."""
    script = launcher.tmp_path / "rank.py"
    script.write_text(OWN_STORE_RANK)
    argv = [str(torch_python), "-m", "mpilaunch", "--nproc-per-node", "3", str(script)]
    done = subprocess.run(argv, env=environment(launcher), capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line.rsplit(" ", 1)[0] for line in done.stdout.splitlines() if line[:1].isdigit())
    assert lines == [f"{rank} 6 True" for rank in range(3)], done.stdout
    versions = {line.rsplit(" ", 1)[1] for line in done.stdout.splitlines() if line[:1].isdigit()}
    assert len(versions) == 1 and versions.pop().startswith(RELEASE)
    assert "does not serve" not in done.stderr, done.stderr
