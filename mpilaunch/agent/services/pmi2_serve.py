"""How a job's PMI server serves a PMI-2 client: one handler per command, and the answers to
what went up to the controller.

Two families of PMI-2 clients read the answers: MPICH's today and the older simple PMI-2 client,
MPICH's own up to 4.0.1 and still Slurm's `libpmi2.so` (which Intel MPI loads with
`I_MPI_PMI_LIBRARY`). Where they read different fields, both are sent.
"""

from __future__ import annotations

from mpilaunch.agent.services.pmi1 import FINALIZED, INITIALIZED, put_error
from mpilaunch.agent.services.pmi2 import (
    VALLEN_MAX,
    Pairs,
    fields,
    parse_body,
    response,
    spawn_apps,
    split_frame,
)
from mpilaunch.agent.services.pmi_job import JobState, PmiClient
from mpilaunch.protocol.messages import Note, PmiNameReply, PmiSpawnReply, SpawnApp

NAMES = {"name-publish": "publish_name", "name-unpublish": "unpublish_name", "name-lookup": "lookup_name"}
NAMES_BACK = {v: k for k, v in NAMES.items()}


def next_message(server: JobState, client: PmiClient) -> bool:
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


def _answer(server: JobState, client: PmiClient, msg: dict[str, str], rc: int = 0, **out: object) -> None:
    server.send(client, response(msg["cmd"], msg.get("thrid"), rc, out.items()))


def _fullinit(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    client.state = INITIALIZED  # pmirank is not trusted: the socket says which rank this is
    spawner = [("spawner-jobid", server.spawner)] if server.spawner else []
    out = [("pmi-version", 2), ("pmi-subversion", 0), ("rank", client.rank), ("size", server.size)]
    out += [("appnum", client.app), *spawner, ("debugged", "FALSE"), ("pmiverbose", "FALSE")]
    server.send(client, response(msg["cmd"], msg.get("thrid"), 0, out))


def _kvs_put(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    error = server.put(msg.get("key", ""), msg.get("value", ""))
    if error:
        _answer(server, client, msg, -1, errmsg=error)
    else:
        _answer(server, client, msg)


def _kvs_get(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    if msg.get("jobid", server.kvsname) != server.kvsname:
        _answer(server, client, msg, -1, found="FALSE", errmsg="unknown_jobid")
    else:
        _answer(server, client, msg, **found(server.lookup(msg.get("key", ""))))


def _kvs_fence(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    client.fence_thrid = msg.get("thrid")
    server.barrier_in(client)


def _put_node_attr(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
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


def _get_node_attr(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    key = msg.get("key", "")
    if key not in server.node_attrs and (msg.get("wait") or "").upper() == "TRUE":
        server.node_waits.append((client, key, msg.get("thrid")))  # answered by the put
    else:
        _answer(server, client, msg, **found(server.node_attrs.get(key)))


def _get_job_attr(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    key = msg.get("key", "")
    if key == "universeSize":  # unset (-1): not found, as hydra without -usize
        _answer(server, client, msg, **found(str(server.universe) if server.universe >= 0 else None))
    else:
        _answer(server, client, msg, **found(server.lookup(key)))


def _finalize(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    client.state = FINALIZED
    _answer(server, client, msg)


def _abort(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    """MPI_Abort. MPICH's client sends `exitcode` and `message`; Slurm's sends only `isworld` and
    `msg`, then exits with the code itself: its exit status is the job's, so no code is made up."""
    message = msg.get("message", msg.get("msg", ""))
    if "exitcode" in msg:
        server.abort(client, msg["exitcode"], message)
        return
    said = f": {message[:VALLEN_MAX]}" if message else ""
    rank = server.rank_of(client)
    server.send_up(Note(text=f"mpilaunch: rank {rank} called MPI_Abort{said} (its exit status is the code)"))


def _name(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
    server.name_request(client, msg.get("thrid"), NAMES[msg["cmd"]], msg.get("name", ""), msg.get("port"))


def _spawn(server: JobState, client: PmiClient, msg: dict[str, str], pairs: Pairs) -> None:
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
    "abort": _abort,
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
def barrier_out(server: JobState, client: PmiClient) -> None:
    server.send(client, response("kvs-fence", client.fence_thrid))


def answer(server: JobState, client: PmiClient, thrid: str | None, message: PmiNameReply | PmiSpawnReply) -> None:
    """The controller's answer to a name or spawn request."""
    if isinstance(message, PmiSpawnReply):
        out = [] if message.rc == 0 else [("errmsg", message.msg or "refused")]
        server.send(client, response("spawn", thrid, 0 if message.rc == 0 else -1, out))
        return
    cmd = NAMES_BACK.get(message.cmd, "name-lookup")
    if message.rc != 0:
        out = [("errmsg", message.msg or "failed")]
    else:  # a found name: MPICH's client reads `port` (hydra's key), Slurm's `value` (its server's key)
        out = [("port", message.port), ("value", message.port)] if cmd == "name-lookup" else []
    server.send(client, response(cmd, thrid, message.rc, out))
