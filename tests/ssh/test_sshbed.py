"""The OpenSSH test bed itself: real sshd per host, the files clients need, leftovers, clean-up.

The SSH transport's tests stand on this bed, so it must prove it behaves like a cluster first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest

from tests.sshbed import TAG_VAR, SshBed, bed_available

AVAILABLE, REASON = bed_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=REASON)


@pytest.fixture(scope="session")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshBed]:
    with SshBed(tmp_path_factory.mktemp("sshbed"), hosts=4) as started:
        yield started


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test must leave no process on any host, so the next test starts clean."""
    yield
    if "bed" not in request.fixturenames:
        return
    bed: SshBed = request.getfixturevalue("bed")
    left = bed.wait_clean(5.0)
    bed.kill_leftovers()
    assert not left, f"processes left on the bed's hosts: {left}"


def ssh(bed: SshBed, name: str, command: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        bed.ssh_argv(name, command, config=config),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def client(bed: SshBed, name: str, known_hosts: Path | None = None) -> paramiko.SSHClient:
    """A paramiko client that trusts only the given known_hosts, like a strict transport would."""
    cli = paramiko.SSHClient()
    cli.load_host_keys(str(known_hosts or bed.known_hosts))
    cli.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        cli.connect(
            bed.address(name),
            port=bed.port,
            username="root",
            key_filename=str(bed.identity),
            allow_agent=False,
            look_for_keys=False,
            timeout=10,
        )
    except BaseException:
        cli.close()  # paramiko leaves the refused connection open (and sshd waiting) otherwise
        raise
    return cli


def run(cli: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, _ = cli.exec_command(command, timeout=30)
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out


def test_files_and_addresses(bed: SshBed) -> None:
    assert bed.names == ["node1", "node2", "node3", "node4"]
    assert [bed.address(n) for n in bed.names] == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    assert 1024 < bed.port < 65536
    assert bed.config.is_file() and bed.identity.is_file() and bed.known_hosts.is_file()
    lines = bed.known_hosts.read_text().splitlines()
    assert len(lines) == 4
    assert lines[1].startswith(f"[127.0.0.3]:{bed.port},[node2]:{bed.port} ssh-ed25519 AAAA")
    keys = {bed.host_key(n) for n in bed.names}
    assert len(keys) == 4, "each host has its own host key"
    assert len(bed.daemon_pids()) == 4 and all(bed.is_running(n) for n in bed.names)
    with pytest.raises(KeyError):
        bed.address("node5")
    resolved = paramiko.SSHConfig.from_path(str(bed.config)).lookup("node2")
    assert (resolved["hostname"], resolved["port"], resolved["user"]) == ("127.0.0.3", str(bed.port), "root")
    assert resolved["identityfile"] == [str(bed.identity)]


def test_openssh_client(bed: SshBed) -> None:
    done = ssh(bed, "node1", "true")
    assert done.returncode == 0, done.stderr
    done = ssh(bed, "node4", "echo $SSH_CONNECTION")
    assert done.returncode == 0, done.stderr
    client_addr, _, server_addr, server_port = done.stdout.split()
    assert (server_addr, int(server_port)) == ("127.0.0.5", bed.port)
    assert client_addr.startswith("127.")


def test_no_accept_env(bed: SshBed) -> None:
    """The transport must put a rank's environment on the command line: sshd accepts none."""
    argv = bed.ssh_argv("node1", "echo ${LC_SSHBED-unset}")
    argv[1:1] = ["-o", "SendEnv=LC_SSHBED"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={**os.environ, "LC_SSHBED": "x"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unset"


def test_paramiko(bed: SshBed) -> None:
    cli = client(bed, "node2")
    try:
        status, out = run(cli, "echo $SSH_CONNECTION; exit 3")
    finally:
        cli.close()
    assert status == 3
    assert out.split()[2:] == ["127.0.0.3", str(bed.port)]


def test_parallel_connections(bed: SshBed) -> None:
    """Clients on every host at once, as a launch fans out."""
    names = bed.names * 2
    with ThreadPoolExecutor(len(names)) as pool:
        codes = list(pool.map(lambda n: ssh(bed, n, "true").returncode, names))
    assert codes == [0] * len(names)


def test_many_pending_connections(bed: SshBed) -> None:
    """40 connections not yet authenticated on one host: sshd's default MaxStartups (10) would drop some."""
    socks = []
    try:
        for _ in range(40):
            sock = socket.create_connection((bed.address("node1"), bed.port), timeout=10)
            socks.append(sock)
        banners = [sock.recv(256) for sock in socks]
        assert all(b.startswith(b"SSH-2.0-") for b in banners), banners
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.sendall(b"SSH-2.0-test\r\n")  # a polite goodbye: no error in sshd's log
            sock.close()


def test_leftover_found_and_killed(bed: SshBed) -> None:
    done = ssh(bed, "node3", "sleep 30 </dev/null >/dev/null 2>&1 & echo $!")
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    try:
        time.sleep(0.2)  # the session's own sshd processes are gone by now or soon
        assert pid in bed.leftover_pids()
        assert bed.wait_clean(0.3) == [pid], "the session ended: only the orphan is left"
        with open(f"/proc/{pid}/environ", "rb") as handle:
            assert f"{TAG_VAR}={bed.tag}".encode() in handle.read().split(b"\0")
    finally:
        os.kill(pid, signal.SIGKILL)
    assert bed.wait_clean(5.0) == []


def test_open_session_is_a_leftover(bed: SshBed) -> None:
    """A connection still open counts: its sshd processes are on the host until it closes."""
    cli = client(bed, "node1")
    try:
        assert run(cli, "true")[0] == 0
        assert bed.leftover_pids(), "the per-connection sshd is a process of the host"
    finally:
        cli.close()
    assert bed.wait_clean(5.0) == []


def test_stop_host(bed: SshBed) -> None:
    bed.stop_host("node2")
    try:
        assert not bed.is_running("node2")
        done = ssh(bed, "node2", "true")
        assert done.returncode == 255
        assert "refused" in done.stderr
        with pytest.raises(paramiko.ssh_exception.NoValidConnectionsError):
            client(bed, "node2")
        assert ssh(bed, "node1", "true").returncode == 0
        assert ssh(bed, "node3", "true").returncode == 0
    finally:
        bed.start_host("node2")
    done = ssh(bed, "node2", "true")
    assert done.returncode == 0, done.stderr


def test_leftover_of_stopped_host(bed: SshBed) -> None:
    """An orphan outlives its host's sshd: the bed's tag still finds it."""
    done = ssh(bed, "node4", "sleep 30 </dev/null >/dev/null 2>&1 & echo $!")
    pid = int(done.stdout)
    try:
        bed.stop_host("node4")
        assert pid in bed.leftover_pids()
    finally:
        os.kill(pid, signal.SIGKILL)
        bed.start_host("node4")


def test_changed_host_key(bed: SshBed) -> None:
    wrong = bed.known_hosts_wrong_key("node3")
    assert wrong != bed.known_hosts
    with pytest.raises(paramiko.BadHostKeyException):
        client(bed, "node3", wrong)
    cli = client(bed, "node2", wrong)  # only node3 is wrong
    cli.close()
    done = ssh(bed, "node3", "true", config=bed.write_ssh_config(wrong))
    assert done.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr or "verification failed" in done.stderr


def test_unknown_host(bed: SshBed) -> None:
    without = bed.known_hosts_without("node1")
    assert "127.0.0.2" not in without.read_text()
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        client(bed, "node1", without)
    done = ssh(bed, "node1", "true", config=bed.write_ssh_config(without))
    assert done.returncode == 255
    assert "Host key verification failed" in done.stderr
    assert ssh(bed, "node2", "true", config=bed.write_ssh_config(without)).returncode == 0


def test_close_stops_everything(tmp_path: Path) -> None:
    """close() stops every sshd and kills what a session left; a reused directory starts again."""
    with SshBed(tmp_path, hosts=2) as small:
        daemons = small.daemon_pids()
        done = ssh(small, "node2", "sleep 30 </dev/null >/dev/null 2>&1 & echo $!")
        orphan = int(done.stdout)
        cli = client(small, "node1")  # an open connection too
        sessions = small.leftover_pids()
        assert orphan in sessions and len(sessions) > 1
    cli.close()
    for pid in [*daemons, *sessions]:
        assert not _alive(pid), f"{pid} survived close()"
    survivors = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in survivors
    with SshBed(tmp_path, hosts=2) as again:
        assert ssh(again, "node1", "true").returncode == 0


def test_killed_owner_takes_sshd_along(tmp_path: Path) -> None:
    """A test run killed with -9 leaves no sshd behind (parent-death signal on every daemon)."""
    code = (
        "import sys, time; from tests.sshbed import SshBed; "
        f"bed = SshBed({str(tmp_path)!r}, hosts=2).start(); "
        "print(*bed.daemon_pids(), flush=True); time.sleep(60)"
    )
    root = str(Path(__file__).resolve().parents[2])
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        daemons = [int(pid) for pid in owner.stdout.readline().split()] if owner.stdout else []
        assert len(daemons) == 2 and all(_alive(pid) for pid in daemons)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 5.0
    while any(_alive(pid) for pid in daemons) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(_alive(pid) for pid in daemons)


def test_thirty_two_hosts(tmp_path: Path) -> None:
    """The benchmark's size: 32 sshd on 127.0.0.2..127.0.0.33, the last one reachable."""
    start = time.monotonic()
    with SshBed(tmp_path, hosts=32) as big:
        elapsed = time.monotonic() - start
        assert big.address("node32") == "127.0.0.33"
        done = ssh(big, "node32", "echo $SSH_CONNECTION")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[2] == "127.0.0.33"
        assert len(big.daemon_pids()) == 32
    assert elapsed < 20, f"32 hosts took {elapsed:.1f}s to start"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
