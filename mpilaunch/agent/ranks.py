"""The ranks of one agent: started behind a gate, their output sent up, their stdin fed, their
exits reported once their last bytes are out.

An agent can run ranks of several jobs (job 1 and spawned jobs); it knows each rank by its
process id, unique over the run.
"""

from __future__ import annotations

import _signal as signal
import os

from mpilaunch.agent.death import DeathWatch
from mpilaunch.agent.host_os import HostOS
from mpilaunch.agent.loop import WRITE, Loop, Timer
from mpilaunch.agent.services.base import ServiceError
from mpilaunch.host import spawn
from mpilaunch.host.limits import limit_words
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import Exited, Failed, Started, StdinAck

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.services.base import Service, Services
    from mpilaunch.protocol.messages import Death, RankSpec
    from mpilaunch.protocol.record import Record

EXIT_REPORT_DELAY = 0.2  # wait this long for a dead rank's pipes to close before reporting


class RankProcess:
    """One rank as this agent sees it."""

    def __init__(self, ident: int, job: int, pid: int) -> None:
        self.ident = ident
        self.job = job
        self.pid = pid
        self.open_fds: set[int] = set()
        self.stdin_fd: int | None = None
        self.stdin_queue: list[bytes] = []
        self.stdin_eof = False
        self.status: int | None = None
        self.cpu: float | None = None  # user + system seconds, from wait4
        self.rss: int | None = None  # peak resident set in bytes, from wait4
        self.reaped_at = 0.0
        self.reported = False
        self.error_file: str | None = None  # TORCHELASTIC_ERROR_FILE: read when it ends
        self.sent_kill = False  # this agent sent it SIGKILL (a SIGKILL it did not send is looked into)
        self.death: Death | None = None  # how a signal killed it (agent/death.py)


ERROR_FILE_MAX = 1 << 20  # bytes of a rank's error file sent up (a traceback is far less)


def read_error_file(path: str) -> str:
    """What a failed rank left in its error file (torch's @record writes JSON there), or ""."""
    try:
        with open(path, "rb") as handle:
            return handle.read(ERROR_FILE_MAX).decode("utf-8", "replace")
    except OSError:
        return ""


class Ranks(Timer):
    def __init__(
        self,
        loop: Loop,
        send: Callable[[Record], None],
        send_frame: Callable[[bytes], None],
        watch: Callable[[int], None],
        host_os: HostOS | None = None,
    ) -> None:
        self.loop = loop
        self.os = host_os if host_os is not None else HostOS()  # spawn, signal: the seam tests replace
        self.send = send
        self.send_frame = send_frame
        self.watch = watch  # told each rank's pid (the guardian kills it if the agent dies)
        self.services: Services | None = None
        self.by_ident: dict[int, RankProcess] = {}
        self.by_pid: dict[int, RankProcess] = {}
        self.fd_owner: dict[int, tuple[RankProcess, int]] = {}
        self.death = DeathWatch(self.os)  # the memory cgroup of each live rank; how a signal killed one
        self.live = 0  # ranks not reaped yet
        self.unreported: dict[int, RankProcess] = {}  # reaped, their `exited` not sent yet

    # -- starting ------------------------------------------------------------------------
    def spawn(
        self,
        job: int,
        spec: RankSpec,
        env: dict[str, str],
        merge: bool,
        cpus: list[int] | None,
        gate: spawn.Gate,
        services: list[Service],
        found: dict[tuple[str, str | None], str] | None = None,
    ) -> bool:
        """Start one rank behind the gate; False (and a `failed` report) if it could not. found:
        the programs this launch has looked up (host/spawn.start)."""
        passed: list[int] = []
        try:
            for service in services:
                passed += service.prepare(job, spec, env)
        except ServiceError as exc:
            for service in services:
                service.not_spawned(job, spec)
            self.send(Failed(proc=spec.proc, error=str(exc), code=126))
            return False
        try:
            started = self.os.start(
                spec.argv, env, spec.wdir or None, stdin=spec.stdin, merge=merge, pass_fds=passed, gate=gate,
                cpus=cpus, found=found,
            )  # fmt: skip
        except (OSError, NotImplementedError) as exc:  # NotImplementedError: posix_spawn without setsid (glibc < 2.26)
            for service in services:
                service.not_spawned(job, spec)
            limit = limit_words(exc)  # this host's limit, not the program's fault: the launcher's status 2
            if limit is not None:
                self.send(Failed(proc=spec.proc, error=limit, code=2))
                return False
            reason = getattr(exc, "strerror", None) or str(exc)
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self.send(Failed(proc=spec.proc, error=f"{spec.argv[0]}: {reason}", code=code))
            return False
        for service in services:
            service.spawned(job, spec, started.pid)
        self.watch(started.pid)
        self.death.spawned(started.pid, spec.wdir)
        rp = RankProcess(spec.proc, job, started.pid)
        rp.error_file = env.get("TORCHELASTIC_ERROR_FILE")
        self.by_ident[spec.proc] = rp
        self.by_pid[started.pid] = rp
        self.live += 1
        for stream, fd in ((wire.STDOUT, started.stdout), (wire.STDERR, started.stderr)):
            if fd is not None:
                rp.open_fds.add(fd)
                self.fd_owner[fd] = (rp, stream)
                self.loop.watch(fd, self.read_output)
        if started.stdin is not None:
            rp.stdin_fd = started.stdin
            os.set_blocking(rp.stdin_fd, False)
        self.send(Started(proc=spec.proc, pid=started.pid))
        return True

    # -- output and stdin ----------------------------------------------------------------
    def read_output(self, fd: int) -> None:
        rp, stream = self.fd_owner[fd]
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        if data:
            self.send_frame(wire.output(rp.ident, stream, data))
            return
        self.loop.unwatch(fd)
        del self.fd_owner[fd]
        rp.open_fds.discard(fd)
        os.close(fd)
        self.maybe_report(rp, self.os.clock())

    def queue_stdin(self, ident: int, data: bytes) -> None:
        rp = self.by_ident.get(ident)
        if rp is None or rp.stdin_fd is None:
            if data:
                self.send(StdinAck(n=len(data)))
            return
        if not data:
            rp.stdin_eof = True
        else:
            rp.stdin_queue.append(data)
        self.write_stdin(rp)

    def write_stdin(self, rp: RankProcess) -> None:
        written = 0
        fd = rp.stdin_fd
        assert fd is not None
        try:
            while rp.stdin_queue:
                chunk = rp.stdin_queue[0]
                n = os.write(fd, chunk)
                written += n
                if n < len(chunk):
                    rp.stdin_queue[0] = chunk[n:]
                    break
                rp.stdin_queue.pop(0)
        except BlockingIOError:
            pass
        except OSError:  # the rank closed its stdin or exited: drop what it will never read
            written += sum(len(c) for c in rp.stdin_queue)
            rp.stdin_queue.clear()
            rp.stdin_eof = True
        if written:
            self.send(StdinAck(n=written))
        self._update_stdin_interest(rp)

    def _update_stdin_interest(self, rp: RankProcess) -> None:
        fd = rp.stdin_fd
        if fd is None:
            return
        registered = self.loop.watched(fd)
        if rp.stdin_queue and not registered:
            self.loop.watch(fd, lambda _fd, rp=rp: self.write_stdin(rp), WRITE)
        elif not rp.stdin_queue:
            if registered:
                self.loop.unwatch(fd)
            if rp.stdin_eof:
                os.close(fd)
                rp.stdin_fd = None

    # -- exits ---------------------------------------------------------------------------
    def reaped(self, pid: int, status: int, usage: os.struct_rusage) -> bool:
        """pid was reaped: True if it was one of our live ranks (now recorded as ended)."""
        rp = self.by_pid.get(pid)
        if rp is None or rp.status is not None:
            return False
        rp.status = os.waitstatus_to_exitcode(status)
        rp.cpu = round(usage.ru_utime + usage.ru_stime, 6)
        rp.rss = usage.ru_maxrss * 1024  # kilobytes on Linux
        rp.death = self.death.ended(pid, status, rp.sent_kill, rp.rss)
        rp.reaped_at = self.os.clock()
        self.live -= 1
        self.unreported[rp.ident] = rp
        if rp.stdin_fd is not None:
            dropped = sum(len(c) for c in rp.stdin_queue)
            rp.stdin_queue.clear()
            rp.stdin_eof = True
            if dropped:
                self.send(StdinAck(n=dropped))
            self._update_stdin_interest(rp)
        self.maybe_report(rp, rp.reaped_at)
        if self.services is not None:
            self.services.exited(rp.job, rp.ident)
        return True

    def maybe_report(self, rp: RankProcess, now: float) -> None:
        """`exited` once the rank's pipes are closed (its last output is out), or EXIT_REPORT_DELAY
        after it was reaped if something else (a child of it) still holds them."""
        if rp.reported or rp.status is None:
            return
        if rp.open_fds and now - rp.reaped_at < EXIT_REPORT_DELAY:
            return
        rp.reported = True
        del self.unreported[rp.ident]
        state = self.services.state_of(rp.job, rp.ident) if self.services is not None else "new"
        error = read_error_file(rp.error_file) if rp.status and rp.error_file else ""
        exited = Exited(proc=rp.ident, status=rp.status, mpi=state, cpu=rp.cpu, rss=rp.rss, death=rp.death)
        self.send(exited._replace(error=error, error_file=rp.error_file if error else ""))

    def next_deadline(self) -> float | None:
        if not self.unreported:
            return None
        return min(rp.reaped_at for rp in self.unreported.values()) + EXIT_REPORT_DELAY

    def tick(self, now: float) -> None:
        for rp in list(self.unreported.values()):
            self.maybe_report(rp, now)

    # -- signals and questions -----------------------------------------------------------------
    def signal_all(self, sig: int) -> None:
        """Signal the process group of every rank not yet reaped (its pid cannot have been reused)."""
        for rp in self.by_ident.values():
            if rp.status is None:
                rp.sent_kill = rp.sent_kill or sig == signal.SIGKILL
                self.os.killpg(rp.pid, sig)

    def running(self, ident: int) -> bool:
        rp = self.by_ident.get(ident)
        return rp is not None and rp.status is None

    def is_live(self, pid: int) -> bool:
        """pid is a rank of ours that has not been reaped."""
        rp = self.by_pid.get(pid)
        return rp is not None and rp.status is None

    def any(self) -> bool:
        return bool(self.by_ident)

    def any_live(self) -> bool:
        return self.live > 0

    def live_pids(self) -> list[int]:
        return [rp.pid for rp in self.by_pid.values() if rp.status is None]

    def all_done(self) -> bool:
        """Every rank reaped and its pipes closed."""
        return all(rp.status is not None and not rp.open_fds for rp in self.by_ident.values())
