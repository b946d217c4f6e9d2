"""The PMI-2 wire protocol (MPICH's pmi-2.0): length-prefixed `cmd=NAME;key=value;...;` frames.

A PMI-2 client first sends the PMI-1 line `cmd=init pmi_version=2 pmi_subversion=0` (answered
in PMI-1 format); from then on each message is a frame: 6 ASCII characters giving the length
of the rest in decimal (MPICH pads with spaces, right-aligned today, left-aligned in older
clients), then `key=value;` fields, the first being `cmd=`. A `;` inside a value is doubled.
Every response echoes the request's `thrid` (a multi-threaded client matches replies by it).

The frame format first, then how a job's server (pmi_job.JobServer) serves a PMI-2 client:
one handler per command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from mpilaunch.agent.services.pmi1 import FINALIZED, INITIALIZED, ProtocolError, put_error
from mpilaunch.protocol.messages import PmiNameReply, PmiSpawnReply, SpawnApp

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see protocol/record.py)
if TYPE_CHECKING:
    from mpilaunch.agent.services.pmi_job import JobServer, PmiClient

LENGTH_DIGITS = 6
FRAME_MAX = 1 << 16  # MPICH's PMI-2 client never sends more (PMII_MAX_COMMAND_LEN)
KEYLEN_MAX = 64  # PMI2_MAX_KEYLEN
VALLEN_MAX = 1024  # PMI2_MAX_VALLEN
NPROCS_MAX = 1 << 16
_LENGTH = rb"^ *[0-9]{1,6} *$"  # these two compiled by re when a PMI-2 client first speaks
_KEY = r"^[A-Za-z0-9_.-]{1,64}$"

Pairs = list[tuple[str, str]]


def split_frame(buf: bytes | bytearray) -> tuple[bytes, int] | None:
    """The body of the first whole frame in buf and the bytes it used, or None if incomplete.

    Raises ProtocolError for a length prefix that is not a decimal number or is over FRAME_MAX,
    so a hostile length is refused before its body is awaited.
    """
    if len(buf) < LENGTH_DIGITS:
        return None
    prefix = bytes(buf[:LENGTH_DIGITS])
    if not re.match(_LENGTH, prefix):
        raise ProtocolError(f"bad PMI-2 length prefix {prefix!r}")
    length = int(prefix)
    if length > FRAME_MAX:
        raise ProtocolError(f"a PMI-2 frame of {length} bytes (the limit is {FRAME_MAX})")
    end = LENGTH_DIGITS + length
    if len(buf) < end:
        return None
    return bytes(buf[LENGTH_DIGITS:end]), end


def looks_like_frame(buf: bytes | bytearray) -> bool:
    """A client that starts with a PMI-2 frame instead of the PMI-1 init line (hydra accepts it)."""
    return (
        len(buf) >= LENGTH_DIGITS + 4
        and bool(re.match(_LENGTH, bytes(buf[:LENGTH_DIGITS])))
        and (bytes(buf[LENGTH_DIGITS : LENGTH_DIGITS + 4]) == b"cmd=")
    )


def parse_body(body: bytes) -> Pairs:
    """`cmd=kvs-put;key=a;value=x;;y;` -> [("cmd", "kvs-put"), ("key", "a"), ("value", "x;y")].

    Order and repeated keys are kept: a spawn request repeats argv0... once per program.
    """
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("PMI-2 frame is not ASCII") from None
    pairs: Pairs = []
    for field in _fields(text):
        key, eq, value = field.partition("=")
        if not eq:
            raise ProtocolError(f"PMI-2 field without '=': {field[:40]!r}")
        if not re.match(_KEY, key):
            raise ProtocolError(f"bad PMI-2 key {key[:40]!r}")
        pairs.append((key, value))
    if not pairs or pairs[0][0] != "cmd" or not pairs[0][1]:
        raise ProtocolError("PMI-2 frame without cmd=")
    return pairs


def _fields(text: str) -> Iterable[str]:
    """Split at single `;`; `;;` is a literal `;`. The last field's `;` may be missing."""
    field: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == ";" and text[i + 1 : i + 2] == ";":
            field.append(";")
            i += 2
            continue
        if char == ";":
            yield "".join(field)
            field = []
        else:
            field.append(char)
        i += 1
    if field:
        yield "".join(field)


def fields(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """First value of each key (a repeated key only matters in spawn, read with spawn_apps)."""
    out: dict[str, str] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def format_frame(cmd: str, pairs: Iterable[tuple[str, object]] = ()) -> bytes:
    """One frame: the length, then `cmd=...;` and each `key=value;`, with `;` doubled in values."""
    parts = [f"cmd={cmd};"] + [f"{key}={_escape(str(value))};" for key, value in pairs]
    body = "".join(parts).encode("ascii", "replace")
    return b"%6d" % len(body) + body


def _escape(value: str) -> str:
    return value.replace(";", ";;")


def response(cmd: str, thrid: str | None, rc: int = 0, pairs: Iterable[tuple[str, object]] = ()) -> bytes:
    """The answer to a `cmd` request: `cmd-response`, the request's thrid, rc, then the fields."""
    head: list[tuple[str, object]] = [("thrid", thrid)] if thrid is not None else []
    return format_frame(f"{cmd}-response", [*head, ("rc", rc), *pairs])


def boolean(value: bool) -> str:
    return "TRUE" if value else "FALSE"


def is_true(value: str | None) -> bool:
    return (value or "").upper() == "TRUE"


def spawn_apps(pairs: Sequence[tuple[str, str]]) -> list[dict]:
    """A PMI-2 `spawn` request as the controller wants it: one {nprocs, argv, preput, info} per program.

    `ncmds`, `preputcount` and `ppkeyN`/`ppvalN` come first; each program starts with
    `subcmd=EXECUTABLE` followed by its `maxprocs`, `argc`, `argvN`, `infokeycount`,
    `infokeyN`/`infovalN`. Raises ValueError (or KeyError) for a request that does not add up.
    """
    head: dict[str, str] = {}
    segments: list[dict[str, str]] = []
    for key, value in pairs[1:]:
        if key == "subcmd":
            segments.append({})
        (segments[-1] if segments else head).setdefault(key, value)
    count = int(head.get("ncmds", len(segments)))
    if count != len(segments) or not 0 < count <= 64:
        raise ValueError(f"ncmds={head.get('ncmds')} but {len(segments)} programs")
    preput = {head[f"ppkey{i}"]: head[f"ppval{i}"] for i in range(int(head.get("preputcount", "0")))}
    apps = []
    for index, seg in enumerate(segments):
        nprocs = int(seg["maxprocs"])
        if not 0 < nprocs <= NPROCS_MAX:
            raise ValueError("maxprocs out of range")
        args = [seg[f"argv{i}"] for i in range(int(seg.get("argc", "0")))]
        info = {seg[f"infokey{i}"]: seg[f"infoval{i}"] for i in range(int(seg.get("infokeycount", "0")))}
        preput_here = preput if index == 0 else {}
        app: dict = {"nprocs": nprocs, "argv": [seg["subcmd"], *args], "preput": preput_here, "info": info}
        if "wdir" in info:
            app["wdir"] = info["wdir"]
        apps.append(app)
    return apps


# -- serving a PMI-2 client ---------------------------------------------------------------------
NAMES = {"name-publish": "publish_name", "name-unpublish": "unpublish_name", "name-lookup": "lookup_name"}
NAMES_BACK = {v: k for k, v in NAMES.items()}


def next_message(server: JobServer, client: PmiClient) -> bool:
    """Serve one whole frame from the client's buffer; False when more bytes are needed."""
    got = split_frame(client.buf)
    if got is None:
        return False
    body, used = got
    del client.buf[:used]
    pairs = parse_body(body)
    msg = fields(pairs)
    handler = COMMANDS.get(msg["cmd"])
    if handler is None:
        server.unknown(client, msg["cmd"])
        server.send(client, response(msg["cmd"][:40], msg.get("thrid"), -1, [("errmsg", "unknown_command")]))
    else:
        handler(server, client, msg, pairs)
    return True


def _answer(server: JobServer, client: PmiClient, msg: dict[str, str], rc: int = 0, **out: object) -> None:
    server.send(client, response(msg["cmd"], msg.get("thrid"), rc, out.items()))


def _fullinit(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    client.state = INITIALIZED  # pmirank is not trusted: the socket says which rank this is
    spawner = [("spawner-jobid", server.spawner)] if server.spawner else []
    out = [("pmi-version", 2), ("pmi-subversion", 0), ("rank", client.rank), ("size", server.size)]
    out += [("appnum", client.app), *spawner, ("debugged", "FALSE"), ("pmiverbose", "FALSE")]
    server.send(client, response(msg["cmd"], msg.get("thrid"), 0, out))


def _kvs_put(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    error = server.put(msg.get("key", ""), msg.get("value", ""))
    if error:
        _answer(server, client, msg, -1, errmsg=error)
    else:
        _answer(server, client, msg)


def _kvs_get(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    if msg.get("jobid", server.kvsname) != server.kvsname:
        _answer(server, client, msg, -1, found="FALSE", errmsg="unknown_jobid")
    else:
        _answer(server, client, msg, **found(server.lookup(msg.get("key", ""))))


def _kvs_fence(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    client.fence_thrid = msg.get("thrid")
    server.barrier_in(client)


def _put_node_attr(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    """Node attributes are shared by this host's ranks of the job; a get that waits is answered now."""
    key, value = msg.get("key", ""), msg.get("value", "")
    error = put_error(key, value)
    if error:
        _answer(server, client, msg, -1, errmsg=error)
        return
    server.node_attrs[key] = value
    _answer(server, client, msg)
    waiting = [w for w in server.node_waits if w[1] == key]
    server.node_waits = [w for w in server.node_waits if w[1] != key]
    for waiter, _, waiter_thrid in waiting:
        server.send(waiter, response("info-getnodeattr", waiter_thrid, 0, found(value).items()))


def _get_node_attr(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    key = msg.get("key", "")
    if key not in server.node_attrs and is_true(msg.get("wait")):
        server.node_waits.append((client, key, msg.get("thrid")))  # answered by the put
    else:
        _answer(server, client, msg, **found(server.node_attrs.get(key)))


def _get_job_attr(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    key = msg.get("key", "")
    _answer(server, client, msg, **found(str(server.universe) if key == "universeSize" else server.lookup(key)))


def _finalize(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    client.state = FINALIZED
    _answer(server, client, msg)


def _name(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    server.name_request(client, msg.get("thrid"), NAMES[msg["cmd"]], msg.get("name", ""), msg.get("port"))


def _spawn(server: JobServer, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    try:
        apps = [SpawnApp(**app) for app in spawn_apps(pairs)]
    except (KeyError, ValueError) as exc:
        _answer(server, client, msg, -1, errmsg=f"bad_spawn_command:{exc}")
        return
    server.spawn(client, apps, msg.get("thrid"))


COMMANDS = {
    "fullinit": _fullinit,
    "job-getid": lambda server, client, msg, pairs: _answer(server, client, msg, jobid=server.kvsname),
    "kvs-put": _kvs_put,
    "kvs-get": _kvs_get,
    "kvs-fence": _kvs_fence,
    "info-putnodeattr": _put_node_attr,
    "info-getnodeattr": _get_node_attr,
    "info-getjobattr": _get_job_attr,
    "finalize": _finalize,
    "abort": lambda server, client, msg, pairs: server.abort(
        client, msg.get("exitcode"), msg.get("message", msg.get("msg", ""))
    ),
    "name-publish": _name,
    "name-unpublish": _name,
    "name-lookup": _name,
    "spawn": _spawn,
    "job-connect": lambda server, client, msg, pairs: _answer(server, client, msg, -1, errmsg="not_supported"),
    "job-disconnect": lambda server, client, msg, pairs: _answer(server, client, msg, -1, errmsg="not_supported"),
}


def found(value: str | None) -> dict[str, str]:
    """PMI-2's answer to a lookup: found=TRUE and the value, or found=FALSE."""
    return {"found": "TRUE", "value": value} if value is not None else {"found": "FALSE"}


# -- answers ----------------------------------------------------------------------------------
def barrier_out(server: JobServer, client: PmiClient) -> None:
    server.send(client, response("kvs-fence", client.fence_thrid))


def answer(server: JobServer, client: PmiClient, thrid: str | None, message: PmiNameReply | PmiSpawnReply) -> None:
    """The controller's answer to a name or spawn request."""
    if isinstance(message, PmiSpawnReply):
        out = [] if message.rc == 0 else [("errmsg", message.msg or "refused")]
        server.send(client, response("spawn", thrid, 0 if message.rc == 0 else -1, out))
        return
    cmd = NAMES_BACK.get(message.cmd, "name-lookup")
    if message.rc != 0:
        out = [("errmsg", message.msg or "failed")]
    else:
        out = [("port", message.port)] if cmd == "name-lookup" else []
    server.send(client, response(cmd, thrid, message.rc, out))
