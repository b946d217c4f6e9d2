"""The ssh config for the paramiko client (transport/sshconfig.py): Include expanded as OpenSSH
does when there is no ssh binary to ask, `ssh -G` output read, and the directives the paramiko
client cannot honour named."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpilaunch.errors import LaunchError
from mpilaunch.transport.sshconfig import expand_includes, not_honoured, paramiko_settings, parse_dump


def test_include_globs_relative_paths_and_blocks(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "b.conf").write_text("Host b\n  HostName 10.0.0.2\n")
    (tmp_path / "conf.d" / "a.conf").write_text("Host a\n  HostName 10.0.0.1\n  Port 2201\n")
    main = tmp_path / "config"
    main.write_text("Include conf.d/*.conf\nHost *\n  User u\n")
    text = expand_includes(str(main), str(tmp_path))  # a relative Include is read from the base (~/.ssh)
    assert text.index("10.0.0.1") < text.index("10.0.0.2") < text.index("User u")  # globs in order, in place
    main.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost *\n  User u\n")
    lookup = paramiko_settings(str(main))
    assert (lookup("a")["hostname"], lookup("a")["port"], lookup("a")["user"]) == ("10.0.0.1", "2201", "u")
    assert lookup("b")["hostname"] == "10.0.0.2"


def test_a_missing_include_is_skipped_and_a_loop_is_refused(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_text(f"Include {tmp_path}/absent*\nInclude {two}\n")
    two.write_text(f"Host x\n  Include {one}\n")
    with pytest.raises(LaunchError, match=r"Include loop \(one -> two -> one\)"):
        expand_includes(str(one), str(tmp_path))
    with pytest.raises(LaunchError, match=r"--ssh-config .*/one: Include loop"):
        paramiko_settings(str(one))


def test_ssh_dump_is_read_and_what_paramiko_ignores_is_named() -> None:
    settings = parse_dump(
        "host n\nhostname 10.0.0.9\nport 2222\nidentityfile ~/.nothing-here\nconnecttimeout none\n"
        "stricthostkeychecking true\nproxycommand ssh -W %h:%p gw\ncontrolmaster auto\ngssapiauthentication no\n"
    )
    assert settings["hostname"] == "10.0.0.9" and settings["identityfile"] == []  # a missing key is skipped
    assert "connecttimeout" not in settings and settings["stricthostkeychecking"] == "yes"
    assert not_honoured(settings) == ["ProxyCommand", "ControlMaster"]
    assert not_honoured(parse_dump("host n\ncontrolmaster false\nproxycommand none\n")) == []
