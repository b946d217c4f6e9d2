"""PMI-1 and PMI-2 served by an agent to its own ranks over inherited socket pairs (PMI_FD).

Everything a rank can be answered locally is: maxima, appnum, kvsname, universe size, its
host's puts, node attributes and every key fenced so far. Only job-wide steps go up the
link: a barrier once all local ranks of the job entered it (with the puts made since the
last one), abort, the name service and spawn. The controller answers a barrier by sending
every rank's puts to every agent of the job. One service per job: spawned jobs have their
own KVS and barriers.

Each rank picks its version: a PMI-2 client says `cmd=init pmi_version=2` (or starts with a
PMI-2 frame) and is served PMI-2 frames from then on. Both versions share the keys, the
barrier (PMI-1 `barrier_in` and PMI-2 `kvs-fence` are the same step) and the requests to the
controller, so ranks of one job may even speak different versions.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from mpilaunch.agent.services import pmi2
from mpilaunch.agent.services.pmi1 import (
    KEYLEN_MAX,
    KVSNAME_MAX,
    LINE_MAX,
    VALLEN_MAX,
    ProtocolError,
    format_reply,
    parse_line,
)
from mpilaunch.protocol import wire

NEW, INITIALIZED, FINALIZED = "new", "init", "finalized"
NAME_RESULTS = {"publish_name": "publish_result", "unpublish_name": "unpublish_result", "lookup_name": "lookup_result"}
NAMES_V2 = {"name-publish": "publish_name", "name-unpublish": "unpublish_name", "name-lookup": "lookup_name"}
SEND_TIMEOUT = 5.0  # a rank that leaves its replies unread this long is cut off, so the agent never stalls


class PmiClient:
    """One rank's end of the protocol; ident is its process id (unique over the run's jobs)."""

    def __init__(self, ident: int, rank: int, app: int, sock: socket.socket | None) -> None:
        self.ident = ident
        self.rank = rank
        self.app = app
        self.sock = sock  # None until a TCP client has presented its id
        self.buf = bytearray()
        self.state = NEW
        self.version = 1  # 2 once it asked for PMI-2: frames from then on
        self.in_barrier = False
        self.stalled = False  # it stopped reading its replies: it is reported and served no more
        self.fence_thrid: str | None = None  # PMI-2: the thrid to echo when the fence completes
        self.spawn_block: dict[str, str] | None = None  # lines of an `mcmd=spawn` being read
        self.spawn_apps: list[dict] = []  # MPI_Comm_spawn_multiple sends one block per app


class PmiService:
    def __init__(
        self, job: dict, send_up: Callable[[bytes], None], on_hangup: Callable[[int], None] | None = None
    ) -> None:
        self.job = int(job.get("job", 1))
        self.on_hangup = on_hangup  # told when an initialized rank closes its socket
        self.size = int(job["size"])
        self.universe = int(job["universe"])
        self.kvsname = str(job["kvsname"])
        self.send_up = send_up
        self.spawner = job.get("spawner")  # kvsname of the job whose MPI_Comm_spawn made this one
        self.kvs: dict[str, str] = {"PMI_process_mapping": str(job["mapping"]), **job.get("preput", {})}
        self.pending: dict[str, str] = {}
        self.node_attrs: dict[str, str] = {}  # PMI-2 node attributes: shared by this host's ranks of the job
        self.node_waits: list[tuple[PmiClient, str, str | None]] = []  # info-getnodeattr wait=TRUE
        self.clients: dict[int, PmiClient] = {}  # by socket fd
        self.by_ident: dict[int, PmiClient] = {}
        self.waiting: dict[int, tuple[PmiClient, str | None]] = {}  # name and spawn requests by id, with thrid
        self.next_request = 0

    # -- wiring ---------------------------------------------------------------------------
    def attach(self, ident: int, rank: int, app: int) -> tuple[socket.socket, socket.socket]:
        """A socket pair for a rank about to start: (ours, the one it inherits as PMI_FD)."""
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        client = PmiClient(ident, rank, app, ours)
        self.clients[ours.fileno()] = client
        self.by_ident[ident] = client
        return ours, theirs

    def expect(self, ident: int, rank: int, app: int) -> None:
        """A rank that will connect over TCP (PMI_PORT) and present its PMI_ID."""
        self.by_ident[ident] = PmiClient(ident, rank, app, None)

    def connect(self, ident: int, sock: socket.socket) -> None:
        """The rank's TCP connection presented the right id: answer as hydra does, then serve it."""
        client = self.by_ident[ident]
        client.sock = sock
        self.clients[sock.fileno()] = client
        self.reply(client, "initack", rc=0)
        for key, value in (("size", self.size), ("rank", client.rank), ("debug", 0)):
            self.reply(client, "set", **{key: value})

    def detach(self, ident: int) -> None:
        """The rank could not start: it takes no part in barriers."""
        client = self.by_ident.pop(ident, None)
        if client is not None and client.sock is not None:
            self.clients.pop(client.sock.fileno(), None)
            client.sock.close()

    def state_of(self, ident: int) -> str:
        client = self.by_ident.get(ident)
        return client.state if client else NEW

    def rank_of(self, client: PmiClient) -> str:
        return str(client.ident) if self.job == 1 else f"{client.ident} (spawned job {self.job})"

    # -- reading ------------------------------------------------------------------------
    def readable(self, fd: int) -> bool:
        """Handle what a rank sent; False when its socket must be dropped (closed or misbehaving)."""
        client = self.clients[fd]
        if client.stalled:
            return False
        try:
            data = client.sock.recv(LINE_MAX)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            if client.state == INITIALIZED and self.on_hangup is not None:
                self.on_hangup(client.ident)  # its peers would wait for it in the next barrier
            return False
        client.buf += data
        try:
            while not client.stalled and self.next_message(client):
                pass
        except ProtocolError as exc:
            return self.refuse(client, str(exc))
        return not client.stalled

    def next_message(self, client: PmiClient) -> bool:
        """Handle one whole message from the client's buffer; False when more bytes are needed."""
        if client.version == 2 or (client.state == NEW and pmi2.looks_like_frame(client.buf)):
            client.version = 2
            got = pmi2.split_frame(client.buf)
            if got is None:
                return False
            body, used = got
            del client.buf[:used]
            self.handle2(client, pmi2.parse_body(body))
            return True
        end = client.buf.find(b"\n")
        if end > LINE_MAX or (end < 0 and len(client.buf) > LINE_MAX):
            raise ProtocolError(f"a line longer than {LINE_MAX} bytes")
        if end < 0:
            return False
        line = bytes(client.buf[:end])
        del client.buf[: end + 1]
        if client.spawn_block is not None:
            self.spawn_line(client, line)
        else:
            self.handle(client, parse_line(line))
        return True

    def drop(self, fd: int) -> None:
        """Forget a rank's socket (the caller has unregistered it from its selector)."""
        client = self.clients.pop(fd, None)
        if client is not None:
            client.sock.close()
            self.node_waits = [w for w in self.node_waits if w[0] is not client]

    def refuse(self, client: PmiClient, why: str) -> bool:
        self.send_up(wire.control("pmi_error", proc=client.ident, error=f"PMI protocol error: {why}"))
        return False

    def reply(self, client: PmiClient, cmd: str, **fields: object) -> None:
        """A PMI-1 line (also the answer to a PMI-2 client's init line)."""
        self.send(client, format_reply(cmd, **fields))

    def send(self, client: PmiClient, data: bytes) -> None:
        """Blocking, but for SEND_TIMEOUT at most: replies are short, so only a rank that does
        not read them makes it wait, and it is then reported (the job ends) and dropped."""
        if client.sock is None or client.stalled or client.sock.fileno() not in self.clients:
            return
        try:
            client.sock.settimeout(SEND_TIMEOUT)
            client.sock.sendall(data)
        except socket.timeout:
            client.stalled = True
            error = f"did not read its PMI replies for {SEND_TIMEOUT:g} s"
            self.send_up(wire.control("pmi_error", proc=client.ident, error=error))
        except OSError:
            pass
        finally:
            try:
                client.sock.setblocking(False)
            except OSError:
                pass

    # -- the commands ---------------------------------------------------------------------
    def handle(self, client: PmiClient, msg: dict[str, str]) -> None:
        cmd = msg["cmd"]
        if cmd == "init":
            if msg.get("pmi_version") == "2":
                client.version = 2  # every later message is a PMI-2 frame
                client.state = INITIALIZED
                self.reply(client, "response_to_init", pmi_version=2, pmi_subversion=0, rc=0)
                return
            if msg.get("pmi_version", "1") != "1":
                self.reply(client, "response_to_init", pmi_version=1, pmi_subversion=1, rc=-1)
                return
            client.state = INITIALIZED
            self.reply(client, "response_to_init", pmi_version=1, pmi_subversion=1, rc=0)
        elif cmd == "get_maxes":
            self.reply(client, "maxes", rc=0, kvsname_max=KVSNAME_MAX, keylen_max=KEYLEN_MAX, vallen_max=VALLEN_MAX)
        elif cmd == "get_appnum":
            self.reply(client, "appnum", rc=0, appnum=client.app)
        elif cmd == "get_my_kvsname":
            self.reply(client, "my_kvsname", rc=0, kvsname=self.kvsname)
        elif cmd == "get_universe_size":
            self.reply(client, "universe_size", rc=0, size=self.universe)
        elif cmd == "put":
            self.put(client, msg)
        elif cmd == "get":
            self.get(client, msg)
        elif cmd == "barrier_in":
            self.barrier_in(client)
        elif cmd == "finalize":
            client.state = FINALIZED
            self.reply(client, "finalize_ack", rc=0)
        elif cmd == "abort":
            self.abort(client, msg.get("exitcode"), msg.get("error_msg", msg.get("msg", "")))
        elif cmd in NAME_RESULTS:
            self.request(client, "pmi_name", cmd=cmd, service=msg.get("service", ""), port=msg.get("port"))
        elif cmd == "spawn":
            client.spawn_block = {}
        else:
            text = f"mpilaunch: rank {self.rank_of(client)} sent unknown PMI command {cmd[:40]!r}"
            self.send_up(wire.control("note", text=text))
            self.reply(client, f"{cmd[:40]}_result", rc=-1, msg="unknown_command")

    def put(self, client: PmiClient, msg: dict[str, str]) -> None:
        key, value = msg.get("key", ""), msg.get("value", "")
        error = "unknown_kvsname" if msg.get("kvsname") != self.kvsname else put_error(key, value)
        if error:
            self.reply(client, "put_result", rc=-1, msg=error)
        else:
            self.pending[key] = value
            self.reply(client, "put_result", rc=0)

    def lookup(self, key: str) -> str | None:
        """A key of the job: put on this host since the last barrier, fenced, or preput."""
        return self.pending.get(key, self.kvs.get(key))

    def get(self, client: PmiClient, msg: dict[str, str]) -> None:
        value = self.lookup(msg.get("key", ""))
        if msg.get("kvsname") != self.kvsname:
            self.reply(client, "get_result", rc=-1, msg="unknown_kvsname")
        elif value is None:
            self.reply(client, "get_result", rc=-1, msg="key_not_found")
        else:
            self.reply(client, "get_result", rc=0, value=value)

    def barrier_in(self, client: PmiClient) -> None:
        if client.in_barrier:
            return
        client.in_barrier = True
        if all(c.in_barrier for c in self.by_ident.values()):
            self.send_up(wire.control("pmi_fence", job=self.job, kvs=self.pending))
            self.kvs.update(self.pending)
            self.pending = {}

    def abort(self, client: PmiClient, code: str | None, message: str) -> None:
        """MPI_Abort: the controller ends the job; the rank gets no answer."""
        number = to_int(code, 1)
        self.send_up(wire.control("pmi_abort", proc=client.ident, code=number, message=message[:VALLEN_MAX]))

    def request(self, client: PmiClient, op: str, thrid: str | None = None, **fields: object) -> None:
        """A job-wide request to the controller; its answer comes back through from_controller."""
        self.next_request += 1
        self.waiting[self.next_request] = (client, thrid)
        self.send_up(wire.control(op, job=self.job, proc=client.ident, req=self.next_request, **fields))

    def spawn(self, client: PmiClient, apps: list[dict], thrid: str | None = None) -> None:
        for app in apps:
            app["spawner"] = self.kvsname  # the new job's ranks learn they were spawned, and by whom
        self.request(client, "pmi_spawn", thrid, apps=apps)

    # -- MPI_Comm_spawn --------------------------------------------------------------------
    def spawn_line(self, client: PmiClient, line: bytes) -> None:
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
            self.reply(client, "spawn_result", rc=-1, errmsg=f"bad_spawn_command:{exc}")
            return
        client.spawn_apps.append(app)
        if so_far < total:
            return
        apps, client.spawn_apps = client.spawn_apps, []
        self.spawn(client, apps)

    # -- answers from the controller -------------------------------------------------------
    def from_controller(self, msg: dict) -> None:
        op = msg["op"]
        if op == "pmi_fence_done":
            self.kvs.update(msg["kvs"])
            for client in self.by_ident.values():
                if client.in_barrier:
                    client.in_barrier = False
                    if client.version == 2:
                        self.send(client, pmi2.response("kvs-fence", client.fence_thrid))
                    else:
                        self.reply(client, "barrier_out", rc=0)
            return
        entry = self.waiting.pop(int(msg["req"]), None)
        if entry is None:
            return
        client, thrid = entry
        if client.version == 2:
            self.answer2(client, thrid, msg)
        elif op == "pmi_name_reply":
            self.reply(client, NAME_RESULTS.get(msg["cmd"], "lookup_result"), **msg["fields"])
        elif msg["rc"] == 0:
            self.reply(client, "spawn_result", rc=0)
        else:
            self.reply(client, "spawn_result", rc=-1, errmsg=str(msg.get("msg", "refused")).replace(" ", "_"))

    # -- PMI-2 ------------------------------------------------------------------------------
    def handle2(self, client: PmiClient, pairs: list[tuple[str, str]]) -> None:
        """One PMI-2 request (MPICH's pmi-2.0 message set); every answer echoes its thrid."""
        msg = pmi2.fields(pairs)
        cmd, thrid = msg["cmd"], msg.get("thrid")

        def answer(rc: int = 0, **fields: object) -> None:
            self.send(client, pmi2.response(cmd, thrid, rc, fields.items()))

        if cmd == "fullinit":  # pmirank is not trusted: the socket says which rank this is
            client.state = INITIALIZED
            spawner = [("spawner-jobid", self.spawner)] if self.spawner else []
            fields = [("pmi-version", 2), ("pmi-subversion", 0), ("rank", client.rank), ("size", self.size)]
            fields += [("appnum", client.app), *spawner, ("debugged", "FALSE"), ("pmiverbose", "FALSE")]
            self.send(client, pmi2.response(cmd, thrid, 0, fields))
        elif cmd == "job-getid":
            answer(jobid=self.kvsname)
        elif cmd == "kvs-put":
            key, value = msg.get("key", ""), msg.get("value", "")
            error = put_error(key, value)
            if error:
                answer(-1, errmsg=error)
            else:
                self.pending[key] = value
                answer()
        elif cmd == "kvs-get":
            value = self.lookup(msg.get("key", ""))
            if msg.get("jobid", self.kvsname) != self.kvsname:
                answer(-1, found="FALSE", errmsg="unknown_jobid")
            else:
                answer(**found(value))
        elif cmd == "kvs-fence":
            client.fence_thrid = thrid
            self.barrier_in(client)
        elif cmd == "info-putnodeattr":
            self.put_node_attr(client, thrid, msg.get("key", ""), msg.get("value", ""))
        elif cmd == "info-getnodeattr":
            key = msg.get("key", "")
            if key not in self.node_attrs and pmi2.is_true(msg.get("wait")):
                self.node_waits.append((client, key, thrid))  # answered by the put
            else:
                answer(**found(self.node_attrs.get(key)))
        elif cmd == "info-getjobattr":
            key = msg.get("key", "")
            answer(**found(str(self.universe) if key == "universeSize" else self.lookup(key)))
        elif cmd == "finalize":
            client.state = FINALIZED
            answer()
        elif cmd == "abort":
            self.abort(client, msg.get("exitcode"), msg.get("message", msg.get("msg", "")))
        elif cmd in NAMES_V2:
            service, port = msg.get("name", ""), msg.get("port")
            self.request(client, "pmi_name", thrid, cmd=NAMES_V2[cmd], service=service, port=port)
        elif cmd == "spawn":
            try:
                apps = pmi2.spawn_apps(pairs)
            except (KeyError, ValueError) as exc:
                answer(-1, errmsg=f"bad_spawn_command:{exc}")
                return
            self.spawn(client, apps, thrid)
        elif cmd in ("job-connect", "job-disconnect"):
            answer(-1, errmsg="not_supported")
        else:
            text = f"mpilaunch: rank {self.rank_of(client)} sent unknown PMI-2 command {cmd[:40]!r}"
            self.send_up(wire.control("note", text=text))
            self.send(client, pmi2.response(cmd[:40], thrid, -1, [("errmsg", "unknown_command")]))

    def put_node_attr(self, client: PmiClient, thrid: str | None, key: str, value: str) -> None:
        error = put_error(key, value)
        if error:
            self.send(client, pmi2.response("info-putnodeattr", thrid, -1, [("errmsg", error)]))
            return
        self.node_attrs[key] = value
        self.send(client, pmi2.response("info-putnodeattr", thrid))
        waiting = [w for w in self.node_waits if w[1] == key]
        self.node_waits = [w for w in self.node_waits if w[1] != key]
        for waiter, _, waiter_thrid in waiting:
            self.send(waiter, pmi2.response("info-getnodeattr", waiter_thrid, 0, found(value).items()))

    def answer2(self, client: PmiClient, thrid: str | None, msg: dict) -> None:
        """The controller's answer to a PMI-2 name or spawn request."""
        if msg["op"] == "pmi_name_reply":
            fields = msg["fields"]
            cmd = {v: k for k, v in NAMES_V2.items()}.get(msg["cmd"], "name-lookup")
            rc = to_int(str(fields.get("rc", -1)), -1)
            out = [("port", fields.get("port", ""))] if rc == 0 and cmd == "name-lookup" else []
            if rc != 0:
                out = [("errmsg", fields.get("msg", "failed"))]
            self.send(client, pmi2.response(cmd, thrid, rc, out))
        elif msg["rc"] == 0:
            self.send(client, pmi2.response("spawn", thrid))
        else:
            self.send(client, pmi2.response("spawn", thrid, -1, [("errmsg", str(msg.get("msg", "refused")))]))


def found(value: str | None) -> dict[str, str]:
    """PMI-2's answer to a lookup: found=TRUE and the value, or found=FALSE."""
    return {"found": "TRUE", "value": value} if value is not None else {"found": "FALSE"}


def put_error(key: str, value: str) -> str | None:
    if not key or len(key) > KEYLEN_MAX:
        return "key_length_out_of_range"
    if len(value) > VALLEN_MAX:
        return "value_too_long"
    return None


def to_int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


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
