"""`mpilaunch check` with the default client, OpenSSH's `ssh` (issue 35, "Never silent, never
wrong": `check` reports only what it verified). Each host fails at the step ssh itself failed at,
read from its status and its words; the steps after it show `-`, never `ok`; ADDRESS is where
ssh reaches the host. The same hosts give paramiko's table, where both clients can tell.

The bed is node1, node2 on 127.0.0.2-3; the other names are aliases in a config of the test's
own, written in front of the bed's (ssh takes a setting's first value): a name that does not
resolve, an address whose port refuses connections, node2's address under a known_hosts that
lacks its key or has another one, node1's address as a user that does not exist. Every test
ends with no process of the job here (the `launcher` fixture: the ssh clients carry its tag)
or on the hosts (`clean_hosts`).
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
PY = sys.executable
PYTHON = ".".join(map(str, sys.version_info[:3]))
DEAD = "127.0.0.9"  # no sshd of this bed: a port held bound there (never listening) refuses connections

bed, clean_hosts = sshbed_fixtures("checkbed", 2)


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port on DEAD that refuses connections for the whole test: bound by us, not listening,
    so nobody else can listen there meanwhile."""
    with socket.socket() as held:
        held.bind((DEAD, 0))
        yield held.getsockname()[1]


@pytest.fixture
def config(bed: SshBed, tmp_path: Path, refused_port: int) -> Path:
    without = bed.known_hosts_without("node2")
    wrong = bed.known_hosts_wrong_key("node2")
    node1, node2 = bed.address("node1"), bed.address("node2")
    aliases = (
        "Host nowhere\n    HostName nowhere.invalid\n"
        f"Host dead\n    HostName {DEAD}\n    Port {refused_port}\n"
        f"Host quiet\n    HostName {DEAD}\n    Port {refused_port}\n    LogLevel QUIET\n"
        f'Host unknownkey\n    HostName {node2}\n    UserKnownHostsFile "{without}"\n'
        f'Host changedkey\n    HostName {node2}\n    UserKnownHostsFile "{wrong}"\n'
        f"Host stranger\n    HostName {node1}\n    User nosuchuser\n"
    )
    path = tmp_path / "ssh_config"
    path.write_text(aliases + bed.config.read_text())
    return path


def table(out: str) -> dict[str, list[str]]:
    """The table's rows by host: ADDRESS and the step cells (columns are two spaces apart or more)."""
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "HOST", "ADDRESS", "RESOLVE", "CONNECT", "HOST KEY", "AUTH", "PYTHON", "PROGRAM", "PORT",
    ]  # fmt: skip
    rows = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != 9:
            break  # the problem lines below the table
        rows[cells[0]] = cells[1:]
    return rows


def check(launcher: Launcher, config: Path, hosts: str, *rest: str) -> tuple[int, dict[str, list[str]], str]:
    proc = launcher.run("check", "--ssh-config", str(config), "-H", hosts, *rest, timeout=90)
    out = proc.stdout.decode()
    assert "Traceback" not in out + proc.stderr.decode()
    return proc.returncode, table(out), out


def test_each_host_fails_at_the_step_ssh_failed_at(
    launcher: Launcher, bed: SshBed, config: Path, refused_port: int
) -> None:
    """The issue's case first: node9 resolves nowhere, and was shown `ok` for every SSH step."""
    port, user, refused = bed.port, bed.user, refused_port
    status, rows, out = check(launcher, config, "localhost,node1,node9,nowhere,dead,unknownkey,changedkey,stranger", PY)
    assert status == 1, out
    assert rows == {
        "localhost": ["this machine", "local", "-", "-", "-", PYTHON, "ok", "auto"],
        "node1": [f"{user}@127.0.0.2:{port}", "ok", "ok", "ok", "ok", PYTHON, "ok", "auto"],
        "node9": [f"{user}@node9:{port}", "FAIL", "-", "-", "-", "-", "-", "-"],
        "nowhere": [f"{user}@nowhere.invalid:{port}", "FAIL", "-", "-", "-", "-", "-", "-"],
        "dead": [f"{user}@{DEAD}:{refused}", "ok", "FAIL", "-", "-", "-", "-", "-"],
        "unknownkey": [f"{user}@127.0.0.3:{port}", "ok", "ok", "FAIL", "-", "-", "-", "-"],
        "changedkey": [f"{user}@127.0.0.3:{port}", "ok", "ok", "FAIL", "-", "-", "-", "-"],
        "stranger": [f"nosuchuser@127.0.0.2:{port}", "ok", "ok", "ok", "FAIL", "-", "-", "-"],
    }, out
    problems = out.splitlines()[len(rows) + 1 :]
    assert problems == [
        "node9: ssh: Could not resolve hostname node9: Name or service not known",
        "nowhere: ssh: Could not resolve hostname nowhere.invalid: Name or service not known",
        f"dead: ssh: connect to host {DEAD} port {refused}: Connection refused",
        "unknownkey: Host key verification failed. (its key is unknown: --ssh-accept-new records it)",
        problems[4],
        "stranger: nosuchuser@127.0.0.2: Permission denied (publickey).",
    ], out
    assert problems[4].startswith("changedkey: Host key verification failed. (its key has CHANGED: always refused")


def test_a_missing_program_fails_on_a_host_every_step_of_which_passed(
    launcher: Launcher, bed: SshBed, config: Path
) -> None:
    status, rows, out = check(launcher, config, "node1,node2", "no-such-program-here")
    assert status == 1, out
    for name in ("node1", "node2"):
        assert rows[name] == [
            f"{bed.user}@{bed.address(name)}:{bed.port}",
            "ok",
            "ok",
            "ok",
            "ok",
            PYTHON,
            "FAIL",
            "auto",
        ]
    assert f"node1: program 'no-such-program-here' not found (PATH and working directory {launcher.tmp_path})" in out


def test_ssh_that_names_no_step_is_shown_as_not_known(launcher: Launcher, config: Path) -> None:
    """With LogLevel QUIET ssh says nothing: no step is known to have passed, so none is `ok`
    (and none is blamed): `?`, and the problem line says what is known."""
    status, rows, out = check(launcher, config, "quiet,node1", PY)
    assert status == 1, out
    assert rows["quiet"][1:] == ["?", "?", "?", "?", "-", "-", "-"], out
    assert rows["node1"][1:] == ["ok", "ok", "ok", "ok", PYTHON, "ok", "auto"], out
    assert "quiet: ssh exited with status 255 before the agent answered" in out


def test_the_table_is_paramikos_for_the_same_hosts(launcher: Launcher, config: Path) -> None:
    """Both clients verify the same steps of these hosts, and reach them at the same addresses."""
    hosts = "localhost,node1,node2,node9,nowhere,dead,unknownkey,changedkey,stranger"
    status, openssh, out = check(launcher, config, hosts, PY)
    paramiko_status, paramiko, paramiko_out = check(launcher, config, hosts, "--ssh-client", "paramiko", PY)
    assert status == paramiko_status == 1
    assert openssh == paramiko, out + "\n" + paramiko_out
