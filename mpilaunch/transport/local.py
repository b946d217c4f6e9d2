"""The local host's agent: a forked child joined by a socket pair (no exec, no imports)."""

from __future__ import annotations

import os
import socket
import sys


class LocalLink:
    """A connected agent process on this machine."""

    local = True  # pids it reports are pids here

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.name = "localhost"
        sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self) -> bytes | None:
        """Data, None when there is nothing yet, b'' at end."""
        try:
            return self.sock.recv(1 << 18)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def send(self, frame: bytes) -> None:
        self.sock.setblocking(True)
        try:
            self.sock.sendall(frame)
        finally:
            self.sock.setblocking(False)

    def close(self) -> None:
        self.sock.close()

    def wait(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def start_local_agent() -> LocalLink:
    """Fork an agent; it runs in its own session so terminal signals reach only the controller."""
    ours, theirs = socket.socketpair()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the agent
        status = 1
        try:
            ours.close()
            keep = theirs.fileno()  # no other descriptor of the launcher (an SSH connection) stays open here
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.close(devnull)
            from mpilaunch.agent import serve

            status = serve(theirs)
        except BaseException as exc:
            try:
                print(f"mpilaunch: local agent failed: {exc!r}", file=sys.stderr)
            except Exception:
                pass
        finally:
            os._exit(status)
    theirs.close()
    return LocalLink(ours, pid)
