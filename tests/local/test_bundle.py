"""The shipped agent alone: it runs from its bundle, on every Python from 3.9, and answers a probe."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from mpilaunch.protocol import wire
from tests.conftest import fake_smi


@pytest.mark.parametrize("magic", [None, b"\0\0\r\n"], ids=["precompiled", "compiled-there"])
def test_the_shipped_agent_runs_from_its_bundle_alone(tmp_path: Path, magic: bytes | None) -> None:
    """The agent as a remote host gets it: `python -S -c` with the loader, modules from stdin,
    nothing of mpilaunch importable from disk (from an empty directory, no site-packages)."""
    import subprocess

    from mpilaunch.protocol.wire import MARKER
    from mpilaunch.transport.bootstrap import agent_command, agent_payload

    payload = agent_payload() if magic is None else agent_payload(magic)
    check = wire.control("check", apps=[{"program": "sh", "wdir": str(tmp_path)}], carried={}, mpi=True, port=0)
    proc = subprocess.run(
        ["sh", "-c", agent_command()], input=payload + check, capture_output=True, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"}, timeout=30,
    )  # fmt: skip
    frames = wire.Decoder().feed(proc.stdout.partition(MARKER)[2])
    assert [f[1]["op"] for f in frames] == ["hello", "checked"], proc.stderr.decode()
    assert frames[1][1]["problems"] == [] and frames[1][1]["port_free"] is True
    assert proc.returncode == 0  # its stdin closed: it stops, as when the launcher goes


OTHER_PYTHONS = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3"))


@pytest.mark.skipif(not OTHER_PYTHONS, reason="no other Python versions installed to try the agent on")
def test_the_agent_runs_on_every_python_from_3_9_and_says_so_below() -> None:
    """Remote hosts run whatever python3 they have: the bundle compiles there when the bytecode
    differs, and a Python older than 3.9 gets one clear line instead of a traceback."""
    import subprocess

    from mpilaunch.protocol.wire import MARKER
    from mpilaunch.transport.bootstrap import agent_command, agent_payload

    for python in OTHER_PYTHONS:
        version = tuple(int(x) for x in python.split("/versions/")[1].split("/")[0].split(".")[:2])
        proc = subprocess.run(
            ["sh", "-c", agent_command(python)], input=agent_payload(), capture_output=True, timeout=30,
            env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        frames = wire.Decoder().feed(proc.stdout.partition(MARKER)[2])
        if version >= (3, 9):
            assert frames and frames[0][1]["python"].startswith(f"{version[0]}.{version[1]}."), (python, proc.stderr)
        else:
            assert not frames and proc.returncode == 4, (python, proc.stderr)
            assert b"the agent needs Python 3.9 or newer; this host runs" in proc.stderr


def test_the_shipped_agent_answers_the_probe_and_writes_the_table(tmp_path: Path) -> None:
    """What a remote host's agent does for these options, run as it is shipped (stdlib only,
    modules from stdin): counts GPUs on its PATH, reads hccn.conf, writes the rank table."""
    import subprocess

    from mpilaunch.protocol import wire
    from mpilaunch.protocol.wire import MARKER
    from mpilaunch.transport.bootstrap import agent_command, agent_payload

    smi_dir = fake_smi(tmp_path, "echo 'GPU 0: X'; echo 'GPU 1: X'")
    conf = tmp_path / "hccn.conf"
    conf.write_text("address_0=192.1.27.6\naddress_1=192.2.27.6\n")
    table = tmp_path / "out" / "rank_table.json"
    frames_in = wire.control(
        "check", apps=[], carried={"PATH": f"{smi_dir}:/usr/bin:/bin"}, mpi=False, port=-1,
        probe={"gpus": True, "hccn": str(conf)},
    ) + wire.control("put", path=str(table), data="{}\n")  # fmt: skip
    proc = subprocess.run(
        ["sh", "-c", agent_command()], input=agent_payload() + frames_in, capture_output=True, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"}, timeout=30,
    )  # fmt: skip
    frames = [f[1] for f in wire.Decoder().feed(proc.stdout.partition(MARKER)[2])]
    assert [f["op"] for f in frames] == ["hello", "checked", "put_done"], proc.stderr.decode()
    info = frames[1]["info"]
    assert info["gpus"] == {"count": 2} and info["hccn"] == {"addresses": {"0": "192.1.27.6", "1": "192.2.27.6"}}
    assert info["cpus"] == len(os.sched_getaffinity(0))
    assert frames[2]["error"] is None and table.read_text() == "{}\n"
