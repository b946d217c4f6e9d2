"""Which step of an OpenSSH connection failed, read from `ssh`'s exit status and its own words,
and the address `ssh` reaches a host at: what `mpilaunch check` shows for the default client.

`ssh` runs the whole connection in its own process, so the launcher learns how far it got only
from what it says: status 255 and a line such as `Could not resolve hostname`, `Connection
refused` or `Permission denied`. A step is reported as passed only when ssh's words (or the
remote command having run) prove it; words not recognised name no step (UNKNOWN_STAGE), so
`check` never shows a step it did not verify as `ok`.
"""

from __future__ import annotations

import re

from mpilaunch.transport.base import STAGES, UNKNOWN_STAGE

SSH_FAILED = 255  # ssh's own status for a failure of its own (any other is the remote command's)

# (pattern, step), tried on each line of ssh's stderr in turn: the first line that matches one
# names the step. Within a line the first pattern wins, so the specific come before the general.
PATTERNS: tuple[tuple[str, str], ...] = (
    (r"could not resolve", "resolve"),
    (r"name or service not known|temporary failure in name resolution|no address associated with hostname", "resolve"),
    (r"nodename nor servname provided", "resolve"),
    (r"\bline \d+: |bad configuration option|bad owner or permissions on", "resolve"),  # the host's settings
    (r"kex_exchange_identification|ssh_exchange_identification|banner exchange", "connect"),
    (r"unable to negotiate with", "connect"),
    (r"connection refused|connection timed out|operation timed out|no route to host|network is unreachable", "connect"),
    (r"host is down|connect failed|stdio forwarding failed", "connect"),
    (r"^connection to .* closed by remote host", "agent"),  # the session had started
    (r"connection (reset|closed) by", "connect"),
    (r"remote host identification has changed|revoked host key|host key verification failed", "host key"),
    (r"host key is known for|has changed and you have requested strict checking", "host key"),
    (r"permission denied|too many authentication failures|no more authentication methods", "auth"),
    (r"^authentication failed", "auth"),
)
_COMPILED = tuple((re.compile(pattern, re.IGNORECASE), step) for pattern, step in PATTERNS)
assert all(step in STAGES for _, step in PATTERNS)


def failed_step(status: int | None, said: str, reached: bool, openssh: bool = True) -> str:
    """The step (base.STAGES, or UNKNOWN_STAGE) at which an ssh client's connection failed: status
    is its exit status (None: still running; negative: a signal), said its stderr, reached whether
    the remote command wrote anything (the connection was made: whatever failed is the agent).
    A status other than 255 is the remote command's own, so ssh got that far; status 255 (or
    none) names a step only through ssh's words. For a command in ssh's place (openssh False)
    only reached tells anything."""
    if reached:
        return "agent"
    if not openssh:
        return UNKNOWN_STAGE
    if status is not None and 0 <= status != SSH_FAILED:
        return "agent"
    for line in said.splitlines():
        for pattern, step in _COMPILED:
            if pattern.search(line.strip()):
                return step
    return UNKNOWN_STAGE


def host_key_hint(said: str) -> str:
    """What to do about ssh's terse `Host key verification failed.` (BatchMode asks nothing),
    from the lines before it: an unknown key can be accepted, a changed one never."""
    lowered = said.lower()
    if "remote host identification has changed" in lowered:
        remove = re.search(r"ssh-keygen\b.* -R .*", said)
        how = f": {remove.group(0).strip()}" if remove else " with ssh-keygen -R"
        return f"(its key has CHANGED: always refused; if the change is expected, remove the old key{how})"
    if "revoked host key" in lowered:
        return "(its key is revoked: always refused)"
    if "host key is known for" in lowered:
        return "(its key is unknown: --ssh-accept-new records it)"
    return "(its key is unknown: --ssh-accept-new records it; or it CHANGED: always refused)"


def resolved(hostname: str, port: int | str, family: str = "any") -> str:
    """The first address `ssh` would try for hostname (getaddrinfo with its AddressFamily, as ssh
    asks), or "" when it does not resolve here."""
    import socket

    families = {"inet": socket.AF_INET, "inet6": socket.AF_INET6}
    try:
        found = socket.getaddrinfo(hostname, port, families.get(family, socket.AF_UNSPEC), socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ""
    return str(found[0][4][0]) if found else ""
