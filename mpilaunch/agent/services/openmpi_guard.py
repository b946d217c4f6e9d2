"""The Open MPI guard: a rank found loading Open MPI at run time (a Python rank whose mpi4py was
built against Open MPI) ends the job with a message instead of running as a singleton of size 1.
(A program linked with Open MPI is refused before launch: host/mpi_family.py.)
"""

from __future__ import annotations

import os
import select
import time

from mpilaunch.agent.services.base import Service
from mpilaunch.host.procfs import children_of
from mpilaunch.protocol.messages import PmiError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.protocol.messages import RankSpec

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
LOOK_SLACK = 0.05  # ranks due this soon are looked at in the same wake-up (a host's ranks start together)
FIRST_MAPS_LOOK = 0.5  # maps reads are not free: first after 0.5 s, the gap doubling up to MAPS_CAP
MAPS_CAP = 60.0
ADVICE = (
    "which needs a PMIx server, and this job is served PMI-1 (for MPICH-family MPIs), so the rank would run alone "
    "as a singleton of size 1. Pass --mpi pmix to serve the job PMIx, or --mpi none to run the ranks as "
    "singletons anyway"
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
        stack.extend(children_of(current))
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


class OpenMpiGuard(Service):
    """The agent's watch over its ranks that have not spoken PMI (yet), as a service: every rank
    of a job served PMI gets the trap variable and is watched until it speaks PMI; one found
    using Open MPI is reported as a PMI failure. An MPICH rank speaks PMI in MPI_Init and is
    dropped at its first look, a rank that exits is dropped, so ordinary ranks cost a poll(2) or
    two; Open MPI ranks are reported once, by the first look that sees them."""

    name = "openmpi-guard"

    def __init__(self, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(host)
        self.trap: int | None = None  # the pipe's write end; its read end is closed
        self.poller: select.poll | None = None
        self.link = ""
        self.watched: dict[int, _Watched] = {}  # by process id
        self.soonest: float | None = None  # the earliest look_at, so that most loop turns cost one compare
        self.reported = False
        self.job_of: dict[int, int] = {}  # process id -> job
        self.served_pmix: set[int] = set()  # process ids that got PMIx: an Open MPI rank is no singleton there

    def prepare(self, job: int, spec: RankSpec, env: dict[str, str]) -> list[int]:
        if "PMIX_NAMESPACE" in env:  # served PMIx as well (by the "pmix" service, before this one)
            self.served_pmix.add(spec.proc)
            return []
        if self.trap is None:  # the pipe that stops an Open MPI 4 singleton in MPI_Init, made on first use
            read_end, self.trap = os.pipe()  # not inheritable: no rank holds a writer
            os.close(read_end)
            self.poller = select.poll()
            self.poller.register(self.trap, select.POLLOUT)
            self.link = f"pipe:[{os.fstat(self.trap).st_ino}]"
        env.setdefault(TRAP_VARIABLE, f"file:/proc/{os.getpid()}/fd/{self.trap}")  # a user's -mca or -x wins
        return []

    def spawned(self, job: int, spec: RankSpec, pid: int) -> None:
        if spec.proc in self.served_pmix or self.reported:
            return
        self.job_of[spec.proc] = job
        now = time.monotonic()
        self.watched[spec.proc] = _Watched(pid, now)
        self.soonest = min(self.soonest or now + FIRST_LOOK, now + FIRST_LOOK)

    def next_deadline(self) -> float | None:
        return self.soonest

    def tick(self, now: float) -> None:
        found = self.look(now)
        if found is not None:
            self.host.send(PmiError(proc=found[0], error=found[1]))

    def silent(self, ident: int) -> bool:
        """Alive, served PMI and never sent `init`: only such a rank can be an Open MPI singleton."""
        job = self.job_of.get(ident)
        return job is not None and self.host.rank_running(ident) and self.host.mpi_state(job, ident) == "new"

    def trap_has_reader(self) -> bool:
        """Whether some process holds the pipe open for reading: an Open MPI singleton waiting in MPI_Init."""
        if self.poller is None:
            return False
        return any(not events & select.POLLERR for _, events in self.poller.poll(0))

    def look(self, now: float) -> tuple[int, str] | None:
        """Look at the silent ranks that are due. Returns (process id, reason) for the first rank
        found using Open MPI."""
        if self.soonest is None or self.soonest > now:
            return None
        soon = now + LOOK_SLACK
        due = {ident for ident, entry in self.watched.items() if entry.look_at <= soon and self.silent(ident)}
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
