"""Tree spawn on a bed of seven real sshd hosts: --ssh-tree-width 2 makes the launcher connect to
node1 and node2 only; node1's agent starts node3 and node4 with OpenSSH's ssh, node2's starts
node5 and node6, and node3's starts node7 (three levels).

Every test ends with no process of the job on any host (the `clean_hosts` fixture).
"""

from __future__ import annotations

import os
import signal
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
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
PY = __import__("sys").executable
HOSTS = [f"node{i}" for i in range(1, 8)]
ALL_HOSTS = ",".join(HOSTS)
TREE = ("--ssh-tree-width", "2")
PARENTS = {"node3": "node1", "node4": "node1", "node5": "node2", "node6": "node2", "node7": "node3"}


bed, clean_hosts = sshbed_fixtures("treebed", len(HOSTS), settle=5.0)


def tree_run(launcher: Launcher, bed: SshBed, *args: str, **kw) -> subprocess.CompletedProcess:
    return launcher.run("--ssh-config", str(bed.config), *TREE, *args, **kw)


def tree_popen(launcher: Launcher, bed: SshBed, *args: str, **kw) -> subprocess.Popen:
    return launcher.popen("--ssh-config", str(bed.config), *TREE, *args, **kw)


def agents_by_host(bed: SshBed) -> dict[str, int]:
    """Each host's remote agent, found by the address its sshd was reached at."""
    found = {}
    for pid in bed.leftover_pids():
        if is_remote_agent(pid):
            text = environ_text(pid)
            for name in HOSTS:
                if f" {bed.address(name)} " in text:
                    found[name] = pid
    return found


def wait_for(proc: subprocess.Popen, word: bytes, count: int, timeout: float = 60) -> str:
    """Read the job's stdout until count ranks printed a line starting with word; the lines read."""
    assert proc.stdout is not None and proc.stderr is not None
    lines = []
    deadline = time.monotonic() + timeout
    while len(lines) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            raise AssertionError(f"the job ended ({proc.returncode}): {proc.stderr.read().decode()}")
        if line.startswith(word):
            lines.append(line.decode())
    assert len(lines) == count, f"{len(lines)} of {count} ranks said {word!r}"
    return "".join(lines)


def ended(proc: subprocess.Popen, timeout: float) -> tuple[bytes, bytes]:
    """The job's stdout and stderr once it ends; if it has not within timeout, it is stopped
    (SIGTERM: the launcher names what still ran) and the test fails with all it said."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"the job did not end in {timeout} s; stdout {out!r}, stderr:\n{err.decode()}") from None


def test_allreduce_over_a_tree_with_two_connections_from_the_launcher(
    launcher: Launcher, bed: SshBed, tmp_path: Path
) -> None:
    """Every host's rank joins one COMM_WORLD; the launcher holds two SSH connections (through its
    ssh clients with the default client); the
    relays (node1, node2, node3) each run one `ssh` per child."""
    go = tmp_path / "go"
    script = write_script(
        tmp_path,
        "tree.py",
        "import os, time\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
        "print('rank', c.rank, 'of', c.size, 'sum', c.allreduce(c.rank), 'at', "
        "os.environ['SSH_CONNECTION'].split()[2], os.environ['MASTER_ADDR'], flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n",
    )
    proc = tree_popen(launcher, bed, "-H", ALL_HOSTS, "--output-filename", "logs", PY, script)
    assert proc.stdout is not None
    try:
        said = wait_for(proc, b"rank", 7)
        me = psutil.Process(proc.pid)  # the connections are its own (paramiko) or its ssh clients' (OpenSSH)
        conns = [
            c
            for p in (me, *me.children())
            for c in p.net_connections("tcp")
            if c.raddr and c.raddr.port == bed.port and c.status == psutil.CONN_ESTABLISHED
        ]
        assert sorted(c.raddr.ip for c in conns) == [bed.address("node1"), bed.address("node2")]
        agents = agents_by_host(bed)
        assert sorted(agents) == HOSTS
        for name, pid in agents.items():
            ssh_children = [p for p in psutil.Process(pid).children() if p.name() == "ssh"]
            targets = sorted(p.cmdline()[p.cmdline().index("--") + 1] for p in ssh_children)
            assert targets == sorted(h for h, parent in PARENTS.items() if parent == name), name
    finally:
        go.touch()
    _, err = ended(proc, 60)
    assert proc.returncode == 0, err.decode()
    for rank, name in enumerate(HOSTS):
        line = f"rank {rank} of 7 sum 21 at {bed.address(name)} {bed.address('node1')}"
        assert line in said
        assert (tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout").read_text().startswith(line)


def test_output_and_stdin_pass_through_relays(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """20,000 lines from every host reach their files whole; stdin reaches rank 6 on node7, two
    relays down, with the launcher's flow control."""
    lines = 20000
    script = write_script(
        tmp_path,
        "talk.py",
        "import os, sys\nr = os.environ['RANK']\n"
        "if r == '6':\n    print('stdin', len(sys.stdin.buffer.read()), flush=True)\n"
        f"for i in range({lines}):\n    print(f'{{r}} line {{i}} ' + 'x' * 60)\n",
    )
    data = b"".join(b"input %d\n" % i for i in range(50000))
    proc = subprocess.run(
        launcher.argv("--ssh-config", str(bed.config), *TREE, "-H", ALL_HOSTS, "--stdin", "6",
                      "--output-filename", "logs:nocopy", PY, script),
        input=data, capture_output=True, env=launcher.env, cwd=tmp_path, timeout=90,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    for rank in range(7):
        text = (tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout").read_text().splitlines()
        body = text[1:] if rank == 6 else text
        assert body == [f"{rank} line {i} " + "x" * 60 for i in range(lines)], rank
    assert (tmp_path / "logs" / "1" / "rank.6" / "stdout").read_text().startswith(f"stdin {len(data)}\n")


def test_failure_three_levels_down_aborts_every_host(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "fail.py",
        "import os, sys, time\nif os.environ['RANK'] == '6':\n    time.sleep(1)\n"
        "    print('bad', file=sys.stderr); sys.exit(3)\ntime.sleep(60)\n",
    )
    started = time.monotonic()
    proc = tree_run(launcher, bed, "-H", ALL_HOSTS, PY, script, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 3, err
    assert "Rank:      6" in err and "Host:      node7" in err and "bad" in err
    assert time.monotonic() - started < 20


def test_signals_reach_ranks_behind_relays(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "trap.py",
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: (print('usr1', flush=True), sys.exit(0)))\n"
        "print('up', flush=True)\ntime.sleep(60)\n",
    )
    proc = tree_popen(launcher, bed, "-H", ALL_HOSTS, PY, script)
    assert proc.stdout is not None
    wait_for(proc, b"up", 7)
    proc.send_signal(signal.SIGUSR1)
    out, err = ended(proc, 30)
    assert out == b"usr1\n" * 7, err  # each exits 0: none ends the job before the others got it
    assert proc.returncode == 0


def test_kill_9_of_a_relay_names_every_host_below_it(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """node1's agent dies: node1, node3, node4 and node7 (below node3) are lost and named, the job
    ends, and no rank is left on any host (node1's guardian kills its ssh clients, whose agents
    then see the end of their links)."""
    script = write_script(tmp_path, "sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    proc = tree_popen(launcher, bed, "-H", ALL_HOSTS, PY, script)
    assert proc.stdout is not None
    wait_for(proc, b"up", 7)
    os.kill(agents_by_host(bed)["node1"], signal.SIGKILL)
    _, err = ended(proc, 30)
    text = err.decode()
    assert proc.returncode != 0
    assert "lost the agent of host node1" in text
    for name in ("node3", "node4"):
        assert f"lost the agent of host {name} (its relay node1 was lost)" in text
    assert "lost the agent of host node7 (its relay node3 was lost)" in text
    for name in ("node2", "node5", "node6"):
        assert f"lost the agent of host {name}" not in text


def test_kill_9_of_the_launcher_cleans_every_host_of_the_tree(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    proc = tree_popen(launcher, bed, "-H", ALL_HOSTS, PY, script)
    assert proc.stdout is not None
    wait_for(proc, b"up", 7)
    kill_launcher_expecting_clean_hosts(proc, bed, 5.0)


def test_a_host_a_relay_cannot_reach_is_named_with_sshs_words(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    bed.stop_host("node6")
    try:
        proc = tree_run(launcher, bed, "-H", ALL_HOSTS, "true")
    finally:
        bed.start_host("node6")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.startswith("mpilaunch: node6: ") and "Connection refused" in err, err
    assert "(tree spawn through node2; --ssh-tree-width 0 starts each host from here)" in err, err
    assert len(err.splitlines()) == 1, err


def test_a_silent_cut_below_a_relay_is_detected(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """node5's sshd sessions are stopped (a cut without a reset): the launcher hears nothing from
    node5 through node2 and gives it up after the heartbeat timeout; node2 cuts its ssh client;
    node5's agent, hearing no pings from node2, stops its rank on its own."""
    script = write_script(tmp_path, "quiet.py", "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    proc = tree_popen(launcher, bed, "-H", ALL_HOSTS, PY, script, env={"MPILAUNCH_HEARTBEAT_TIMEOUT": "2"})
    assert proc.stdout is not None
    wait_for(proc, b"up", 7)
    time.sleep(2.5)  # longer than the timeout: the relays' pings keep a healthy tree alive
    assert proc.poll() is None
    stopped = sshd_of_sessions(bed, "node5")
    assert stopped
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        _, err = ended(proc, 30)
        assert time.monotonic() - started < 6
        assert proc.returncode != 0
        assert "lost the agent of host node5 (no word from it for 2 s)" in err.decode()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def test_rank_table_is_written_on_every_host_of_the_tree(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    script = write_script(
        tmp_path, "rt.py", "import json, os\nt = json.load(open(os.environ['RANK_TABLE_FILE']))\n"
        "print('servers', len(t['server_list']), flush=True)\n"
    )  # fmt: skip
    proc = tree_run(
        launcher, bed, "-H", ALL_HOSTS, "--rank-table", "rt.json", PY, script, env={"CUDA_VISIBLE_DEVICES": "0"}
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout.decode().split("\n")[:7] == ["servers 7"] * 7
    assert "(and on node1, node2, node3, node4, node5, node6, node7)" in err


def test_spawn_reaches_a_host_behind_a_relay(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    """MPI_Comm_spawn from rank 0 places its child on a free slot: node7's, three levels down."""
    script = write_script(
        tmp_path,
        "spawn.py",
        "import os, sys\nfrom mpi4py import MPI\n"
        "parent = MPI.Comm.Get_parent()\n"
        "if parent != MPI.COMM_NULL:\n"
        "    print('child at', os.environ['SSH_CONNECTION'].split()[2], flush=True)\n"
        "    parent.Disconnect()\n"
        "else:\n"
        "    c = MPI.COMM_WORLD\n"
        "    child = c.Spawn(sys.executable, [__file__], 1)\n"
        "    child.Disconnect()\n",
    )
    hosts = ",".join(f"{h}:{2 if h == 'node7' else 1}" for h in HOSTS)
    proc = tree_run(launcher, bed, "-H", hosts, "-n", "7", PY, script, timeout=90)
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"child at {bed.address('node7')}" in proc.stdout.decode()


def test_a_paused_console_does_not_lose_an_idle_host_behind_a_relay(
    launcher: Launcher, bed: SshBed, tmp_path: Path
) -> None:
    """Nobody reads the launcher's stdout for 5 s while node1's rank writes 20 MB: the console
    is stalled, so after its backlog it gets no more rank output (one notice), and the log
    files get all of it. node3, below node1, is idle the whole time and does not take the
    silence for a lost launcher (heartbeat timeout 2 s)."""
    script = write_script(
        tmp_path,
        "pause.py",
        "import os, sys, time\nr = os.environ['RANK']\n"
        "if r == '0':\n    sys.stdout.write(('x' * 99 + '\\n') * 200000)\n"
        "elif r == '2':\n    time.sleep(6)\n    print('node3 alive', flush=True)\n",
    )
    hosts = ("-H", "node1,node2,node3", "--output-filename", "logs")
    proc = tree_popen(launcher, bed, *hosts, PY, script, env={"MPILAUNCH_HEARTBEAT_TIMEOUT": "2"})
    time.sleep(5)  # stdout unread: the launcher's console backlog fills, then it stalls
    out, err = ended(proc, 60)
    assert proc.returncode == 0, err.decode()
    assert (tmp_path / "logs" / "1" / "rank.0" / "stdout").read_bytes() == (b"x" * 99 + b"\n") * 200000
    # No line holds two ranks' bytes (one cut short where the console's copy was dropped may be).
    odd = [line[:120] for line in out.split(b"\n")[:-1] if line.strip(b"x") and line != b"node3 alive"]
    assert not odd, odd
    assert b"node3 alive\n" in out
    assert err.decode().count("the console is not reading") == 1
