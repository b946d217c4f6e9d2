"""Everything the agent started ends with it: reaping, killing, and the guardian for kill -9.

The agent is a child subreaper, so orphans of its ranks (a daemon a rank left behind) become
its children; the Reaper reaps ranks, adopted orphans and a relay's ssh clients alike. It
kills by descendants, not only by groups: each rank's process group, and every process below
the agent (a daemon's worker in a session of its own included), SIGTERM first and SIGKILL
after a grace, then SIGKILL again every KILL_ROUND until nothing is left. Where the host lets
it, the ranks also run in a cgroup of the job (host/cgroup.py), which nothing started under
them can leave. The Guardian is a small shell that kills what it was told about (and the
cgroup) if the agent dies without doing so.
"""

from __future__ import annotations

import _signal as signal
import os

from mpilaunch.agent.loop import Timer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.host_os import HostOS
    from mpilaunch.agent.ranks import Ranks
    from mpilaunch.agent.relay import Relay
    from mpilaunch.host.cgroup import JobCgroup

ADOPTION_SCAN = 0.5  # seconds between looks at what is below the ranks (told to the guardian)
SWEEP_LIMIT = 2.0  # the last sweep kills re-parented descendants, round after round, this long at most
KILL_ROUND = 0.05  # seconds between SIGKILL rounds while anything of the job is left
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphans of our ranks are re-parented to us, not to init: we can still reach them.
    prctl is called through `_ctypes`, not `ctypes` (docs/performance.md, "Start-up tricks")."""
    args = (PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        import _ctypes

        _ctypes.call_function(_ctypes.dlsym(_ctypes.dlopen(None, 0), "prctl"), args)
        return
    except (ImportError, OSError, AttributeError):
        pass
    try:  # an interpreter whose _ctypes is not CPython's
        import ctypes

        ctypes.CDLL(None).prctl(*args)
    except (OSError, AttributeError):
        pass


# The guardian: a shell that waits on the agent's pipe (fd 3). A line there lets it go; the
# pipe's end without one means the agent died, and it kills, three rounds 20 ms apart, what the
# agent recorded (fd 4: lines "pid start-time", blank where a record was taken back; "-" for
# the agent's own children, whose pids stay theirs until it reaps them): the process and its
# group, unless its start time says the pid is someone else's now; and the
# job's cgroup; then it removes the agent's PMIx server folders. $1: the agent's pid, $2:
# where those folders are, $3: the cgroup ("": none).
GUARD_SCRIPT = r"""agent=$1 base=$2 cgroup=$3
trap '' TERM HUP INT
read -r _ <&3 && exit 0
read -r me </proc/self/stat
set -- ${me##*") "}
own=$3
for round in 1 2 3; do
    if [ -n "$cgroup" ]; then
        { echo 1 >"$cgroup/cgroup.kill"; } 2>/dev/null ||
            { while read -r pid; do kill -9 "$pid"; done <"$cgroup/cgroup.procs"; } 2>/dev/null
    fi
    while read -r pid start; do
        [ -n "$pid" ] || continue
        group=$pid
        if { read -r stat <"/proc/$pid/stat"; } 2>/dev/null; then
            set -- ${stat##*") "}
            [ "$start" = - ] || [ "${20}" = "$start" ] || continue
            group=$3
        fi
        for g in $pid $group; do [ "$g" = "$own" ] || kill -9 "-$g" 2>/dev/null; done
        kill -9 "$pid" 2>/dev/null
    done </proc/self/fd/4
    sleep 0.02
done
if [ -n "$cgroup" ]; then
    tries=0
    while [ -d "$cgroup" ] && ! rmdir "$cgroup" 2>/dev/null && [ $tries -lt 200 ]; do
        tries=$((tries + 1))
        sleep 0.005
    done
fi
for folder in "$base/mpilaunch-pmix-$agent-"*; do
    if [ -d "$folder" ]; then rm -rf "$folder"; fi
done
"""
RECORD = 32  # bytes of one record: "%10d %20s\n", or blank


class Guardian:
    """A watcher that kills the ranks' process groups if this agent dies without doing so
    (kill -9): ranks run in sessions of their own, so nothing else would reach them. It runs
    in a session of its own too: Grid Engine's `qdel` kills a task's process group (the agent's)
    with SIGKILL, and the guardian must outlive it to end what escaped. Without
    preexec_fn there is no PR_SET_PDEATHSIG for the ranks. It is a shell (GUARD_SCRIPT), not a
    forked Python that stays one: that keeps a copy of every page the agent writes after the
    fork, several MB, to read a pipe. What it is to kill is a table the agent keeps in a file
    of its own with no name (memfd), read only if the agent dies; each record is one write of
    its own, so a death at any point leaves whole records."""

    def __init__(self, host_os: HostOS, cgroup: JobCgroup | None = None) -> None:
        from mpilaunch.host.shm import server_base
        from mpilaunch.host.spawn import above

        self.os = host_os  # starts and waits for the shell: the seam tests replace
        self.table = above(_nameless_file(), 5)  # neither 3 nor 4, the numbers it gets in the guardian
        self.slots: dict[int, int] = {}  # pid -> its record's place in the table
        self.free: list[int] = []  # places of records taken back
        self.used = 0  # places ever used
        read_fd, self.fd = os.pipe()
        read_fd = above(read_fd, 5)
        self.base = server_base()
        args = ["sh", "-c", GUARD_SCRIPT, "mpilaunch-guardian", str(os.getpid()), self.base]
        args.append(cgroup.path if cgroup is not None else "")
        self.pid = host_os.start_guardian(args, read_fd, self.table)
        os.close(read_fd)

    def watch(self, pid: int, started: bytes | None = None) -> None:
        """A rank, a process below one, or an ssh client: kill it (and its group) if the agent
        dies. started: its start time, for a process that is not the agent's child (its pid may
        be someone else's by the time the agent looks again); a child's pid stays its own until
        the agent reaps it, and its record is taken back as it is reaped."""
        place = self.slots.get(pid)
        if place is None:
            place = self.free.pop() if self.free else self.used
            self.used = max(self.used, place + 1)
            self.slots[pid] = place
        self._write(place, b"%10d %20s\n" % (pid, started or b"-"))

    def forget(self, pid: int) -> None:
        """The process was reaped: its pid (and process group id) may be reused by anyone now."""
        place = self.slots.pop(pid, None)
        if place is not None:
            self._write(place, b" " * (RECORD - 1) + b"\n")
            self.free.append(place)

    def folders_left(self) -> bool:
        """Whether a folder of this agent's (its PMIx server's, torch's) is in base, or nobody can say."""
        from mpilaunch.host.shm import SERVER_FOLDER

        mine = SERVER_FOLDER.format(pid=os.getpid())
        try:
            return any(name.startswith(mine) for name in os.listdir(self.base))
        except OSError:
            return True

    def _write(self, place: int, record: bytes) -> None:
        try:
            os.pwrite(self.table, record, place * RECORD)
        except OSError:
            pass

    def release(self) -> None:
        """Every rank is gone: the guardian leaves without killing anything, and is reaped here,
        so that nothing of the agent's session outlives it (not even a zombie for init). If a
        folder of this agent's is still in /dev/shm (its removal failed: a `ulimit -n` with no
        descriptor left to list it, say), the pipe closes without the line: the guardian's own
        cleanup removes it."""
        try:
            if not self.folders_left():
                os.write(self.fd, b"\n")
            os.close(self.fd)
        except OSError:
            pass
        os.close(self.table)
        self.os.wait(self.pid)  # it exits as soon as it reads the line (or sees the pipe close)


def _nameless_file() -> int:
    """A file with no name, gone with its last descriptor (memfd; an O_TMPFILE one where the C
    library has no memfd_create)."""
    try:
        return os.memfd_create("mpilaunch-guardian", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        for folder in ("/dev/shm", os.environ.get("TMPDIR") or "/tmp"):
            try:
                return os.open(folder, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
            except (AttributeError, OSError):
                continue
        raise


class Reaper(Timer):
    """Reaps the agent's children and kills what is left of the job, in two steps or at once.

    A reaped rank's pid is never signalled again: it may belong to anyone by then. What is left
    of its process group is an orphan of ours (we are a subreaper), or a descendant of one, and
    is reached through the orphans' groups, whose pids cannot be reused while they are unreaped
    children of ours."""

    def __init__(self, ranks: Ranks, host_os: HostOS | None = None) -> None:
        self.ranks = ranks
        self.os = host_os if host_os is not None else ranks.os  # reap, signal, look: the seam tests replace
        self.guardian: Guardian | None = None  # started when the agent starts to run
        self.relay: Relay | None = None  # tree spawn: its ssh clients are children of ours too
        self.told: set[int] = set()  # processes below the ranks (not ranks) the guardian was told about
        self.cgroup: JobCgroup | None = None  # made when the agent starts to run, where the host lets it
        self.before_kill: Callable[[], None] | None = None  # a last look at the ranks (agent/shm_watch.py)
        self.kill_deadline: float | None = None  # when SIGTERM'd processes get SIGKILL
        self.next_adoption_scan = 0.0
        self.link_lost = False  # then a kill cuts the links of the hosts we relay to as well

    # -- reaping --------------------------------------------------------------------------
    def reap(self) -> None:
        while True:
            try:
                ended = self.os.reap()
            except ChildProcessError:
                return
            if ended is None:
                return
            pid, status, usage = ended
            if self.relay is not None and self.relay.reaped(pid, status):  # an ssh client of tree spawn
                self.forget(pid)
            elif self.ranks.is_live(pid):
                self.forget(pid)  # first: its pid is free for anyone from now on
                self.ranks.reaped(pid, status, usage)
            elif pid in self.told:  # an orphan adopted as subreaper
                self.told.discard(pid)
                self.forget(pid)

    def watch(self, pid: int) -> None:
        """A process of ours (a rank, an ssh client) to be killed with its group if the agent dies."""
        if self.guardian is not None:
            self.guardian.watch(pid)

    def watch_rank(self, pid: int) -> None:
        """A rank, held at its start gate: into the job's cgroup before it runs anything."""
        if self.cgroup is not None:
            self.cgroup.add(pid)
        self.watch(pid)

    def forget(self, pid: int) -> None:
        if self.guardian is not None:
            self.guardian.forget(pid)

    def adopted(self) -> list[int]:
        """Our children that are neither a live rank nor the guardian nor an ssh client of ours:
        orphans re-parented to us, zombies included until reaped."""
        relayed = self.relay.pids() if self.relay is not None else ()
        guardian = self.guardian.pid if self.guardian is not None else None
        return [
            pid for pid in self.os.children() if pid != guardian and pid not in relayed and not self.ranks.is_live(pid)
        ]

    def below_ranks(self) -> list[int]:
        """Every live process below this agent but the guardian and a relay's ssh clients (with
        what is below those): the ranks, their children, adopted orphans and everything under
        them, whichever sessions and groups they moved to; and what is in the job's cgroup."""
        skip = set(self.relay.pids()) if self.relay is not None else set()
        if self.guardian is not None:
            skip.add(self.guardian.pid)
        found: list[int] = []
        todo = [pid for pid in self.os.children() if pid not in skip]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(self.os.children(pid))
        if self.cgroup is not None:
            seen = set(found)
            found.extend(pid for pid in self.cgroup.pids() if pid not in seen)
        return found

    # -- killing --------------------------------------------------------------------------
    def signal_orphans(self, sig: int) -> None:
        """Signal every adopted orphan and its process group."""
        own = self.os.getpgrp()
        for pid in self.adopted():
            try:
                group = self.os.getpgid(pid)  # an unreaped child of ours: its pid is still its own
            except (ProcessLookupError, PermissionError):
                continue
            if group != own:
                self.os.killpg(group, sig)
            self.os.kill(pid, sig)

    def signal_below(self, sig: int) -> None:
        """Signal every process below the ranks one by one (those that left every group we know)."""
        for pid in self.below_ranks():
            self.os.kill(pid, sig)

    def terminate_all(self, grace: float) -> None:
        """SIGTERM every rank's group, every orphan and every process below them; SIGKILL what is
        left after grace seconds, and again every KILL_ROUND until nothing is."""
        if self.before_kill is not None and self.ranks.any_live():
            self.before_kill()
        self.ranks.signal_all(signal.SIGTERM)
        self.signal_orphans(signal.SIGTERM)
        self.signal_below(signal.SIGTERM)
        deadline = self.os.clock() + grace
        if self.kill_deadline is None or deadline < self.kill_deadline:
            self.kill_deadline = deadline

    def kill_all(self, relayed_too: bool) -> None:
        """SIGKILL every live rank's group and every adopted orphan with its group; with
        relayed_too, the ssh clients of the hosts we relay to (their links are to be cut)."""
        self.ranks.signal_all(signal.SIGKILL)
        self.signal_orphans(signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()
        self.signal_below(signal.SIGKILL)
        if relayed_too and self.relay is not None:
            self.relay.kill()

    def sweep(self) -> None:
        """The last kill, in rounds: an orphan's descendants that left its process group (a
        daemon's worker in a session of its own) are re-parented to us only when it dies, so kill
        and reap until no child but the guardian is left (SWEEP_LIMIT seconds at most)."""
        deadline = self.os.clock() + SWEEP_LIMIT
        if self.relay is not None:
            self.relay.close_all()
        while True:
            self.kill_all(relayed_too=True)
            self.reap()
            relaying = self.relay is not None and self.relay.running()
            if (not self.ranks.any_live() and not relaying and not self.below_ranks()) or self.os.clock() >= deadline:
                return
            self.os.sleep(0.005)

    def release(self) -> None:
        """The end: the guardian leaves, the cgroup (empty by now) goes."""
        if self.guardian is not None:
            self.guardian.release()
        if self.cgroup is not None:
            self.cgroup.remove(tries=40)

    # -- timer: the kill deadline and the look at what is below the ranks ---------------------
    def next_deadline(self) -> float | None:
        scan = self.next_adoption_scan if self.ranks.any() else None
        return min((t for t in (self.kill_deadline, scan) if t is not None), default=None)

    def tick(self, now: float) -> None:
        self.reap()
        if self.kill_deadline is not None and now >= self.kill_deadline:
            self.kill_all(relayed_too=self.link_lost)
            self.reap()
            # Killing a daemon re-parents its workers to us only then: kill again until none is left.
            left = self.ranks.any_live() or self.below_ranks()
            self.kill_deadline = now + KILL_ROUND if left else None
        self.tell_guardian(now)

    def tell_guardian(self, now: float) -> None:
        """Tell the guardian about every process below the ranks (orphans we adopted, and their
        descendants in sessions of their own), so a kill -9 of this agent takes them too; the
        job's cgroup, where there is one, holds them anyway."""
        if self.guardian is None or not self.ranks.any() or now < self.next_adoption_scan:
            return
        first = not self.next_adoption_scan
        self.next_adoption_scan = now + ADOPTION_SCAN
        if first:  # the ranks were just let through their gates: nothing can be below them yet
            return
        below = {pid for pid in self.below_ranks() if not self.ranks.is_live(pid)}  # ranks: told at spawn
        for pid in below - self.told:
            self.guardian.watch(pid, self.os.start_time(pid) or b"-")
        for pid in self.told - below:
            self.guardian.forget(pid)
        self.told = below
