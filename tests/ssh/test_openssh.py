"""`--ssh-client openssh` alone: one OpenSSH `ssh` client per host instead of paramiko in the
launcher, end to end on a bed of real sshd servers (node1..node4 on 127.0.0.2-5). What both
clients do alike is tried with each in tests/ssh/test_ssh.py (parametrized over the client).

Every test ends with no process of the job on any host (the `clean_hosts` fixture) and none
here (the `launcher` fixture: the ssh clients carry the job's tag too).
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.conftest import Launcher, sshbed_fixtures, write_script
from tests.ssh.test_ssh import ALLREDUCE, PY, client_args
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)


bed, clean_hosts = sshbed_fixtures("opensshbed", 4)


def test_missing_ssh_client_is_a_clear_error(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    proc = launcher.run(*client_args(bed, "openssh", "-H", "node1:1", "-n", "1", "true"), env={"PATH": str(tmp_path)})
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.strip() == "mpilaunch: --ssh-client openssh: no OpenSSH `ssh` client found on PATH"


def test_tree_spawn_with_openssh_heads(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """Width 2 on four hosts: the launcher's ssh clients reach node1 and node2, whose agents start
    node3 and node4; the launcher has two ssh children only."""
    script = write_script(tmp_path, "allreduce.py", ALLREDUCE + "import time\nprint('up', flush=True)\ntime.sleep(1)\n")
    hosts = "node1:1,node2:1,node3:1,node4:1"
    proc = launcher.popen(*client_args(bed, "openssh", "--ssh-tree-width", "2", "-H", hosts, "-n", "4", PY, script))
    assert proc.stdout is not None
    lines = [proc.stdout.readline().decode() for _ in range(8)]
    assert sorted(c.name() for c in psutil.Process(proc.pid).children()) == ["ssh", "ssh"]
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    text = "".join(lines) + out.decode()
    for rank in range(4):
        assert f"rank {rank} of 4 sum 6 host {bed.address(f'node{rank + 1}')}" in text


def test_a_start_slowed_by_its_machine_is_slow_not_failed(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """Four hosts whose connections take turns at one slow resource (each holds it 6 s, as a
    busy machine's CPU is shared by hundreds of logins): all at once, the fourth answered after
    24 s, past the 20 s patience, and the job failed ("no answer in 20 s"). Two at a time
    (Open MPI's plm_rsh_num_concurrent), each host's patience counts from its own start: the job
    runs (issue "Grid Engine": hundreds of hosts without false failures)."""
    lock = tmp_path / "turns"
    shell = tmp_path / "slow-ssh"
    shell.write_text(f'#!/bin/sh\nflock "{lock}" sleep 6\nexec ssh -F "{bed.config}" "$@"\n')
    shell.chmod(0o755)
    hosts = "node1:1,node2:1,node3:1,node4:1"
    proc = launcher.run(
        "-mca", "plm_rsh_agent", str(shell), "-mca", "plm_rsh_num_concurrent", "2", "-H", hosts, "-n", "4",
        "sh", "-c", "echo rank $RANK", timeout=120,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert sorted(proc.stdout.decode().splitlines()) == [f"rank {r}" for r in range(4)]


def test_a_slow_host_holds_only_its_own_place_in_the_window(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """node1's connection is made only once node3's has begun (as a host stuck behind a busy
    machine's queue of logins waits on others). Two in flight at a time: when node2 answers,
    node3 is opened at once in its place and node1 goes on. In batches of two, node3 waited for
    node1, which waited for node3 until its 20 s patience ran out ("no answer in 20 s")."""
    mark = tmp_path / "node3-began"
    shell = tmp_path / "waiting-ssh"
    shell.write_text(
        "#!/bin/sh\n"
        'for word in "$@"; do\n'
        f'  case "$word" in node3) touch "{mark}";; node1) while [ ! -e "{mark}" ]; do sleep 0.05; done;; esac\n'
        "done\n"
        f'exec ssh -F "{bed.config}" "$@"\n'
    )
    shell.chmod(0o755)
    hosts = "node1:1,node2:1,node3:1,node4:1"
    proc = launcher.run(
        "-mca", "plm_rsh_agent", str(shell), "--ssh-concurrent", "2", "-H", hosts, "-n", "4",
        "sh", "-c", "echo rank $RANK", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == [f"rank {r}" for r in range(4)]
