"""One job's PMI state in an agent, and the steps PMI-1 and PMI-2 share.

Everything a rank can be answered locally is: maxima, appnum, kvsname, universe size, its
host's puts, node attributes and every key fenced so far. Only job-wide steps go up the
link: a barrier once all local ranks of the job entered it (with the puts made since the
last one), abort, the name service and spawn. The controller answers a barrier by sending
every rank's puts to every agent of the job. One server per job: spawned jobs have their
own KVS and barriers.

Each rank picks its version: a PMI-2 client says `cmd=init pmi_version=2` (or starts with a
PMI-2 frame) and is served PMI-2 frames from then on. Both versions share the keys, the
barrier (PMI-1 `barrier_in` and PMI-2 `kvs-fence` are the same step) and the requests to the
controller, so ranks of one job may even speak different versions. What differs (parsing,
the commands, the shape of answers) is in pmi1_serve.py and pmi2_serve.py; pmi_server.py reads
the rank's socket and picks the version.
"""

from __future__ import annotations

import _socket

from mpilaunch.agent.services.pmi1 import NEW, VALLEN_MAX, format_reply, put_error
from mpilaunch.protocol.messages import (
    Note,
    PmiAbort,
    PmiError,
    PmiFence,
    PmiFenceDone,
    PmiJob,
    PmiName,
    PmiSpawn,
    SpawnApp,
)
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

SEND_TIMEOUT = 5.0  # a rank that leaves its replies unread this long is cut off, so the agent never stalls


class PmiClient:
    """One rank's end of the protocol; ident is its process id (unique over the run's jobs)."""

    def __init__(self, ident: int, rank: int, app: int, sock: _socket.socket | None) -> None:
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
        self.spawn_apps: list[SpawnApp] = []  # MPI_Comm_spawn_multiple sends one block per app


class JobState:
    def __init__(
        self,
        job: PmiJob,
        send_up: Callable[[Record], None],
        on_hangup: Callable[[int], None] | None = None,
        on_init: Callable[[int, int], None] | None = None,
    ) -> None:
        self.job = job.job
        self.on_hangup = on_hangup  # told when an initialized rank closes its socket
        self.on_init = on_init  # told (process id, rank) when a rank has initialized
        self.size = job.size
        self.universe = job.universe
        self.kvsname = job.kvsname
        self.send_up = send_up
        self.spawner = job.spawner  # kvsname of the job whose MPI_Comm_spawn made this one
        self.kvs: dict[str, str] = {"PMI_process_mapping": job.mapping, **job.preput}
        self.pending: dict[str, str] = {}
        self.node_attrs: dict[str, str] = {}  # PMI-2 node attributes: shared by this host's ranks of the job
        self.node_waits: list[tuple[PmiClient, str, str | None]] = []  # info-getnodeattr wait=TRUE
        self.clients: dict[int, PmiClient] = {}  # by socket fd
        self.by_ident: dict[int, PmiClient] = {}
        self.waiting: dict[int, tuple[PmiClient, str | None]] = {}  # name and spawn requests by id, with thrid
        self.next_request = 0

    # -- wiring ---------------------------------------------------------------------------
    def attach(self, ident: int, rank: int, app: int) -> tuple[_socket.socket, _socket.socket]:
        """A socket pair for a rank about to start: (ours, the one it inherits as PMI_FD)."""
        ours, theirs = _socket.socketpair()
        ours.setblocking(False)
        client = PmiClient(ident, rank, app, ours)
        self.clients[ours.fileno()] = client
        self.by_ident[ident] = client
        return ours, theirs

    def expect(self, ident: int, rank: int, app: int) -> None:
        """A rank that will connect over TCP (PMI_PORT) and present its PMI_ID."""
        self.by_ident[ident] = PmiClient(ident, rank, app, None)

    def connect(self, ident: int, sock: _socket.socket) -> None:
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

    def state_of(self, ident: int) -> str | None:
        client = self.by_ident.get(ident)
        return client.state if client else None

    def rank_of(self, client: PmiClient) -> str:
        return str(client.ident) if self.job == 1 else f"{client.ident} (spawned job {self.job})"

    def drop(self, fd: int) -> None:
        """Forget a rank's socket (the caller has stopped watching it)."""
        client = self.clients.pop(fd, None)
        if client is not None:
            client.sock.close()  # type: ignore[union-attr]
            self.node_waits = [w for w in self.node_waits if w[0] is not client]

    def reply(self, client: PmiClient, cmd: str, **fields: object) -> None:
        """A PMI-1 line (also the answer to a PMI-2 client's init line)."""
        self.send(client, format_reply(cmd, **fields))

    def send(self, client: PmiClient, data: bytes) -> None:
        """Blocking, but for SEND_TIMEOUT at most: replies are short, so only a rank that does
        not read them makes it wait, and it is then reported (the job ends) and dropped."""
        sock = client.sock
        if sock is None or client.stalled or sock.fileno() not in self.clients:
            return
        try:
            sock.settimeout(SEND_TIMEOUT)
            sock.sendall(data)
        except _socket.timeout:
            client.stalled = True
            self.send_up(PmiError(proc=client.ident, error=f"did not read its PMI replies for {SEND_TIMEOUT:g} s"))
        except OSError:
            pass
        finally:
            try:
                sock.setblocking(False)
            except OSError:
                pass

    def unknown(self, client: PmiClient, cmd: str) -> None:
        """A command neither version knows: the user is told once per request."""
        version = "PMI-2 " if client.version == 2 else "PMI "
        self.send_up(Note(text=f"mpilaunch: rank {self.rank_of(client)} sent unknown {version}command {cmd[:40]!r}"))

    # -- what both versions share ------------------------------------------------------------
    def put(self, key: str, value: str) -> str | None:
        """A key put by a rank of this host (seen by the others at the next barrier); or why not."""
        error = put_error(key, value)
        if error is None:
            self.pending[key] = value
        return error

    def lookup(self, key: str) -> str | None:
        """A key of the job: put on this host since the last barrier, fenced, or preput."""
        return self.pending.get(key, self.kvs.get(key))

    def barrier_in(self, client: PmiClient) -> None:
        """Once every rank of the job here is in: when this host has all of the job's ranks the
        barrier is over and is answered here (no round trip through the launcher); else the
        controller joins every host's puts and answers all of them (fence_done)."""
        if client.in_barrier:
            return
        client.in_barrier = True
        if all(c.in_barrier for c in self.by_ident.values()):
            whole = len(self.by_ident) == self.size
            if not whole:
                self.send_up(PmiFence(job=self.job, kvs=self.pending))
            self.kvs.update(self.pending)
            self.pending = {}
            if whole:
                self.fence_done(PmiFenceDone(job=self.job, kvs={}))

    def abort(self, client: PmiClient, code: str | None, message: str) -> None:
        """MPI_Abort: the controller ends the job; the rank gets no answer."""
        self.send_up(PmiAbort(proc=client.ident, code=to_int(code, 1), message=message[:VALLEN_MAX]))

    def name_request(self, client: PmiClient, thrid: str | None, cmd: str, service: str, port: str | None) -> None:
        """publish_name, unpublish_name or lookup_name: the run's name service is the controller's."""
        req = self._waiting(client, thrid)
        self.send_up(PmiName(job=self.job, proc=client.ident, req=req, cmd=cmd, service=service, port=port))

    def spawn(self, client: PmiClient, apps: list[SpawnApp], thrid: str | None = None) -> None:
        apps = [app._replace(spawner=self.kvsname) for app in apps]  # the new job's ranks learn who spawned them
        self.send_up(PmiSpawn(job=self.job, proc=client.ident, req=self._waiting(client, thrid), apps=apps))

    def _waiting(self, client: PmiClient, thrid: str | None) -> int:
        self.next_request += 1
        self.waiting[self.next_request] = (client, thrid)
        return self.next_request


def to_int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
