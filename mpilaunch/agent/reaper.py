"""Everything the agent started ends with it: reaping, killing, and the guardian for kill -9.

The agent is a child subreaper, so orphans of its ranks (a daemon a rank left behind) become
its children; the Reaper reaps ranks, adopted orphans and a relay's ssh clients alike. It
kills by descendants, not only by groups: each rank's process group, and every process below
the agent (a daemon's worker in a session of its own included), SIGTERM first and SIGKILL
after a grace, then SIGKILL again every KILL_ROUND until nothing is left. Where the host lets
it, the ranks also run in a cgroup of the job (host/cgroup.py), which nothing started under
them can leave. The Guardian is a forked watcher that kills what it was told about (and the
cgroup) if the agent dies without doing so.
"""

from __future__ import annotations

import os
import signal
import time

from mpilaunch.agent.loop import Timer
from mpilaunch.host.procfs import start_time

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
FORGET = 1 << 31  # in a pid told to the guardian: that process is gone


def become_subreaper() -> None:
    """Orphans of our ranks are re-parented to us, not to init: we can still reach them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Guardian:
    """A forked watcher that kills the ranks' process groups if this agent dies without doing so
    (kill -9): ranks run in sessions of their own, so nothing else would reach them. Without
    preexec_fn there is no PR_SET_PDEATHSIG for the ranks, and this costs one fork per host."""

    def __init__(self, cgroup: JobCgroup | None = None) -> None:
        read_fd, self.fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(self.fd)
                _guard(read_fd, cgroup)
            finally:
                os._exit(0)
        os.close(read_fd)

    def watch(self, pid: int) -> None:
        """A rank, a process below one, or an ssh client: kill it (and its group) if the agent dies."""
        self._tell(pid)

    def forget(self, pid: int) -> None:
        """The process was reaped: its pid (and process group id) may be reused by anyone now."""
        self._tell(pid | FORGET)

    def _tell(self, value: int) -> None:
        try:
            os.write(self.fd, value.to_bytes(4, "big"))
        except OSError:
            pass

    def release(self) -> None:
        """Every rank is gone: the guardian leaves without killing anything, and is reaped here,
        so that nothing of the agent's session outlives it (not even a zombie for init)."""
        try:
            os.write(self.fd, bytes(4))
            os.close(self.fd)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)  # it exits as soon as it reads the zero (or sees the pipe close)
        except ChildProcessError:  # reaped already
            pass


def _guard(read_fd: int, cgroup: JobCgroup | None) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    os.closerange(3, read_fd)  # not the link: the controller must see the agent's end
    os.closerange(read_fd + 1, 1 << 16)
    recorded: dict[int, bytes | None] = {}  # pid -> its start time when we were told of it
    agent = os.getppid()
    buf = b""
    while True:
        try:
            data = os.read(read_fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            _kill_recorded(recorded, cgroup)
            _remove_server_folders(agent)
            return
        buf += data
        while len(buf) >= 4:
            pid, buf = int.from_bytes(buf[:4], "big"), buf[4:]
            if pid == 0:
                return
            if pid & FORGET:
                recorded.pop(pid & ~FORGET, None)
            else:
                recorded[pid] = start_time(pid)


def _kill_recorded(recorded: dict[int, bytes | None], cgroup: JobCgroup | None) -> None:
    """The agent died: SIGKILL the job's cgroup, and each recorded process (a rank, a process
    below one) with its process group (a rank's is its pid; an orphan's may be a dead rank's
    group). A process whose start time changed is someone else's now, with a reused pid."""
    own = os.getpgrp()  # the agent's group: never ours to kill
    for _ in range(3):  # what a killed parent's death re-parents is in the cgroup, or recorded
        if cgroup is not None:
            cgroup.kill()
        for pid, started in recorded.items():
            now = start_time(pid)
            if now is not None and started is not None and now != started:
                continue
            try:
                group = os.getpgid(pid)
            except OSError:
                group = pid  # gone: its group may still have members (a pid is not reused while it does)
            for pgid in {pid, group} - {own}:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
    if cgroup is not None:
        cgroup.remove(tries=200)


def _remove_server_folders(agent: int) -> None:
    """The dead agent's PMIx server folders (its ranks are dead too): nobody else removes them."""
    from mpilaunch.host.shm import SERVER_FOLDER, remove_folder, server_base

    prefix, base = SERVER_FOLDER.format(pid=agent), server_base()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            remove_folder(os.path.join(base, name))


class Reaper(Timer):
    """Reaps the agent's children and kills what is left of the job, in two steps or at once.

    A reaped rank's pid is never signalled again: it may belong to anyone by then. What is left
    of its process group is an orphan of ours (we are a subreaper), or a descendant of one, and
    is reached through the orphans' groups, whose pids cannot be reused while they are unreaped
    children of ours."""

    def __init__(self, ranks: Ranks, host_os: HostOS | None = None) -> None:
        self.ranks = ranks
        self.os = host_os if host_os is not None else ranks.os  # reap, signal, look: the seam tests replace
        self.guardian: Guardian | None = None  # forked when the agent starts to run
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
            elif self.ranks.reaped(pid, status, usage):
                self.forget(pid)
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
                if group != own:
                    self.os.killpg(group, sig)
                self.os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def signal_below(self, sig: int) -> None:
        """Signal every process below the ranks one by one (those that left every group we know)."""
        for pid in self.below_ranks():
            try:
                self.os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

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
            time.sleep(0.005)

    def release(self) -> None:
        """The end: the guardian leaves, the cgroup (empty by now) goes."""
        if self.guardian is not None:
            self.guardian.release()
        if self.cgroup is not None:
            self.cgroup.remove(tries=40)

    # -- timer: the kill deadline and the look at what is below the ranks ---------------------
    def next_deadline(self) -> float | None:
        if self.kill_deadline is not None:
            return min(self.kill_deadline, self.next_adoption_scan) if self.ranks.any() else self.kill_deadline
        return self.next_adoption_scan if self.ranks.any() else None

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
        self.next_adoption_scan = now + ADOPTION_SCAN
        below = {pid for pid in self.below_ranks() if not self.ranks.is_live(pid)}  # ranks: told at spawn
        for pid in below - self.told:
            self.guardian.watch(pid)
        for pid in self.told - below:
            self.guardian.forget(pid)
        self.told = below
