"""OpenSSH's command line, as mpilaunch runs it: by the launcher (--ssh-client openssh) and by
a relay of tree spawn on a host, so it is stdlib only (shipped to remote hosts)."""

from __future__ import annotations

import os

from mpilaunch.host.programs import find_program
from mpilaunch.protocol.messages import SshSpec

# Key exchange first tried: the one mpilaunch's own connections (paramiko) use. OpenSSH 9's
# default, sntrup761x25519, costs client and server about three times the CPU per connection
# (16 connections at once on 2 cores: 1.5 s against 0.5 s). `^` (OpenSSH 8.0 and later) puts
# it first and keeps the default list behind it.
KEX = "KexAlgorithms=^curve25519-sha256"


def is_ssh(ssh: SshSpec) -> bool:
    """Whether the remote shell is OpenSSH's `ssh` (the default), not another command in its
    place (Kubeflow's `kubectl exec` wrapper, say), which is given only the host and the command."""
    return not ssh.command or ssh.command[0].rpartition("/")[2] == "ssh"


def ssh_options(ssh: SshSpec, version: tuple[int, int] = (8, 0)) -> list[str]:
    """The remote shell's command line up to the host, the same for every host. For OpenSSH:
    the launcher's ssh config (where that path exists here too; else this host's own), the
    host-key policy and the user's extra arguments; version is the client's (for KEX). Another
    command in its place gets only the user's extra arguments."""
    if not is_ssh(ssh):
        return [*ssh.command, *ssh.extra]
    argv = [*(ssh.command or ("ssh",)), "-T", "-o", "BatchMode=yes"]
    if version >= (8, 0):
        argv += ["-o", KEX]
    if ssh.config and os.path.isfile(ssh.config):
        argv += ["-F", ssh.config]
    if ssh.accept_new:
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    return [*argv, *ssh.extra]


def ssh_argv(
    options: list[str], name: str, user: str | None, port: int | None, command: str, openssh: bool = True
) -> list[str]:
    """One host's command line: ssh_options, the hostfile's user and port, the host, and the
    agent's loader as the remote command (a command in place of ssh: the host and the command)."""
    if not openssh:
        return [*options, name, command]
    argv = list(options)
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(int(port))]
    return [*argv, "--", name, command]


def ssh_version(env: dict[str, str], program: str = "ssh") -> tuple[int, int]:
    """(major, minor) of the `ssh` on env's PATH (or program), (0, 0) if there is none or it
    cannot tell: asked once per relay and per launcher with --ssh-client openssh. posix_spawn,
    not subprocess, whose import is not otherwise on this path."""
    import re

    read, write = os.pipe()
    try:
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        actions += [(os.POSIX_SPAWN_DUP2, write, 1), (os.POSIX_SPAWN_DUP2, write, 2)]
        pid = os.posix_spawn(find_program(program, env), [program, "-V"], env, file_actions=actions)
    except OSError:
        os.close(read)
        return (0, 0)
    finally:
        os.close(write)
    with open(read, "rb") as said:
        text = said.read(1 << 16)
    os.waitpid(pid, 0)
    match = re.search(rb"OpenSSH_(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
