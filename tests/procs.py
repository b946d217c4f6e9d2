"""What /proc says of a process, for the tests and their beds (the sshd bed, the Slurm bed): no
pytest here, so the benchmarks can use the beds without it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable


def stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, session, ...);
    [] when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def parent_pid(pid: int) -> int:
    """A process's parent, 0 when it is gone."""
    fields = stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def process_name(pid: int) -> str:
    """The kernel's comm of a process (slurmstepd shows as `slurmstepd`), '' when gone."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != b"Z"


def signal_quietly(pid: int, sig: int) -> None:
    """Send sig to pid; a process already gone (or not ours) is no error."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_and_wait(pids: Iterable[int], timeout: float = 5.0) -> None:
    """SIGKILL these pids and wait (bounded) until they are gone or zombies."""
    pids = list(pids)
    for pid in pids:
        signal_quietly(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def tagged_processes(needle: bytes) -> tuple[set[int], dict[int, int]]:
    """(the live processes whose environment holds needle, e.g. b"TAG=value", the parent of
    every live process); zombies and this process are left out."""
    tagged: set[int] = set()
    parents: dict[int, int] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        fields = stat_fields(pid)
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        parents[pid] = int(fields[1])
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    tagged.add(pid)
        except OSError:
            continue
    return tagged, parents


def below(roots: set[int], parents: dict[int, int], limit: int = 256) -> set[int]:
    """The processes of `parents` that have an ancestor in roots (at most limit levels up)."""
    found = set()
    for pid in parents:
        parent, seen = parents.get(pid, 0), 0
        while parent > 1 and seen < limit:
            if parent in roots:
                found.add(pid)
                break
            parent, seen = parents.get(parent, 0), seen + 1
    return found


class Leftovers:
    """What a bed's leftover_pids gives the tests: wait for none, or kill them by pid."""

    POLL = 0.05  # seconds between looks

    def leftover_pids(self) -> list[int]:
        raise NotImplementedError

    def wait_clean(self, timeout: float = 5.0) -> list[int]:
        """Poll until no leftover process remains; return those still there at the deadline."""
        deadline = time.monotonic() + timeout
        left = self.leftover_pids()
        while left and time.monotonic() < deadline:
            time.sleep(self.POLL)
            left = self.leftover_pids()
        return left

    def kill_leftovers(self) -> list[int]:
        """SIGKILL every leftover process by its pid; return the pids that were killed."""
        left = self.leftover_pids()
        kill_and_wait(left)
        return left


def peak_rss_kib(pid: int) -> int:
    """A process's peak resident set since its start (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on this port (/proc/net/tcp and tcp6,
    whose addresses are 32-bit words each in the host's order)."""
    import socket

    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except OSError:  # no IPv6 here
            continue
        for line in lines:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, ordered))
    return found


def left_in_dev_shm(before: set[str], prefixes: tuple[str, ...], within: float | None = None) -> list[str]:
    """What a test left in /dev/shm: entries named with one of prefixes made since `before` (a
    listing), neither another user's (test_bad_environment.py's) nor a live agent's (its folder
    names its pid). Run one test at a time, that is all, at once (a job's agents remove their
    own before the launcher ends), unless `within` gives what is removed later time to go.
    Run beside other tests (pytest -n), an entry is left only if it stays `within` seconds (5
    unless given: another job may be removing its own) and no live process maps or holds it
    (Open MPI's segments carry no pid)."""
    beside = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    deadline = time.monotonic() + (within if within is not None else 5.0 if beside else 0.0)
    while True:
        made = set(os.listdir("/dev/shm")) - before
        left = sorted(name for name in made if name.startswith(prefixes) and _left(name, beside))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _left(name: str, beside: bool) -> bool:
    try:
        if os.stat(f"/dev/shm/{name}").st_uid != os.getuid():
            return False
    except FileNotFoundError:  # removed meanwhile
        return False
    from mpilaunch.host.shm import AGENTS_FOLDERS  # mpilaunch-pmix-PID-...

    if name.startswith(AGENTS_FOLDERS):
        pid = name[len(AGENTS_FOLDERS) :].split("-", 1)[0]
        return not (pid.isdigit() and os.path.exists(f"/proc/{pid}"))
    return not (beside and held(f"/dev/shm/{name}"))


def held(path: str) -> bool:
    """Whether a live process maps this file or has it open."""
    for proc in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{proc}/maps") as maps:
                if path in maps.read():
                    return True
            if any(os.readlink(f"/proc/{proc}/fd/{fd}") == path for fd in os.listdir(f"/proc/{proc}/fd")):
                return True
        except OSError:  # gone meanwhile, or a descriptor closed while read
            continue
    return False
