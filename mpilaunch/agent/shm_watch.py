"""The /dev/shm files of a host's ranks: seen while they run, removed after the job if left.

A segment can only be seen while a rank (or a process below it) maps it, so the agent looks at its ranks' maps soon
after they start and then less and less often (FIRST_LOOK doubling up to LOOK_CAP), as soon as
one of them ends (its node's peers map the same segment; not again within END_LOOK_GAP, as a
job's ranks end together and each look reads every live rank's maps), and before it kills them. At the end
of the agent's run, host/shm.py removes what they left. Not seen, so not removed: a segment
made and left by a job whose ranks all end within FIRST_LOOK, or after their last look. A look
reads the maps only when /dev/shm holds a file it could record (unseen): most looks of
most jobs find nothing new there and cost one listing, and a look stops reading maps once it
has recorded every file it could.
"""

from __future__ import annotations

import time

from mpilaunch.agent.loop import Timer
from mpilaunch.host import shm
from mpilaunch.host.procfs import with_descendants

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.agent.ranks import Ranks

FIRST_LOOK = 0.1  # seconds after a rank starts
LOOK_CAP = 30.0  # maps reads are not free: never more often than this once a job runs
END_LOOK_GAP = 0.05  # seconds: a rank's end after a look this recent adds none (8 ranks' ends: 28 maps reads)


class ShmWatch(Timer):
    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.before = shm.present()  # files there before any rank of ours ran: never removed
        self.seen: dict[str, shm.FileId] = {}
        self.gap = FIRST_LOOK
        self.next_look: float | None = None
        self.live = 0
        self.last_look = float("-inf")

    def look(self) -> None:
        """Record what every live rank, and each process below it (a script's MPI program), maps
        in /dev/shm now: until every file there that a look could record is recorded (the ranks
        of a host map the same segments: most looks read one rank's maps, or none)."""
        self.last_look = time.monotonic()
        unseen = self.unseen()
        if unseen is not None and not unseen:
            return
        for pid in self.ranks.live_pids():
            for process in with_descendants(pid):
                found = shm.mapped_by(process)
                self.seen.update(found)
                if unseen is not None:
                    for path in [path for path, ident in found.items() if unseen.get(path) == ident]:
                        del unseen[path]
                    if not unseen:
                        return

    def unseen(self) -> dict[str, shm.FileId] | None:
        """The files in /dev/shm a look could record: not there before the job, and not seen yet
        at their path (None: /dev/shm could not be listed in full, so any may be). Listing
        /dev/shm costs far less than reading a rank's maps. The agents' PMIx server folders
        are left out: this one's is removed, whoever maps it, before what the ranks left
        (Agent.run); another agent's (of another job, or a host of this one started here) is
        its own to remove, and on a machine with hundreds of agents walking them all at every
        look would cost each agent in proportion to the others."""
        present = shm.files(skip=shm.AGENTS_FOLDERS)
        if present is None:
            return None
        before, seen = self.before, self.seen
        return {path: ident for path, ident in present.items() if ident not in before and seen.get(path) != ident}

    def next_deadline(self) -> float | None:
        return self.next_look

    def tick(self, now: float) -> None:
        live = self.ranks.live
        if live > self.live:  # ranks started (a job, or a spawned one): look soon
            self.gap = FIRST_LOOK
            self.next_look = now + FIRST_LOOK
        elif live < self.live and live and now - self.last_look >= END_LOOK_GAP:
            self.look()  # one ended: its peers on this host map what it mapped
        if not live:
            self.next_look = None
        elif self.next_look is not None and now >= self.next_look:
            self.look()
            self.gap = min(self.gap * 2, LOOK_CAP)
            self.next_look = now + self.gap
        self.live = live

    def clean(self) -> list[str]:
        """After the job: remove what the ranks left (see host/shm.remove_left)."""
        return shm.remove_left(self.seen, self.before) if self.seen else []
