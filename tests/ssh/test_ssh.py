"""Launching over SSH, end to end, on a bed of real sshd servers (node1..node4 on 127.0.0.2-5).

Every test ends with no process of the job on any host: the `clean_hosts` fixture fails the
test otherwise (and kills what was left, by pid).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import (
    ROOT,
    Launcher,
    environ_text,
    is_remote_agent,
    kill_launcher_expecting_clean_hosts,
    parent_pid,
    process_name,
    session_sshd,
    sshbed_fixtures,
    sshd_of_sessions,
    write_script,
)
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
PY = sys.executable
ALLREDUCE = (
    "import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
    "print('rank', c.rank, 'of', c.size, 'sum', c.allreduce(c.rank), 'host', os.environ['SSH_CONNECTION'].split()[2],"
    " flush=True)\n"
)


bed, clean_hosts = sshbed_fixtures("sshbed", 4)


def ssh(launcher: Launcher, bed: SshBed, *args: str, config: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """A job with the paramiko client (the tests that start jobs directly use the default, OpenSSH)."""
    return launcher.run("--ssh-client", "paramiko", "--ssh-config", str(config or bed.config), *args, **kw)


CLIENTS = ["openssh", "paramiko"]  # what a test of both runs its jobs with (--ssh-client)
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"
KEY_FAILED = "Host key verification failed."  # ssh's words


def client_args(bed: SshBed, client: str, *rest: str, config: Path | None = None) -> list[str]:
    """A job's words with this client and the bed's config (or another)."""
    return ["--ssh-client", client, "--ssh-config", str(config or bed.config), *rest]


def wait_up(proc: subprocess.Popen, count: int) -> None:
    """Until `count` ranks said `up`."""
    assert proc.stdout is not None
    for _ in range(count):
        assert proc.stdout.readline().startswith(b"up")


@pytest.mark.parametrize("client", CLIENTS)
def test_four_hosts_allreduce_and_logs(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    """Eight mpi4py ranks on four hosts. With OpenSSH, one `ssh` child per host: the launcher
    itself holds no TCP connection and never loads paramiko's cryptography."""
    script = write_script(tmp_path, "allreduce.py", ALLREDUCE + "import time\nprint('up', flush=True)\ntime.sleep(1)\n")
    hosts = "node1:2,node2:2,node3:2,node4:2"
    proc = launcher.popen(*client_args(bed, client, "-H", hosts, "-n", "8", "--output-filename", "logs", PY, script))
    assert proc.stdout is not None
    lines = [proc.stdout.readline().decode() for _ in range(16)]
    if client == "openssh":
        me = psutil.Process(proc.pid)
        assert sorted(c.name() for c in me.children()) == ["ssh"] * 4
        assert [c for c in me.net_connections(kind="inet")] == []
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "cryptography" not in maps and "nacl" not in maps
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    text = "".join(lines) + out.decode()
    assert len([line for line in text.splitlines() if line.startswith("rank")]) == 8
    for rank in range(8):
        host = bed.address(f"node{rank // 2 + 1}")
        assert f"rank {rank} of 8 sum 28 host {host}" in text
        assert (tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout").read_text().startswith(f"rank {rank} of 8")


@pytest.mark.parametrize("client", CLIENTS)
def test_local_and_remote_ranks_share_one_job(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    script = write_script(
        tmp_path,
        "where.py",
        "import os, sys\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "print(c.rank, c.allreduce(1), os.environ['MASTER_ADDR'], sys.executable, flush=True)\n",
    )
    proc = launcher.run(*client_args(bed, client, "-H", "localhost:1,node1:1,node2:1", "-n", "3", PY, script))
    assert proc.returncode == 0, proc.stderr.decode()
    # rank 0 runs here: remote ranks reach it at the address their host was reached from
    assert sorted(proc.stdout.decode().split("\n")[:3]) == [f"{rank} 3 127.0.0.1 {PY}" for rank in range(3)]


@pytest.mark.parametrize("client", CLIENTS)
def test_remote_rank_zero_gets_master_addr_and_a_free_port(
    launcher: Launcher, bed: SshBed, tmp_path: Path, client: str
) -> None:
    show = ("sh", "-c", "echo $RANK $MASTER_ADDR $MASTER_PORT")
    proc = launcher.run(*client_args(bed, client, "-H", "node2:2", "-n", "2", *show))
    assert proc.returncode == 0, proc.stderr.decode()
    lines = sorted(proc.stdout.decode().split("\n")[:2])
    addr, port = lines[0].split()[1:]
    assert addr == bed.address("node2") and lines[1].split()[1:] == [addr, port]
    with socket.socket() as probe:  # a port that was free there (the job is over, so it still is)
        probe.bind((addr, int(port)))


@pytest.mark.parametrize("client", CLIENTS)
def test_failure_on_node3_aborts_every_host(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    script = write_script(
        tmp_path,
        "fail.py",
        "import os, sys, time\nif os.environ['RANK'] == '5':\n    print('bad', file=sys.stderr); sys.exit(3)\n"
        "time.sleep(60)\n",
    )
    started = time.monotonic()
    proc = launcher.run(*client_args(bed, client, "-H", "node1:2,node2:2,node3:2,node4:2", "-n", "8", PY, script))
    err = proc.stderr.decode()
    assert proc.returncode == 3, err
    assert "Rank:      5" in err and "Host:      node3" in err and "bad" in err
    assert time.monotonic() - started < 20
    assert not bed.wait_clean(3.0)


@pytest.mark.parametrize("client", CLIENTS)
def test_kill_9_of_the_launcher_cleans_every_host(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    script = write_script(tmp_path, "sleep.py", SLEEPER)
    proc = launcher.popen(*client_args(bed, client, "-H", "node1:2,node2:2,node3:2,node4:2", "-n", "8", PY, script))
    wait_up(proc, 8)
    assert len(bed.leftover_pids()) >= 8
    kill_launcher_expecting_clean_hosts(proc, bed, 2.0)


def test_lost_host_aborts_the_job_naming_it(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    proc = launcher.popen("--ssh-config", str(bed.config), "-H", "node1:1,node2:1,node3:1", "-n", "3", PY, script)
    assert proc.stdout is not None and proc.stderr is not None
    for _ in range(3):
        assert proc.stdout.readline().startswith(b"up")
    try:
        sessions = session_sshd(bed, "node2")
        assert sessions
        bed.stop_host("node2")  # the daemon, then its sessions: the machine is gone
        for pid in sessions:
            os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        bed.start_host("node2")
    assert proc.returncode != 0
    assert "lost the agent of host node2" in err.decode()


@pytest.mark.parametrize("client", CLIENTS)
def test_killed_agent_aborts_the_job_naming_its_host(
    launcher: Launcher, bed: SshBed, tmp_path: Path, client: str
) -> None:
    script = write_script(tmp_path, "sleep.py", SLEEPER)
    proc = launcher.popen(*client_args(bed, client, "-H", "node1:1,node4:1", "-n", "2", PY, script))
    wait_up(proc, 2)
    agents = [p for p in bed.leftover_pids() if is_remote_agent(p)]
    assert len(agents) == 2
    node4 = [p for p in agents if bed.address("node4") in environ_text(p)]
    assert len(node4) == 1
    os.kill(node4[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "lost the agent of host node4" in err.decode()


def test_arguments_arrive_verbatim(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    args = ["a b", "it's", '"quoted"', "$(touch /tmp/mpilaunch-pwned)", "", "; echo no", "`id`", "\\n", "*", "-n"]
    args += ["two\nlines", "\n", "", "tab\there", " ", "ünïcødé", "--", "'$(id)'", '"$(id)"', "a\\", "&& id |"]
    script = write_script(tmp_path, "argv.py", "import sys, json\nprint(json.dumps(sys.argv[1:]))\n")
    proc = ssh(launcher, bed, "-H", "node1:1", "-n", "1", PY, script, *args)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout.decode()) == args
    assert not os.path.exists("/tmp/mpilaunch-pwned")


def test_environment_travels_as_data_never_on_a_command_line(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    secret = "s3cr3t-value-4242"
    script = write_script(
        tmp_path, "env.py", "import os, time\nprint(os.environ['MY_TOKEN'], flush=True)\ntime.sleep(60)\n"
    )
    proc = launcher.popen(
        "--ssh-config",
        str(bed.config),
        "-H",
        "node1:1,node2:1",
        "-n",
        "2",
        "-x",
        "MY_TOKEN",
        PY,
        script,
        env={"MY_TOKEN": secret},
    )
    assert proc.stdout is not None
    for _ in range(2):
        assert proc.stdout.readline().strip() == secret.encode()
    lines = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    assert secret not in lines
    assert "mpilaunch-loader" in lines  # the agents are there, with nothing of the job on their command line
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)


def test_missing_program_on_one_host_is_a_per_host_error(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    proc = ssh(launcher, bed, "-H", "node1:1,node2:1", "-n", "2", "/nonexistent/prog")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "node1: program '/nonexistent/prog' not found" in err
    assert "node2: program '/nonexistent/prog' not found" in err
    assert "Traceback" not in err


def test_missing_working_directory_is_refused_before_launch(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    proc = ssh(launcher, bed, "-H", "node3:1", "-n", "1", "--wdir", "/nonexistent/dir", "true")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "node3: working directory '/nonexistent/dir' does not exist" in err


@pytest.mark.parametrize("client", CLIENTS)
def test_unknown_host_key_is_refused_then_accepted_on_request(
    launcher: Launcher, bed: SshBed, tmp_path: Path, client: str
) -> None:
    known = bed.write_known_hosts(tmp_path / "known_hosts", without=["node2"])
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    job = ("-H", "node2:1", "-n", "1", "true")
    proc = launcher.run(*client_args(bed, client, *job, config=config))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    if client == "openssh":  # ssh's own words, and what to do
        assert lines == [f"mpilaunch: node2: {KEY_FAILED} (its key is unknown: --ssh-accept-new records it)"]
    else:
        assert len(lines) == 1 and "host key of node2" in err and "is unknown" in err and "--ssh-accept-new" in err
    proc = launcher.run(*client_args(bed, client, "--ssh-accept-new", *job, config=config))
    assert proc.returncode == 0, proc.stderr.decode()
    assert bed.host_key("node2").split()[1] in known.read_text()
    proc = launcher.run(*client_args(bed, client, *job, config=config))  # now known
    assert proc.returncode == 0, proc.stderr.decode()


@pytest.mark.parametrize("client", CLIENTS)
def test_changed_host_key_is_always_refused(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    known = bed.write_known_hosts(tmp_path / "known_hosts", wrong=["node3"])
    before = known.read_text()
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    for extra in ([], ["--ssh-accept-new"]):
        proc = launcher.run(
            *client_args(bed, client, *extra, "-H", "node1:1,node3:1", "-n", "2", "true", config=config)
        )
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        if client == "openssh":
            assert f"mpilaunch: node3: {KEY_FAILED} (its key has CHANGED: always refused" in err
        else:
            assert "host key of node3" in err and "CHANGED" in err and "ssh-keygen -R" in err
        assert "node1" not in err
        assert "Traceback" not in err
    assert known.read_text() == before


@pytest.mark.parametrize("client", CLIENTS)
def test_unreachable_hosts_are_named(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    bed.stop_host("node4")
    try:
        proc = launcher.run(*client_args(bed, client, "-H", "node1:1,node4:1,nowhere-host:1", "-n", "3", "true"))
    finally:
        bed.start_host("node4")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    node4 = bed.address("node4")
    if client == "openssh":  # in ssh's words
        assert f"mpilaunch: node4: ssh: connect to host {node4} port {bed.port}: Connection refused" in err
        assert "mpilaunch: nowhere-host: ssh: Could not resolve hostname nowhere-host" in err
    else:
        assert f"node4: connection refused by {node4}" in err
        assert "nowhere-host: cannot resolve" in err
    assert len(err.strip().splitlines()) == 2 and "Traceback" not in err


def test_host_that_never_speaks_ssh_times_out_named(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.9", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host mute\n    HostName 127.0.0.9\n    Port {port}\n    ConnectTimeout 1\n")
    try:
        started = time.monotonic()
        proc = ssh(launcher, bed, "-H", "mute:1", "-n", "1", "true", config=config, timeout=30)
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "mute:" in err and "gave no SSH answer in 1 s" in err
    assert elapsed < 10


def test_hostfile_user_and_port(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    known = bed.known_hosts
    config = tmp_path / "ssh_config"  # no Port and no User: the hostfile gives them
    config.write_text(
        "".join(f"Host {n}\n    HostName {bed.address(n)}\n" for n in bed.names)
        + f"Host *\n    IdentityFile {bed.identity}\n    IdentitiesOnly yes\n    UserKnownHostsFile {known}\n"
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{bed.user}@node1 slots=1 port={bed.port}\nnode2 slots=1 port={bed.port} user={bed.user}\n")
    proc = ssh(launcher, bed, "--hostfile", str(hostfile), "sh", "-c", "echo $RANK $USER", config=config)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().split("\n")[:2]) == [f"0 {bed.user}", f"1 {bed.user}"]


def test_proxy_jump(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host node3\n    ProxyJump node1\n\n{bed.config.read_text()}")
    proc = ssh(launcher, bed, "-H", "node3:1", "-n", "1", "sh", "-c", "echo via $SSH_CONNECTION", config=config)
    assert proc.returncode == 0, proc.stderr.decode()
    # node3 saw the connection come from node1's end of the jump
    assert proc.stdout.decode().split()[:2] == ["via", bed.address("node1")] or "via 127.0.0" in proc.stdout.decode()


def test_python_means_the_launchers_interpreter_where_it_exists(
    launcher: Launcher, bed: SshBed, tmp_path: Path
) -> None:
    name = os.path.basename(PY)  # e.g. python3.11, found through the PATH carried to the host
    env = {"PATH": f"{os.path.dirname(PY)}:/nonexistent/bin:/usr/bin:/bin", "VIRTUAL_ENV": "/nonexistent/venv"}
    proc = ssh(
        launcher,
        bed,
        "-H",
        "node1:1",
        "-n",
        "1",
        name,
        "-c",
        "import os, sys; print(sys.executable); print(os.environ['PATH']); print(os.environ.get('VIRTUAL_ENV'))",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    exe, path, venv = proc.stdout.decode().splitlines()[:3]
    assert os.path.realpath(exe) == os.path.realpath(PY)
    assert path.startswith(os.path.dirname(PY) + ":/usr/bin") and "/nonexistent" not in path
    assert venv == "None"


def test_spawn_reaches_a_connected_remote_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    child = write_script(
        tmp_path,
        "child.py",
        "import os\nfrom mpi4py import MPI\np = MPI.Comm.Get_parent()\n"
        "p.send(os.environ['SSH_CONNECTION'].split()[2], dest=0)\np.Disconnect()\n",
    )
    parent = write_script(
        tmp_path,
        "parent.py",
        "import sys\nfrom mpi4py import MPI\n"
        f"c = MPI.COMM_SELF.Spawn(sys.executable, [{child!r}], maxprocs=1)\n"
        "print('child on', c.recv(source=0), flush=True)\nc.Disconnect()\n",
    )
    proc = ssh(launcher, bed, "-H", "node1:2", "-n", "1", PY, parent, timeout=90)
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"child on {bed.address('node1')}" in proc.stdout.decode()


def test_check_table(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    known = bed.write_known_hosts(tmp_path / "known_hosts", without=["node2"])
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    port = busy.getsockname()[1]
    try:
        paramiko = ("--ssh-client", "paramiko")
        hosts = ("-H", "node1,node2,nope-x")
        proc = launcher.run("check", *paramiko, "--ssh-config", str(config), "--port", str(port), *hosts, PY)
        bad = proc.stdout.decode()
        proc_ok = launcher.run("check", *paramiko, "--ssh-config", str(bed.config), "-H", "localhost,node1,node3", PY)
    finally:
        busy.close()
    assert proc.returncode == 1
    rows = {line.split()[0]: line.split() for line in bad.splitlines()[1:4]}
    assert rows["node1"][2:7] == ["ok", "ok", "ok", "ok", rows["node1"][6]] and rows["node1"][-1] == "USE"
    assert rows["node2"][2:5] == ["ok", "ok", "FAIL"]
    assert rows["nope-x"][2] == "FAIL"
    assert "node2: host key of node2" in bad and "nope-x: cannot resolve" in bad
    good = proc_ok.stdout.decode()
    assert proc_ok.returncode == 0, good + proc_ok.stderr.decode()
    assert len([line for line in good.splitlines() if line.rstrip().endswith("auto")]) == 3  # a free port to pick


def test_allrun_runs_once_per_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    proc = launcher.run(
        "allrun",
        "--ssh-config",
        str(bed.config),
        "-H",
        "node1:4,node2:4,node3",
        "sh",
        "-c",
        'echo "on $(echo $SSH_CONNECTION | cut -d" " -f3)"; [ "$RANK" != 1 ]',
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1, err
    for n in ("node1", "node2", "node3"):
        assert f"[{n}]<stdout>:on {bed.address(n)}" in out
    assert re.search(r"node1\s+ok", err) and re.search(r"node2\s+Exit code: 1", err) and re.search(r"node3\s+ok", err)
    assert "allrun: 2 of 3 hosts succeeded" in err


def test_concurrent_jobs_share_the_bed(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """Several launchers at once over the same hosts: each job sees only its own ranks."""
    results: list[subprocess.CompletedProcess] = []

    def one() -> None:
        results.append(ssh(launcher, bed, "-H", "node1:2,node2:2", "-n", "4", "sh", "-c", "echo $RANK $WORLD_SIZE"))

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for proc in results:
        assert proc.returncode == 0, proc.stderr.decode()
        assert sorted(proc.stdout.decode().split("\n")[:4]) == ["0 4", "1 4", "2 4", "3 4"]


def test_match_exec_is_applied_through_ssh_and_refused_clearly_without_it(
    launcher: Launcher, bed: SshBed, tmp_path: Path
) -> None:
    """paramiko asks `ssh -G`, which runs the `Match exec` command as ssh would (here it makes the
    user nobody, whom the bed refuses); with no ssh on PATH it is one clear line."""
    config = tmp_path / "ssh_config"
    config.write_text(f'Match exec "true"\n    User nobody\n\n{bed.config.read_text()}')
    proc = ssh(launcher, bed, "-H", "node1:1", "-n", "1", "true", config=config)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "node1: authentication as nobody failed" in err, err
    bare = {**os.environ, "PATH": str(tmp_path)}
    proc = ssh(launcher, bed, "-H", "node1:1", "-n", "1", "true", config=config, env=bare)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "node1: the ssh config uses `Match exec`, which paramiko runs only with invoke" in err


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_connections_dropped_before_the_banner_are_retried(
    launcher: Launcher, bed: SshBed, tmp_path: Path, client: str
) -> None:
    """What sshd's MaxStartups does to a burst: accept, then close before the banner. A proxy in
    front of node1 drops the first two connections, then forwards; the launch must succeed."""
    listener = socket.socket()
    listener.bind(("127.0.0.9", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted: list[int] = []

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            if len(accepted) <= 2:
                client.close()
                continue
            upstream = socket.create_connection((bed.address("node1"), bed.port))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.9]:{port} {bed.host_key('node1')}\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host flaky\n    HostName 127.0.0.9\n    Port {port}\n    User {bed.user}\n    IdentityFile {bed.identity}\n"
        f"    IdentitiesOnly yes\n    UserKnownHostsFile {known}\n"
    )
    try:
        proc = launcher.run("--ssh-client", client, "--ssh-config", str(config), "-H", "flaky:1", "-n", "1", "echo",
                            "through")  # fmt: skip
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == "through\n" and len(accepted) == 3


@pytest.mark.parametrize("client", CLIENTS)
def test_signals_reach_remote_ranks(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    script = write_script(
        tmp_path,
        "trap.py",
        "import os, signal, sys, time\n"
        f"seen = {str(tmp_path)!r} + '/usr1.'\n"
        "def usr1(*_):\n"  # each exits 5 once both have it: the first exit would abort the other
        "    print('usr1', flush=True)\n"
        "    open(seen + os.environ['RANK'], 'w').close()\n"
        "    while not all(os.path.exists(seen + r) for r in '01'):\n"
        "        time.sleep(0.02)\n"
        "    sys.exit(5)\n"
        "signal.signal(signal.SIGUSR1, usr1)\n"
        "print('up', flush=True)\ntime.sleep(60)\n",
    )
    proc = launcher.popen(*client_args(bed, client, "-H", "node1:1,node2:1", "-n", "2", PY, script))
    assert proc.stdout is not None
    for _ in range(2):
        assert proc.stdout.readline() == b"up\n"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert out == b"usr1\nusr1\n", err
    assert proc.returncode == 5


@pytest.mark.parametrize("client", CLIENTS)
def test_stdin_reaches_a_remote_rank_zero(launcher: Launcher, bed: SshBed, tmp_path: Path, client: str) -> None:
    data = b"".join(b"line %d\n" % i for i in range(20000))
    proc = subprocess.run(
        launcher.argv(*client_args(bed, client, "-H", "node2:2", "-n", "2", "sh", "-c", "wc -c")),
        input=data, capture_output=True, env=launcher.env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().split()) == ["0", str(len(data))]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_silent_network_cut_is_detected_on_both_sides(
    launcher: Launcher, bed: SshBed, tmp_path: Path, client: str
) -> None:
    """SIGSTOP of node2's sshd sessions: the TCP connection stays up and carries nothing, as in a
    network cut without a reset. The launcher declares node2 lost after the heartbeat timeout,
    and node2's agent, hearing nothing either, kills its ranks on its own."""
    script = write_script(tmp_path, "quiet.py", SLEEPER)
    proc = launcher.popen(
        *client_args(bed, client, "-H", "node1:1,node2:1", "-n", "2", PY, script),
        env={"MPILAUNCH_HEARTBEAT_TIMEOUT": "2"},
    )
    assert proc.stdout is not None
    for _ in range(2):
        assert proc.stdout.readline() == b"up\n"
    time.sleep(2.5)  # what is tested: a healthy job outlives the timeout, the pings keep it alive
    assert proc.poll() is None
    stopped = sshd_of_sessions(bed, "node2")
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - started < 6
        assert proc.returncode != 0
        assert "lost the agent of host node2 (no word from it for 2 s)" in err.decode()
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and _ranks_running(script):
            time.sleep(0.1)
        assert not _ranks_running(script), "node2's agent did not stop its rank on its own"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def agents_of(bed: SshBed, name: str) -> list[int]:
    """The remote agents of one host of the bed, found by the address its sshd was reached at."""
    return [p for p in bed.leftover_pids() if is_remote_agent(p) and f" {bed.address(name)} " in environ_text(p)]


def _ranks_running(script: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if script.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


def test_this_machine_with_a_login_is_reached_over_ssh(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """`localhost port=P`: the user asked for a login, so it goes through sshd (here node1's,
    reached as localhost through a HostName in the config)."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host localhost\n    HostName {bed.address('node1')}\n\n{bed.config.read_text()}")
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"localhost slots=1 port={bed.port}\n")
    proc = ssh(launcher, bed, "--hostfile", str(hostfile), "sh", "-c", "echo ${SSH_CONNECTION:-no ssh}", config=config)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().split()[2:4] == [bed.address("node1"), str(bed.port)]


def test_a_chatty_login_shell_does_not_confuse_the_agent(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Output that ~/.bashrc prints before the agent starts (a banner, a `conda activate` line)
    is skipped: the stream starts at the agent's marker."""
    home = tmp_path_factory.mktemp("chatty-home")
    (home / ".bashrc").write_text("echo 'Welcome to the cluster!'\nprintf '\\0\\1\\2 binary noise \\377'\n")
    (home / ".profile").write_text("echo profile says hi\n")
    with SshBed(tmp_path_factory.mktemp("chattybed"), 1, setenv={"HOME": str(home)}) as chatty:
        banner = subprocess.run(chatty.ssh_argv("node1", "true"), capture_output=True, timeout=30)
        assert b"Welcome to the cluster!" in banner.stdout  # the shell really does print it
        launcher = Launcher("chatty", home)
        proc = launcher.run("--ssh-config", str(chatty.config), "-H", "node1:2", "-n", "2", "sh", "-c", "echo $RANK")
        assert proc.returncode == 0, proc.stderr.decode()
        assert sorted(proc.stdout.decode().split()) == ["0", "1"]
        assert not chatty.wait_clean(3.0)


def test_ctrl_c_while_a_host_hangs_leaves_at_once(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.9", 0))
    silent.listen(8)
    config = tmp_path / "ssh_config"
    port = silent.getsockname()[1]
    config.write_text(f"Host mute\n    HostName 127.0.0.9\n    Port {port}\n\n{bed.config.read_text()}")
    silent.settimeout(30)
    hanging = None
    try:
        proc = launcher.popen("--ssh-config", str(config), "-H", "node1:1,mute:1", "-n", "2", "true")
        hanging, _ = silent.accept()  # mute's connection, never answered (10 s timeout)
        deadline = time.monotonic() + 30
        while not agents_of(bed, "node1"):  # node1 is connected: its agent runs
            assert time.monotonic() < deadline, "node1's agent never started"
            time.sleep(0.02)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - started < 2, err
    finally:
        if hanging is not None:
            hanging.close()
        silent.close()
    assert proc.returncode == 130, err


def test_a_refused_job_leaves_no_log_files(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    proc = ssh(launcher, bed, "-H", "node1:1,node2:1", "-n", "2", "--output-filename", "logs", "/nonexistent/prog")
    assert proc.returncode == 2, proc.stderr.decode()
    assert not (tmp_path / "logs").exists()


def test_a_remote_only_job_keeps_no_local_agent(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """The local agent forked at start-up is ended as soon as the plan shows no local rank."""
    script = write_script(tmp_path, "hold.py", "import time\nprint('up', flush=True)\ntime.sleep(2)\n")
    proc = launcher.popen("--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "-n", "2", PY, script)
    for _ in range(2):
        assert proc.stdout.readline().strip() == b"up"  # type: ignore[union-attr]
    children = [int(e) for e in os.listdir("/proc") if e.isdigit() and parent_pid(int(e)) == proc.pid]
    assert [process_name(pid) for pid in children] == ["ssh", "ssh"]  # its hosts' clients; no forked agent
    proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_report_json_over_ssh_names_each_ranks_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """--report-json over SSH: each rank's host, pid, times, CPU and peak RSS come from its remote
    agent (the bed's hosts share this machine's clock and pids), and the failure names its host."""
    from tests.local.test_report_json import RANK, accounted, check_ranks

    config = ("--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "--kill-timeout", "1")
    status, document, ranks, err = accounted(launcher, tmp_path, ["3", "sleep"], *config)
    assert status == 3 == document["exit_status"], err
    assert document["outcome"] == "failed" and document["aborted"]
    assert document["hosts"] == [{"name": "node1", "slots": 1, "ranks": 1}, {"name": "node2", "slots": 1, "ranks": 1}]
    check_ranks(document, ranks, ["node1", "node2"])
    failed, killed = document["ranks"]
    assert (failed["exit_code"], failed["killed"], killed["signal"], killed["killed"]) == (3, False, "SIGTERM", True)
    first = document["first_failure"]
    assert (first["rank"], first["host"], first["pid"], first["exit_code"]) == (0, "node1", ranks[0]["pid"], 3)
    assert first["last_stderr"] == ["rank 0 3"] and first["command"][:2] == [PY, RANK]


@pytest.mark.parametrize("end", ["ranks_exit", "kill9"])
def test_daemons_that_ignore_sigterm_die_with_the_job_on_every_host(
    launcher: Launcher, bed: SshBed, tmp_path: Path, end: str
) -> None:
    """The daemon of "No process left, ever" (a worker in a session of its own below a parent
    that ignores SIGTERM, tests/ranks/escape.py) on two hosts: the job ends once the ranks exit,
    and after kill -9 of the launcher nothing is left on any host within --kill-timeout + 1 s.
    (The remote agents read MPILAUNCH_CGROUP from their host's environment: the sweep alone is
    tried in tests/local/test_orphans.py.)"""
    escape = str(ROOT / "tests" / "ranks" / "escape.py")
    action = "0" if end == "ranks_exit" else "sleep"
    argv = ["--ssh-config", str(bed.config), "-H", "node1:1,node2:1", "-n", "2", "--kill-timeout", "1"]
    proc = launcher.popen(*argv, PY, escape, "worker", action)
    assert proc.stdout is not None
    started = time.monotonic()
    for _ in range(2):
        assert proc.stdout.readline().startswith(b"rank ")
    if end == "ranks_exit":
        proc.communicate(timeout=30)
        assert proc.returncode == 0 and time.monotonic() - started < 10
        left = bed.wait_clean(0.5)
        assert not left, f"left on the hosts after the job: {left}"
    else:
        kill_launcher_expecting_clean_hosts(proc, bed, 2.0)
