"""The ssh config as OpenSSH reads it, for the paramiko client (`--ssh-client paramiko`).

paramiko's parser ignores `Include`, `Match exec`, tokens and canonicalization, so a config
that `ssh` reads well would send paramiko to the wrong host. Where an `ssh` binary exists, each
host's settings are what `ssh -G HOST` prints: OpenSSH's own answer. Without one, paramiko's
parser reads the config with its `Include` lines expanded first (globs, paths relative to
~/.ssh, loops refused). Either way, directives the paramiko client cannot honour for a host
are named in one line.
"""

from __future__ import annotations

import glob
import os

from mpilaunch.errors import LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

MAX_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
# Directive (as ssh_config spells it; `ssh -G` names it in lower case) -> the value that means
# "not used"; any other value is not honoured by the paramiko client.
NOT_HONOURED = {
    "ProxyCommand": "none",
    "ControlMaster": "false",
    "CertificateFile": None,
    "PKCS11Provider": "none",
    "HostKeyAlias": None,
    "LocalForward": None,
    "RemoteForward": None,
    "DynamicForward": None,
    "LocalCommand": None,
}


def resolver(path: str | None, ssh: str | None, paramiko: object = None) -> Callable[[str], dict]:
    """name -> the host's settings (lower-case keys as paramiko's lookup gives them, identityfile
    a list), from `ssh -G` when ssh is the path of an ssh binary, else from paramiko's parser
    (the paramiko module, as transport/ssh.py imports it)."""
    if ssh is not None:
        if path is not None and not os.path.isfile(path):
            raise LaunchError(f"--ssh-config {path}: cannot read: no such file")
        return lambda name: openssh_settings(ssh, path, name)
    return paramiko_settings(path, paramiko)


def openssh_settings(ssh: str, path: str | None, name: str) -> dict:
    """What `ssh -G` says of a host: the user's config, its Includes, Match and tokens applied."""
    import subprocess

    argv = [ssh, *(("-F", path) if path is not None else ()), "-G", "--", name]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"ssh -G {name}: {exc}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()  # the first names file and line
        raise ConfigError(f"the ssh config: {said[0] if said else f'ssh -G failed ({done.returncode})'}")
    return parse_dump(done.stdout.decode(errors="replace"))


def parse_dump(text: str) -> dict:
    """`ssh -G` output -> settings: one `key value` per line; identityfile and the forwards repeat."""
    settings: dict = {"identityfile": []}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        key = key.lower()
        if not key:
            continue
        if key in ("identityfile", "certificatefile", "localforward", "remoteforward", "dynamicforward"):
            settings.setdefault(key, []).append(value)
        else:
            settings[key] = value
    settings["identityfile"] = [f for f in settings["identityfile"] if os.path.isfile(os.path.expanduser(f))]
    for key in ("connecttimeout", "proxyjump"):
        if settings.get(key, "none") == "none":
            settings.pop(key, None)
    strict = settings.get("stricthostkeychecking")
    if strict in ("true", "false"):
        settings["stricthostkeychecking"] = "yes" if strict == "true" else "no"
    return settings


def not_honoured(settings: dict) -> list[str]:
    """The directives of these settings the paramiko client ignores, as ssh_config spells them."""
    found = []
    for directive, unused in NOT_HONOURED.items():
        value = settings.get(directive.lower())
        if value and value != unused and value != [] and str(value).lower() not in ("no", "none", "false"):
            found.append(directive)
    return found


class ConfigError(Exception):
    """A host's ssh config settings cannot be read (said for that host)."""


def paramiko_settings(path: str | None, paramiko: object = None) -> Callable[[str], dict]:
    """paramiko's parser over the config with its Includes expanded; lookup per host."""
    if paramiko is None:
        import paramiko  # type: ignore[no-redef]
    named = path is not None
    if path is None:
        path = os.path.expanduser("~/.ssh/config")
        if not os.path.isfile(path):
            return lambda name: {}
    where = f"--ssh-config {path}" if named else f"SSH config {path}"
    try:
        text = expand_includes(path, os.path.expanduser("~/.ssh"))
        config = paramiko.SSHConfig.from_text(text)  # type: ignore[attr-defined]
    except LaunchError as exc:
        raise LaunchError(f"{where}: {exc}") from None
    except OSError as exc:
        raise LaunchError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except Exception as exc:  # paramiko's parser raises plain exceptions for bad lines
        raise LaunchError(f"{where}: {exc}") from None

    def lookup(name: str) -> dict:
        try:
            return dict(config.lookup(name))
        except ImportError:
            raise ConfigError("the ssh config uses `Match exec`, which paramiko runs only with invoke") from None

    return lookup


def expand_includes(path: str, base: str, stack: tuple[str, ...] = ()) -> str:
    """The config's text with each `Include` line replaced by the files it names (OpenSSH: globs
    in order, relative paths from ~/.ssh, missing files skipped, at most 16 deep)."""
    real = os.path.realpath(path)
    if real in stack:
        chain = " -> ".join(os.path.basename(p) for p in (*stack, real))
        raise LaunchError(f"Include loop ({chain})")
    if len(stack) >= MAX_DEPTH:
        raise LaunchError(f"Include nested more than {MAX_DEPTH} deep at {path}")
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        lines = handle.read().splitlines()
    out = []
    for line in lines:
        words = line.split()
        if not words or words[0].lower() != "include":
            out.append(line)
            continue
        for pattern in words[1:]:
            pattern = os.path.expanduser(pattern.strip('"'))
            if not os.path.isabs(pattern):
                pattern = os.path.join(base, pattern)
            for included in sorted(glob.glob(pattern)):
                if os.path.isfile(included):
                    out.append(expand_includes(included, base, (*stack, real)))
    return "\n".join(out) + "\n"
