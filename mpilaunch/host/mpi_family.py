"""Which MPI library a program uses: its ELF DT_NEEDED entries before launch, and, for a rank
that turns out to load Open MPI at run time (a Python rank: mpi4py built against Open MPI), a
watch kept by the agent (stdlib only: it runs on every host).

Open MPI ranks find their job through PMIx, which mpilaunch does not serve; started here they
would each run alone as a singleton of size 1, which must never happen silently.
"""

from __future__ import annotations

import os
import select
import struct
from collections.abc import Callable

OPEN_MPI_LIBRARIES = ("libmpi.so.40", "libopen-rte.so", "libopen-pal.so", "libmpi_mpifh.so.40", "libmpi_cxx.so.40")
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB = 0, 1, 5
MAX_HEADERS = 4096


def needed_libraries(path: str) -> list[str]:
    """The shared libraries an ELF file asks for; [] for anything that is not a readable ELF."""
    try:
        with open(path, "rb") as handle:
            return _needed(handle)
    except (OSError, struct.error, ValueError):
        return []


def _needed(handle) -> list[str]:  # type: ignore[no-untyped-def]
    ident = handle.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return []
    wide = ident[4] == 2
    order = "<" if ident[5] == 1 else ">"
    if wide:
        (phoff,) = struct.unpack_from(order + "Q", ident, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", ident, 0x36)
        phdr, dyn = struct.Struct(order + "IIQQQQQQ"), struct.Struct(order + "qQ")
    else:
        (phoff,) = struct.unpack_from(order + "I", ident, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", ident, 0x2A)
        phdr, dyn = struct.Struct(order + "IIIIIIII"), struct.Struct(order + "iI")
    if phnum > MAX_HEADERS or phentsize < phdr.size:
        return []
    loads, dynamic = [], None
    for index in range(phnum):
        handle.seek(phoff + index * phentsize)
        fields = phdr.unpack(handle.read(phdr.size))
        if wide:
            p_type, _, offset, vaddr, _, filesz, _, _ = fields
        else:
            p_type, offset, vaddr, _, filesz, _, _, _ = fields
        if p_type == PT_LOAD:
            loads.append((vaddr, filesz, offset))
        elif p_type == PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return []
    handle.seek(dynamic[0])
    raw = handle.read(min(dynamic[1], MAX_HEADERS * dyn.size))
    needed, strtab = [], None
    for position in range(0, len(raw) - dyn.size + 1, dyn.size):
        tag, value = dyn.unpack_from(raw, position)
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            needed.append(value)
        elif tag == DT_STRTAB:
            strtab = value
    base = next((off + strtab - va for va, size, off in loads if strtab is not None and va <= strtab < va + size), None)
    if base is None:
        return []
    names = []
    for offset in needed:
        handle.seek(base + offset)
        names.append(handle.read(256).split(b"\0", 1)[0].decode("utf-8", "replace"))
    return names


def open_mpi_library(path: str) -> str | None:
    """The Open MPI library this program needs, or None."""
    return next((lib for lib in needed_libraries(path) if lib.startswith(OPEN_MPI_LIBRARIES)), None)


# -- Open MPI loaded at run time ------------------------------------------------------------
# Open MPI up to 4.x (ORTE; tested with 4.1): a rank that finds no PMIx server becomes a
# singleton, and a singleton given `ess_singleton_server=file:PATH` first reads its server's
# address from PATH. PATH is the write end of a pipe that the agent holds and never writes
# (reopened for reading through /proc), so such a rank blocks in MPI_Init before it computes
# anything, and one poll(2) of the pipe tells the agent that it has a reader. MPICH and programs
# without MPI ignore the variable. Open MPI 5 has no such parameter: ranks that have not spoken
# PMI are also looked at in /proc/PID/maps, less and less often, which catches those that live
# long enough (not at their exit: an exited process has no maps left to read).
TRAP_VARIABLE = "OMPI_MCA_ess_singleton_server"
OPEN_MPI_MAPPED = (b"/libmpi.so.40", b"/libopen-rte.so", b"/libopen-pal.so")
FIRST_LOOK = 0.1  # seconds after start; the gap doubles up to LOOK_CAP
LOOK_CAP = 2.0
LOOK_SLACK = 0.05  # ranks due this soon are looked at in the same wake-up (ranks start ~1 ms apart)
FIRST_MAPS_LOOK = 0.5  # a maps read costs 0.1-2 ms: first after 0.5 s, the gap doubling up to MAPS_CAP
MAPS_CAP = 60.0
ADVICE = (
    "which needs a PMIx server; mpilaunch does not serve PMIx (only PMI-1, for MPICH-family MPIs), so the rank "
    "would run alone as a singleton of size 1. Use Open MPI's mpirun, use an MPICH-family MPI, or pass --mpi none "
    "to run the ranks as singletons anyway"
)


def open_mpi_mapped(pid: int) -> str | None:
    """The file name of the Open MPI library mapped into a live process, or None (also once it is gone)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            maps = handle.read()
    except OSError:
        return None
    for needle in OPEN_MPI_MAPPED:
        at = maps.find(needle)
        if at >= 0:
            end = maps.find(b"\n", at)
            return maps[at + 1 : end if end >= 0 else len(maps)].decode("utf-8", "replace")
    return None


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found.extend(int(word) for word in handle.read().split())
        except (OSError, ValueError):
            pass
    return found


def _holder(pid: int, link: str) -> int | None:
    """pid, or the first of its descendants, that has a descriptor open on `link` (pipe:[inode])."""
    stack, seen = [pid], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            fds = os.listdir(f"/proc/{current}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{current}/fd/{fd}") == link:
                    return current
            except OSError:
                pass
        stack.extend(_children(current))
    return None


def open_mpi_reason(library: str | None, rank_pid: int, pid: int) -> str:
    """What the launcher prints after `rank N ` for a rank caught loading Open MPI."""
    what = f"Open MPI ({library})" if library else "Open MPI"
    who = "uses" if pid == rank_pid else f"started a process (pid {pid}) that uses"
    return f"{who} {what}, {ADVICE}"


class _Watched:
    """One rank under watch: when to look next (trap) and when to read its maps next."""

    __slots__ = ("gap", "look_at", "maps_at", "maps_gap", "pid")

    def __init__(self, pid: int, now: float) -> None:
        self.pid = pid
        self.gap, self.look_at = FIRST_LOOK, now + FIRST_LOOK
        self.maps_gap, self.maps_at = FIRST_MAPS_LOOK, now + FIRST_MAPS_LOOK


class OpenMpiWatch:
    """The agent's watch over its ranks that have not spoken PMI (yet). An MPICH rank speaks PMI
    in MPI_Init and is dropped at its first look, a rank that exits is dropped, so ordinary ranks
    cost a poll(2) or two; Open MPI ranks are reported once, by the first look that sees them."""

    def __init__(self) -> None:
        self.trap: int | None = None  # the pipe's write end; its read end is closed
        self.poller: select.poll | None = None
        self.link = ""
        self.watched: dict[int, _Watched] = {}  # by process id
        self.soonest: float | None = None  # the earliest look_at, so that most loop turns cost one compare
        self.reported = False

    def rank_env(self) -> dict[str, str]:
        """The variable that stops an Open MPI 4 singleton in MPI_Init (the pipe is made on first use)."""
        if self.trap is None:
            read_end, self.trap = os.pipe()  # not inheritable: no rank holds a writer
            os.close(read_end)
            self.poller = select.poll()
            self.poller.register(self.trap, select.POLLOUT)
            self.link = f"pipe:[{os.fstat(self.trap).st_ino}]"
        return {TRAP_VARIABLE: f"file:/proc/{os.getpid()}/fd/{self.trap}"}

    def watch(self, ident: int, pid: int, now: float) -> None:
        if not self.reported:
            self.watched[ident] = _Watched(pid, now)
            self.soonest = min(self.soonest or now + FIRST_LOOK, now + FIRST_LOOK)

    def next_deadline(self) -> float | None:
        return self.soonest

    def trap_has_reader(self) -> bool:
        """Whether some process holds the pipe open for reading: an Open MPI singleton waiting in MPI_Init."""
        if self.poller is None:
            return False
        return any(not events & select.POLLERR for _, events in self.poller.poll(0))

    def look(self, now: float, silent: Callable[[int], bool]) -> tuple[int, str] | None:
        """Look at the ranks that are due; silent(ident) says a rank is alive and has not spoken PMI.
        Returns (process id, reason) for the first rank found using Open MPI."""
        if self.soonest is None or self.soonest > now:
            return None
        soon = now + LOOK_SLACK
        due = {ident for ident, entry in self.watched.items() if entry.look_at <= soon and silent(ident)}
        self.watched = {ident: e for ident, e in self.watched.items() if ident in due or e.look_at > soon}
        trapped = self.trap_has_reader()
        for ident, entry in self.watched.items():
            if trapped:
                holder = _holder(entry.pid, self.link)
                if holder is not None:
                    return self._found(ident, entry.pid, holder)
            if ident not in due:
                continue
            if entry.maps_at <= soon:
                entry.maps_gap = min(entry.maps_gap * 2, MAPS_CAP)
                entry.maps_at = now + entry.maps_gap
                if open_mpi_mapped(entry.pid):
                    return self._found(ident, entry.pid, entry.pid)
            entry.gap = min(entry.gap * 2, LOOK_CAP)
            entry.look_at = now + entry.gap
        self.soonest = min((e.look_at for e in self.watched.values()), default=None)
        return None

    def _found(self, ident: int, rank_pid: int, pid: int) -> tuple[int, str]:
        self.reported = True  # the job ends: one report per agent is enough
        self.watched.clear()
        self.soonest = None
        return ident, open_mpi_reason(open_mpi_mapped(pid), rank_pid, pid)
