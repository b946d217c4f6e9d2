"""The SSH client by default is OpenSSH's `ssh` (issue "Launch through the engine the cluster
already trusts"): a config that holds only `Include ...` works as it does for `ssh`, and so do
`Match` and `ProxyJump`; `--ssh-client paramiko` reads the same config through `ssh -G`, or, on a
machine without `ssh`, with its Includes expanded. The config is a test file given with
--ssh-config (ssh reads ~/.ssh from the passwd entry, not $HOME): the machine's own ~/.ssh is
never read or written.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import Launcher, sshbed_fixtures
from tests.sshbed import SshBed, bed_available

available, why = bed_available()
pytestmark = pytest.mark.skipif(not available, reason=why)

bed, clean_hosts = sshbed_fixtures("defaultbed", 3)
SHOW = "echo $OMPI_COMM_WORLD_RANK ${SSH_CONNECTION##* }"  # the rank and the address its sshd listens on


@pytest.fixture
def home(tmp_path: Path, bed: SshBed) -> Path:
    """A user config that is only an Include of the bed's config (a common layout)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(f"Include {bed.config}\n")
    return home


def _env(home: Path, **more: str) -> dict[str, str]:
    return {**os.environ, **more}


def _cfg(home: Path) -> tuple[str, str]:
    return ("--ssh-config", str(home / ".ssh" / "config"))


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:  # the launcher is ending
        return []


def _names(pid: int) -> list[str]:
    names = []
    for child in _children(pid):
        try:
            names.append(psutil.Process(child).name())
        except psutil.Error:  # ended (or a zombie) between the two looks
            pass
    return names


def _cmdlines(pid: int) -> list[list[str]]:
    lines = []
    for child in _children(pid):
        try:
            lines.append(psutil.Process(child).cmdline())
        except psutil.Error:
            pass
    return lines


def _rows(out: bytes) -> list[str]:
    return sorted(out.decode().split("\n")[:-1])


def test_an_include_only_config_works_with_the_default_client(launcher: Launcher, bed: SshBed, home: Path) -> None:
    proc = launcher.popen(
        *_cfg(home), "-H", "node1:1,node2:1", "-n", "2", "sh", "-c", SHOW + "; sleep 2", env=_env(home)
    )
    deadline = time.monotonic() + 20
    clients: list[str] = []
    while time.monotonic() < deadline and clients.count("ssh") < 2:  # the early local agent goes soon
        clients = _names(proc.pid)
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert clients.count("ssh") == 2  # OpenSSH's client, one per host
    assert _rows(out) == [f"0 {bed.port}", f"1 {bed.port}"]


@pytest.mark.parametrize("path", ["with ssh", "without ssh"])
def test_paramiko_reads_the_config_as_openssh_does(
    launcher: Launcher, bed: SshBed, home: Path, tmp_path: Path, path: str
) -> None:
    """With `ssh` on PATH, paramiko is given what `ssh -G` says; without it (a minimal
    container), the Include is expanded before paramiko's parser reads the config."""
    env = _env(home) if path == "with ssh" else _env(home, PATH=str(tmp_path))
    client = ["--ssh-client", "paramiko"] if path == "with ssh" else []  # without ssh, auto is paramiko
    proc = launcher.run(*client, *_cfg(home), "-H", "node1:1,node2:1", "-n", "2", "sh", "-c", SHOW, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert _rows(proc.stdout) == [f"0 {bed.port}", f"1 {bed.port}"]


def test_paramiko_names_what_it_cannot_honour(launcher: Launcher, bed: SshBed, home: Path) -> None:
    config = f"Host node1\n    ForwardAgent no\n    ControlMaster auto\nHost *\nInclude {bed.config}\n"
    (home / ".ssh" / "config").write_text(config)
    proc = launcher.run("--ssh-client", "paramiko", *_cfg(home), "-H", "node1:1", "-n", "1", "true", timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    said = "mpilaunch: --ssh-client paramiko does not honour, from the ssh config: ControlMaster (node1); --ssh-client"
    assert said in err, err


def test_match_and_proxyjump_work_as_for_ssh(launcher: Launcher, bed: SshBed, home: Path) -> None:
    """`Match originalhost gpu2` sends a name the bed does not know to node2; node3 is reached
    through node1 (`ProxyJump`): its ssh client starts the jump's own `ssh -W`."""
    (home / ".ssh" / "config").write_text(
        f"Match originalhost gpu2\n    HostName {bed.address('node2')}\n"
        f"Host node3\n    ProxyJump node1\n"
        f"Host *\nInclude {bed.config}\n"
    )
    proc = launcher.popen(
        *_cfg(home), "-H", "gpu2:1,node3:1", "-n", "2", "sh", "-c", SHOW + "; sleep 2", env=_env(home)
    )
    jumps: list[list[str]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not jumps:
        jumps = [line for pid in _children(proc.pid) for line in _cmdlines(pid) if "-W" in line]
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert _rows(out) == [f"0 {bed.port}", f"1 {bed.port}"]
    assert jumps and "node1" in jumps[0], jumps


def test_check_and_allrun_take_the_client_and_a_job_file(launcher: Launcher, bed: SshBed, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"host: [node1, node2]\nssh_config: {bed.config}\nssh_client: paramiko\n")
    checked = launcher.run("check", "--config", str(job), timeout=60)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    rows = [line.split()[0] for line in checked.stdout.decode().splitlines()[1:]]
    assert rows == ["node1", "node2"]
    ran = launcher.run("allrun", "--config", str(job), "--ssh-client", "openssh", "sh", "-c", "echo here", timeout=60)
    assert ran.returncode == 0, ran.stderr.decode()
    assert ran.stdout.decode().count("here") == 2
    assert "allrun: 2 of 2 hosts succeeded" in ran.stderr.decode()
