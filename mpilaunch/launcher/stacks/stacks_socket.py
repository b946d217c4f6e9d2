"""How `mpilaunch stacks` finds a running job: a Unix socket of the job's own, named by the
launcher's pid, in a directory of the user's that nobody else may enter.

The directory is `$XDG_RUNTIME_DIR/mpilaunch` where that variable names a directory (systemd
makes it per user, mode 0700), else `/tmp/mpilaunch-UID`. It is made with mode 0700 and used only
when it is a real directory (not a symbolic link) owned by this user with no access for group or
others: anything else is refused, said once, and the job runs without the socket. Each run
binds `DIR/PID.sock` when it starts and removes it when it ends; a launcher killed with
`kill -9` leaves its socket, which `mpilaunch stacks` finds refused and removes. The job also
checks that whoever connects runs as the same user (SO_PEERCRED).

A request is one line of JSON: `{"op": "stacks", "pid": N}` (with `"ranks": [[JOB, RANK], ...]`
for those ranks' stacks alone), answered with the stacks as text, or `{"op": "top"}`, answered
with what every rank uses (launcher/stacks/usage.py) as one JSON document; then the end of the
connection. Requests that come while a snapshot is taken join it
(launcher/stacks/snapshots.py), so many at once cost one snapshot; the queue holds BACKLOG connections
and the client tries again while it is full (cli/stackscli.py). The loop never waits on a
client: its socket is non-blocking and written as it takes the text. `_socket` only: the
launcher does not import `socket`.
"""

from __future__ import annotations

import _socket
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from selectors import BaseSelector

SUFFIX = ".sock"
MAX_REQUEST = 4096
BACKLOG = 128  # connections the kernel holds for the loop: many `mpilaunch stacks` may ask at once


def socket_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return os.path.join(runtime, "mpilaunch")
    return f"/tmp/mpilaunch-{os.geteuid()}"


def dir_problem(path: str, create: bool) -> str:
    """'' when path is a directory of this user's that nobody else may enter; else why it is not
    to be used (made first, mode 0700, when create)."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"cannot make {path}: {exc.strerror}"
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != os.geteuid():
        return f"{path} belongs to uid {info.st_uid}, not to you"
    if info.st_mode & 0o077:
        return f"{path} is open to others (mode {stat.S_IMODE(info.st_mode):o}; 700 expected)"
    return ""


def peer_uid(conn: _socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (Linux's SO_PEERCRED)."""
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder)


class Client:
    """One `mpilaunch stacks` connected to the job: its request, then the answer written out."""

    def __init__(self, conn: _socket.socket, sel: BaseSelector) -> None:
        self.conn = conn
        self.sel = sel
        self.request = b""
        self.op = ""
        self.pid = 0  # the asker's, as it said
        self.ranks: set[tuple[int, int]] = set()  # (job, rank) it asks about; empty: every one
        self.out = b""

    def reply(self, text: str) -> None:
        self.out = text.encode("utf-8", "surrogateescape")
        if self.conn.fileno() >= 0:
            self.sel.register(self.conn, 2, self.write)  # selectors.EVENT_WRITE

    def write(self, fd: int) -> None:
        try:
            sent = self.conn.send(self.out[: 1 << 16])
        except BlockingIOError:
            return
        except OSError:
            sent = len(self.out)  # it went away: nothing more to give it
        self.out = self.out[sent:]
        if not self.out:
            self.close()

    def close(self) -> None:
        try:
            self.sel.unregister(self.conn)
        except (KeyError, ValueError):
            pass
        self.conn.close()


class StacksServer:
    def __init__(self, sel: BaseSelector, asked: Mapping[str, Callable[[Client], None]]) -> None:
        self.sel = sel
        self.asked = asked  # op -> called with each client whose request is read
        self.path = ""
        self.listener: _socket.socket | None = None
        self.clients: list[Client] = []

    def open(self) -> str:
        """Bind the job's socket; '' or why it could not be (the job runs on without it)."""
        folder = socket_dir()
        problem = dir_problem(folder, create=True)
        if problem:
            return problem
        path = os.path.join(folder, f"{os.getpid()}{SUFFIX}")
        listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            try:
                os.unlink(path)  # a pid is unique among the running: this one's is left from a dead run
            except FileNotFoundError:
                pass
            listener.bind(path)
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except OSError as exc:
            listener.close()
            return f"cannot listen on {path}: {exc.strerror}"
        self.listener, self.path = listener, path
        self.sel.register(listener, 1, self.accept)  # selectors.EVENT_READ
        return ""

    def accept(self, fd: int) -> None:
        assert self.listener is not None
        try:
            conn_fd, _ = self.listener._accept()  # type: ignore[attr-defined]
        except OSError:
            return
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, conn_fd)
        conn.setblocking(False)
        try:
            uid = peer_uid(conn)
        except OSError:
            uid = -1
        if uid != os.geteuid():  # the folder keeps others out; this says so again
            conn.close()
            return
        client = Client(conn, self.sel)
        self.clients.append(client)
        self.sel.register(conn, 1, lambda fd, c=client: self.read(c))

    def read(self, client: Client) -> None:
        try:
            data = client.conn.recv(MAX_REQUEST)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        client.request += data
        if data and b"\n" not in client.request and len(client.request) < MAX_REQUEST:
            return
        import json  # only when someone asks: a plain run does not import it

        try:
            request = json.loads(client.request.split(b"\n", 1)[0])
            ok = isinstance(request, dict) and request.get("op") in self.asked
            ranks = request.get("ranks", []) if ok else []
            ok = ok and isinstance(ranks, list) and all(_is_rank(r) for r in ranks)
        except ValueError:
            ok = False
        if not ok:
            self.clients.remove(client)
            client.close()
            return
        client.op = request["op"]
        client.pid = request.get("pid") if isinstance(request.get("pid"), int) else 0
        client.ranks = {(job, rank) for job, rank in ranks}
        self.sel.unregister(client.conn)  # nothing more is read from it; the answer is written when ready
        self.asked[client.op](client)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()
        if self.listener is not None:
            try:
                self.sel.unregister(self.listener)
            except (KeyError, ValueError):
                pass
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _is_rank(value: object) -> bool:
    """[JOB, RANK], two whole numbers."""
    return isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)
