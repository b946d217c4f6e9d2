"""The ssh config as OpenSSH's own `ssh -G` reads it (transport/sshconfig.resolver: Include,
Match), and the same settings from paramiko's parser, where a machine has no ssh. Every config
is a test file given to ssh with -F: the machine's own ssh files are never read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mpilaunch.transport.sshconfig import resolver


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_ssh_g_follows_include_and_match(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.write_text("Host n*\n  HostName 10.1.1.1\nMatch host m1\n  Port 2300\n")
    outer = tmp_path / "config"
    outer.write_text(f"Include {inner}\n")
    lookup = resolver(str(outer), shutil.which("ssh"))
    assert lookup("n7")["hostname"] == "10.1.1.1" and lookup("m1")["port"] == "2300"


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
def test_ssh_target_applies_the_config_and_the_hostfile_wins(tmp_path: Path, reader: str) -> None:
    """The same settings whether OpenSSH reads the config (`ssh -G`, where ssh exists) or
    paramiko's parser does (a machine without ssh)."""
    import shutil

    from mpilaunch.transport.base import TransportError
    from mpilaunch.transport.ssh import parse_jump, ssh_target
    from mpilaunch.transport.sshconfig import resolver

    ssh = shutil.which("ssh") if reader == "ssh -G" else None
    if reader == "ssh -G" and ssh is None:
        pytest.skip("no ssh client")
    key = tmp_path / "k1"
    key.write_text("not read here")
    config_file = tmp_path / "config"
    config_file.write_text(
        f"Host n1\n  HostName 10.0.0.1\n  Port 2200\n  User alice\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
        "  ProxyJump bob@gate:2022\n  StrictHostKeyChecking accept-new\n  UserKnownHostsFile /tmp/kh1 /tmp/kh2\n"
        "  ConnectTimeout 3\n"
    )
    config = resolver(str(config_file), ssh)
    target = ssh_target("n1", None, None, config)
    assert (target.hostname, target.port, target.user, target.timeout) == ("10.0.0.1", 2200, "alice", 3.0)
    assert target.identity_files == (str(key),) and target.identities_only
    assert target.proxy_jump == "bob@gate:2022" and target.strict == "accept-new"
    assert target.known_hosts == ("/tmp/kh1", "/tmp/kh2") and target.key_name == "[10.0.0.1]:2200"
    override = ssh_target("n1", "carol", 22, config)
    assert (override.user, override.port, override.key_name) == ("carol", 22, "10.0.0.1")
    assert ssh_target("other", None, None, config).hostname == "other"
    assert parse_jump("bob@gate:2022") == ("bob", "gate", 2022) and parse_jump("gate") == (None, "gate", None)
    for bad in ("-oProxyCommand=x", "a;b", "u$@h", "h:port"):
        with pytest.raises(TransportError):
            parse_jump(bad)
    with pytest.raises(TransportError):
        ssh_target("n1", "-evil", None, config)
