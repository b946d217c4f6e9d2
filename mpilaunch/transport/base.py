"""What every transport gives the launcher: links to agents, and a result per host started.

A transport starts one agent per host and hands back a HostResult each: a Link, or the
TransportError that says why the host cannot be used; the launcher greets the links
(launcher/start/greeting.py), and the result then holds the agent's answer to its Check. A Link
declares what it is through its attributes, the same on every kind (no attribute probing):
whether the pids it reports are this machine's, whether it has a descriptor of its own or
rides another host's connection (tree spawn), which host started its agent, whether a shell
started it. Transports are found by name in REGISTRY and imported only when used, so
a run on one machine never imports paramiko.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # messages: imported by the agent after the early fork, not before it
    from collections.abc import Callable, Iterable, Mapping

    from mpilaunch.plan.hosts import Host
    from mpilaunch.protocol.messages import Checked, Hello

STAGES = ("resolve", "connect", "host key", "auth", "agent")  # in the order a connection meets them
UNKNOWN_STAGE = "unknown"  # it failed, but what carried it did not say at which step (`check` shows `?`)


class TransportError(Exception):
    """Why one host cannot be used; stage is what failed (STAGES, or UNKNOWN_STAGE)."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


class Link:
    """The launcher's end of one agent's link."""

    local = False  # the agent runs on this machine: the pids it reports are pids here
    relayed = False  # reached through another host's agent: no descriptor of its own
    parent: int | None = None  # tree spawn: the host whose agent started this one (None: the launcher)
    head_index: int | None = None  # tree spawn: the host whose connection carries this one's frames
    head: Link | None = None  # ... and its link
    marked = True  # a shell started the agent: its stream opens with a login script's output and MARKER
    await_hello = True  # the launcher waits for its Hello before it is used (not this machine's fork)
    patience = 20.0  # seconds its greeting may take (launcher/start/greeting.py)

    def __init__(self, name: str) -> None:
        self.name = name
        self.hello: Hello | None = None
        self.peer = ""  # the address the host was reached at: what its ranks are known by
        self.local_address = ""  # this machine's address as the host sees it
        self.unread = b""  # read during start-up but not used there: the controller's
        self.outbox = bytearray()  # to write before anything else: the agent's code, where a shell started it
        self.follow: list[bytes] = []  # frames for the agent right behind its check (tree spawn: its RelayHosts)

    def fileno(self) -> int:
        raise NotImplementedError

    def recv(self) -> bytes | None:
        """Data, None when there is nothing yet, b'' at end (the agent or its connection is gone)."""
        raise NotImplementedError

    def readable(self) -> bool:
        raise NotImplementedError

    def send(self, frame: bytes) -> None:
        raise NotImplementedError

    def write_fileno(self) -> int | None:
        """A descriptor the outbox is written to without blocking, or None: it is sent whole."""
        return None

    def write_outbox(self) -> bool:
        """Write what the descriptor takes now: True while some is left."""
        raise NotImplementedError

    def read_diagnostics(self) -> None:
        """Take what the process carrying the link wrote on stderr (a full pipe would stall it)."""

    def last_words(self) -> str:
        """Why the agent could not be greeted, from what carried it (ssh's last line), or ""."""
        return ""

    def ended_words(self) -> str:
        """What to say when its stream ended before the greeting did, with no last words."""
        return "the agent closed its stream"

    def failed_step(self) -> str:
        """The step its greeting failed at (STAGES, or UNKNOWN_STAGE): "agent" where the
        transport made the connection itself; an `ssh` client's link reads ssh's own words."""
        return "agent"

    def on_hello(self, hello: Hello) -> None:
        """The agent greeted: where it was reached, where it sees this machine (a transport that
        knew them from its connection keeps its own)."""
        self.hello = hello
        self.peer = self.peer or hello.addr or self.name
        self.local_address = self.local_address or hello.client

    def ping_every(self, interval: float, frame: bytes) -> None:
        """Send frame every interval seconds from a thread, until closed (the launcher's loop may
        be blocked on a full console; the agent must not take that for a lost launcher)."""

    def close(self) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        """After close: wait for whatever process carried the link."""

    def give_up(self) -> None:
        """A link whose greeting failed: closed, and what carried it reaped (killed if it stays)."""
        self.close()
        self.wait()

    def lost_because(self) -> str:
        """Why the link ended, when the transport knows (a Slurm step, a Grid Engine task that ended); else ""."""
        return ""


class HostResult:
    """What starting one host's agent gave: a link (and, once greeted, its reply), or the error."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.address = "-"  # user@host:port as the transport resolved it (`mpilaunch check` shows it)
        self.link: Link | None = None
        self.reply: Checked | None = None
        self.error: TransportError | None = None


class Transport:
    """Starts agents on hosts, as hydra's launch backends do: `start` starts one agent per host
    (index -> Host) and hands back its link, its code perhaps still queued in the link's outbox,
    or the error that says why the host cannot be used. The launcher greets every link
    (launcher/start/greeting.py). Failures are results, not exceptions: callers decide what they mean."""

    name = ""
    start_blocks = False  # start returns once its connections are made (paramiko): refilled a few at a time

    def start(self, hosts: Mapping[int, Host]) -> dict[int, HostResult]:
        raise NotImplementedError

    def retry(self, error: TransportError) -> bool:
        """Whether a host that failed so is worth starting again (a connection dropped early)."""
        return False

    def addresses(self, hosts: Mapping[int, Host], results: Mapping[int, HostResult]) -> None:
        """For `mpilaunch check`: set each result's address where start did not know it (an
        `ssh` client's transport asks ssh); by default start set it."""


# name -> "module:class"; imported on first use (paramiko only with the ssh transport)
REGISTRY = {
    "local": "mpilaunch.transport.local:LocalTransport",
    "paramiko": "mpilaunch.transport.ssh:ParamikoTransport",
    "openssh": "mpilaunch.transport.openssh:OpensshTransport",
    "tree": "mpilaunch.transport.tree:TreeTransport",
    "slurm": "mpilaunch.transport.slurm:SlurmTransport",
    "sge": "mpilaunch.transport.sge:SgeTransport",
}


def transport_class(name: str) -> type[Transport]:
    module, _, cls = REGISTRY[name].partition(":")
    # __import__, not importlib.import_module: importlib (and warnings) would be on every start's path
    return getattr(__import__(module, fromlist=[cls]), cls)


def host_problems(results: Mapping[int, HostResult], names: Callable[[int], str]) -> list[str]:
    """One line per problem of a start, in host order: a host not reached or not greeted, and
    what its agent's Check found (a program missing there)."""
    problems = []
    for index, result in sorted(results.items()):
        if result.error is not None:
            problems.append(f"{names(index)}: {result.error}")
        elif result.reply is not None:
            problems.extend(f"{names(index)}: {p}" for p in result.reply.problems)
    return problems


def close_and_wait(links: Iterable[Link | None]) -> None:
    """Every agent told to stop at once (the end of its link), then what carried each reaped."""
    found = [link for link in links if link is not None]
    for link in found:
        link.close()
    for link in found:
        link.wait()
