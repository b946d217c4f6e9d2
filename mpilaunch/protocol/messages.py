"""Every control message between the controller and its agents: one typed record each.

A message travels as a CONTROL frame (wire.py): a JSON object whose "op" names its record
(`PmiFenceDone` is "pmi_fence_done"). `encode` makes the frame; `decode` turns a received
object into the record of its op, checking each field against the record's annotations, and
raises MessageError (a wire.FrameError) for anything else, so a receiver catches one error
type and treats the link as not to be trusted. Receivers dispatch on the record's type
through a table of their own: adding a message is adding a record here and a row there.

The annotations are the schema: int, float, str, bool, object (any JSON), X | None,
tuple[X, ...] (a JSON array), dict[str, X] and the records below. DOWN records go from the controller to agents, UP
records from agents to the controller; Ping goes both ways. Fields unknown to a record are
ignored, so a newer peer may add some. Rank output and stdin are never messages: they stay
binary frames (wire.OUTPUT, wire.STDIN).
"""

from __future__ import annotations

from mpilaunch.protocol import wire
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

DOWN, UP = "down", "up"


class MessageError(wire.FrameError):
    """A control frame that is not a message of this protocol, or not one this side takes."""


# -- parts of messages -------------------------------------------------------------------
class AppCheck(Record):
    """One program to look for on a host before launch."""

    program: str
    wdir: str
    path: str | None = None  # the app's -x PATH; None: the host's own


class Probe(Record):
    """What a host must find out about itself (hostinfo.probe): GPUs, device IPs."""

    gpus: bool = False
    hccn: str | None = None  # the hccn.conf to read, for --rank-table


class RankSpec(Record):
    """One rank of a launch, as its agent starts it."""

    proc: int  # process id: unique over the run's jobs
    rank: int
    local_rank: int
    app: int
    argv: tuple[str, ...]
    wdir: str
    env: dict[str, str]  # only what is set on top of the host's environment and the Launch's env
    stdin: bool = False


class PmiJob(Record):
    """What every PMI service needs to know of a job to serve its ranks."""

    job: int
    size: int
    universe: int
    kvsname: str
    mapping: str  # PMI_process_mapping
    preput: dict[str, str]  # keys a spawning parent passed
    spawner: str | None = None  # the kvsname of the job whose MPI_Comm_spawn made this one


class PmixJob(Record):
    """What a host's PMIx server registers of a job: the same on every host but `node`."""

    nspace: str
    size: int
    universe: int
    nodes: tuple[tuple[int, ...], ...]  # the ranks on each node of the job, nodes in order
    hosts: tuple[str, ...]  # each node's host name
    apps: tuple[int, ...]  # each app context's number of ranks (ranks are numbered app by app)
    node: int = -1  # this host's place in nodes
    oversubscribed: bool = False  # more ranks than cores here: Open MPI ranks should yield
    library: str | None = None  # --pmix-lib
    job: int = 1  # the job's number in the run
    parent: str = ""  # MPI_Comm_spawn: the namespace of the rank that spawned this job, and its rank
    parent_rank: int = 0


class SshSpec(Record):
    """How a relay's ssh reaches the hosts below it."""

    config: str | None = None  # --ssh-config, where that path exists on the relay
    accept_new: bool = False
    command: tuple[str, ...] = ()  # in place of `ssh` (plm_rsh_agent, -bootstrap-exec)
    extra: tuple[str, ...] = ()  # more arguments for it, before the host (plm_rsh_args)


class RelayHost(Record):
    """A host a relay starts, with the hosts that one starts in turn."""

    index: int
    name: str
    user: str | None
    port: int | None
    below: tuple[RelayHost, ...]  # the hosts it starts in turn (the relay routes their frames)


class SpawnApp(Record):
    """One program of an MPI_Comm_spawn(_multiple) request."""

    nprocs: int
    argv: tuple[str, ...]
    preput: dict[str, str]
    info: dict[str, str]
    wdir: str | None = None
    spawner: str | None = None
    env: dict[str, str] = {}  # noqa: RUF012 (a record is never changed) variables the spawning rank sets (PMIx)


class PmixGroup(Record):
    """Ranks of one job taking part in a PMIx collective: () for all of them."""

    job: int
    ranks: tuple[int, ...]


class PmixDatum(Record):
    """One published name (PMIx_Publish), with the rank that published it."""

    key: str
    value: str  # the string, or base64 of the bytes when binary
    binary: bool = False  # a byte object (Open MPI's connect/accept agrees on a context id with them)
    nspace: str = ""
    rank: int = 0


class Death(Record):
    """How a rank a signal ended died, as its agent found out: killed by the kernel's
    out-of-memory killer (the memory limit it hit, the host's memory), and its core file."""

    oom: bool = False
    limit_bytes: int | None = None  # the smallest memory limit of its cgroup and those above; None: none
    host_bytes: int | None = None  # the host's memory (MemTotal)
    peak_rss: int | None = None  # bytes, from wait4
    core: str | None = None  # the core file's path
    core_handler: str = ""  # core_pattern pipes cores to this program (systemd-coredump, apport): no path
    core_pattern: str = ""  # a core was dumped but not found where this core_pattern puts it


class RankStack(Record):
    """One rank's stack as a tool printed it (agent/stacks.py), or why there is none."""

    proc: int
    text: str = ""  # the tool's output, whole (every thread)
    tool: str = ""  # py-spy, eu-stack or gdb
    why: str = ""  # when no stack was taken: why not


class RankUsage(Record):
    """What one running rank uses now, with every process below it (agent/usage.py)."""

    proc: int
    cpu: float  # CPU seconds so far, user + system, of the rank and its processes
    rss: int  # bytes resident, summed over them
    state: str  # the rank's own: R running, S sleeping, D disk wait, T stopped, Z zombie
    processes: int = 1


# -- controller to agent -------------------------------------------------------------------
class Check(Record):
    """Remote agents, once, before any launch: take the launcher's search paths, check each
    program, probe a port (-1 none, 0 pick one, N is N free) and answer the probe."""

    apps: tuple[AppCheck, ...]
    carried: dict[str, str]  # the launcher's PATH, LD_LIBRARY_PATH, VIRTUAL_ENV, CONDA_PREFIX
    mpi: bool  # a program linked with Open MPI is a problem (the job is served PMI-1 only)
    port: int
    heartbeat: float | None = None  # seconds of silence after which the launcher counts as gone
    probe: Probe | None = None
    families: bool = False  # say which MPI each program is linked with (host/mpi_family.py)
    torch: bool = False  # say which torch each Python program would import (host/torch_release.py)


class Put(Record):
    """Write this file on the host (the rank table), whole, before launch."""

    path: str
    data: str


class Ping(Record):
    """Heartbeat: any frame counts as a word; no answer."""


class Launch(Record):
    """Start this host's ranks of a job, with the agent services the job uses."""

    job: int
    ranks: tuple[RankSpec, ...]
    env: dict[str, str]  # every rank's, on top of the host's environment; each RankSpec's env on top of it
    services: tuple[str, ...] = ()  # agent services for the job's ranks (agent/services: "pmi", "pmi-tcp", ...)
    pmi: PmiJob | None = None
    pmix: PmixJob | None = None
    merge: bool = False
    bind_to: str = "none"
    cpus_per_rank: int = 1  # Open MPI's PE: each rank bound to this many of bind_to's groups
    store_port: int = 0  # host a TCPStore here on this port before the ranks start (torchrun's agent store)
    store_host: str = ""  # the address its ranks reach it at (MASTER_ADDR): if loopback, the only one it listens on
    report_bindings: bool = False
    drop_prefixes: tuple[str, ...] = ()  # variables of an enclosing launcher that must not reach the ranks
    drop_names: tuple[str, ...] = ()
    others: tuple[PmixJob, ...] = ()  # the run's other PMIx jobs: registered here too (spawn, connect)


class Signal(Record):
    """Send this signal to every running rank's process group."""

    sig: int


class Kill(Record):
    """SIGTERM every rank, then SIGKILL after grace seconds; grace 0 is SIGKILL now."""

    grace: float


class Finish(Record):
    """The run is over: stop leftovers with this grace, then exit."""

    grace: float


class TakeStacks(Record):
    """Take the stack of every running rank of this host, each tool's run bounded by limit
    seconds, and answer Stacks with snap."""

    snap: int
    limit: float = 5.0


class TakeUsage(Record):
    """Measure every running rank of this host (CPU seconds, memory) and answer Usage with snap."""

    snap: int


class PmiFenceDone(Record):
    """Every host of the job entered the barrier; kvs holds every host's puts since the last."""

    job: int
    kvs: dict[str, str]


class PmixFenceDone(Record):
    """Every host with a participant entered this PMIx fence: blob is all their data joined."""

    job: int
    key: str
    blob: str  # base64
    status: int = 0


class PmixDmodexAsk(Record):
    """To the host of `rank`: a PMIx server on host `host` asks for its data (direct modex);
    key: the one the asking rank needs, if it said (the data is given once it has it)."""

    job: int
    rank: int
    host: int
    req: int
    key: str = ""


class PmixDmodexDone(Record):
    """To the asking host: `rank`'s data (direct modex), or PMIx's status of why not."""

    job: int
    rank: int
    req: int
    blob: str  # base64
    status: int = 0


class PmixNspace(Record):
    """A PMIx job none of whose ranks run here (MPI_Comm_spawn made it, or it is a spawning
    job's parent): registered so that this host's ranks may connect to it."""

    pmix: PmixJob


class PmixSpawnReply(Record):
    """The answer to PmixSpawn: PMIx's status and the new job's namespace, or why not."""

    job: int
    req: int
    status: int
    nspace: str = ""
    msg: str = ""


class PmixJoinDone(Record):
    """Every host with a participant entered this PMIx collective; blob: all their data joined."""

    key: str
    blob: str  # base64
    status: int = 0


class PmixNamesReply(Record):
    """The answer to PmixPublish, PmixLookup or PmixUnpublish: PMIx's status and what was found."""

    job: int
    req: int
    status: int
    found: tuple[PmixDatum, ...] = ()


class PmiNameReply(Record):
    """The answer to a PmiName request, matched by req."""

    job: int
    req: int
    cmd: str
    rc: int
    port: str = ""
    msg: str = ""


class PmiSpawnReply(Record):
    """The answer to a PmiSpawn request: rc 0, or -1 with msg."""

    job: int
    req: int
    rc: int
    msg: str = ""


class RelayHosts(Record):
    """Tree spawn: start an agent on each host with ssh, and pass its subtree on."""

    ssh: SshSpec
    command: str
    hosts: tuple[RelayHost, ...]


class Drop(Record):
    """Tree spawn, to a host's parent: cut that child off."""

    host: int


# -- agent to controller -------------------------------------------------------------------
class Hello(Record):
    """The agent runs: its host name, CPUs, pid, Python, and both ends of SSH_CONNECTION."""

    host: str
    cpus: int
    pid: int
    python: str
    addr: str = ""  # the address this host was reached at (empty for a local agent)
    client: str = ""  # the launcher's address as this host sees it


# How Checked.families names what a program uses: "FAMILY LIBRARY" (host/mpi_family.py), the
# library marked when it was read off a Python's mpi4py, FAMILY unknown for a program that may
# start either family (a shell, a script, an interpreter).
MPI4PY_HINT = "mpi4py:"
UNKNOWN = "unknown"


class Checked(Record):
    """The answer to Check: one line per problem, the port, and the host's facts."""

    problems: tuple[str, ...]
    port: int
    port_free: bool | None  # None when no port was asked for
    info: dict[str, object] | None = None  # hostinfo.probe's answer
    families: dict[str, str] | None = None  # program -> "openmpi LIBRARY" or "mpich LIBRARY", when asked
    torch: dict[str, str] | None = None  # program -> torch's __version__, when asked


class PutDone(Record):
    """The answer to Put: None, or why the file could not be written."""

    error: str | None


class Started(Record):
    """The rank is running."""

    proc: int
    pid: int


class Failed(Record):
    """The rank could not be spawned (code 127: not found, 2: a limit of its host, such as
    `ulimit -u` or `ulimit -n`; 126: otherwise)."""

    proc: int
    error: str
    code: int


class Exited(Record):
    """The rank ended: exit code or -signal, its MPI state, its resource use (wait4), and what
    its agent found of how a signal killed it."""

    proc: int
    status: int
    mpi: str = "new"  # new, init or finalized, as the rank's PMI service saw it
    cpu: float | None = None  # user + system seconds
    rss: int | None = None  # peak resident set, bytes
    error: str = ""  # what the rank left in its TORCHELASTIC_ERROR_FILE (torch's @record), if anything
    error_file: str = ""  # ... and where
    death: Death | None = None  # for a rank a signal ended: the out-of-memory killer, a core file


class StdinAck(Record):
    """n stdin bytes were written to ranks, or dropped."""

    n: int


class Note(Record):
    """A line for the launcher's stderr."""

    text: str


class PmiFence(Record):
    """Every rank of the job on this host entered the barrier, and other hosts have ranks of the
    job; kvs holds their puts since the last."""

    job: int
    kvs: dict[str, str]


class PmixFence(Record):
    """This host's part of a PMIx fence (PMIx calls up once per host per fence): the opaque
    data of its participants. ranks: the participants, () for every rank of the job."""

    job: int
    key: str  # the fence, as this host's PMIx server named its participants, and how many came before
    ranks: tuple[int, ...]
    blob: str  # base64: the data has NUL bytes


class PmixDmodex(Record):
    """A local rank needs the data of `rank`, on another host (PMIx's direct modex): req is
    this agent's number for the request, given back in PmixDmodexDone."""

    job: int
    rank: int
    req: int
    key: str = ""  # PMIx's required key: the data is wanted once it holds this key


class PmixDmodexData(Record):
    """The answer of `rank`'s host to PmixDmodexAsk, for host `host`'s request req."""

    job: int
    rank: int
    host: int
    req: int
    blob: str  # base64
    status: int = 0


class PmixSpawn(Record):
    """PMIx_Spawn from a rank (MPI_Comm_spawn of Open MPI): problem, when the agent found one
    already (a program missing on the spawning rank's host), refuses it."""

    job: int
    proc: int
    req: int
    apps: tuple[SpawnApp, ...]
    problem: str = ""


class PmixJoin(Record):
    """This host's part of a PMIx collective over ranks of several jobs (connect, disconnect, a
    fence across jobs): PMIx calls up once per host; key names it as this host's server did."""

    key: str
    groups: tuple[PmixGroup, ...]
    blob: str = ""  # base64


class PmixPublish(Record):
    """PMIx_Publish (MPI_Publish_name, and Open MPI's connect/accept): once, the data is gone once looked up."""

    job: int
    proc: int
    rank: int
    req: int
    data: tuple[PmixDatum, ...]
    once: bool = False


class PmixLookup(Record):
    """PMIx_Lookup: wait, until every key is published (timeout seconds at most, 0: no limit)."""

    job: int
    proc: int
    req: int
    keys: tuple[str, ...]
    wait: bool = False
    timeout: float = 0.0


class PmixUnpublish(Record):
    """PMIx_Unpublish of names the rank's job published."""

    job: int
    proc: int
    req: int
    keys: tuple[str, ...]


class PmiAbort(Record):
    """The rank called MPI_Abort."""

    proc: int
    code: int
    message: str


class PmiError(Record):
    """The rank broke PMI (a bad line, a hang-up while initialized) or could not be served."""

    proc: int
    error: str


def mixed_reason(protocol: str, other: str, other_rank: int) -> str:
    """PmiError.error for a job served PMI and PMIx whose ranks use both (an agent sees it on
    its host, the controller across hosts): said of the rank that used `protocol` after rank
    other_rank used `other`."""
    family = {"PMI": "an MPICH-family MPI", "PMIx": "Open MPI"}
    return (
        f"initialized MPI through {protocol} ({family[protocol]}) and rank {other_rank} of its job through "
        f"{other} ({family[other]}): their ranks cannot share one MPI_COMM_WORLD; run them as two jobs"
    )


class PmiName(Record):
    """A publish_name, unpublish_name or lookup_name request; req numbers it in its service."""

    job: int
    proc: int
    req: int
    cmd: str
    service: str
    port: str | None = None


class PmiSpawn(Record):
    """An MPI_Comm_spawn(_multiple) request, one entry per program."""

    job: int
    proc: int
    req: int
    apps: tuple[SpawnApp, ...]


class Stacks(Record):
    """The answer to TakeStacks: each running rank's stack; lacks: what this host has not, for
    the user to hear (py-spy: Python ranks were read as native programs; tools: none at all)."""

    snap: int
    stacks: tuple[RankStack, ...]
    lacks: str = ""


class Usage(Record):
    """The answer to TakeUsage: each running rank's use, and the host's CPUs."""

    snap: int
    ranks: tuple[RankUsage, ...]
    cpus: int = 0


class Bye(Record):
    """The agent is about to exit; end of file follows. why: what stopped it before the job
    was done (a limit of its host), '' when it was told to finish."""

    why: str = ""


class Gone(Record):
    """Tree spawn, from a relay: that child's stream ended (why: ssh's last words, if any)."""

    host: int
    why: str


DOWN_MESSAGES = (
    Check,
    Put,
    Ping,
    Launch,
    Signal,
    Kill,
    Finish,
    TakeStacks,
    TakeUsage,
    PmiFenceDone,
    PmixFenceDone,
    PmixDmodexAsk,
    PmixDmodexDone,
    PmixNspace,
    PmixSpawnReply,
    PmixJoinDone,
    PmixNamesReply,
    PmiNameReply,
    PmiSpawnReply,
    RelayHosts,
    Drop,
)
UP_MESSAGES = (
    Hello,
    Checked,
    PutDone,
    Ping,
    Started,
    Failed,
    Exited,
    StdinAck,
    Note,
    PmiFence,
    PmixFence,
    PmixDmodex,
    PmixDmodexData,
    PmixSpawn,
    PmixJoin,
    PmixPublish,
    PmixLookup,
    PmixUnpublish,
    PmiAbort,
    PmiError,
    PmiName,
    PmiSpawn,
    Stacks,
    Usage,
    Bye,
    Gone,
)
PARTS = (
    AppCheck, Probe, RankSpec, PmiJob, PmixJob, SshSpec, RelayHost, SpawnApp, PmixGroup, PmixDatum, Death, RankStack,
    RankUsage,
)  # fmt: skip


def op_name(cls: type) -> str:
    """PmiFenceDone -> pmi_fence_done."""
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(cls.__name__))


BY_OP: dict[str, type] = {op_name(cls): cls for cls in (*DOWN_MESSAGES, *UP_MESSAGES)}
_TAKES = {DOWN: frozenset(DOWN_MESSAGES), UP: frozenset(UP_MESSAGES)}
_NAMED = {cls.__name__: cls for cls in (*DOWN_MESSAGES, *UP_MESSAGES, *PARTS)}
for _op, _cls in BY_OP.items():
    _cls.op = _op  # type: ignore[attr-defined]


def encode(message: Record) -> bytes:
    """The CONTROL frame of a message."""
    fields = {name: _plain(value) for name, value in zip(message._fields, message)}
    return wire.control(message.op, **fields)  # type: ignore[attr-defined]


def _plain(value: object) -> object:
    """A field's value as JSON sees it: records become objects, recursively."""
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return {name: _plain(item) for name, item in zip(value._fields, value)}  # type: ignore[attr-defined]
    if isinstance(value, (list, tuple)) and value and hasattr(type(value[0]), "_fields"):
        return [_plain(item) for item in value]
    return value


def decode(obj: dict, sender: str) -> Record:
    """The record of a received control object from sender (UP: an agent, DOWN: the controller)."""
    cls = BY_OP.get(obj["op"])
    if cls is None or cls not in _TAKES[sender]:
        raise MessageError(f"no {sender} message is called {str(obj['op'])[:40]!r}")
    return _build(cls, obj, cls.op)  # type: ignore[attr-defined]


# -- checking fields against the annotations ------------------------------------------------
_schemas: dict[type, tuple[tuple[str, bool, object, Callable[[object, str], object]], ...]] = {}


def _schema(cls: type) -> tuple[tuple[str, bool, object, Callable[[object, str], object]], ...]:
    """(name, has a default, the default, checker) for each field of a record, built once."""
    found = _schemas.get(cls)
    if found is None:
        defaults = cls._field_defaults  # type: ignore[attr-defined]
        found = _schemas[cls] = tuple(
            (name, name in defaults, defaults.get(name), _checker(cls.__annotations__[name]))
            for name in cls._fields  # type: ignore[attr-defined]
        )
    return found


def _build(cls: type, obj: object, where: str) -> Record:
    if not isinstance(obj, dict):
        raise MessageError(f"{where}: expected an object")
    values: list[object] = []
    for name, has_default, default, check in _schema(cls):
        if name in obj:
            values.append(check(obj[name], f"{where}.{name}"))
        elif has_default:
            values.append(default)
        else:
            raise MessageError(f"{where}: no {name}")
    return cls(*values)


def _checker(annotation: str) -> Callable[[object, str], object]:
    """A function that checks (and returns) a JSON value of this annotation."""
    text = annotation.strip()
    if text.endswith("| None"):
        inner = _checker(text[: -len("| None")])
        return lambda value, where: None if value is None else inner(value, where)
    if text.startswith("tuple[") and text.endswith(", ...]"):
        item = _checker(text[len("tuple[") : -len(", ...]")])

        def check_array(value: object, where: str) -> object:
            if not isinstance(value, list):
                raise MessageError(f"{where}: expected an array")
            return tuple(item(v, where) for v in value)

        return check_array
    if text.startswith("dict[str, ") and text.endswith("]"):
        entry = _checker(text[len("dict[str, ") : -1])

        def check_dict(value: object, where: str) -> object:
            if not isinstance(value, dict):
                raise MessageError(f"{where}: expected an object")
            return {key: entry(v, where) for key, v in value.items()}

        return check_dict
    if text == "object":
        return lambda value, where: value
    scalar = _SCALARS.get(text)
    if scalar is not None:
        return scalar
    cls = _NAMED[text]  # a part: a record of its own
    return lambda value, where: _build(cls, value, where)


def _scalar(convert: type, expected: str, *types: type) -> Callable[[object, str], object]:
    """A checker of a JSON scalar whose type is one of types (convert itself when none are given),
    converted (an integer where a float is expected becomes one)."""
    types = types or (convert,)

    def check(value: object, where: str) -> object:
        if type(value) not in types:
            raise MessageError(f"{where}: expected {expected}")
        return convert(value)

    return check


_SCALARS = {
    "int": _scalar(int, "an integer"),
    "float": _scalar(float, "a number", int, float),
    "str": _scalar(str, "a string"),
    "bool": _scalar(bool, "true or false"),
}


def catalogue() -> str:
    """The messages as Markdown tables (docs/architecture.md holds this text; a test compares)."""
    lines: list[str] = []
    for title, records in (
        ("Controller to agent", DOWN_MESSAGES),
        ("Agent to controller", UP_MESSAGES),
        ("Parts of messages", PARTS),
    ):
        lines += [f"{title}:", "", "| name | fields | meaning |", "|---|---|---|"]
        for cls in records:
            name = getattr(cls, "op", cls.__name__)
            fields = ", ".join(_field_text(cls, f) for f in cls._fields)  # type: ignore[attr-defined]
            lines.append(f"| `{name}` | {fields} | {' '.join((cls.__doc__ or '').split())} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _field_text(cls: type, name: str) -> str:
    """`name: type` (and its default), with | escaped for a Markdown table."""
    text = f"{name}: {cls.__annotations__[name]}"
    defaults = cls._field_defaults  # type: ignore[attr-defined]
    if name in defaults:
        text += f" = {defaults[name]!r}"
    return "`" + text.replace("|", "\\|") + "`"
