"""Named states of a rank and of the run, with the moves each may make (checked).

A rank is PLANNED until its agent says it started, RUNNING until it ends, STOPPING once the
launcher sent it a kill, and ends EXITED (status 0) or FAILED (anything else, or a status 0
the policy counts as a failure). The run is RUNNING, INTERRUPTED once a stop signal (Ctrl-C)
was forwarded to the ranks, ABORTING once a kill went out, FINISHING once every rank ended,
and DONE when every agent's link closed.
"""

from __future__ import annotations

from mpilaunch.plan.placement import Rank

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.protocol.messages import Death

PLANNED, RUNNING, STOPPING, EXITED, FAILED = "planned", "running", "stopping", "exited", "failed"
RANK_MOVES = {
    PLANNED: frozenset((RUNNING, STOPPING, EXITED, FAILED)),
    RUNNING: frozenset((STOPPING, EXITED, FAILED)),
    STOPPING: frozenset((EXITED, FAILED)),
    EXITED: frozenset(),
    FAILED: frozenset(),
}
ENDED = frozenset((EXITED, FAILED))

INTERRUPTED, ABORTING, FINISHING, DONE = "interrupted", "aborting", "finishing", "done"
RUN_MOVES = {
    RUNNING: frozenset((INTERRUPTED, ABORTING, FINISHING, DONE)),
    INTERRUPTED: frozenset((ABORTING, FINISHING, DONE)),
    ABORTING: frozenset((FINISHING, DONE)),
    FINISHING: frozenset((DONE,)),
    DONE: frozenset(),
}


class StateError(AssertionError):
    """A move the state machine does not allow: a bug in the policy, not bad input."""


def moved(current: str, new: str, moves: dict[str, frozenset[str]]) -> str:
    """new, if current may move there."""
    if new not in moves[current]:
        raise StateError(f"no move from {current} to {new}")
    return new


class RankState:
    """One process of the run as the controller knows it (a plain class: see plan/spec.py).

    Times are the policy clock's (monotonic seconds); cpu and rss come from the agent's wait4,
    death from its look at how a signal killed the rank (agent/death.py)."""

    __slots__ = (
        "abort_code",
        "cpu",
        "death",
        "ended_at",
        "error",
        "error_file",
        "job",
        "killed",
        "pid",
        "proc",
        "rank",
        "reason",
        "rss",
        "started_at",
        "state",
        "status",
        "unfinalized",
    )

    def __init__(self, proc: int, job: int, rank: Rank) -> None:
        self.proc = proc
        self.job = job
        self.rank = rank
        self.state = PLANNED
        self.pid: int | None = None
        self.status: int | None = None  # exit code, or -signal
        self.reason: str | None = None
        self.abort_code: int | None = None  # from MPI_Abort or a PMI failure
        self.error = ""  # its TORCHELASTIC_ERROR_FILE's text (torch's @record), and the file
        self.error_file = ""
        self.killed = False  # still running when a kill was sent
        self.unfinalized = False  # exited 0 after MPI_Init without MPI_Finalize while other ranks ran
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.cpu: float | None = None
        self.rss: int | None = None
        self.death: Death | None = None  # how a signal killed it, as its agent found out

    @property
    def done(self) -> bool:
        return self.state in ENDED

    def move(self, new: str) -> None:
        self.state = moved(self.state, new, RANK_MOVES)
