"""Issue 27's cases with remote hosts, on the real sshd bed: a remote agent frozen past the
heartbeat, a rank table written by the agents at a path that is a device node, and bytes that
are not UTF-8 in a remote rank's arguments and environment.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Launcher, environ_text, is_remote_agent, sshbed_fixtures, write_script
from tests.smalldisk import small_tmpfs
from tests.sshbed import bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
bed, clean_hosts = sshbed_fixtures("hostilebed", 2, settle=5.0)
PY = sys.executable


def _agent_of(bed, name: str) -> int:  # type: ignore[no-untyped-def]
    agents = [p for p in bed.leftover_pids() if is_remote_agent(p) and bed.address(name) in environ_text(p)]
    assert len(agents) == 1, agents
    return agents[0]


ALIVE = """
import os, sys, time
print("up", flush=True)
while True:
    with open(sys.argv[1] + "." + os.environ["RANK"], "w") as f:
        f.write(str(time.time()))
    time.sleep(0.1)
"""


def test_a_frozen_agent_is_lost_but_its_ranks_are_not_called_killed(launcher: Launcher, bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """node2's agent stopped (SIGSTOP) past the heartbeat: its rank goes on running, so the
    launcher says it could not be confirmed ended (before: `Signal: SIGKILL (9)` while it ran),
    the report gives it no status and does not count it killed, and the status is 1. Once the
    agent is continued it finds its link gone and stops the rank (the bed's check: nothing left)."""
    script = write_script(tmp_path, "alive.py", ALIVE)
    report = tmp_path / "report.json"
    proc = launcher.popen(
        "--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "-n", "2", "--report-json", str(report),
        PY, script, str(tmp_path / "alive"), env={"MPILAUNCH_HEARTBEAT_TIMEOUT": "2"},
    )  # fmt: skip
    assert proc.stdout is not None
    agent = None
    try:
        for _ in range(2):
            assert proc.stdout.readline() == b"up\n"
        agent = _agent_of(bed, "node2")
        os.kill(agent, signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)
        text = err.decode()
        assert proc.returncode == 1, text
        beat = (tmp_path / "alive.1").read_text()
        time.sleep(0.5)
        assert (tmp_path / "alive.1").read_text() != beat, "node2's rank was to run on while its agent is frozen"
    finally:
        if agent is not None:
            os.kill(agent, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "lost the agent of host node2 (no word from it for 2 s); its ranks could not be confirmed ended\n" in text
    assert "  Host:      node2\n" in text and "  Status:    not known (its host was lost)\n" in text
    assert "  Reason:    host node2 lost; its ranks could not be confirmed ended\n" in text
    assert "Killed by mpilaunch: rank 0\n" in text and "SIGKILL" not in text
    ranks = json.loads(report.read_text())["ranks"]
    assert ranks[1]["host"] == "node2" and ranks[1]["state"] == "failed" and ranks[1]["killed"] is False
    assert ranks[1]["exit_code"] is None and ranks[1]["signal"] is None
    assert ranks[1]["reason"] == "host node2 lost; its ranks could not be confirmed ended"
    assert ranks[0]["killed"] is True


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs where a device node may be made; mounted in this namespace, which the
    bed's hosts share."""
    with small_tmpfs(tmp_path / "fs", "1m") as where:
        yield where


def test_the_agents_write_the_rank_table_through_a_device(launcher: Launcher, bed, tmpfs: Path) -> None:  # type: ignore[no-untyped-def]
    """--rank-table at a character device (another /dev/null): written here and by each remote
    agent, it stays a device (the agents renamed a file over it, as the launcher did)."""
    table = tmpfs / "table"
    os.mknod(table, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    proc = launcher.run("--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "-n", "2", "--rank-table",
                        str(table), "sh", "-c", "test -c $RANK_TABLE_FILE && echo device")  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"written to {table} (and on node1, node2)" in proc.stderr.decode()
    assert proc.stdout.decode().split() == ["device", "device"]
    found = os.lstat(table)
    assert stat.S_ISCHR(found.st_mode) and (os.major(found.st_rdev), os.minor(found.st_rdev)) == (1, 3)


def test_bytes_that_are_not_utf8_reach_a_remote_rank_and_its_summary(launcher: Launcher, bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A remote rank's arguments and -x value with such bytes: the ranks get them, and rank 0's
    failure is summed up (the bytes as they came) and reported (losslessly) with its status."""
    word, value = b"caf\xe9-\xff\xfe.txt", b"v\xc3\x28\xed\xa0\x80"
    report = tmp_path / "report.json"
    proc = launcher.run(
        "--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "-n", "2", "--report-json", str(report),
        "-x", b"VALUE=" + value, "sh", "-c", 'printf %s "$VALUE" > got.$RANK; [ $RANK = 1 ] || { sleep 1; exit 3; }',
        "sh", word,
        env={"PYTHONIOENCODING": "utf-8:strict"},
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr
    command = proc.stderr.split(b"  Command:   ", 1)[1].split(b"\n", 1)[0]
    assert b" sh " in command and word in command
    assert (tmp_path / "got.0").read_bytes() == value and (tmp_path / "got.1").read_bytes() == value
    document = json.loads(report.read_text())
    assert os.fsencode(document["first_failure"]["command"][-1]) == word
