"""PMI-1 served by an agent to its own ranks over inherited socket pairs (PMI_FD).

Everything a rank can be answered locally is: maxima, appnum, kvsname, universe size, its
host's puts and every key fenced so far. Only job-wide steps go up the link: a barrier once
all local ranks entered it (with the puts made since the last one), abort, and the name
service. The controller answers a barrier by sending every rank's puts to every agent.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from mpilaunch import wire
from mpilaunch.pmi.simple import KEYLEN_MAX, KVSNAME_MAX, LINE_MAX, VALLEN_MAX, ProtocolError, format_reply, parse_line

NEW, INITIALIZED, FINALIZED = "new", "init", "finalized"


class PmiClient:
    """One rank's end of the protocol."""

    def __init__(self, rank: int, app: int, sock: socket.socket) -> None:
        self.rank = rank
        self.app = app
        self.sock = sock
        self.buf = bytearray()
        self.state = NEW
        self.in_barrier = False


class PmiService:
    def __init__(self, job: dict, send_up: Callable[[bytes], None]) -> None:
        self.size = int(job["size"])
        self.universe = int(job["universe"])
        self.kvsname = str(job["kvsname"])
        self.mapping = str(job["mapping"])
        self.send_up = send_up
        self.kvs: dict[str, str] = {"PMI_process_mapping": self.mapping}
        self.pending: dict[str, str] = {}
        self.clients: dict[int, PmiClient] = {}  # by socket fd
        self.by_rank: dict[int, PmiClient] = {}
        self.waiting: dict[int, PmiClient] = {}  # name-service requests by id
        self.next_request = 0

    # -- wiring ---------------------------------------------------------------------------
    def attach(self, rank: int, app: int) -> tuple[socket.socket, socket.socket]:
        """A socket pair for a rank about to start: (ours, the one it inherits as PMI_FD)."""
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        client = PmiClient(rank, app, ours)
        self.clients[ours.fileno()] = client
        self.by_rank[rank] = client
        return ours, theirs

    def detach(self, rank: int) -> None:
        """The rank could not start: it takes no part in barriers."""
        client = self.by_rank.pop(rank, None)
        if client is not None:
            self.clients.pop(client.sock.fileno(), None)
            client.sock.close()

    def state_of(self, rank: int) -> str:
        client = self.by_rank.get(rank)
        return client.state if client else NEW

    # -- reading ------------------------------------------------------------------------
    def readable(self, fd: int) -> bool:
        """Handle what a rank sent; False when its socket must be dropped (closed or misbehaving)."""
        client = self.clients[fd]
        try:
            data = client.sock.recv(LINE_MAX)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            if client.state == INITIALIZED:  # its peers would wait for it in the next barrier
                self.send_up(
                    wire.control("pmi_error", rank=client.rank, error="closed its PMI connection before finalize")
                )
            return False
        client.buf += data
        while True:
            end = client.buf.find(b"\n")
            if end < 0:
                if len(client.buf) > LINE_MAX:
                    return self.refuse(client, f"a line longer than {LINE_MAX} bytes")
                return True
            line = bytes(client.buf[:end])
            del client.buf[: end + 1]
            try:
                self.handle(client, parse_line(line))
            except ProtocolError as exc:
                return self.refuse(client, str(exc))

    def drop(self, fd: int) -> None:
        """Forget a rank's socket (the caller has unregistered it from its selector)."""
        client = self.clients.pop(fd, None)
        if client is not None:
            client.sock.close()

    def refuse(self, client: PmiClient, why: str) -> bool:
        self.send_up(wire.control("pmi_error", rank=client.rank, error=f"PMI protocol error: {why}"))
        return False

    def reply(self, client: PmiClient, cmd: str, **fields: object) -> None:
        try:
            client.sock.sendall(format_reply(cmd, **fields))
        except BlockingIOError:
            client.sock.setblocking(True)  # replies are short; a rank that does not read them stalls only itself
            try:
                client.sock.sendall(format_reply(cmd, **fields))
            finally:
                client.sock.setblocking(False)
        except OSError:
            pass

    # -- the commands ---------------------------------------------------------------------
    def handle(self, client: PmiClient, msg: dict[str, str]) -> None:
        cmd = msg["cmd"]
        if cmd == "init":
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
            code = msg.get("exitcode", "1")
            self.send_up(
                wire.control(
                    "pmi_abort",
                    rank=client.rank,
                    code=int(code) if code.lstrip("-").isdigit() else 1,
                    message=msg.get("error_msg", msg.get("msg", ""))[:VALLEN_MAX],
                )
            )
        elif cmd in ("publish_name", "unpublish_name", "lookup_name"):
            self.name_request(client, cmd, msg)
        else:
            self.send_up(
                wire.control("note", text=f"mpilaunch: rank {client.rank} sent unknown PMI command {cmd[:40]!r}")
            )
            self.reply(client, f"{cmd[:40]}_result", rc=-1, msg="unknown_command")

    def put(self, client: PmiClient, msg: dict[str, str]) -> None:
        key, value = msg.get("key", ""), msg.get("value", "")
        if msg.get("kvsname") != self.kvsname:
            self.reply(client, "put_result", rc=-1, msg="unknown_kvsname")
        elif not key or len(key) > KEYLEN_MAX:
            self.reply(client, "put_result", rc=-1, msg="key_length_out_of_range")
        elif len(value) > VALLEN_MAX:
            self.reply(client, "put_result", rc=-1, msg="value_too_long")
        else:
            self.pending[key] = value
            self.reply(client, "put_result", rc=0)

    def get(self, client: PmiClient, msg: dict[str, str]) -> None:
        key = msg.get("key", "")
        value = self.pending.get(key, self.kvs.get(key))
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
        if all(c.in_barrier for c in self.by_rank.values()):
            self.send_up(wire.control("pmi_fence", kvs=self.pending))
            self.kvs.update(self.pending)
            self.pending = {}

    def fence_done(self, kvs: dict[str, str]) -> None:
        """The controller saw every host enter the barrier: here are all keys put before it."""
        self.kvs.update(kvs)
        for client in self.by_rank.values():
            if client.in_barrier:
                client.in_barrier = False
                self.reply(client, "barrier_out", rc=0)

    def name_request(self, client: PmiClient, cmd: str, msg: dict[str, str]) -> None:
        self.next_request += 1
        self.waiting[self.next_request] = client
        self.send_up(
            wire.control(
                "pmi_name", req=self.next_request, cmd=cmd, service=msg.get("service", ""), port=msg.get("port")
            )
        )

    def name_reply(self, req: int, cmd: str, fields: dict[str, object]) -> None:
        client = self.waiting.pop(req, None)
        if client is not None and client.sock.fileno() in self.clients:
            result = {"publish_name": "publish_result", "unpublish_name": "unpublish_result"}.get(cmd, "lookup_result")
            self.reply(client, result, **fields)
