"""Per-host supervisor: spawns that host's ranks, relays their output, kills them.

Stdlib only: for remote hosts this module is shipped over the link and run by a bare
Python 3. It exits, killing its ranks, when its link to the controller closes.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable

from mpilaunch.agent.relay import Relay
from mpilaunch.agent.services.pmi import PmiService
from mpilaunch.host import hostinfo, spawn
from mpilaunch.host.binding import cpu_groups, cpus_for
from mpilaunch.host.mpi_family import OpenMpiWatch
from mpilaunch.host.programs import merge_host_environment, probe_port, program_problem
from mpilaunch.protocol import wire

EXIT_REPORT_DELAY = 0.2  # wait this long for a dead rank's pipes to close before reporting
HANGUP_GRACE = 0.5  # a rank that closed its PMI socket early has this long to exit instead
ORPHAN_GRACE = 1.0  # grace between SIGTERM and SIGKILL when the controller is gone
ADOPTION_SCAN = 0.5  # seconds between looks for orphans we adopted (told to the guardian)
SWEEP_LIMIT = 2.0  # the last sweep kills re-parented descendants, round after round, this long at most
MAX_REFUSED = 16  # wrong PMI_IDs before the TCP PMI port is closed
PR_SET_CHILD_SUBREAPER = 36
FORGET = 1 << 31  # in a pid told to the guardian: that rank is gone


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Affinity:
    """Bind the next child by binding ourselves around its fork: the child inherits the mask, so
    it is bound from its first instruction, and no Python runs in the child (which would cost a
    full fork instead of vfork: 3 ms instead of 0.6 ms a rank)."""

    def __init__(self, cpus: list[int] | None) -> None:
        self.cpus = cpus
        self.saved: set[int] | None = None

    def __enter__(self) -> None:
        if self.cpus:
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cpus)

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            os.sched_setaffinity(0, self.saved)


class Guardian:
    """A forked watcher that kills the ranks' process groups if this agent dies without doing so
    (kill -9): ranks run in sessions of their own, so nothing else would reach them. Without
    preexec_fn there is no PR_SET_PDEATHSIG for the ranks, and this costs one fork per host."""

    def __init__(self) -> None:
        read_fd, self.fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(self.fd)
                _guard(read_fd)
            finally:
                os._exit(0)
        os.close(read_fd)

    def watch(self, pid: int) -> None:
        """A rank, or an orphan we adopted: kill it and its process group if the agent dies."""
        self._tell(pid)

    def forget(self, pid: int) -> None:
        """The rank was reaped: its pid (and process group id) may be reused by anyone now."""
        self._tell(pid | FORGET)

    def _tell(self, value: int) -> None:
        try:
            os.write(self.fd, value.to_bytes(4, "big"))
        except OSError:
            pass

    def release(self) -> None:
        """Every rank is gone: the guardian leaves without killing anything, and is reaped here,
        so that nothing of the agent's session outlives it (not even a zombie for init)."""
        try:
            os.write(self.fd, bytes(4))
            os.close(self.fd)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)  # it exits as soon as it reads the zero (or sees the pipe close)
        except ChildProcessError:  # reaped already
            pass


def _guard(read_fd: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    os.closerange(3, read_fd)  # not the link: the controller must see the agent's end
    os.closerange(read_fd + 1, 1 << 16)
    groups: set[int] = set()
    buf = b""
    while True:
        try:
            data = os.read(read_fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            _kill_recorded(groups)
            return
        buf += data
        while len(buf) >= 4:
            pid, buf = int.from_bytes(buf[:4], "big"), buf[4:]
            if pid == 0:
                return
            if pid & FORGET:
                groups.discard(pid & ~FORGET)
            else:
                groups.add(pid)


def _kill_recorded(pids: set[int]) -> None:
    """The agent died: SIGKILL each recorded process (a rank, or an orphan the agent adopted) with
    its process group (a rank's is its pid; an orphan's may be a dead rank's group)."""
    own = os.getpgrp()  # the agent's group: never ours to kill
    for pid in pids:
        try:
            group = os.getpgid(pid)
        except OSError:
            group = pid
        for pgid in {pid, group} - {own}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class RankProcess:
    """One rank as this agent sees it, known by its process id (unique over the run's jobs)."""

    def __init__(self, ident: int, job: int, pid: int) -> None:
        self.ident = ident
        self.job = job
        self.pid = pid
        self.open_fds: set[int] = set()
        self.stdin_fd: int | None = None
        self.stdin_queue: list[bytes] = []
        self.stdin_eof = False
        self.status: int | None = None
        self.reaped_at = 0.0
        self.reported = False


class PipeLink:
    """The link of a remote agent: its stdin and stdout, which sshd joins to the SSH channel.

    A send waits while the launcher does not read (its console is paused, say). Every
    stall_every seconds of that wait it calls on_stall: a relay pings its children from
    there, or an idle child would take the silence for a lost launcher."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        os.set_blocking(write_fd, False)
        self.stall_every = 5.0
        self.on_stall: Callable[[], None] | None = None

    def fileno(self) -> int:
        return self.read_fd

    def recv(self, size: int) -> bytes:
        return os.read(self.read_fd, size)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.write_fd, view) :]
            except BlockingIOError:
                select.select([], [self.write_fd], [], self.stall_every)
                if self.on_stall is not None:
                    self.on_stall()  # after every wait: a slow reader stalls a long send too


class Agent:
    def __init__(self, link: socket.socket | PipeLink, payload: bytes | None = None) -> None:
        self.link = link
        self.payload = payload  # the loader and modules this agent came with (remote agents)
        self.relay: Relay | None = None  # tree spawn: the hosts this agent started
        if isinstance(link, PipeLink):
            link.on_stall = self.ping_children
        self.host_env: dict[str, str] = dict(os.environ)  # a remote host's is merged with the launcher's paths
        self.sel = selectors.DefaultSelector()
        self.decoder = wire.Decoder()
        self.ranks: dict[int, RankProcess] = {}
        self.by_pid: dict[int, RankProcess] = {}
        self.fd_owner: dict[int, tuple[RankProcess, int]] = {}
        self.kill_deadline: float | None = None
        self.link_open = True
        self.finishing = False
        self.stop_requested = False
        self.pmi: dict[int, PmiService] = {}  # by job
        self.pmi_fds: dict[int, PmiService] = {}  # by rank socket
        self.hangups: dict[int, float] = {}  # process id -> when it closed its PMI socket early
        self.pmi_tcp = False
        self.refused = 0  # TCP PMI connections that presented a wrong id
        self.pmi_listener: socket.socket | None = None
        self.pmi_ids: dict[int, tuple[PmiService, int]] = {}  # secret PMI_ID -> (service, process id)
        self.pmi_hello: dict[int, tuple[socket.socket, bytearray]] = {}  # TCP clients yet to present an id
        self.host = socket.gethostname()
        self.open_mpi = OpenMpiWatch()  # ranks that may be Open MPI singletons
        self.guardian: Guardian | None = None
        self.heartbeat: float | None = None  # remote agents: seconds of silence before the launcher counts as gone
        self.heard = time.monotonic()
        self.next_ping = 0.0
        self.next_relay_ping = 0.0  # tree spawn: when our children are pinged next
        self.orphans: set[int] = set()  # adopted orphans the guardian was told about
        self.next_adoption_scan = 0.0

    # -- sending -------------------------------------------------------------------------
    def send(self, frame: bytes) -> None:
        if not self.link_open:
            return
        try:
            self.link.sendall(frame)
        except OSError:
            self.link_lost()

    def link_lost(self) -> None:
        """The controller is gone: nobody will read output or decide policy any more."""
        if self.link_open:
            self.link_open = False
            try:
                self.sel.unregister(self.link)
            except (KeyError, ValueError):
                pass
            self.terminate_all(ORPHAN_GRACE)
            self.finishing = True
            if self.relay is not None:
                self.relay.close_all()  # their agents stop as this one does

    # -- launching -----------------------------------------------------------------------
    def launch(self, msg: dict) -> None:
        base = {
            k: v
            for k, v in self.host_env.items()
            if k not in msg.get("drop_names", ()) and not k.startswith(tuple(msg.get("drop_prefixes", ())))
        }
        job = int(msg.get("job", 1))
        self.pmi_tcp = bool(msg.get("pmi") and msg["pmi"].get("tcp"))
        if msg.get("pmi") and job not in self.pmi:
            self.pmi[job] = PmiService(msg["pmi"], self.send, self.pmi_hangup)
        bind_to = msg.get("bind_to", "none")
        groups = cpu_groups(bind_to) if bind_to != "none" else []
        merge = bool(msg.get("merge"))
        gate = spawn.Gate()  # the ranks of this launch start together, once all are spawned
        started = 0
        try:
            for spec in msg["ranks"]:
                cpus = cpus_for(bind_to, spec["local_rank"], groups)
                if msg.get("report_bindings"):
                    where = f"bound to CPUs {','.join(map(str, cpus))}" if cpus else "not bound"
                    note = f"[{self.host}:{os.getpid()}] MCW rank {spec['rank']} {where}"
                    self.send(wire.control("note", text=note))
                started += self.spawn(job, spec, base, merge, cpus, gate)
        finally:
            gate.release(started)

    def spawn(
        self, job: int, spec: dict, base: dict[str, str], merge: bool, cpus: list[int] | None, gate: spawn.Gate
    ) -> bool:
        """Start one rank behind the gate; False (and a `failed` report) if it could not."""
        env = dict(base)
        env.update(spec["env"])
        ident = spec["proc"]
        service = self.pmi.get(job)
        pmi_pair = None
        if service is not None and self.pmi_tcp:
            secret = self.new_pmi_id()
            service.expect(ident, spec["rank"], spec.get("app", 0))
            self.pmi_ids[secret] = (service, ident)
            env["PMI_PORT"] = f"127.0.0.1:{self.pmi_port()}"
            env["PMI_ID"] = str(secret)
        elif service is not None:
            pmi_pair = service.attach(ident, spec["rank"], spec.get("app", 0))
            env["PMI_FD"] = str(pmi_pair[1].fileno())
        if service is not None:
            for name, value in self.open_mpi.rank_env().items():
                env.setdefault(name, value)  # a user's -mca or -x wins
        try:
            with _Affinity(cpus):
                started = spawn.start(
                    spec["argv"],
                    env,
                    spec.get("wdir") or None,
                    stdin=bool(spec.get("stdin")),
                    merge=merge,
                    pass_fd=pmi_pair[1].fileno() if pmi_pair else None,
                    gate=gate,
                )
        except (OSError, NotImplementedError) as exc:  # NotImplementedError: posix_spawn without setsid (glibc < 2.26)
            if service:
                if pmi_pair:
                    pmi_pair[1].close()
                service.detach(ident)
            reason = getattr(exc, "strerror", None) or str(exc)
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            self.send(wire.control("failed", proc=ident, error=f"{spec['argv'][0]}: {reason}", code=code))
            return False
        if pmi_pair and service:
            pmi_pair[1].close()
            self.pmi_fds[pmi_pair[0].fileno()] = service
            self.sel.register(pmi_pair[0].fileno(), selectors.EVENT_READ, "pmi")
        if self.guardian is not None:
            self.guardian.watch(started.pid)
        rp = RankProcess(ident, job, started.pid)
        self.ranks[ident] = rp
        self.by_pid[started.pid] = rp
        for stream, fd in ((wire.STDOUT, started.stdout), (wire.STDERR, started.stderr)):
            if fd is not None:
                rp.open_fds.add(fd)
                self.fd_owner[fd] = (rp, stream)
                self.sel.register(fd, selectors.EVENT_READ, "out")
        if started.stdin is not None:
            rp.stdin_fd = started.stdin
            os.set_blocking(rp.stdin_fd, False)
        self.send(wire.control("started", proc=ident, pid=started.pid))
        if service is not None:
            self.open_mpi.watch(ident, started.pid, time.monotonic())
        return True

    def check(self, msg: dict) -> None:
        """Before anything starts: take the launcher's paths, and say whether each program and
        directory exists here, whether a MASTER_PORT is free (or pick one), and what the job
        asks about this host (CPUs, GPUs, device IPs: hostinfo.probe)."""
        self.host_env = merge_host_environment(dict(os.environ), msg.get("carried", {}))
        if msg.get("heartbeat"):
            self.heartbeat = float(msg["heartbeat"])
            if isinstance(self.link, PipeLink):
                self.link.stall_every = self.heartbeat / 6
        problems = []
        for app in msg.get("apps", ()):
            path = app.get("path") or self.host_env.get("PATH", os.defpath)
            problem = program_problem(app["program"], app["wdir"], path, bool(msg.get("mpi")))
            if problem and problem not in problems:
                problems.append(problem)
        port = int(msg.get("port", -1))
        port_free = None
        if port >= 0:
            port, port_free = probe_port(port)
        reply: dict = {"problems": problems, "port": port, "port_free": port_free}
        probe = msg.get("probe")
        if probe is not None:
            path = self.host_env.get("PATH", os.defpath)
            reply["info"] = hostinfo.probe(bool(probe.get("gpus")), probe.get("hccn"), path)
        self.send(wire.control("checked", **reply))

    # -- rank output and stdin -----------------------------------------------------------
    def read_output(self, fd: int) -> None:
        rp, stream = self.fd_owner[fd]
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        if data:
            self.send(wire.output(rp.ident, stream, data))
            return
        self.sel.unregister(fd)
        del self.fd_owner[fd]
        rp.open_fds.discard(fd)
        os.close(fd)
        self.maybe_report(rp)

    def queue_stdin(self, rank: int, data: bytes) -> None:
        rp = self.ranks.get(rank)
        if rp is None or rp.stdin_fd is None:
            if data:
                self.send(wire.control("stdin_ack", n=len(data)))
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
            self.send(wire.control("stdin_ack", n=written))
        self._update_stdin_interest(rp)

    def _update_stdin_interest(self, rp: RankProcess) -> None:
        fd = rp.stdin_fd
        if fd is None:
            return
        registered = fd in self.sel.get_map()
        if rp.stdin_queue and not registered:
            self.sel.register(fd, selectors.EVENT_WRITE, "in")
        elif not rp.stdin_queue:
            if registered:
                self.sel.unregister(fd)
            if rp.stdin_eof:
                os.close(fd)
                rp.stdin_fd = None

    # -- exits ---------------------------------------------------------------------------
    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.relay is not None and self.relay.reaped(pid, status):  # an ssh client of tree spawn
                if self.guardian is not None:
                    self.guardian.forget(pid)
                continue
            rp = self.by_pid.get(pid)
            if rp is None or rp.status is not None:  # an orphan adopted as subreaper
                if pid in self.orphans:
                    self.orphans.discard(pid)
                    if self.guardian is not None:
                        self.guardian.forget(pid)
                continue
            if self.guardian is not None:
                self.guardian.forget(pid)
            rp.status = os.waitstatus_to_exitcode(status)
            rp.reaped_at = time.monotonic()
            if rp.stdin_fd is not None:
                written = sum(len(c) for c in rp.stdin_queue)
                rp.stdin_queue.clear()
                rp.stdin_eof = True
                if written:
                    self.send(wire.control("stdin_ack", n=written))
                self._update_stdin_interest(rp)
            self.maybe_report(rp)

    def maybe_report(self, rp: RankProcess, now: float | None = None) -> None:
        if rp.reported or rp.status is None:
            return
        if rp.open_fds and (now or time.monotonic()) - rp.reaped_at < EXIT_REPORT_DELAY:
            return
        rp.reported = True
        service = self.pmi.get(rp.job)
        pmi = service.state_of(rp.ident) if service else "new"
        self.send(wire.control("exited", proc=rp.ident, status=rp.status, pmi=pmi))

    # -- killing -------------------------------------------------------------------------
    def signal_all(self, sig: int) -> None:
        """Signal the process group of every rank not yet reaped (its pid cannot have been reused)."""
        for rp in self.ranks.values():
            if rp.status is None:
                try:
                    os.killpg(rp.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def adopted(self) -> list[int]:
        """Our children that are neither a live rank nor the guardian: orphans re-parented to us
        (we are a subreaper), zombies included until reaped."""
        guardian = self.guardian.pid if self.guardian else None
        relayed = self.relay.pids() if self.relay is not None else ()
        return [
            pid
            for pid in _children_of(os.getpid())
            if pid != guardian
            and pid not in relayed
            and (pid not in self.by_pid or self.by_pid[pid].status is not None)
        ]

    def signal_orphans(self, sig: int) -> None:
        """Signal every adopted orphan and its process group. Whatever is left of a reaped rank's
        group (a child it left behind) is an orphan of ours or a descendant of one, so this
        reaches it without signalling a reaped rank's pid, which may belong to anyone by now."""
        own = os.getpgrp()
        for pid in self.adopted():
            try:
                group = os.getpgid(pid)  # an unreaped child of ours: its pid is still its own
                if group != own:
                    os.killpg(group, sig)
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def terminate_all(self, grace: float) -> None:
        self.signal_all(signal.SIGTERM)
        self.signal_orphans(signal.SIGTERM)
        deadline = time.monotonic() + grace
        if self.kill_deadline is None or deadline < self.kill_deadline:
            self.kill_deadline = deadline

    def kill_stragglers(self) -> None:
        """SIGKILL every live rank's process group and every orphan this agent adopted, with its group."""
        self.signal_all(signal.SIGKILL)
        self.signal_orphans(signal.SIGKILL)
        if self.relay is not None and not self.link_open:  # its children's links: to be cut now
            self.relay.kill()

    def sweep(self) -> None:
        """The last kill, in rounds: an orphan's descendants that left its process group (a
        daemon's worker in a session of its own) are re-parented to us only when it dies, so kill
        and reap until no child but the guardian is left (SWEEP_LIMIT seconds at most)."""
        deadline = time.monotonic() + SWEEP_LIMIT
        if self.relay is not None:
            self.relay.close_all()
        while True:
            self.kill_stragglers()
            if self.relay is not None:
                self.relay.kill()
            self.reap()
            live = [rp for rp in self.ranks.values() if rp.status is None]
            relaying = self.relay is not None and self.relay.running()
            if (not live and not relaying and not self.adopted()) or time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def watch_adopted(self, now: float) -> None:
        """Tell the guardian about orphans we adopted, so a kill -9 of this agent takes them too."""
        if self.guardian is None or not self.ranks or now < self.next_adoption_scan:
            return
        self.next_adoption_scan = now + ADOPTION_SCAN
        for pid in self.adopted():
            if pid not in self.orphans:
                self.orphans.add(pid)
                self.guardian.watch(pid)

    # -- main loop -----------------------------------------------------------------------
    def handle(self, kind: int, value: object) -> None:
        if kind == wire.STDIN:
            rank, _, data = value  # type: ignore[misc]
            self.queue_stdin(rank, data)
            return
        if kind == wire.ROUTED:  # tree spawn: for the hosts below, or (ALL) for them and us
            host, frame = value  # type: ignore[misc]
            if host == wire.ALL:
                if self.relay is not None:
                    self.relay.broadcast(frame)
                self.handle(*wire.decode_frame(frame))
            elif self.relay is not None:
                self.relay.down(host, frame)
            return
        msg = value
        assert isinstance(msg, dict)
        op = msg["op"]
        if op == "launch":
            self.launch(msg)
        elif op == "check":
            self.check(msg)
        elif op == "put":  # a file the ranks read (the rank table), before they start
            self.send(wire.control("put_done", error=hostinfo.write_file(str(msg["path"]), str(msg["data"]))))
        elif op == "signal":
            self.signal_all(int(msg["sig"]))
        elif op == "kill":
            grace = float(msg.get("grace", 0))
            if grace <= 0:
                self.kill_stragglers()
            else:
                self.terminate_all(grace)
        elif op in ("pmi_fence_done", "pmi_name_reply", "pmi_spawn_reply"):
            service = self.pmi.get(int(msg["job"]))
            if service is not None:
                service.from_controller(msg)
        elif op == "finish":
            self.finishing = True
            self.terminate_all(float(msg.get("grace", 0.5)))
        elif op == "relay":
            self.start_relay(msg)
        elif op == "drop" and self.relay is not None:
            self.relay.drop(int(msg["host"]))

    def start_relay(self, msg: dict) -> None:
        """Tree spawn: start the agents of the hosts below this one, with our own code."""
        if self.payload is None:
            raise ValueError("this agent was not started over SSH and cannot relay")
        if self.relay is None:
            self.relay = Relay(self.payload, self.send, self.sel)
        for pid in self.relay.start(msg, dict(os.environ)):
            if self.guardian is not None:
                self.guardian.watch(pid)  # a kill -9 of this agent cuts its children's links too

    def read_link(self) -> None:
        try:
            data = self.link.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.link_lost()
            return
        self.heard = time.monotonic()
        try:
            for kind, value in self.decoder.feed(data):
                self.handle(kind, value)
        except wire.FrameError as exc:
            print(f"mpilaunch agent: {exc}; stopping", file=sys.stderr)
            self.link_lost()
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, OSError) as exc:
            # A frame that decodes but asks for nothing we can do: the link is not to be trusted.
            print(f"mpilaunch agent: bad request from the launcher ({exc!r}); stopping", file=sys.stderr)
            self.link_lost()

    def all_done(self) -> bool:
        if self.relay is not None and not self.relay.done():
            return False
        return all(rp.status is not None and not rp.open_fds for rp in self.ranks.values())

    def run(self) -> int:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        spawn.close_on_exec_all()
        self.guardian = Guardian()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_stop_signal)
        # A handler, not SIG_IGN: an ignored signal would stay ignored in every rank we exec.
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        self.sel.register(self.link, selectors.EVENT_READ, "link")
        version = ".".join(map(str, sys.version_info[:3]))
        reached = os.environ.get("SSH_CONNECTION", "").split()  # client, port, the address we were reached at, port
        hello = wire.control(
            "hello",
            host=self.host,
            cpus=os.cpu_count() or 1,
            pid=os.getpid(),
            python=version,
            addr=reached[2] if len(reached) > 2 else "",
            client=reached[0] if reached else "",  # the launcher's address as this host sees it (over OpenSSH)
        )
        self.send(hello)
        try:
            self.loop(wake_r)
        finally:  # also after an exception: nothing this agent started may outlive it
            self.sweep()
            self.guardian.release()
        self.send(wire.control("bye"))
        return 0

    def loop(self, wake_r: int) -> None:
        while not (self.finishing and self.all_done()):
            timeout = self.next_timeout()
            for key, _ in self.sel.select(timeout):
                tag = key.data
                if tag == "out":
                    self.read_output(key.fd)  # type: ignore[arg-type]
                elif tag == "in":
                    fd = key.fd
                    rp = next(r for r in self.ranks.values() if r.stdin_fd == fd)
                    self.write_stdin(rp)
                elif tag == "link":
                    self.read_link()
                elif tag in ("relay_out", "relay_err", "relay_in"):
                    self.relay.readable(key.fd, tag)  # type: ignore[union-attr,arg-type]
                elif tag == "pmi_listen":
                    self.pmi_accept()
                elif tag == "pmi_hello":
                    self.pmi_hello_readable(key.fd)  # type: ignore[arg-type]
                elif tag == "pmi":
                    service = self.pmi_fds[key.fd]  # type: ignore[index]
                    if not service.readable(key.fd):  # type: ignore[arg-type]
                        self.sel.unregister(key.fd)
                        service.drop(key.fd)  # type: ignore[arg-type]
                        del self.pmi_fds[key.fd]  # type: ignore[arg-type]
                else:
                    try:
                        os.read(wake_r, 512)
                    except BlockingIOError:
                        pass
            self.reap()
            if self.stop_requested:
                self.stop_requested = False
                self.link_lost()
            now = time.monotonic()
            for rp in self.ranks.values():
                self.maybe_report(rp, now)
            self.check_hangups(now)
            self.check_open_mpi(now)
            if self.heartbeat and self.link_open:
                self.keep_alive(now)
            if self.kill_deadline is not None and now >= self.kill_deadline:
                self.kill_deadline = None
                self.kill_stragglers()
            self.watch_adopted(now)

    # -- PMI over TCP (PMI_PORT + PMI_ID) ---------------------------------------------------
    def pmi_port(self) -> int:
        """A listener on loopback only: ranks are on this host, nobody else needs to reach it."""
        if self.pmi_listener is None:
            self.pmi_listener = socket.socket()
            self.pmi_listener.bind(("127.0.0.1", 0))
            self.pmi_listener.listen(128)
            self.pmi_listener.setblocking(False)
            self.sel.register(self.pmi_listener, selectors.EVENT_READ, "pmi_listen")
        return self.pmi_listener.getsockname()[1]

    def new_pmi_id(self) -> int:
        """An unguessable id per rank (the client parses it as an int): its only credential."""
        while True:
            secret = int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF
            if secret > 1 and secret not in self.pmi_ids:
                return secret

    def pmi_accept(self) -> None:
        assert self.pmi_listener is not None
        try:
            sock, _ = self.pmi_listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        self.pmi_hello[sock.fileno()] = (sock, bytearray())
        self.sel.register(sock, selectors.EVENT_READ, "pmi_hello")

    def pmi_hello_readable(self, fd: int) -> None:
        """The first line of a TCP client must be `cmd=initack pmiid=<its PMI_ID>`; else it is refused."""
        sock, buf = self.pmi_hello[fd]
        try:
            data = sock.recv(512)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buf += data
        if data and b"\n" not in buf and len(buf) < 512:
            return
        self.sel.unregister(sock)
        del self.pmi_hello[fd]
        words = dict(w.split("=", 1) for w in buf.split(b"\n", 1)[0].decode("ascii", "replace").split() if "=" in w)
        claimed = words.get("pmiid", "")
        entry = self.pmi_ids.pop(int(claimed), None) if words.get("cmd") == "initack" and claimed.isdigit() else None
        if entry is None:
            sock.close()
            self.refused += 1
            text = "mpilaunch: refused a PMI connection that did not present a valid PMI_ID"
            self.send(wire.control("note", text=text))
            if self.refused == MAX_REFUSED:  # someone is guessing ids: close the door for this job
                self.close_pmi_port()
            return
        service, ident = entry
        service.connect(ident, sock)
        self.pmi_fds[sock.fileno()] = service
        self.sel.register(sock, selectors.EVENT_READ, "pmi")

    def close_pmi_port(self) -> None:
        """Stop listening; ranks that have not connected yet can no longer, so the job must end."""
        if self.pmi_listener is not None:
            self.sel.unregister(self.pmi_listener)
            self.pmi_listener.close()
            self.pmi_listener = None
        error = f"PMI port closed after {MAX_REFUSED} connections with a wrong PMI_ID"
        for _, ident in self.pmi_ids.values():
            self.send(wire.control("pmi_error", proc=ident, error=error))
        self.pmi_ids.clear()

    def pmi_hangup(self, ident: int) -> None:
        self.hangups[ident] = time.monotonic()

    def check_hangups(self, now: float) -> None:
        """A rank that closed its PMI socket before finalize: if it is dying its exit says why;
        if it is still running after HANGUP_GRACE, its peers would wait for it, so say so."""
        for ident, since in list(self.hangups.items()):
            rp = self.ranks.get(ident)
            if rp is None or rp.status is not None:
                del self.hangups[ident]
            elif now - since >= HANGUP_GRACE:
                del self.hangups[ident]
                error = "closed its PMI connection before finalize"
                self.send(wire.control("pmi_error", proc=ident, error=error))

    def check_open_mpi(self, now: float) -> None:
        """A rank found loading Open MPI ends the job with a message instead of running as a singleton."""
        found = self.open_mpi.look(now, self._pmi_silent)
        if found is not None:
            self.send(wire.control("pmi_error", proc=found[0], error=found[1]))

    def _pmi_silent(self, ident: int) -> bool:
        """Alive, served PMI and never sent `init`: only such a rank can be an Open MPI singleton."""
        rp = self.ranks.get(ident)
        service = self.pmi.get(rp.job) if rp else None
        return rp is not None and rp.status is None and service is not None and service.state_of(ident) == "new"

    def keep_alive(self, now: float) -> None:
        """A remote agent pings the launcher and stops when it has heard nothing for a heartbeat
        timeout: after a network cut without a reset, the channel would never close."""
        assert self.heartbeat is not None
        if now >= self.next_ping:
            self.next_ping = now + self.heartbeat / 6
            self.send(wire.control("ping"))
            self.ping_children(now)
        if now - self.heard > self.heartbeat and not select.select([self.link], [], [], 0)[0]:
            print(f"mpilaunch agent: no word from the launcher for {self.heartbeat:g} s; stopping", file=sys.stderr)
            self.link_lost()

    def ping_children(self, now: float | None = None) -> None:
        """Tree spawn: our children count our silence as the launcher's. On the schedule of our
        own pings, from the loop and from inside a send to the launcher that waits."""
        if self.relay is None or not self.heartbeat:
            return
        now = time.monotonic() if now is None else now
        if now >= self.next_relay_ping:
            self.next_relay_ping = now + self.heartbeat / 6
            self.relay.ping()

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    def next_timeout(self) -> float | None:
        deadlines = [
            rp.reaped_at + EXIT_REPORT_DELAY for rp in self.ranks.values() if rp.status is not None and not rp.reported
        ]
        if self.kill_deadline is not None:
            deadlines.append(self.kill_deadline)
        deadlines.extend(since + HANGUP_GRACE for since in self.hangups.values())
        look = self.open_mpi.next_deadline()
        if look is not None:
            deadlines.append(look)
        if self.heartbeat and self.link_open:
            deadlines += [self.next_ping, self.heard + self.heartbeat]
        if self.ranks:
            deadlines.append(self.next_adoption_scan)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())


def _children_of(pid: int) -> list[int]:
    """Children of pid: from /proc/PID/task/*/children (cheap) where the kernel has it, else a scan."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        found: list[int] = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found.extend(int(child) for child in handle.read().split())
        return found
    except (OSError, ValueError):
        return _scan_children_of(pid)


def _scan_children_of(pid: int) -> list[int]:
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(name))
    return found


def serve(link: socket.socket) -> int:
    """Run an agent on an already connected link until the job ends."""
    return Agent(link).run()


def serve_stdio(payload: bytes | None = None) -> int:
    """Run as a remote host's agent: the link is stdin/stdout (the SSH channel). They are moved
    to private descriptors, so no rank inherits them and a stray print cannot corrupt a frame."""
    read_fd, write_fd = os.dup(0), os.dup(1)  # dup'd descriptors are not inherited
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    return Agent(PipeLink(read_fd, write_fd), payload).run()
