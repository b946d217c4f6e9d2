"""The local host's agent: a forked child joined by a socket pair (no exec, no imports).

Both ends are `_socket.socket`s, the C type under `socket.socket`: neither side needs anything
else of the socket module, whose set-up (its enums) would be on every start's path, the
launcher's and the agent's (an agent imports it only to serve PMI over TCP or PMIx).
"""

from __future__ import annotations

import _socket
import os
import select
import sys

from mpilaunch.errors import LaunchError
from mpilaunch.transport.base import HostResult, Link, Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


class LocalLink(Link):
    """A connected agent process on this machine, forked by the launcher: no shell started it,
    it is sent no Check (the launcher checks this machine's programs itself), and its Hello is
    not waited for (its launch goes right behind it, and the controller reads the Hello)."""

    local = True
    marked = False
    await_hello = False

    def __init__(self, sock: _socket.socket, pid: int) -> None:
        super().__init__("localhost")
        self.sock = sock
        self.pid = pid
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

    def readable(self) -> bool:
        return bool(select.select([self.sock], [], [], 0)[0])

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


class LocalTransport(Transport):
    """This machine's agents: forked children of the launcher. One may be forked early
    (prestart), before the command line is parsed: its imports and set-up (subreaper, guardian,
    PMI server) then run on another core while the launcher imports and plans, instead of
    after it; the first agent asked for is that one. Forking this early is sound because the
    launcher never changes its environment or working directory afterwards: the agent has the
    same as a later fork would."""

    name = "local"

    def __init__(self) -> None:
        self.early: LocalLink | None = None  # forked by prestart, not taken yet
        self.ending: list[LocalLink] = []  # early agents told to stop, reaped before the launcher leaves

    def start(self, hosts: Mapping[int, object]) -> dict[int, HostResult]:
        results = {}
        for index in sorted(hosts):
            results[index] = HostResult(index)
            results[index].link = self.agent()
        return results

    def agent(self) -> LocalLink:
        """One agent here: the one forked early, or a new one."""
        link, self.early = self.early, None
        return link if link is not None else _fork_agent()

    def prestart(self, pmix_guess: Callable[[], tuple[str | None, str | None] | None] | None = None) -> None:
        """Fork the next agent now, with the descriptor limit raised first (its ranks inherit
        it). pmix_guess, called in the agent, says whether to start a PMIx server already
        (cli/pmix_guess.py)."""
        if self.early is None:
            raise_fd_limit()
            # Both sides need these: imported once, here, the agent gets them with the fork.
            import selectors  # noqa: F401
            import signal  # noqa: F401

            from mpilaunch.host import programs  # noqa: F401
            from mpilaunch.protocol import messages, wire  # noqa: F401

            try:
                self.early = _fork_agent(pmix_guess)
            except LaunchError:  # a limit of this host: the launch forks again and says why it cannot
                self.early = None

    def discard(self, wait: bool = True) -> None:
        """The job did not take the agent forked early (a refused command line, a remote-only
        job): end it. wait=False leaves the reaping to the next call with wait (entry.main makes
        one before the launcher exits), so a remote-only job starts its connections at once
        instead of waiting for the agent to finish its own start and stop."""
        link, self.early = self.early, None
        if link is not None:
            link.close()  # the agent stops at the end of its link
            self.ending.append(link)
        while wait and self.ending:
            self.ending.pop().wait()


def raise_fd_limit() -> None:
    """Log files need two descriptors per rank; lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _fork_agent(pmix_guess: Callable[[], tuple[str | None, str | None] | None] | None = None) -> LocalLink:
    """Fork an agent; it runs in its own session so terminal signals reach only the controller.
    It keeps no descriptor of the launcher's but its socket: an agent holding the launcher's
    connection to a remote sshd would keep it open after a kill -9 of the launcher, and the
    remote agent would never see the end of its link (launch.probe forks this machine's agent
    before any connection too). A limit of this host (`ulimit -u`, `ulimit -n`) that refuses
    the fork or the socket pair is a LaunchError that names it."""
    try:
        ours, theirs = _socket.socketpair()
    except OSError as exc:
        raise _cannot_start(exc) from None
    for stream in (sys.stdout, sys.stderr):  # nothing buffered may be written twice
        if stream is not None:
            stream.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        raise _cannot_start(exc) from None
    if pid == 0:  # the agent
        status = 1
        try:
            import _signal

            _signal.set_wakeup_fd(-1)  # the launcher's signal pipe closes below, and its number is reused
            ours.close()
            keep = theirs.fileno()  # no other descriptor of the launcher (an SSH connection) stays open here
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.close(devnull)
            from mpilaunch.agent.agent import serve

            status = serve(theirs, pmix_guess)
        except BaseException as exc:
            try:
                print(f"mpilaunch: local agent failed: {exc!r}", file=sys.stderr)
            except Exception:
                pass
        finally:
            os._exit(status)
    theirs.close()
    return LocalLink(ours, pid)


def _cannot_start(exc: OSError) -> LaunchError:
    from mpilaunch.host.limits import limit_words

    return LaunchError(f"cannot start this machine's agent: {limit_words(exc) or exc.strerror or exc}")
