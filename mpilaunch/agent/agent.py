"""Per-host supervisor: spawns that host's ranks, relays their output, kills them.

Stdlib only, like everything in agent/, host/ and protocol/: for remote hosts these are
shipped over the link and run by a bare Python 3. It exits, killing its ranks, when its link
to the controller closes. The parts: the loop (loop.py), the ranks (ranks.py), reaping and
killing (reaper.py), rank-facing services such as PMI (services/), tree-spawn relaying
(relay.py), the link and its heartbeat (link.py). This class owns the link and answers the
controller's messages, one handler per message type.
"""

from __future__ import annotations

import _socket
import os
import select
import signal
import sys
import time

from mpilaunch.agent.link import Heartbeat, LinkOwner, PipeLink
from mpilaunch.agent.loop import Loop, Timer
from mpilaunch.agent.ranks import Ranks
from mpilaunch.agent.reaper import Guardian, Reaper, become_subreaper
from mpilaunch.agent.services.base import ServiceHost, Services
from mpilaunch.agent.services.registry import REGISTRY
from mpilaunch.agent.shm_watch import ShmWatch
from mpilaunch.agent.torch_support import TorchSupport
from mpilaunch.host import files, hostinfo, spawn
from mpilaunch.host.binding import cpu_groups, cpus_for, domains
from mpilaunch.host.binding import report as binding_report
from mpilaunch.host.limits import limit_words
from mpilaunch.host.programs import merge_host_environment, probe_port, program_family, program_problem
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import (
    DOWN,
    Bye,
    Check,
    Checked,
    Drop,
    Finish,
    Hello,
    Kill,
    Launch,
    Note,
    Ping,
    Put,
    PutDone,
    RelayHosts,
    Signal,
    TakeStacks,
    decode,
    encode,
)
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.relay import Relay
    from mpilaunch.agent.stacks import StackTaker

ORPHAN_GRACE = 1.0  # grace between SIGTERM and SIGKILL when the controller is gone
SIGNALS = frozenset(signal.valid_signals())
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # torch's @record writes a rank's exception there, unless the job names it


class Agent(ServiceHost, LinkOwner, Timer):
    def __init__(self, link: _socket.socket | PipeLink, payload: bytes | None = None) -> None:
        self.link = link
        self.payload = payload  # the loader and modules this agent came with (remote agents)
        self.host_env: dict[str, str] = dict(os.environ)  # a remote host's is merged with the launcher's paths
        self.host = _socket.gethostname()
        self.loop = Loop()
        self.decoder = wire.Decoder()
        self.link_open = True
        self.held: list[bytes] | None = None  # frames kept for one write (hold_frames)
        self.finishing = False
        self.stop_requested = 0  # the stop signal received (SIGTERM, SIGHUP), handled in tick
        self.relay: Relay | None = None  # tree spawn: the hosts this agent started
        self.stacks: StackTaker | None = None  # made at the first TakeStacks
        self.torch = TorchSupport(self.loop, self.send, self.host)  # error files; torchrun's agent store
        self.ranks = Ranks(self.loop, self.send, self.send_frame, lambda pid: self.reaper.watch_rank(pid))
        self.reaper = Reaper(self.ranks)
        self.shm = ShmWatch(self.ranks)
        self.reaper.before_kill = self.shm.look  # while the ranks still map their segments
        self.services = Services(self, REGISTRY)
        self.ranks.services = self.services
        self.heartbeat = Heartbeat(self)
        self.handlers = {
            Launch: self.launch,
            Check: self.check,
            Put: self.put,
            Signal: self.signal,
            Kill: self.kill,
            Finish: self.finish,
            RelayHosts: self.start_relay,
            Drop: self.drop,
            TakeStacks: self.want_stacks,
            Ping: lambda message: None,  # any frame is a word from the launcher
            **self.services.dispatch_rows(),
        }

    # -- the link -------------------------------------------------------------------------
    def send(self, message: Record) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        if not self.link_open:
            return
        if self.held is not None:
            self.held.append(frame)
            return
        try:
            self.link.sendall(frame)
        except OSError:
            self.link_lost()

    def hold_frames(self) -> None:
        """Frames are kept until release_frames: what one turn of the loop has to say (a launch's
        report per rank, the exits reaped together) goes to the launcher in one write."""
        self.held = []

    def release_frames(self) -> None:
        held, self.held = self.held, None
        if held:
            self.send_frame(b"".join(held))

    def link_lost(self) -> None:
        """The controller is gone: nobody will read output or decide policy any more."""
        if self.link_open and self.held:  # what this turn said before (a stop signal's note)
            held, self.held = self.held, []
            try:
                self.link.sendall(b"".join(held))
            except OSError:
                pass
        if self.link_open:
            self.link_open = False
            self.loop.unwatch(self.link)
            self.reaper.link_lost = True
            self.reaper.terminate_all(ORPHAN_GRACE)
            self.finishing = True
            if self.relay is not None:
                self.relay.close_all()  # their agents stop as this one does

    def read_link(self, fd: int) -> None:
        try:
            data = self.link.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.link_lost()
            return
        self.heartbeat.heard = time.monotonic()
        try:
            for kind, value in self.decoder.feed(data):
                self.on_frame(kind, value)
        except wire.FrameError as exc:  # bytes that are no frame, or a message we cannot take
            print(f"mpilaunch agent: bad request from the launcher ({exc}); stopping", file=sys.stderr)
            self.link_lost()

    def on_frame(self, kind: int, value: object) -> None:
        if kind == wire.STDIN:
            ident, _, data = value  # type: ignore[misc]
            self.ranks.queue_stdin(ident, data)
        elif kind == wire.ROUTED:  # tree spawn: for the hosts below, or (ALL) for them and us
            host, frame = value  # type: ignore[misc]
            if host == wire.ALL:
                if self.relay is not None:
                    self.relay.broadcast(frame)
                self.on_frame(*wire.decode_frame(frame))
            elif self.relay is not None:
                self.relay.down(host, frame)
        elif kind == wire.CONTROL:
            message = decode(value, DOWN)  # type: ignore[arg-type]
            self.handlers[type(message)](message)
        else:
            raise wire.FrameError(f"a frame of kind {kind} from the launcher")

    # -- the controller's messages ----------------------------------------------------------
    def check(self, message: Check) -> None:
        """Before anything starts: take the launcher's paths, and say whether each program and
        directory exists here, whether a MASTER_PORT is free (or pick one), and what the job
        asks about this host (CPUs, GPUs, device IPs: hostinfo.probe)."""
        self.host_env = merge_host_environment(dict(os.environ), message.carried)
        if message.heartbeat:
            self.heartbeat.start(message.heartbeat)
        problems = []
        families: dict[str, str] | None = {} if message.families else None
        for app in message.apps:
            path = app.path or self.host_env.get("PATH", os.defpath)
            problem = program_problem(app.program, app.wdir, path, message.mpi)
            if problem and problem not in problems:
                problems.append(problem)
            found = program_family(app.program, app.wdir, path) if families is not None and not problem else None
            if found is not None:
                families[app.program] = " ".join(found)  # type: ignore[index]
        port, port_free = message.port, None
        if port >= 0:
            port, port_free = probe_port(port)
        info = None
        if message.probe is not None:
            path = self.host_env.get("PATH", os.defpath)
            info = hostinfo.probe(message.probe.gpus, message.probe.hccn, path)
        self.send(Checked(problems=problems, port=port, port_free=port_free, info=info, families=families))

    def put(self, message: Put) -> None:
        """A file the ranks read (the rank table), before they start."""
        self.send(PutDone(error=files.write_file(message.path, message.data)))

    def launch(self, message: Launch) -> None:
        drop_names, drop_prefixes = set(message.drop_names), tuple(message.drop_prefixes)
        base = {k: v for k, v in self.host_env.items() if k not in drop_names and not k.startswith(drop_prefixes)}
        if message.store_port:
            self.torch.serve_store(message.store_port)
        services = self.services.start_job(message)
        level = message.bind_to
        groups = domains(len(message.ranks)) if level == "auto" else cpu_groups(level) if level != "none" else []
        gate = spawn.Gate()  # the ranks of this launch start together, once all are spawned
        started = 0
        found: dict[tuple[str, str | None], str] = {}  # their programs, looked up once per PATH
        try:
            for spec in message.ranks:
                cpus = cpus_for(level, spec.local_rank, groups, message.cpus_per_rank)
                if message.report_bindings:  # in Open MPI's words
                    self.send(Note(text=f"[{self.host}:{os.getpid()}] MCW rank {spec.rank} {binding_report(cpus)}"))
                env = {**base, **message.env, **spec.env}
                if ERROR_FILE not in spec.env and ERROR_FILE not in message.env:
                    env[ERROR_FILE] = self.torch.error_file(message.job, spec.rank)
                started += self.ranks.spawn(message.job, spec, env, message.merge, cpus, gate, services, found)
        finally:
            gate.release(started)

    def signal(self, message: Signal) -> None:
        if message.sig not in SIGNALS:
            raise wire.FrameError(f"signal {message.sig} out of range")
        self.ranks.signal_all(message.sig)

    def kill(self, message: Kill) -> None:
        if message.grace <= 0:
            self.reaper.kill_all(relayed_too=not self.link_open)
        else:
            self.reaper.terminate_all(message.grace)

    def finish(self, message: Finish) -> None:
        self.finishing = True
        self.reaper.terminate_all(message.grace)

    def start_relay(self, message: RelayHosts) -> None:
        """Tree spawn: start the agents of the hosts below this one, with our own code."""
        if self.payload is None:
            raise wire.FrameError("this agent was not started over SSH and cannot relay")
        if self.relay is None:
            from mpilaunch.agent.relay import Relay  # tree spawn only: a plain job never imports it

            self.relay = Relay(self.payload, self.send_frame, self.loop)
            self.reaper.relay = self.relay
        for pid in self.relay.start(message, dict(os.environ)):
            self.reaper.watch(pid)  # a kill -9 of this agent cuts its children's links too

    def drop(self, message: Drop) -> None:
        if self.relay is not None:
            self.relay.drop(message.host)

    def want_stacks(self, message: TakeStacks) -> None:
        if self.stacks is None:  # made at the first request: a plain job never imports it
            from mpilaunch.agent.stacks import StackTaker

            self.stacks = StackTaker(self.loop, self.send, self.ranks, self.reaper.watch, self.host_env)
        self.stacks.handle(message)

    pmix_guess: Callable[[], tuple[str | None, str | None] | None] | None = None

    def warm_pmix(self) -> None:
        """An agent forked at the launcher's start whose command line will likely be served PMIx
        starts the server now, on a thread, while the launcher parses and plans. Not when the
        launch is already here: it decides at once, and the guess (reading the program) would
        only delay it."""
        if self.pmix_guess is None or select.select([self.link], [], [], 0)[0]:
            return
        try:
            guess = self.pmix_guess()
        except Exception:  # only a guess: the launch decides
            return
        if guess is not None:
            self.services.prestart("pmix", guess)

    # -- what services ask --------------------------------------------------------------------
    def rank_running(self, ident: int) -> bool:
        return self.ranks.running(ident)

    def mpi_state(self, job: int, ident: int) -> str:
        return self.services.state_of(job, ident)

    def spoke(self, job: int, ident: int, rank: int, protocol: str) -> None:
        self.services.spoke(job, ident, rank, protocol)

    # -- running ------------------------------------------------------------------------------
    def all_done(self) -> bool:
        if self.relay is not None and not self.relay.done():
            return False
        return self.ranks.all_done()

    def tick(self, now: float) -> None:
        """A SIGTERM or SIGHUP to the agent: say so while the link still works, then act as if
        it were lost."""
        if self.stop_requested:
            sig, self.stop_requested = self.stop_requested, 0
            who = " by Slurm (scancel, or the job's time limit)" if os.environ.get("SLURM_STEP_ID") else ""
            try:
                self.send(Note(text=f"mpilaunch: the agent on {self.host} was sent {signal.Signals(sig).name}{who}"))
            except OSError:
                pass
            self.link_lost()

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        self.stop_requested = signum

    def run(self) -> int:
        become_subreaper()
        spawn.close_on_exec_all()
        cgroup = None
        if os.environ.get("MPILAUNCH_CGROUP", "0") == "1":  # on request only (host/cgroup.py says why)
            from mpilaunch.host.cgroup import JobCgroup

            cgroup = self.reaper.cgroup = JobCgroup.create(f"mpilaunch-{os.getpid()}")
        self.reaper.guardian = Guardian(cgroup)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_stop_signal)
        # A handler, not SIG_IGN: an ignored signal would stay ignored in every rank we exec.
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        self.loop.watch(wake_r, _drain)
        self.loop.watch(self.link, self.read_link)
        for timer in (self.reaper, self, self.ranks, self.ranks.death, self.heartbeat, self.shm, self.services):
            self.loop.add_timer(timer)  # services add themselves when a launch starts them
        reached = os.environ.get("SSH_CONNECTION", "").split()  # client, port, the address we were reached at, port
        self.send(
            Hello(
                host=self.host,
                cpus=os.cpu_count() or 1,
                pid=os.getpid(),
                python=".".join(map(str, sys.version_info[:3])),
                addr=reached[2] if len(reached) > 2 else "",
                client=reached[0] if reached else "",  # the launcher's address as this host sees it (over OpenSSH)
            )
        )
        self.warm_pmix()
        try:
            while not (self.finishing and self.all_done()):
                self.hold_frames()  # what one turn has to say (exits, output, PMI) goes in one write
                try:
                    self.loop.turn()
                finally:
                    self.release_frames()
        finally:  # also after an exception: nothing this agent started may outlive it
            self.reaper.sweep()
            self.reaper.release()
            self.services.close()  # a PMIx server and its files
            self.shm.clean()  # what the ranks left in /dev/shm, now that none of them maps it
            self.torch.close()
        self.send(Bye())
        return 0


def _drain(fd: int) -> None:
    """The signal wake-up pipe: its bytes only wake the loop (SIGCHLD: the reaper's tick reaps)."""
    try:
        os.read(fd, 512)
    except BlockingIOError:
        pass


def serve(link: _socket.socket, pmix_guess: Callable[[], tuple[str | None, str | None] | None] | None = None) -> int:
    """Run an agent on an already connected link until the job ends; pmix_guess: see
    Agent.warm_pmix."""
    agent = Agent(link)
    agent.pmix_guess = pmix_guess
    return run_or_say_why(agent)


def serve_stdio(payload: bytes | None = None) -> int:
    """Run as a remote host's agent: the link is stdin/stdout (the SSH channel). They are moved
    to private descriptors, so no rank inherits them and a stray print cannot corrupt a frame."""
    read_fd, write_fd = os.dup(0), os.dup(1)  # dup'd descriptors are not inherited
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    return run_or_say_why(Agent(PipeLink(read_fd, write_fd), payload))


def run_or_say_why(agent: Agent) -> int:
    """Run the agent; if a limit of this host stops it (`ulimit -u`: no guardian, no thread;
    `ulimit -n`: no pipe), its ranks are ended by the way out of run and the launcher is told
    why in its Bye, in words that name the limit, instead of a traceback here."""
    try:
        return agent.run()
    except (OSError, RuntimeError) as exc:
        why = limit_words(exc)
        if why is None:
            raise
        agent.send(Bye(why=why))
        return 1
