"""Hostfile and -H parsing: text in, [Host] out, errors naming file and line."""

from __future__ import annotations

import os
import re

from mpilaunch.errors import LaunchError
from mpilaunch.protocol.record import Record

# The variables in which a platform or batch system names its allocation's hosts (read by
# hostsources.py, in this order); kept here so that a job with none of them set never imports it.
ENVIRONMENT_SOURCES = (
    "MLP_MPI_HOSTFILE",
    "MLP_MPI_HOSTS",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "PE_HOSTFILE",
    "PBS_NODEFILE",
    "LSB_MCPU_HOSTS",
    "OMPI_MCA_orte_default_hostfile",
)

_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])$")
_USER_RE = r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$"  # compiled by re on first use: most runs name no user
_SLOTS_KEYS = ("slots", "slot", "cpu", "cpus", "count")
_MAX_KEYS = ("max_slots", "max-slots")
_USER_KEYS = ("user", "username")
HOSTFILE_MAX = 16 << 20
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class Host(Record):
    """A machine of the job. slots None means "as many as it has cores"."""

    name: str
    slots: int | None = None
    max_slots: int | None = None
    user: str | None = None
    port: int | None = None


def shown(value: str) -> str:
    """A value quoted for a one-line message, cut when long (a 5 MB host name is not echoed)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:76]}...' ({len(value)} characters)"


class HostSyntaxError(ValueError):
    """A bad host entry; the caller adds where it came from."""


def check_host_name(name: str) -> str:
    """Refuse names that could be read as options or shell syntax."""
    if not _HOST_RE.match(name):
        raise HostSyntaxError(f"invalid host name {shown(name)}")
    return name


def check_user_name(user: str) -> str:
    if not re.match(_USER_RE, user):
        raise HostSyntaxError(f"invalid user name {shown(user)}")
    return user


def _count(key: str, value: str) -> int:
    if not value.isdigit() or not value.isascii():
        raise HostSyntaxError(f"{key} must be a whole number, not {shown(value)}")
    if len(value) > 12:  # int() refuses more than 4300 digits; anything this long is too large anyway
        raise HostSyntaxError(f"{key}={value[:12]}... is too large")
    number = int(value)
    if number < 1 and key not in _MAX_KEYS:
        raise HostSyntaxError(f"{key} must be at least 1")
    if number > 1_000_000:
        raise HostSyntaxError(f"{key}={shown(value)} is too large")
    return number


def _split_word(word: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:N]` as its user, its host's name and N, each checked (None: not given)."""
    before, at, rest = word.rpartition("@")
    user = check_user_name(before) if at else None
    name, slots = _split_count(rest)
    return user, check_host_name(name), slots


def _split_count(word: str) -> tuple[str, int | None]:
    """MPICH's host:N (an IPv6 address must be bracketed to carry a count)."""
    if word.startswith("["):
        end = word.find("]")
        if end < 0:
            raise HostSyntaxError(f"unclosed '[' in {shown(word)}")
        rest = word[end + 1 :]
        if not rest:
            return word, None
        if not rest.startswith(":"):
            raise HostSyntaxError(f"unexpected {shown(rest)} after {shown(word[: end + 1])}")
        return word[: end + 1], _count("slots", rest[1:])
    if word.count(":") == 1:
        name, _, count = word.partition(":")
        return name, _count("slots", count)
    return word, None


def parse_hostfile_line(line: str) -> Host | None:
    """One hostfile line: `[user@]host[:N] [slots=N] [max_slots=M] [port=P] [user=U]`."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    text = "=".join(part.strip() for part in text.split("="))  # `slots = 2`, as Open MPI reads it
    first, *fields = text.split()
    user, name, slots = _split_word(first)
    max_slots = port = None
    for item in fields:
        key, eq, value = item.partition("=")
        key = key.lower()
        if not eq or not value:
            raise HostSyntaxError(f"expected key=value, got {shown(item)}")
        if key in _SLOTS_KEYS:
            slots = _count(key, value)
        elif key in _MAX_KEYS:
            max_slots = _count(key, value)
        elif key == "port":
            port = _count(key, value)
            if port > 65535:
                raise HostSyntaxError(f"port={value} is out of range")
        elif key in _USER_KEYS:
            user = check_user_name(value)
        else:
            raise HostSyntaxError(f"unknown key {shown(key)}")
    if max_slots is not None and slots is not None and max_slots < slots:
        raise HostSyntaxError(f"max_slots={max_slots} is less than slots={slots}")
    if slots is None and max_slots:  # Open MPI: max_slots alone sets the slots too
        slots = max_slots
    return Host(name, slots, max_slots, user, port)


def merge_hosts(entries: list[Host]) -> list[Host]:
    """A repeated host adds its slots; order of first mention is kept.

    As in Open MPI, a line without slots counts one slot once the host is repeated
    (a single such line means "as many slots as cores").
    """
    merged: dict[tuple[str, str | None, int | None], Host] = {}
    for host in entries:
        key = (host.name, host.user, host.port)
        old = merged.get(key)
        if old is None:
            merged[key] = host
            continue
        slots = (old.slots or 1) + (host.slots or 1)
        max_slots = None if old.max_slots is None or host.max_slots is None else old.max_slots + host.max_slots
        merged[key] = old._replace(slots=slots, max_slots=max_slots)
    return list(merged.values())


def parse_hostfile(text: str, path: str) -> list[Host]:
    """Parse a whole hostfile; an error names the file and the line."""
    return merge_hosts(hostfile_entries(text, path))


def hostfile_entries(text: str, path: str) -> list[Host]:
    """A hostfile's lines as hosts, in order, a repeated host not merged (hydra's list)."""
    entries = []
    for lineno, line in enumerate(text.splitlines(), 1):
        try:
            host = parse_hostfile_line(line)
        except HostSyntaxError as exc:
            raise LaunchError(f"{path}:{lineno}: {exc}") from None
        if host is not None:
            entries.append(host)
    if not entries:
        raise LaunchError(f"{path}: no hosts in the hostfile")
    return entries


def read_hostfile(path: str, merge: bool = True) -> list[Host]:
    """A hostfile's hosts, a repeated one merged (or, merge=False, hydra's list of its lines)."""
    from mpilaunch.plan.textfiles import read_text  # only a job with a hostfile reads one

    text = read_text(path, "hostfile", HOSTFILE_MAX)
    return parse_hostfile(text, path) if merge else hostfile_entries(text, path)


def parse_host_list(value: str, label: str | None = None) -> list[Host]:
    """-H a:2,b,user@c:4 ; a missing :N means one slot, as in Open MPI. Errors start with
    label (default `-H 'value'`), so a variable in the same grammar can name itself."""
    label = f"-H {shown(value)}" if label is None else label
    entries = []
    for word in value.split(","):
        word = word.strip()
        if not word:
            raise LaunchError(f"{label}: empty host name")
        try:
            user, name, slots = _split_word(word)
        except HostSyntaxError as exc:
            raise LaunchError(f"{label}: {exc}") from None
        entries.append(Host(name, 1 if slots is None else slots, None, user))
    return entries


def is_local(name: str) -> bool:
    """Hosts reached without SSH: localhost and this machine's own names."""
    if name in LOCAL_NAMES:
        return True
    own = os.uname().nodename  # what socket.gethostname() returns, without importing socket
    return name in (own, own.split(".")[0])


def needs_ssh(host: Host) -> bool:
    """Reached over SSH: any host that is not this machine, and this machine too when the user
    gave SSH details for it (`user@localhost`, `localhost port=2222`)."""
    return host.user is not None or host.port is not None or not is_local(host.name)


def merge_local_aliases(hosts: list[Host]) -> list[Host]:
    """localhost, 127.0.0.1 and this machine's name are one node: one set of local ranks and devices."""
    first_local = next((h.name for h in hosts if not needs_ssh(h)), None)
    if first_local is None:
        return hosts
    return merge_hosts([h if needs_ssh(h) else h._replace(name=first_local) for h in hosts])


def merge_consecutive(entries: list[Host]) -> list[Host]:
    """hydra's host list: an entry naming the host of the one before it adds its count to that
    one (`a,a,b` is `a:2,b`, as $PBS_NODEFILE lists a host once per slot); `a,b,a` stays three."""
    out: list[Host] = []
    for host in entries:
        last = out[-1] if out else None
        if last is not None and (last.name, last.user, last.port) == (host.name, host.user, host.port):
            out[-1] = last._replace(slots=(last.slots or 1) + (host.slots or 1))
        else:
            out.append(host)
    return out


def entry_hosts(entries: list[Host]) -> tuple[list[Host], list[int]]:
    """hydra's host list, in which a host may come back (`a,b,a`): the job's hosts (merged, this
    machine's names as one) and the index among them of each entry."""
    hosts = merge_local_aliases(merge_hosts(entries))
    local = next((h.name for h in hosts if not needs_ssh(h)), None)

    def key(h: Host) -> tuple[str, str | None, int | None]:
        return (local if local and not needs_ssh(h) else h.name, h.user, h.port)

    index = {key(h): i for i, h in enumerate(hosts)}
    return hosts, [index[key(e)] for e in entries]


def with_core_counts(hosts: list[Host], cores_of: dict[str, int]) -> list[Host]:
    """Fill hosts without a slot count with their core count (Open MPI's rule)."""
    return [h if h.slots is not None else h._replace(slots=cores_of.get(h.name, 1)) for h in hosts]
