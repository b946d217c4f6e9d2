"""How a rank that a signal ended died: whether the kernel's out-of-memory killer took it, with
the memory limit it hit, and where the core file it left is.

A SIGKILL the agent did not send is looked into (one it sent, or a signal it forwarded, is not):
- the kernel log (/dev/kmsg, where this user may read it) names the killed pid, its memory
  cgroup and whether a cgroup's limit or the host's memory ran out;
- the rank's memory cgroup counts its kills (v2 `memory.events` `oom_kill`, v1
  `memory.oom_control` `oom_kill`, or v1 `memory.failcnt` on kernels before 4.13): the count
  when the rank was first seen there is compared with the count after its death.
Which cgroup: a rank may move itself into one after it started (cgexec, systemd-run), so each
live rank's /proc/PID/cgroup is read at its spawn and every LOOK_EVERY seconds (a move is
noticed, with the count then). A dead rank's own entry helps on cgroup v2 only: a zombie still
shows its v2 cgroup there, but "/" for every v1 hierarchy (measured on Linux 6.18), so the
reaper reads the zombie's before reaping it (host_os.HostOS.reap) and the path is used when it
is not "/". The kernel log's `task_memcg` names it too.

A core file: the wait status says whether the kernel dumped one, and core_pattern where: a
file pattern (`core`, `/var/crash/core.%e.%p`), relative to the rank's working directory or
absolute, is matched on disk; a pipe (`|/lib/systemd/systemd-coredump ...`, apport) gets the
core and no path is known here.

The parsing is pure functions; DeathWatch reads the system through the agent's OS seam, so the
tests give it files and a kernel log of their own. Stdlib only: shipped with the agent.
"""

from __future__ import annotations

import _signal as signal
import os

from mpilaunch.agent.loop import Timer
from mpilaunch.protocol.messages import Death
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from mpilaunch.agent.host_os import HostOS

LOOK_EVERY = 1.0  # seconds between looks at which memory cgroup each live rank is in
SLACK = 2.0  # seconds: a kernel log line or a core file this much older than the rank's start is not its
UNLIMITED = 1 << 60  # a v1 limit this high is "no limit" (v1 shows PAGE_COUNTER_MAX pages in bytes)


# -- pure: the files, the kernel log, core_pattern ----------------------------------------------
class Mount(Record):
    """A cgroup hierarchy's mount: the cgroup path at its root and where it is mounted."""

    version: int  # 1 (the v1 memory controller's hierarchy) or 2
    root: str
    point: str


class Counts(Record):
    """A memory cgroup's kill counts at one moment (None: this kernel does not keep that one)."""

    oom_kills: int | None
    failures: int | None  # v1 memory.failcnt, v2 memory.events `max`: the limit was hit


class KernelKill(Record):
    """A process the out-of-memory killer killed, as the kernel log says."""

    pid: int
    when: float  # seconds since boot (the monotonic clock)
    memcg: bool  # a cgroup's limit ran out (not the host's memory)
    task_memcg: str = ""  # the victim's memory cgroup, where the kernel says (4.19+)


def memory_cgroup(proc_cgroup: str) -> tuple[int, str] | None:
    """From /proc/PID/cgroup: (1, path) in the v1 memory controller's hierarchy, else (2, path)
    in the v2 hierarchy; None if neither is there."""
    unified = None
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path:
            continue
        if "memory" in controllers.split(","):
            return 1, path
        if number == "0" and not controllers:
            unified = (2, path)
    return unified


def cgroup_mounts(mountinfo: str) -> dict[int, Mount]:
    """From /proc/self/mountinfo: the v1 memory hierarchy's mount (key 1) and cgroup2's (key 2)."""
    found: dict[int, Mount] = {}
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, described = before.split(), after.split()
        if len(fields) < 5 or len(described) < 3:
            continue
        kind, options = described[0], described[2].split(",")
        version = 2 if kind == "cgroup2" else 1 if kind == "cgroup" and "memory" in options else 0
        if version and version not in found:
            found[version] = Mount(version, _unescape(fields[3]), _unescape(fields[4]))
    return found


def _unescape(field: str) -> str:
    r"""mountinfo writes a space as \040, a tab as \011, a backslash as \134."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup_dir(mount: Mount, path: str) -> str | None:
    """Where a cgroup path of that hierarchy is on disk; None if the mount does not show it."""
    root = mount.root.rstrip("/")
    if path != mount.root and not path.startswith(root + "/"):
        return None
    relative = path[len(root) :].strip("/")
    return os.path.join(mount.point, relative) if relative else mount.point


def keyed(text: str | None) -> dict[str, int]:
    """`oom_kill 3` lines (memory.events, memory.oom_control) as a dict."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.strip().partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


def counts(version: int, events: str | None, failcnt: str | None) -> Counts | None:
    """v2: memory.events; v1: memory.oom_control and memory.failcnt. None if none was readable."""
    found = keyed(events)
    failures = found.get("max") if version == 2 else int(failcnt) if failcnt and failcnt.strip().isdigit() else None
    if not found and failures is None:
        return None
    return Counts(found.get("oom_kill"), failures)


def limit_of(text: str | None) -> int | None:
    """memory.max (`max`) or memory.limit_in_bytes: the limit in bytes, None for none."""
    value = (text or "").strip()
    if not value.isdigit():
        return None
    return int(value) if int(value) < UNLIMITED else None


def host_memory(meminfo: str | None) -> int | None:
    """MemTotal of /proc/meminfo, in bytes."""
    for line in (meminfo or "").splitlines():
        if line.startswith("MemTotal:"):
            words = line.split()
            return int(words[1]) * 1024 if len(words) > 1 and words[1].isdigit() else None
    return None


def kernel_kills(records: Iterable[str]) -> list[KernelKill]:
    """The out-of-memory kills in /dev/kmsg records (`6,1234,9049228000,-;text`), oldest first.
    The victim is named as `Killed process PID (comm)` (older kernels also `Kill process PID`), and
    since 4.19 `oom-kill:constraint=CONSTRAINT_MEMCG,...,task_memcg=/path,task=comm,pid=PID,uid=0`
    just before."""
    kills: list[KernelKill] = []
    pending: dict[int, tuple[bool, str]] = {}  # pid -> what its oom-kill: line said
    for record in records:
        head, _, text = record.partition(";")
        text = text.split("\n", 1)[0]
        parts = head.split(",")
        try:
            when = int(parts[2]) / 1e6
        except (IndexError, ValueError):
            continue
        if text.startswith("oom-kill:"):
            fields = dict(f.partition("=")[::2] for f in text[len("oom-kill:") :].split(","))
            if fields.get("pid", "").isdigit():
                memcg = fields.get("constraint") == "CONSTRAINT_MEMCG"
                pending[int(fields["pid"])] = (memcg, fields.get("task_memcg", ""))
            continue
        for marker in ("Killed process ", "Kill process "):
            mark = text.find(marker)
            if mark >= 0:
                break
        else:
            continue
        word = text[mark + len(marker) :].split(" ", 1)[0]
        if not word.isdigit():
            continue
        pid = int(word)
        memcg, task_memcg = pending.pop(pid, (False, ""))
        memcg = memcg or text.startswith("Memory cgroup")
        if kills and kills[-1].pid == pid and when - kills[-1].when < 1:  # 4.x: "Kill process", "Killed process"
            last = kills[-1]
            kills[-1] = last._replace(memcg=last.memcg or memcg, task_memcg=last.task_memcg or task_memcg)
            continue
        kills.append(KernelKill(pid, when, memcg, task_memcg))
    return kills


def oom_judged(named: bool, before: Counts | None, after: Counts | None) -> bool:
    """Did the out-of-memory killer end a rank that died of a SIGKILL nobody here sent?
    Yes if the kernel log names its pid; else if its cgroup's kill count rose since the rank was
    first seen there (since 0 if it moved in unseen); on kernels without that count (before
    4.13), if the v1 limit was hit since, which needs the count before."""
    if named:
        return True
    if after is None:
        return False
    if after.oom_kills is not None:
        start = before.oom_kills if before is not None and before.oom_kills is not None else 0
        return after.oom_kills > start
    if after.failures is not None and before is not None and before.failures is not None:
        return after.failures > before.failures
    return False


SPECIFIERS_KNOWN = frozenset("pPsugh%")


def core_place(pattern: str, uses_pid: bool, *, pid: int, sig: int, uid: int, gid: int, host: str) -> tuple[str, str]:
    """Where core_pattern puts a core: ("pipe", the program it is handed to), or ("file", a glob
    pattern, relative to the process's working directory unless absolute) with what cannot
    be known here (the time, the thread, the program's name) as `*`."""
    import glob

    pattern = pattern.strip() or "core"
    if pattern.startswith("|"):
        words = pattern[1:].split()
        return "pipe", words[0] if words else ""
    values = {"p": str(pid), "P": str(pid), "s": str(sig), "u": str(uid), "g": str(gid), "h": host, "%": "%"}
    out: list[str] = []
    has_pid = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "%" and i + 1 < len(pattern):
            code = pattern[i + 1]
            has_pid = has_pid or code == "p"
            out.append(glob.escape(values[code]) if code in SPECIFIERS_KNOWN else "*")
            i += 2
            continue
        out.append(glob.escape(char) if char != "%" else "")  # a lone % at the end is dropped, as the kernel does
        i += 1
    found = "".join(out)
    if uses_pid and not has_pid:
        found += f".{pid}"
    return "file", found


# -- the watch --------------------------------------------------------------------------------
class Seen:
    """What the watch knows of one live rank."""

    __slots__ = ("counts", "cwd", "dir", "started", "wall")

    def __init__(self, cwd: str, started: float, wall: float) -> None:
        self.dir: str | None = None  # its memory cgroup's directory
        self.counts: Counts | None = None  # that cgroup's counts when the rank was first seen in it
        self.cwd = cwd  # where a relative core_pattern puts its core
        self.started = started  # the monotonic clock (the kernel log's), at its spawn
        self.wall = wall  # the wall clock (files' times), at its spawn


class DeathWatch(Timer):
    """Follows each live rank's memory cgroup, and says how one that a signal ended died."""

    def __init__(self, host_os: HostOS) -> None:
        self.os = host_os
        self.seen: dict[int, Seen] = {}  # pid -> what is known of it
        self.mounts: dict[int, Mount] | None = None  # read at the first spawn
        self.recent: dict[str, tuple[float, Counts | None]] = {}  # cgroup dir -> (when read, counts)
        self.next_look: float | None = None
        self.born_in: str | None = None  # the memory cgroup the first rank was found in at its spawn

    def spawned(self, pid: int, wdir: str) -> None:
        """A rank starts in this agent's cgroup (or the job's, put there at its gate): one read
        serves every rank; the look (tick) finds one moved since."""
        now = self.os.clock()
        seen = self.seen[pid] = Seen(wdir or self.os.cwd_of(None) or "/", now, self.os.wall())
        if self.born_in is None:
            self.born_in = self.where(pid)
        seen.dir = self.born_in
        if seen.dir is not None:
            seen.counts = self.counts_at(seen.dir, now)
        if self.next_look is None:
            self.next_look = now + LOOK_EVERY

    def where(self, pid: int, text: str | None = None) -> str | None:
        """The directory of pid's memory cgroup (from text, a /proc/PID/cgroup, if given)."""
        if text is None:
            text = self.os.read_text(f"/proc/{pid}/cgroup")
        found = memory_cgroup(text or "")
        if found is None:
            return None
        mount = self.mount(found[0])
        return cgroup_dir(mount, found[1]) if mount is not None else None

    def mount(self, version: int) -> Mount | None:
        if self.mounts is None:
            self.mounts = cgroup_mounts(self.os.read_text("/proc/self/mountinfo") or "")
        return self.mounts.get(version)

    def counts_at(self, where: str, now: float | None = None) -> Counts | None:
        """A cgroup's counts; at a spawn, those read less than LOOK_EVERY ago serve (a launch's
        ranks share their cgroup)."""
        if now is not None and where in self.recent and now - self.recent[where][0] < LOOK_EVERY:
            return self.recent[where][1]
        if self.version_of(where) == 1:
            found = counts(1, self.read(where, "memory.oom_control"), self.read(where, "memory.failcnt"))
        else:
            found = counts(2, self.read(where, "memory.events"), None)
        if now is not None:
            self.recent[where] = (now, found)
        return found

    def version_of(self, where: str) -> int:
        """1 if the directory is in the v1 memory hierarchy, else 2."""
        v1 = self.mount(1)
        return 1 if v1 is not None and (where == v1.point or where.startswith(v1.point.rstrip("/") + "/")) else 2

    def read(self, where: str, name: str) -> str | None:
        return self.os.read_text(os.path.join(where, name))

    # -- the look at the live ranks ------------------------------------------------------------
    def next_deadline(self) -> float | None:
        return self.next_look if self.seen else None

    def tick(self, now: float) -> None:
        if not self.seen or self.next_look is None or now < self.next_look:
            return
        self.next_look = now + LOOK_EVERY
        for pid, seen in self.seen.items():
            where = self.where(pid)
            if where is not None and where != seen.dir:  # it moved (or was moved) since
                seen.dir, seen.counts = where, self.counts_at(where)
            seen.cwd = self.os.cwd_of(pid) or seen.cwd

    # -- a death -------------------------------------------------------------------------------------
    def ended(self, pid: int, status: int, sent_kill: bool, rss: int | None) -> Death | None:
        """pid was reaped with this wait status: how it died, if a signal ended it and
        something is known (None otherwise). sent_kill: the agent sent it a SIGKILL itself."""
        seen = self.seen.pop(pid, None)
        zombie = self.os.zombie_cgroup(pid)
        if seen is None or not os.WIFSIGNALED(status):
            return None
        sig = os.WTERMSIG(status)
        oom, limit, host = False, None, None
        if sig == signal.SIGKILL and not sent_kill:
            oom, limit = self.oom(pid, seen, zombie)
            host = host_memory(self.os.read_text("/proc/meminfo")) if oom else None
        core, handler, pattern = self.core(pid, sig, seen) if os.WCOREDUMP(status) else (None, "", "")
        if not (oom or core or handler or pattern):
            return None
        return Death(oom, limit, host, rss, core, handler, pattern)

    def oom(self, pid: int, seen: Seen, zombie: str | None) -> tuple[bool, int | None]:
        """Whether the out-of-memory killer killed pid, and the memory limit it hit."""
        records = self.os.kernel_log()
        named = [k for k in kernel_kills(records or ()) if k.pid == pid and k.when >= seen.started - SLACK]
        where, before = seen.dir, seen.counts
        found = memory_cgroup(zombie or "")
        if found is not None and found[1] != "/":  # cgroup v2 keeps a zombie's cgroup (v1 shows "/")
            moved = self.where(pid, zombie)
            if moved is not None and moved != where:
                where, before = moved, None
        if named and named[-1].task_memcg:
            mount = self.mount(1) or self.mount(2)
            logged = cgroup_dir(mount, named[-1].task_memcg) if mount is not None else None
            if logged is not None and logged != where:
                where, before = logged, None
        after = self.counts_at(where) if where is not None else None
        if not oom_judged(bool(named), before, after):
            return False, None
        if named and not named[-1].memcg:  # the host's memory ran out, not a cgroup's
            return True, None
        return True, self.limit(where) if where is not None else None

    def limit(self, where: str) -> int | None:
        """The smallest memory limit of the cgroup and those above it (each bounds it)."""
        mount = self.mount(self.version_of(where))
        top = mount.point if mount is not None else where
        name = "memory.limit_in_bytes" if self.version_of(where) == 1 else "memory.max"
        limits = []
        while True:
            value = limit_of(self.read(where, name))
            if value is not None:
                limits.append(value)
            if where == top or len(where) <= len(top) or where == os.path.dirname(where):
                break
            where = os.path.dirname(where)
        return min(limits) if limits else None

    def core(self, pid: int, sig: int, seen: Seen) -> tuple[str | None, str, str]:
        """(path of the core file, "", "") where it was found; (None, the program a pipe hands it
        to, "") for a pipe; (None, "", core_pattern) if it was dumped but not found."""
        pattern = (self.os.read_text("/proc/sys/kernel/core_pattern") or "core").strip()
        uses_pid = (self.os.read_text("/proc/sys/kernel/core_uses_pid") or "0").strip() == "1"
        uid, gid, host = self.os.identity()
        kind, place = core_place(pattern, uses_pid, pid=pid, sig=sig, uid=uid, gid=gid, host=host)
        if kind == "pipe":
            return None, os.path.basename(place) or place, ""  # systemd-coredump, apport, ...
        full = place if place.startswith("/") else os.path.join(seen.cwd, place)
        found = [(mtime, path) for path, mtime in self.os.matches(full) if mtime >= seen.wall - SLACK]
        if found:
            return max(found)[1], "", ""
        return None, "", pattern
