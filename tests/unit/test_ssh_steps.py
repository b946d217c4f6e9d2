"""Which step an OpenSSH connection failed at, read from ssh's status and words (transport/ssh_steps.py),
and how `mpilaunch check` shows it (issue 35, "Never silent, never wrong": `check` reports only
what it verified). The words are OpenSSH 9's own, as tests/ssh/test_check_openssh.py meets them."""

from __future__ import annotations

import pytest

from mpilaunch.launcher.start.check_allrun import step_cells
from mpilaunch.transport.base import UNKNOWN_STAGE
from mpilaunch.transport.ssh_steps import failed_step, host_key_hint

CHANGED = (
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
    "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n"
    "Offending ED25519 key in /tmp/bed/known_hosts.wrong-node2:2\n"
    "  remove with:\n"
    '  ssh-keygen -f "/tmp/bed/known_hosts.wrong-node2" -R "[127.0.0.3]:30962"\n'
    "Host key for [127.0.0.3]:30962 has changed and you have requested strict checking.\n"
    "Host key verification failed.\n"
)
UNKNOWN_KEY = (
    "No ED25519 host key is known for [127.0.0.3]:30962 and you have requested strict checking.\n"
    "Host key verification failed.\n"
)
PROXY_NO_NAME = (
    "channel 0: open failed: connect failed: Name or service not known\n"
    "stdio forwarding failed\n"
    "kex_exchange_identification: Connection closed by remote host\n"
    "Connection closed by UNKNOWN port 65535\n"
)

SAID = [
    ("ssh: Could not resolve hostname node9: Name or service not known\n", "resolve"),
    ("ssh: Could not resolve hostname node9: Temporary failure in name resolution\n", "resolve"),
    ("/tmp/bed/ssh_config line 2: Bad port 'abc'.\n/tmp/bed/ssh_config: terminating, 1 bad configuration options\n",
     "resolve"),
    (PROXY_NO_NAME, "resolve"),
    ("ssh: connect to host 127.0.0.9 port 30962: Connection refused\n", "connect"),
    ("ssh: connect to host 10.9.9.9 port 22: Connection timed out\n", "connect"),
    ("ssh: connect to host 10.9.9.9 port 22: No route to host\n", "connect"),
    ("ssh: connect to host 10.9.9.9 port 22: Network is unreachable\n", "connect"),
    ("kex_exchange_identification: read: Connection reset by peer\nConnection reset by 127.0.0.2 port 22\n", "connect"),
    ("Connection timed out during banner exchange\nConnection to 127.0.0.2 port 22 timed out\n", "connect"),
    ("Unable to negotiate with 127.0.0.2 port 22: no matching host key type found. Their offer: ssh-dss\n", "connect"),
    (UNKNOWN_KEY, "host key"),
    (CHANGED, "host key"),
    ("Warning: Permanently added '[127.0.0.2]:22' (ED25519) to the list of known hosts.\n"
     "nosuch@127.0.0.2: Permission denied (publickey).\n", "auth"),
    ("Received disconnect from 127.0.0.2 port 22:2: Too many authentication failures\n", "auth"),
    ("Connection to node1 closed by remote host.\n", "agent"),
]  # fmt: skip


@pytest.mark.parametrize(("said", "step"), SAID)
def test_ssh_words_name_the_step_that_failed(said: str, step: str) -> None:
    assert failed_step(255, said, reached=False) == step
    assert failed_step(None, said, reached=False) == step  # still running when given up: its words tell


def test_words_that_name_no_step_name_none() -> None:
    assert failed_step(255, "", reached=False) == UNKNOWN_STAGE  # LogLevel QUIET: ssh says nothing
    assert failed_step(255, "something new went wrong\n", reached=False) == UNKNOWN_STAGE
    assert failed_step(-9, "", reached=False) == UNKNOWN_STAGE  # killed: no step is known


def test_the_remote_command_ran_so_every_ssh_step_passed() -> None:
    assert failed_step(127, "bash: line 1: python3: command not found\n", reached=False) == "agent"
    assert failed_step(0, "", reached=False) == "agent"
    assert failed_step(255, "Permission denied\n", reached=True) == "agent"  # it wrote: connected and in


def test_a_command_in_ssh_place_names_no_step_but_the_agent() -> None:
    assert failed_step(255, "ssh: Could not resolve hostname x\n", reached=False, openssh=False) == UNKNOWN_STAGE
    assert failed_step(1, "", reached=False, openssh=False) == UNKNOWN_STAGE
    assert failed_step(1, "", reached=True, openssh=False) == "agent"


def test_host_key_hint_tells_unknown_from_changed() -> None:
    assert host_key_hint(UNKNOWN_KEY) == "(its key is unknown: --ssh-accept-new records it)"
    changed = host_key_hint(CHANGED)
    assert "CHANGED: always refused" in changed
    assert 'ssh-keygen -f "/tmp/bed/known_hosts.wrong-node2" -R "[127.0.0.3]:30962"' in changed
    assert "unknown" not in changed


def test_check_cells_show_ok_only_before_the_failed_step() -> None:
    assert step_cells("resolve") == ("FAIL", "-", "-", "-", "-")
    assert step_cells("connect") == ("ok", "FAIL", "-", "-", "-")
    assert step_cells("host key") == ("ok", "ok", "FAIL", "-", "-")
    assert step_cells("auth") == ("ok", "ok", "ok", "FAIL", "-")
    assert step_cells("agent") == ("ok", "ok", "ok", "ok", "FAIL")
    assert step_cells(UNKNOWN_STAGE) == ("?", "?", "?", "?", "-")
