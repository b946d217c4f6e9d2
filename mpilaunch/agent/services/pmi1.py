"""PMI-1, the "simple" protocol: `cmd=NAME key=value ...` lines (MPICH's pmi-1.1, Flux RFC 13),
and how a job's server (pmi_job.JobServer) serves a PMI-1 client: one handler per command."""

from __future__ import annotations

from mpilaunch.protocol.messages import PmiNameReply, PmiSpawnReply, SpawnApp

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see protocol/record.py)
if TYPE_CHECKING:
    from mpilaunch.agent.services.pmi_job import JobServer, PmiClient

NEW, INITIALIZED, FINALIZED = "new", "init", "finalized"  # a client's state, both versions
KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024
LINE_MAX = 4096  # longer than any valid line: init, put of a maximal key and value, ...


class ProtocolError(ValueError):
    """A line that is not PMI-1; the client cannot be trusted to continue."""


def parse_line(line: bytes) -> dict[str, str]:
    """`cmd=put kvsname=k key=a value=b c` -> {"cmd": "put", ..., "value": "b c"}.

    A word without '=' continues the previous value, so values may contain spaces.
    """
    try:
        text = line.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ProtocolError("line is not ASCII") from None
    fields: dict[str, str] = {}
    last = None
    for word in text.split(" "):
        key, eq, value = word.partition("=")
        if eq and key and key.replace("_", "").isalnum():
            fields[key] = value
            last = key
        elif last is not None:
            fields[last] += " " + word
        elif word:
            raise ProtocolError(f"unexpected word {word[:40]!r}")
    command = fields.get("cmd") or fields.get("mcmd")
    if not command:
        raise ProtocolError("line without cmd=")
    fields["cmd"] = command
    return fields


def put_error(key: str, value: str) -> str | None:
    """Why a key and value cannot be put (both versions have the same limits), or None."""
    if not key or len(key) > KEYLEN_MAX:
        return "key_length_out_of_range"
    if len(value) > VALLEN_MAX:
        return "value_too_long"
    return None


def format_reply(cmd: str, **fields: object) -> bytes:
    words = [f"cmd={cmd}"] + [f"{k}={v}" for k, v in fields.items()]
    return (" ".join(words) + "\n").encode()


# -- serving a PMI-1 client ---------------------------------------------------------------------
NAME_RESULTS = {"publish_name": "publish_result", "unpublish_name": "unpublish_result", "lookup_name": "lookup_result"}


def next_message(server: JobServer, client: PmiClient) -> bool:
    """Serve one whole line from the client's buffer; False when more bytes are needed."""
    end = client.buf.find(b"\n")
    if end > LINE_MAX or (end < 0 and len(client.buf) > LINE_MAX):
        raise ProtocolError(f"a line longer than {LINE_MAX} bytes")
    if end < 0:
        return False
    line = bytes(client.buf[:end])
    del client.buf[: end + 1]
    if client.spawn_block is not None:
        spawn_line(server, client, line)
        return True
    msg = parse_line(line)
    handler = COMMANDS.get(msg["cmd"])
    if handler is None:
        server.unknown(client, msg["cmd"])
        server.reply(client, f"{msg['cmd'][:40]}_result", rc=-1, msg="unknown_command")
    else:
        handler(server, client, msg)
    return True


def _init(server: JobServer, client: PmiClient, msg: dict[str, str]) -> None:
    version = msg.get("pmi_version", "1")
    if version == "2":
        client.version = 2  # every later message is a PMI-2 frame
        client.state = INITIALIZED
        server.reply(client, "response_to_init", pmi_version=2, pmi_subversion=0, rc=0)
    elif version != "1":
        server.reply(client, "response_to_init", pmi_version=1, pmi_subversion=1, rc=-1)
    else:
        client.state = INITIALIZED
        server.reply(client, "response_to_init", pmi_version=1, pmi_subversion=1, rc=0)


def _put(server: JobServer, client: PmiClient, msg: dict[str, str]) -> None:
    error = "unknown_kvsname" if msg.get("kvsname") != server.kvsname else None
    error = error or server.put(msg.get("key", ""), msg.get("value", ""))
    if error:
        server.reply(client, "put_result", rc=-1, msg=error)
    else:
        server.reply(client, "put_result", rc=0)


def _get(server: JobServer, client: PmiClient, msg: dict[str, str]) -> None:
    value = server.lookup(msg.get("key", ""))
    if msg.get("kvsname") != server.kvsname:
        server.reply(client, "get_result", rc=-1, msg="unknown_kvsname")
    elif value is None:
        server.reply(client, "get_result", rc=-1, msg="key_not_found")
    else:
        server.reply(client, "get_result", rc=0, value=value)


def _finalize(server: JobServer, client: PmiClient, msg: dict[str, str]) -> None:
    client.state = FINALIZED
    server.reply(client, "finalize_ack", rc=0)


def _name(server: JobServer, client: PmiClient, msg: dict[str, str]) -> None:
    server.name_request(client, None, msg["cmd"], msg.get("service", ""), msg.get("port"))


def _spawn(server: JobServer, client: PmiClient, msg: dict[str, str]) -> None:
    client.spawn_block = {}  # `key=value` lines follow, up to `endcmd`


COMMANDS = {
    "init": _init,
    "get_maxes": lambda server, client, msg: server.reply(
        client, "maxes", rc=0, kvsname_max=KVSNAME_MAX, keylen_max=KEYLEN_MAX, vallen_max=VALLEN_MAX
    ),
    "get_appnum": lambda server, client, msg: server.reply(client, "appnum", rc=0, appnum=client.app),
    "get_my_kvsname": lambda server, client, msg: server.reply(client, "my_kvsname", rc=0, kvsname=server.kvsname),
    "get_universe_size": lambda server, client, msg: server.reply(client, "universe_size", rc=0, size=server.universe),
    "put": _put,
    "get": _get,
    "barrier_in": lambda server, client, msg: server.barrier_in(client),
    "finalize": _finalize,
    "abort": lambda server, client, msg: server.abort(
        client, msg.get("exitcode"), msg.get("error_msg", msg.get("msg", ""))
    ),
    "publish_name": _name,
    "unpublish_name": _name,
    "lookup_name": _name,
    "spawn": _spawn,
}


def spawn_line(server: JobServer, client: PmiClient, line: bytes) -> None:
    """One `key=value` line of an `mcmd=spawn` block; `endcmd` closes the block."""
    block = client.spawn_block
    assert block is not None
    text = line.decode("ascii", "replace").strip()
    if text != "endcmd":
        key, eq, value = text.partition("=")
        if not eq or len(block) > 4096:
            raise ProtocolError(f"bad line in a spawn command: {text[:40]!r}")
        block[key] = value
        return
    client.spawn_block = None
    try:
        app = spawn_app(block)
        total, so_far = int(block.get("totspawns", "1")), int(block.get("spawnssofar", "1"))
    except (KeyError, ValueError) as exc:
        client.spawn_apps = []
        server.reply(client, "spawn_result", rc=-1, errmsg=f"bad_spawn_command:{exc}")
        return
    client.spawn_apps.append(SpawnApp(**app))
    if so_far < total:
        return
    apps, client.spawn_apps = client.spawn_apps, []
    server.spawn(client, apps)


def spawn_app(block: dict[str, str]) -> dict:
    """An `mcmd=spawn` block as the controller wants it: nprocs, argv, preput keys, info."""
    nprocs = int(block["nprocs"])
    if not 0 < nprocs <= 1 << 16:
        raise ValueError("nprocs out of range")
    args = [block[f"arg{i}"] for i in range(1, int(block.get("argcnt", "0")) + 1)]
    preput = {block[f"preput_key_{i}"]: block[f"preput_val_{i}"] for i in range(int(block.get("preput_num", "0")))}
    info = {block[f"info_key_{i}"]: block[f"info_val_{i}"] for i in range(int(block.get("info_num", "0")))}
    app: dict = {"nprocs": nprocs, "argv": [block["execname"], *args], "preput": preput, "info": info}
    if "wdir" in info:
        app["wdir"] = info["wdir"]
    return app


# -- answers ----------------------------------------------------------------------------------
def barrier_out(server: JobServer, client: PmiClient) -> None:
    server.reply(client, "barrier_out", rc=0)


def answer(server: JobServer, client: PmiClient, thrid: str | None, message: PmiNameReply | PmiSpawnReply) -> None:
    """The controller's answer to a name or spawn request, as PMI-1 result fields."""
    if isinstance(message, PmiSpawnReply):
        if message.rc == 0:
            server.reply(client, "spawn_result", rc=0)
        else:
            server.reply(client, "spawn_result", rc=-1, errmsg=(message.msg or "refused").replace(" ", "_"))
    elif message.rc != 0:
        server.reply(client, NAME_RESULTS.get(message.cmd, "lookup_result"), rc=message.rc, msg=message.msg)
    elif message.cmd == "lookup_name":
        server.reply(client, "lookup_result", rc=0, port=message.port, info="ok")
    else:
        server.reply(client, NAME_RESULTS.get(message.cmd, "lookup_result"), rc=0, info="ok")
