"""`--ssh-client openssh`: one OpenSSH `ssh` client per host instead of paramiko in the
launcher, end to end on a bed of real sshd servers (node1..node4 on 127.0.0.2-5).

Every test ends with no process of the job on any host (the `clean_hosts` fixture) and none
here (the `launcher` fixture: the ssh clients carry the job's tag too).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import (
    Launcher,
    environ_text,
    is_remote_agent,
    kill_launcher_expecting_clean_hosts,
    sshbed_fixtures,
    sshd_of_sessions,
    write_script,
)
from tests.ssh.test_ssh import ALLREDUCE, PY
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
KEY_FAILED = "Host key verification failed."
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"


bed, clean_hosts = sshbed_fixtures("opensshbed", 4)


def args(bed: SshBed, *rest: str, config: Path | None = None) -> list[str]:
    return ["--ssh-client", "openssh", "--ssh-config", str(config or bed.config), *rest]


def wait_up(proc: subprocess.Popen, count: int) -> None:
    assert proc.stdout is not None
    for _ in range(count):
        assert proc.stdout.readline().startswith(b"up")


def test_allreduce_over_ssh_clients_without_paramiko(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """Eight mpi4py ranks on four hosts, one `ssh` child per host; the launcher itself holds no
    TCP connection and never loads paramiko's cryptography."""
    script = write_script(tmp_path, "allreduce.py", ALLREDUCE + "import time\nprint('up', flush=True)\ntime.sleep(1)\n")
    hosts = "node1:2,node2:2,node3:2,node4:2"
    proc = launcher.popen(*args(bed, "-H", hosts, "-n", "8", "--output-filename", "logs", PY, script))
    assert proc.stdout is not None
    lines = [proc.stdout.readline().decode() for _ in range(16)]
    me = psutil.Process(proc.pid)
    children = me.children()
    assert sorted(c.name() for c in children) == ["ssh"] * 4
    assert [c for c in me.net_connections(kind="inet")] == []
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert "cryptography" not in maps and "nacl" not in maps
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    text = "".join(lines) + out.decode()
    for rank in range(8):
        host = bed.address(f"node{rank // 2 + 1}")
        assert f"rank {rank} of 8 sum 28 host {host}" in text
        assert (tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout").read_text().startswith(f"rank {rank} of 8")


def test_local_rank_zero_is_reached_at_the_address_the_hosts_see(
    launcher: Launcher, bed: SshBed, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        "where.py",
        "import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "print(c.rank, c.allreduce(1), os.environ['MASTER_ADDR'])\n",
    )
    proc = launcher.run(*args(bed, "-H", "localhost:1,node1:1,node2:1", "-n", "3", PY, script))
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().split("\n")[:3]) == ["0 3 127.0.0.1", "1 3 127.0.0.1", "2 3 127.0.0.1"]


def test_remote_rank_zero_gets_its_host_address_and_a_free_port(launcher: Launcher, bed: SshBed) -> None:
    proc = launcher.run(*args(bed, "-H", "node2:2", "-n", "2", "sh", "-c", "echo $RANK $MASTER_ADDR $MASTER_PORT"))
    assert proc.returncode == 0, proc.stderr.decode()
    lines = sorted(proc.stdout.decode().split("\n")[:2])
    addr, port = lines[0].split()[1:]
    assert addr == bed.address("node2") and lines[1].split()[1:] == [addr, port]
    with socket.socket() as probe:
        probe.bind((addr, int(port)))


def test_failure_on_node3_aborts_every_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "fail.py",
        "import os, sys, time\nif os.environ['RANK'] == '5':\n    print('bad', file=sys.stderr); sys.exit(3)\n"
        "time.sleep(60)\n",
    )
    started = time.monotonic()
    proc = launcher.run(*args(bed, "-H", "node1:2,node2:2,node3:2,node4:2", "-n", "8", PY, script))
    err = proc.stderr.decode()
    assert proc.returncode == 3, err
    assert "Rank:      5" in err and "Host:      node3" in err and "bad" in err
    assert time.monotonic() - started < 20


def test_kill_9_of_the_launcher_cleans_every_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleep.py", SLEEPER)
    proc = launcher.popen(*args(bed, "-H", "node1:2,node2:2,node3:2,node4:2", "-n", "8", PY, script))
    wait_up(proc, 8)
    assert len(bed.leftover_pids()) >= 8
    kill_launcher_expecting_clean_hosts(proc, bed, 2.0)


def test_killed_agent_aborts_the_job_naming_its_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleep.py", SLEEPER)
    proc = launcher.popen(*args(bed, "-H", "node1:1,node4:1", "-n", "2", PY, script))
    wait_up(proc, 2)
    node4 = [p for p in bed.leftover_pids() if is_remote_agent(p) and bed.address("node4") in environ_text(p)]
    assert len(node4) == 1
    os.kill(node4[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "lost the agent of host node4" in err.decode()


def test_unknown_host_key_is_refused_then_accepted_on_request(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    known = bed.write_known_hosts(tmp_path / "known_hosts", without=["node2"])
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    proc = launcher.run(*args(bed, "-H", "node2:1", "-n", "1", "true", config=config))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    hint = "(its key is unknown: --ssh-accept-new records it)"
    assert err.strip().splitlines() == [f"mpilaunch: node2: {KEY_FAILED} {hint}"]
    proc = launcher.run(*args(bed, "--ssh-accept-new", "-H", "node2:1", "-n", "1", "true", config=config))
    assert proc.returncode == 0, proc.stderr.decode()
    assert bed.host_key("node2").split()[1] in known.read_text()
    proc = launcher.run(*args(bed, "-H", "node2:1", "-n", "1", "true", config=config))  # now known
    assert proc.returncode == 0, proc.stderr.decode()


def test_changed_host_key_is_always_refused(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    known = bed.write_known_hosts(tmp_path / "known_hosts", wrong=["node3"])
    before = known.read_text()
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    for extra in ([], ["--ssh-accept-new"]):
        proc = launcher.run(*args(bed, *extra, "-H", "node1:1,node3:1", "-n", "2", "true", config=config))
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert "mpilaunch: node3: Host key verification failed. (its key has CHANGED: always refused" in err
        assert "node1" not in err
        assert "Traceback" not in err
    assert known.read_text() == before


def test_unreachable_hosts_are_named_in_ssh_words(launcher: Launcher, bed: SshBed) -> None:
    bed.stop_host("node4")
    try:
        proc = launcher.run(*args(bed, "-H", "node1:1,node4:1,nowhere-host:1", "-n", "3", "true"))
    finally:
        bed.start_host("node4")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert f"mpilaunch: node4: ssh: connect to host {bed.address('node4')} port {bed.port}: Connection refused" in err
    assert "mpilaunch: nowhere-host: ssh: Could not resolve hostname nowhere-host" in err
    assert len(err.strip().splitlines()) == 2 and "Traceback" not in err


def test_missing_ssh_client_is_a_clear_error(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    proc = launcher.run(*args(bed, "-H", "node1:1", "-n", "1", "true"), env={"PATH": str(tmp_path)})
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.strip() == "mpilaunch: --ssh-client openssh: no OpenSSH `ssh` client found on PATH"


def test_stdin_and_signals_reach_remote_ranks(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    data = b"".join(b"line %d\n" % i for i in range(20000))
    proc = subprocess.run(
        launcher.argv(*args(bed, "-H", "node2:2", "-n", "2", "sh", "-c", "wc -c")),
        input=data, capture_output=True, env=launcher.env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().split()) == ["0", str(len(data))]
    script = write_script(
        tmp_path,
        "trap.py",
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: (print('usr1', flush=True), sys.exit(5)))\n"
        "print('up', flush=True)\ntime.sleep(60)\n",
    )
    proc = launcher.popen(*args(bed, "-H", "node1:1,node2:1", "-n", "2", PY, script))
    wait_up(proc, 2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert out == b"usr1\nusr1\n", err
    assert proc.returncode == 5


def test_a_silent_network_cut_is_detected(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(tmp_path, "quiet.py", SLEEPER)
    proc = launcher.popen(
        *args(bed, "-H", "node1:1,node2:1", "-n", "2", PY, script), env={"MPILAUNCH_HEARTBEAT_TIMEOUT": "2"}
    )
    wait_up(proc, 2)
    time.sleep(2.5)  # longer than the timeout: the pings keep a healthy job alive
    assert proc.poll() is None
    stopped = sshd_of_sessions(bed, "node2")
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert "lost the agent of host node2 (no word from it for 2 s)" in err.decode()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def test_tree_spawn_with_openssh_heads(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """Width 2 on four hosts: the launcher's ssh clients reach node1 and node2, whose agents start
    node3 and node4; the launcher has two ssh children only."""
    script = write_script(tmp_path, "allreduce.py", ALLREDUCE + "import time\nprint('up', flush=True)\ntime.sleep(1)\n")
    hosts = "node1:1,node2:1,node3:1,node4:1"
    proc = launcher.popen(*args(bed, "--ssh-tree-width", "2", "-H", hosts, "-n", "4", PY, script))
    assert proc.stdout is not None
    lines = [proc.stdout.readline().decode() for _ in range(8)]
    assert sorted(c.name() for c in psutil.Process(proc.pid).children()) == ["ssh", "ssh"]
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    text = "".join(lines) + out.decode()
    for rank in range(4):
        assert f"rank {rank} of 4 sum 6 host {bed.address(f'node{rank + 1}')}" in text
