"""The run's event loop: one table of processes, one place where policy is decided.

Processes are known by a process id, their index in the table, unique over every job of the
run (job 1 is the one launched; MPI_Comm_spawn adds jobs 2, 3, ...). Agents and the wire use
process ids; ranks are numbers within a job.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import time

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.output import OutputSink
from mpilaunch.launcher.pmi import JobKvs, NameService
from mpilaunch.plan.build import JobPlan, LaunchPlan, remote_hosts, spawn_plan
from mpilaunch.plan.placement import Rank
from mpilaunch.plan.rank_env import LEAK_NAMES, LEAK_PREFIXES
from mpilaunch.protocol import wire
from mpilaunch.transport.local import start_local_agent

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see record.py)
if TYPE_CHECKING:
    from mpilaunch.transport.local import LocalLink
    from mpilaunch.transport.ssh import SshLink
    from mpilaunch.transport.tree import RelayedLink

STDIN_WINDOW = 1 << 16  # bytes of stdin in flight per agent before the launcher stops reading
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
HARD_STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a second one kills at once
TIMEOUT_STATUS = 124
BAD_FRAME = (wire.FrameError, KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError)
PINGS_PER_TIMEOUT = 6  # a remote link carries at least this many frames per heartbeat timeout
PENDING_READS = 16  # reads of a head's backlog (up to 4 MB) before a silent host behind it is lost


class RankState:
    """One process of the run, as the loop knows it (a plain class: see spec.py on dataclasses)."""

    __slots__ = ("abort_code", "done", "job", "killed", "pid", "proc", "rank", "reason", "status")

    def __init__(self, proc: int, job: int, rank: Rank) -> None:
        self.proc = proc
        self.job = job
        self.rank = rank
        self.pid: int | None = None
        self.status: int | None = None
        self.done = False
        self.killed = False
        self.reason: str | None = None
        self.abort_code: int | None = None  # from MPI_Abort


class HostLink:
    """The loop's end of one agent's link."""

    __slots__ = ("decoder", "heard", "index", "inflight", "link", "open")

    def __init__(self, index: int, link: LocalLink | SshLink, heard: float = 0.0) -> None:
        self.index = index
        self.link = link
        self.decoder = wire.Decoder()
        self.inflight = 0
        self.open = True
        self.heard = heard  # when the agent last sent anything (remote links are lost after a silence)


class Controller:
    def __init__(self, plan: LaunchPlan, output: OutputSink, links: dict | None = None, summary: bool = True) -> None:
        self.plan = plan
        self.summary = summary  # the failure summary (allrun prints a table of hosts instead)
        self.options = plan.options
        self.output = output
        self.procs: list[RankState] = []
        self.jobs: dict[int, JobPlan] = {}
        self.kvs: dict[int, JobKvs] = {}
        self.names = NameService()
        self.sel = selectors.DefaultSelector()
        self.links: dict[int, HostLink] = {}
        self.relays: set[int] = set()  # tree spawn: hosts whose connection carries hosts below them
        self.first_failure: RankState | None = None
        self.failed: list[int] = []
        self.aborting = False
        self.finishing = False
        self.timed_out = False
        self.stop_signal: int | None = None  # a forwarded SIGINT/SIGTERM/SIGHUP: what ends the job now
        self.abort_at: float | None = None  # after a stop signal: when ranks still running are killed
        self.signals_seen: dict[int, int] = {}
        self.stdin_procs = list(plan.stdin_ranks)  # job 1's process ids are its ranks
        self.stdin_open = bool(self.stdin_procs)
        self.stdin_registered = False
        self.stdin_pollable = True
        self.heartbeat = plan.heartbeat  # seconds of silence after which a remote host is lost
        for index, link in (links or {}).items():  # agents started before the run (remote hosts)
            self._add_link(index, link)
            if not link.local:
                link.ping_every(self.heartbeat / PINGS_PER_TIMEOUT, wire.control("ping"))
        self.add_job(plan.job)

    # -- jobs -----------------------------------------------------------------------------
    def add_job(self, job: JobPlan) -> list[int]:
        first = len(self.procs)
        self.procs.extend(RankState(first + i, job.job, r) for i, r in enumerate(job.ranks))
        self.jobs[job.job] = job
        self.kvs[job.job] = JobKvs(len({r.host for r in job.ranks}))
        return list(range(first, len(self.procs)))

    def procs_of(self, job: int) -> list[RankState]:
        return [s for s in self.procs if s.job == job]

    def launch(self, job: JobPlan) -> None:
        """Start an agent where there is none yet, then hand each agent its share of the job."""
        states = self.procs_of(job.job)
        for index in sorted({s.rank.host for s in states}):
            link = self.links.get(index)
            if link is None:
                link = self._add_link(index, start_local_agent())
            specs = [
                {
                    "proc": s.proc,
                    "rank": s.rank.rank,
                    "local_rank": s.rank.local_rank,
                    "app": s.rank.app,
                    "argv": list(job.argvs[s.rank.app]),
                    "wdir": job.wdirs[s.rank.app],
                    "env": job.envs[s.rank.rank],
                    "stdin": s.proc in self.stdin_procs,
                }
                for s in states
                if s.rank.host == index
            ]
            self.send(
                link,
                wire.control(
                    "launch",
                    job=job.job,
                    ranks=specs,
                    merge=self.options.merge_stderr_to_stdout,
                    bind_to=self.options.bind_to,
                    report_bindings=self.options.report_bindings,
                    drop_prefixes=list(LEAK_PREFIXES),
                    drop_names=sorted(LEAK_NAMES),
                    pmi=job.pmi,
                ),
            )

    def _add_link(self, index: int, agent: LocalLink | SshLink | RelayedLink) -> HostLink:
        link = self.links[index] = HostLink(index, agent, heard=time.monotonic())
        if _relayed(agent):  # its frames come on its head's connection
            self.relays.add(agent.head_index)  # type: ignore[union-attr]
        else:
            self.sel.register(agent.fileno(), selectors.EVENT_READ, link)
        return link

    def start(self) -> None:
        self._install_signals()
        now = time.monotonic()
        for link in list(self.links.values()):
            if getattr(link.link, "unread", b""):  # frames read during tree start-up, not used there
                self.read_link(link, now)
        self.launch(self.plan.job)
        if self.stdin_open and not _stdin_usable():
            self.stdin_open = False
            for proc in self.stdin_procs:
                self._send_stdin(proc, b"")

    def _install_signals(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.saved_signals = {sig: signal.getsignal(sig) for sig in FORWARDED}
        for sig in FORWARDED:
            signal.signal(sig, lambda *_: None)
        self.saved_wakeup_fd = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "signal")

    # -- sending -------------------------------------------------------------------------
    def send(self, link: HostLink, frame: bytes) -> None:
        if not link.open:
            return
        try:
            link.link.send(frame)
        except OSError:
            pass  # the agent is gone; its EOF is handled by the loop

    def broadcast(self, frame: bytes) -> None:
        """To every agent; a relay passes an ALL frame to the hosts below it (one frame per head)."""
        routed = None
        for link in self.links.values():
            if _relayed(link.link):
                continue
            if link.index in self.relays:
                routed = routed or wire.routed(wire.ALL, frame)
                self.send(link, routed)
            else:
                self.send(link, frame)

    def _link_of(self, proc: int) -> HostLink:
        return self.links[self.procs[proc].rank.host]

    def _connection_of(self, link: HostLink) -> HostLink:
        """The link whose connection carries this host's frames: its head's behind relays (the
        stdin window is per connection, or many hosts under one head could fill its channel)."""
        return self.links[link.link.head_index] if _relayed(link.link) else link  # type: ignore[union-attr]

    def _send_stdin(self, proc: int, data: bytes) -> None:
        link = self._link_of(proc)
        self._connection_of(link).inflight += len(data)
        self.send(link, wire.stdin(proc, data))

    # -- policy --------------------------------------------------------------------------
    def rank_exited(self, state: RankState, status: int | None, reason: str | None = None, pmi: str = "new") -> None:
        if state.done:
            return
        state.done = True
        state.status = status
        state.reason = state.reason or reason
        self.output.rank_done(state.proc)
        if status == 0 and pmi == "init" and not all(s.done for s in self.procs):
            # Its peers would wait for it in the next barrier for ever.
            state.reason = "exited without MPI_Finalize while other ranks run"
            state.abort_code = 1
            self._failed(state)
            self.abort(self.options.kill_timeout)
        elif status != 0:
            self._failed(state)
            if self.options.abort_on_failure and self.stop_signal is not None and not self.aborting:
                # Every rank got the user's signal and may still be acting on it (a traceback,
                # a checkpoint): the others get the grace before they are killed, not at once.
                if self.abort_at is None:
                    self.abort_at = time.monotonic() + self.options.kill_timeout
            elif self.options.abort_on_failure:
                self.abort(self.options.kill_timeout)

    def _failed(self, state: RankState) -> None:
        if state.proc not in self.failed:
            self.failed.append(state.proc)
        stopping = self.timed_out or self.stop_signal is not None
        if self.first_failure is None and (not stopping or state.abort_code is not None):
            self.first_failure = state  # failures after a user's signal or the timeout are its effects

    def pmi_failure(self, state: RankState, code: int, reason: str) -> None:
        """MPI_Abort or a broken PMI client: the job ends as if that rank failed with code."""
        print(f"mpilaunch: {self.describe(state)} {reason}", file=sys.stderr)
        if state.abort_code is None:
            state.abort_code = code
            state.reason = reason
        self._failed(state)
        self.abort(self.options.kill_timeout)

    def describe(self, state: RankState) -> str:
        return f"rank {state.rank.rank}" + (f" of spawned job {state.job}" if state.job != 1 else "")

    def abort(self, grace: float) -> None:
        """Stop every rank: SIGTERM to each process group, SIGKILL after grace seconds."""
        if not self.aborting or grace <= 0:
            for state in self.procs:
                if not state.done:
                    state.killed = True
            self.broadcast(wire.control("kill", grace=grace))
        self.aborting = True

    def on_signal(self, sig: int) -> None:
        count = self.signals_seen.get(sig, 0) + 1
        self.signals_seen[sig] = count
        if sig in HARD_STOP and count > 1:
            print(f"mpilaunch: {signal.Signals(sig).name} again: killing every rank", file=sys.stderr)
            self.abort(0)
            return
        if sig in HARD_STOP and self.stop_signal is None:
            self.stop_signal = sig
        self.broadcast(wire.control("signal", sig=int(sig)))

    def on_timeout(self) -> None:
        self.timed_out = True
        print(f"mpilaunch: the job exceeded --timeout {self.options.timeout:g} s; killing every rank", file=sys.stderr)
        self.abort(self.options.kill_timeout)

    def on_spawn(self, link: HostLink, msg: dict) -> None:
        """MPI_Comm_spawn: a new job on free slots, with its own ranks, KVS and log directory."""
        parent = self.procs[msg["proc"]]
        job_no = max(self.jobs) + 1
        in_use = [0] * len(self.plan.hosts)
        for state in self.procs:
            if not state.done:
                in_use[state.rank.host] += 1
        preput: dict[str, str] = {}
        for app in msg["apps"]:
            preput.update(app.get("preput", {}))
        try:
            if self.aborting or self.finishing:
                raise LaunchError("the job is ending")
            child = spawn_plan(self.plan, job_no, msg["apps"], in_use, preput)
            unreached = [i for i in remote_hosts(self.plan.hosts, child.ranks) if i not in self.links]
            if unreached:
                name = self.plan.hosts[unreached[0]].name
                raise LaunchError(f"it would place ranks on {name!r}, which has no agent (no rank of job 1 runs there)")
            procs = self.add_job(child)
            self.output.add_job(job_no, procs)
        except LaunchError as exc:
            print(f"mpilaunch: MPI_Comm_spawn from {self.describe(parent)} refused: {exc}", file=sys.stderr)
            self.send(link, wire.control("pmi_spawn_reply", job=msg["job"], req=msg["req"], rc=-1, msg=str(exc)))
            return
        self.launch(child)
        self.send(link, wire.control("pmi_spawn_reply", job=msg["job"], req=msg["req"], rc=0))

    # -- events from agents ----------------------------------------------------------------
    def _own_proc(self, link: HostLink, proc: object) -> int:
        """A process id an agent sent: one of the processes of its own host, or the frame is bad."""
        if type(proc) is not int or not 0 <= proc < len(self.procs) or self.procs[proc].rank.host != link.index:
            raise ValueError(f"process {proc!r} is not one of this host's")
        return proc

    def on_control(self, link: HostLink, msg: dict) -> None:
        op = msg["op"]
        if "proc" in msg or op in ("started", "exited", "failed", "pmi_abort", "pmi_error", "pmi_spawn"):
            self._own_proc(link, msg.get("proc"))
        if op == "started":
            self.procs[msg["proc"]].pid = msg["pid"]
        elif op == "exited":
            self.rank_exited(self.procs[msg["proc"]], int(msg["status"]), pmi=msg.get("pmi", "new"))
        elif op == "failed":
            state = self.procs[msg["proc"]]
            print(f"mpilaunch: {self.describe(state)} could not start: {msg['error']}", file=sys.stderr)
            self.rank_exited(state, int(msg.get("code", 127)), msg["error"])
        elif op == "stdin_ack":
            self._connection_of(link).inflight -= int(msg["n"])
        elif op == "note":
            print(msg["text"], file=sys.stderr)
        elif op == "pmi_fence":
            merged = self.kvs[msg["job"]].fence(link.index, msg["kvs"])
            if merged is not None:
                self.broadcast(wire.control("pmi_fence_done", job=msg["job"], kvs=merged))
        elif op == "pmi_abort":
            state = self.procs[msg["proc"]]
            text = f"called MPI_Abort with code {msg['code']}" + (f": {msg['message']}" if msg["message"] else "")
            self.pmi_failure(state, int(msg["code"]), text)
        elif op == "pmi_error":
            self.pmi_failure(self.procs[msg["proc"]], 1, msg["error"])
        elif op == "pmi_name":
            fields = self.names.request(msg["cmd"], msg["service"], msg.get("port"))
            reply = wire.control("pmi_name_reply", job=msg["job"], req=msg["req"], cmd=msg["cmd"], fields=fields)
            self.send(link, reply)
        elif op == "pmi_spawn":
            self.on_spawn(link, msg)
        elif op == "gone":  # a relay's child ended (tree spawn)
            below = self.links.get(msg["host"])
            if below is None or getattr(below.link, "parent", None) != link.index:
                raise ValueError(f"host {msg['host']!r} is not one this agent started")
            if below.open:
                self.link_closed(below, str(msg.get("why") or ""), tell_relay=False)

    def read_link(self, link: HostLink, now: float) -> None:
        data = link.link.recv()
        if data is None:
            return
        link.heard = now
        if not data:
            self.link_closed(link)
            return
        try:
            for kind, value in link.decoder.feed(data):
                self._frame(link, kind, value, now)
        except BAD_FRAME as exc:
            self._garbled(link, exc)

    def _garbled(self, link: HostLink, exc: Exception) -> None:
        """Bytes that are no frame, or a frame with fields we cannot use: the link is not to be trusted."""
        why = exc if isinstance(exc, wire.FrameError) else repr(exc)
        host = self.plan.hosts[link.index].name
        print(f"mpilaunch: garbled message from the agent of {host}: {why}", file=sys.stderr)
        if link.open:
            self.link_closed(link)

    def _frame(self, link: HostLink, kind: int, value: object, now: float) -> None:
        if kind == wire.OUTPUT:
            proc, stream, chunk = value  # type: ignore[misc]
            self.output.write(self._own_proc(link, proc), stream, chunk, now)
        elif kind == wire.CONTROL:
            self.on_control(link, value)  # type: ignore[arg-type]
        elif kind == wire.ROUTED:  # from a host below this one (tree spawn)
            host, frame = value  # type: ignore[misc]
            below = self.links.get(host)
            if below is None or getattr(below.link, "head_index", None) != link.index:
                raise ValueError(f"a frame of host {host!r}, which is not below this one")
            if not below.open:
                return
            below.heard = now
            try:
                kind, value = wire.decode_frame(frame)
                if kind == wire.ROUTED:
                    raise wire.FrameError("a routed frame inside a routed frame")
                self._frame(below, kind, value, now)
            except BAD_FRAME as exc:  # that host is not to be trusted; its relay and neighbours still are
                self._garbled(below, exc)

    def keep_alive(self, now: float) -> None:
        """Give up on a remote agent that said nothing for a whole heartbeat timeout (its pings
        come every timeout/6): a network cut that sends no reset would otherwise leave the job
        waiting for ever. Pings to the agents go from a thread of each link, so a launcher
        stuck on a full console pipe does not make the agents give up."""
        for link in list(self.links.values()):
            if link.open and not link.link.local and now - link.heard > self.heartbeat:
                connection = self._connection_of(link)
                # It may have spoken while this loop was busy elsewhere. Behind a relay, its frames
                # may wait behind other hosts' on the head's connection: read on, but not for
                # ever (a busy neighbour must not hide a silent host).
                for _ in range(PENDING_READS if connection is not link else 1):
                    if not (link.open and connection.open and link.link.readable()):
                        break
                    self.read_link(connection, now)
                    if now - link.heard <= self.heartbeat:
                        break
                if link.open and now - link.heard > self.heartbeat:
                    self.link_closed(link, f"no word from it for {self.heartbeat:g} s")

    def link_closed(self, link: HostLink, why: str = "", tell_relay: bool = True) -> None:
        """The agent's link ended (or was given up): its ranks are lost, and so is every host
        it relayed to. A host behind relays is cut off by its relay when tell_relay."""
        link.open = False
        if _relayed(link.link):
            if tell_relay:
                link.link.close()
        else:
            self.sel.unregister(link.link.fileno())
            link.link.close()
        link.link.wait()
        lost = [s for s in self.procs if s.rank.host == link.index and not s.done]
        host = self.plan.hosts[link.index].name
        if lost:
            because = f" ({why})" if why else ""
            print(f"mpilaunch: lost the agent of host {host}{because}; its ranks are killed", file=sys.stderr)
            self._kill_groups(lost)
            for state in lost:
                self.rank_exited(state, -signal.SIGKILL, f"agent of host {host} lost")
        for other in self.links.values():
            if other.open and getattr(other.link, "parent", None) == link.index:
                self.link_closed(other, f"its relay {host} was lost", tell_relay=False)

    # -- stdin ----------------------------------------------------------------------------
    def update_stdin(self) -> bool:
        """(Un)register stdin by the flow-control window; True when it must be read without polling."""
        want = self.stdin_open and all(
            self._connection_of(self._link_of(p)).inflight < STDIN_WINDOW for p in self.stdin_procs
        )
        if want and not self.stdin_registered and self.stdin_pollable:
            try:
                self.sel.register(0, selectors.EVENT_READ, "stdin")
            except PermissionError:  # a regular file or /dev/null: always readable
                self.stdin_pollable = False
                return True
        elif not want and self.stdin_registered:
            self.sel.unregister(0)
        self.stdin_registered = want and self.stdin_pollable
        return want and not self.stdin_pollable

    def read_stdin(self) -> None:
        try:
            data = os.read(0, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.stdin_open = False
        for proc in self.stdin_procs:
            if not self.procs[proc].done or not data:
                self._send_stdin(proc, data)

    # -- loop -----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self._emergency_stop()
            self._release()

    def _release(self) -> None:
        """Give the process back what the run took (a launcher embedded in a longer-lived process
        runs many jobs): the signal handlers, the wake-up pipe and the selector."""
        self._restore_signals()
        for name in ("wake_r", "wake_w"):  # taken off the object: a second release closes nothing
            fd = vars(self).pop(name, None)
            if fd is not None:
                os.close(fd)
        self.sel.close()

    def _emergency_stop(self) -> None:
        """On any way out, no rank may outlive the launcher: kill what is still recorded as running."""
        for link in self.links.values():
            if link.open:
                link.open = False
                link.link.close()
        self._kill_groups([s for s in self.procs if not s.done])
        for link in self.links.values():
            link.link.wait()

    def _kill_groups(self, states: list[RankState]) -> None:
        """SIGKILL these ranks' process groups by recorded pid, for ranks on this machine only
        (a pid an agent reported means something only on its own host)."""
        local = {index for index, link in self.links.items() if link.link.local}
        for state in states:
            if state.pid and state.rank.host in local:
                try:
                    os.killpg(state.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _run(self) -> int:
        start = time.monotonic()
        deadline = start + self.options.timeout if self.options.timeout else None
        self.start()
        while any(link.open for link in self.links.values()):
            if not self.finishing and all(s.done for s in self.procs):
                self.finishing = True
                self.broadcast(wire.control("finish", grace=0.5))
            read_stdin_now = self.update_stdin()
            now = time.monotonic()
            remote = [link.heard for link in self.links.values() if link.open and not link.link.local]
            silent_at = min(remote) + self.heartbeat if remote else None
            if silent_at is not None and silent_at < now:  # a remote link went quiet too long: look closer
                self.keep_alive(now)
            timers = [t for t in (deadline, self.output.next_deadline(), silent_at, self.abort_at) if t is not None]
            timeout = max(0.0, min(timers) - now) if timers else None
            if read_stdin_now:
                self.read_stdin()
                timeout = 0.0
            events = self.sel.select(timeout)
            now = time.monotonic()
            for key, _ in events:
                if isinstance(key.data, HostLink):
                    self.read_link(key.data, now)
                elif key.data == "stdin":
                    self.read_stdin()
                else:
                    self._drain_signals()
            self.output.flush_idle(now)
            if self.abort_at is not None and now >= self.abort_at:
                self.abort_at = None
                if not all(s.done for s in self.procs):
                    self.abort(self.options.kill_timeout)
            if deadline is not None and now >= deadline and not self.timed_out:
                if not all(s.done for s in self.procs):
                    self.on_timeout()
                deadline = None
        self._restore_signals()
        return self.finish()

    def _drain_signals(self) -> None:
        try:
            data = os.read(self.wake_r, 512)
        except BlockingIOError:
            return
        for sig in data:
            self.on_signal(sig)

    def _restore_signals(self) -> None:
        saved = getattr(self, "saved_signals", None)
        if saved is None:  # never installed, or already restored
            return
        signal.set_wakeup_fd(self.saved_wakeup_fd)
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self.saved_signals = None

    def finish(self) -> int:
        self.output.close()
        failure = self.first_failure
        ended = [s for s in self.procs if s.proc in self.failed and s is not failure]
        if failure is None and ended and self.stop_signal is not None:
            from mpilaunch.launcher.report import ranges  # only a failed or stopped run reports

            name = signal.Signals(self.stop_signal).name
            first_job = ranges([s.rank.rank for s in ended if s.job == 1]) or "none of job 1"
            others = sum(1 for s in ended if s.job != 1)
            spawned = f" and {others} rank(s) of spawned jobs" if others else ""
            print(
                f"mpilaunch: stopped by {name} (forwarded to every rank); ranks {first_job}{spawned} ended",
                file=sys.stderr,
            )
        if failure is not None and self.summary:
            from mpilaunch.launcher.report import failure_summary

            killed = [s.proc for s in self.procs if s.killed and s is not failure]
            job = self.jobs[failure.job]
            status = abort_status(failure.abort_code) if failure.abort_code is not None else failure.status
            print(
                failure_summary(
                    rank=failure.rank.rank,
                    job=failure.job,
                    host=self.plan.hosts[failure.rank.host].name,
                    pid=failure.pid,
                    status=status if status is not None else 1,
                    argv=job.argvs[failure.rank.app],
                    last_lines=self.output.last_lines(failure.proc),
                    killed=[self.procs[p].rank.rank for p in killed if self.procs[p].job == 1],
                    killed_other=len([p for p in killed if self.procs[p].job != 1]),
                    aborted=self.options.abort_on_failure or self.aborting,
                    failed_total=len(self.failed),
                    reason=failure.reason,
                ),
                file=sys.stderr,
            )
        return self.exit_status()

    def exit_status(self) -> int:
        if self.timed_out:
            return TIMEOUT_STATUS
        failure = self.first_failure
        if failure is None:
            return 128 + self.stop_signal if self.stop_signal is not None and self.failed else 0
        if failure.abort_code is not None:
            return abort_status(failure.abort_code)
        status = failure.status if failure.status is not None else 1
        return 128 - status if status < 0 else status


def _relayed(link: object) -> bool:
    """A host reached through relays (tree spawn): no descriptor of its own here."""
    return getattr(link, "relayed", False)


def _stdin_usable() -> bool:
    """Whether the launcher can read its stdin without being stopped (SIGTTIN) or failing."""
    try:
        os.fstat(0)
    except OSError:
        return False
    if os.isatty(0):
        try:
            return os.tcgetpgrp(0) == os.getpgrp()
        except OSError:
            return False
    return True


def abort_status(code: int) -> int:
    """The launcher's exit status for MPI_Abort(code): its low byte, but never 0 (success)."""
    return code & 0xFF or 1
