"""How a job's PMI server serves a PMI-1 client: one handler per command, and the answers to
what went up to the controller."""

from __future__ import annotations

from mpilaunch.agent.services.pmi1 import (
    FINALIZED,
    INITIALIZED,
    KEYLEN_MAX,
    KVSNAME_MAX,
    LINE_MAX,
    VALLEN_MAX,
    ProtocolError,
    parse_line,
)
from mpilaunch.agent.services.pmi_job import JobState, PmiClient
from mpilaunch.protocol.messages import PmiNameReply, PmiSpawnReply, SpawnApp

NAME_RESULTS = {"publish_name": "publish_result", "unpublish_name": "unpublish_result", "lookup_name": "lookup_result"}


def next_message(server: JobState, client: PmiClient) -> bool:
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


def _init(server: JobState, client: PmiClient, msg: dict[str, str]) -> None:
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


def _put(server: JobState, client: PmiClient, msg: dict[str, str]) -> None:
    error = "unknown_kvsname" if msg.get("kvsname") != server.kvsname else None
    error = error or server.put(msg.get("key", ""), msg.get("value", ""))
    if error:
        server.reply(client, "put_result", rc=-1, msg=error)
    else:
        server.reply(client, "put_result", rc=0)


def _get(server: JobState, client: PmiClient, msg: dict[str, str]) -> None:
    value = server.lookup(msg.get("key", ""))
    if msg.get("kvsname") != server.kvsname:
        server.reply(client, "get_result", rc=-1, msg="unknown_kvsname")
    elif value is None:
        server.reply(client, "get_result", rc=-1, msg="key_not_found")
    else:
        server.reply(client, "get_result", rc=0, value=value)


def _finalize(server: JobState, client: PmiClient, msg: dict[str, str]) -> None:
    client.state = FINALIZED
    server.reply(client, "finalize_ack", rc=0)


def _name(server: JobState, client: PmiClient, msg: dict[str, str]) -> None:
    server.name_request(client, None, msg["cmd"], msg.get("service", ""), msg.get("port"))


def _spawn(server: JobState, client: PmiClient, msg: dict[str, str]) -> None:
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


def spawn_line(server: JobState, client: PmiClient, line: bytes) -> None:
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
def barrier_out(server: JobState, client: PmiClient) -> None:
    server.reply(client, "barrier_out", rc=0)


def answer(server: JobState, client: PmiClient, thrid: str | None, message: PmiNameReply | PmiSpawnReply) -> None:
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
