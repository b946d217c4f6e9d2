"""The run's event stream: every decision and state change, as a typed record, to whoever listens.

The policy publishes what it decides (Abort, Forward, Finish) and what changed (a rank started,
ended, failed); the controller publishes what it saw (an agent lost, a garbled frame, a note).
Subscribers: the controller carries out the decisions, the console reporter prints the lines a
user reads, the JSON report records the run. Each subscriber keeps a table of the event types
it takes.
"""

from __future__ import annotations

from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


# -- what the controller tells the policy (besides the agents' messages) -------------------------
class SignalReceived(Record):
    """The launcher got a signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2)."""

    sig: int


class NodesEnded(Record):
    """One launcher per node (torchrun's way): another node's job ended badly, or its launcher
    went away; this node's ranks are stopped too."""

    why: str


class NodesRegroup(Record):
    """One launcher per node (torchrun's elastic scale-up): a node came after the nodes' meeting
    closed; this node's ranks are stopped to start again with it (no failure, no restart counted)."""

    why: str


class Silent(Record):
    """No rank wrote any output for this many seconds (--hang-timeout)."""

    seconds: float


class StacksTaken(Record):
    """A snapshot of every rank's stack asked for with this why is printed (launcher/stacks/snapshots.py)."""

    why: str


class HostLost(Record):
    """An agent's link ended (EOF, a garbled frame, silence, its relay lost): its ranks are lost.
    confirmed: the link's end says the agent (or its guardian) stops them; not after a silence."""

    host: int
    name: str
    why: str = ""
    confirmed: bool = True


# -- decisions ---------------------------------------------------------------------------------
class Abort(Record):
    """Stop every rank: SIGTERM, SIGKILL after grace seconds (0: at once)."""

    grace: float


class Forward(Record):
    """Send this signal to every rank."""

    sig: int


class WantStacks(Record):
    """Take every rank's stack and print them grouped; why: SIGQUIT, timeout or hang (the
    snapshot's `why` in --report-json)."""

    why: str


class FinishAgents(Record):
    """Every rank ended: the agents stop what is left with this grace and exit."""

    grace: float


# -- state changes and what the user is told ------------------------------------------------------
class RankStarted(Record):
    proc: int


class RankEnded(Record):
    """The rank ended (its state says how); its console lines are flushed."""

    proc: int


class RankNotStarted(Record):
    proc: int
    error: str


class MpiFailure(Record):
    """MPI_Abort, or a broken PMI client: the job ends as if the rank failed."""

    proc: int
    reason: str


class HardStop(Record):
    """The same stop signal again: every rank is killed at once."""

    sig: int


class StopNotice(Record):
    """The first stop signal went to the ranks (as sent); those still running after grace seconds
    get SIGTERM and then SIGKILL (term), or SIGKILL (not term)."""

    sig: int
    sent: int
    grace: float
    term: bool


class TimedOut(Record):
    """--timeout, or with hang: --hang-timeout with --hang-action kill; stacks: every rank's stack
    is taken before the kill (--get-stack-traces, --hang-timeout)."""

    timeout: float
    hang: bool = False
    stacks: bool = False


class AgentLost(Record):
    """An agent's link ended while it had ranks; procs were running there (and may still be,
    unless confirmed)."""

    host: int
    why: str
    procs: tuple[int, ...]
    confirmed: bool = True


class Garbled(Record):
    """An agent sent something that is no message of the protocol: its link is closed."""

    host: int
    why: str


class AgentNote(Record):
    """A line an agent wants on the launcher's stderr."""

    text: str


class SpawnRefused(Record):
    proc: int
    why: str


class RunEnded(Record):
    """Every link is closed: the run's exit status is known."""

    status: int


class Events:
    """Publish and subscribe, in order: subscribers see every event in the order it was published."""

    def __init__(self) -> None:
        self.subscribers: list[Callable[[Record], None]] = []

    def subscribe(self, subscriber: Callable[[Record], None]) -> None:
        self.subscribers.append(subscriber)

    def publish(self, event: Record) -> None:
        for subscriber in self.subscribers:
            subscriber(event)


def table(rows: dict[type, Callable]) -> Callable[[Record], None]:
    """A subscriber that takes the event types it has a row for and ignores the rest."""

    def dispatch(event: Record) -> None:
        row = rows.get(type(event))
        if row is not None:
            row(event)

    return dispatch
