"""known_hosts and ssh config lines that used to make the paramiko client fail every host with
raw exception text (issue "No process left, ever", part 6): markers and undecodable lines are
read as OpenSSH reads them, and a bad `Port` or `ConnectTimeout` is one line, status 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher, sshbed_fixtures
from tests.sshbed import bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)
PY = sys.executable

bed, clean_hosts = sshbed_fixtures("configbed", 2)


def run(launcher: Launcher, config: Path, *args: str):  # type: ignore[no-untyped-def]
    return launcher.run("--ssh-client", "paramiko", "--ssh-config", str(config), *args, timeout=60)


def test_cert_authority_and_undecodable_lines_are_skipped(launcher: Launcher, bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    known = bed.write_known_hosts(tmp_path / "known_hosts")
    with open(known, "ab") as handle:
        handle.write(b"@cert-authority *.example.org " + bed.host_key("node1").encode() + b"\n")
        handle.write(b"\xff\xfe not utf-8 \x80\n")
        handle.write(b"node9 ssh-rsa not-base64!!\n")
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    proc = run(launcher, config, "-H", "node1:1,node2:1", "-n", "2", "true")
    assert proc.returncode == 0, proc.stderr.decode()


def test_a_revoked_host_key_is_refused_even_with_accept_new(launcher: Launcher, bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    known = bed.write_known_hosts(tmp_path / "known_hosts")
    with open(known, "a") as handle:
        handle.write("@revoked " + bed.known_hosts_line("node2"))
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    for extra in ([], ["--ssh-accept-new"]):
        proc = run(launcher, config, *extra, "-H", "node1:1,node2:1", "-n", "2", "true")
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert "host key of node2" in err and "@revoked" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
    proc = run(launcher, config, "-H", "node1:1", "-n", "1", "true")  # node1's key is not revoked
    assert proc.returncode == 0, proc.stderr.decode()


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
@pytest.mark.parametrize(
    ("line", "words", "ssh_words"),
    [("Port abc", "Port 'abc': not a port", "Bad port 'abc'"),
     ("Port 70000", "Port '70000': not a port", "Bad port '70000'"),
     ("ConnectTimeout soon", "ConnectTimeout 'soon': not seconds", "invalid time value")],
)  # fmt: skip
def test_a_bad_number_in_the_ssh_config_is_one_line(
    launcher: Launcher, bed, tmp_path: Path, line: str, words: str, ssh_words: str, reader: str
) -> None:  # type: ignore[no-untyped-def]
    """With ssh on PATH, OpenSSH's own words (file and line); without, paramiko's reading."""
    known = bed.write_known_hosts(tmp_path / "known_hosts")
    config = bed.write_ssh_config(known, tmp_path / "ssh_config")
    config.write_text(f"Host node1\n    {line}\n\n" + config.read_text())
    env = None if reader == "ssh -G" else {**os.environ, "PATH": str(tmp_path)}
    proc = launcher.run("--ssh-client", "paramiko", "--ssh-config", str(config), "-H", "node1:1", "-n", "1", "true",
                        timeout=60, env=env)  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    expected = f"{config} line 2: {ssh_words}" if reader == "ssh -G" else words
    assert expected in err and "node1" in err and "Traceback" not in err and "ValueError" not in err
    assert len(err.strip().splitlines()) == 1, err
