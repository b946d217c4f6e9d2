"""Per-host supervisor: spawns that host's ranks, relays their output, kills them.

Stdlib only, like everything in agent/, host/ and protocol/: for remote hosts these are
shipped over the link and run by a bare Python 3. It exits, killing its ranks, when its link
to the controller closes. The parts: the loop (loop.py), the link, its frames and its heartbeat
(link.py), the Check and each Launch (launches.py), the ranks (ranks.py), reaping and killing
(reaper.py), rank-facing services such as PMI (services/), tree-spawn relaying (relay.py). This
class makes them, answers the controller's messages (one handler per message type) and runs
the loop until the job is over.
"""

from __future__ import annotations

import _signal as signal
import _socket
import os
import select
import sys

from mpilaunch.agent.launches import Launches
from mpilaunch.agent.link import Heartbeat, PipeLink, Uplink
from mpilaunch.agent.loop import Loop, Timer
from mpilaunch.agent.ranks import Ranks
from mpilaunch.agent.reaper import Guardian, Reaper, become_subreaper
from mpilaunch.agent.services.base import ServiceHost, Services
from mpilaunch.agent.shm_watch import ShmWatch
from mpilaunch.agent.torch_support import TorchSupport
from mpilaunch.host import files, spawn
from mpilaunch.host.limits import limit_words
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import (
    Bye,
    Check,
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
    TakeUsage,
    Usage,
)
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.stacks import StackTaker

ORPHAN_GRACE = 1.0  # grace between SIGTERM and SIGKILL when the controller is gone
SIGNALS = frozenset(signal.valid_signals())
STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}  # what the agent takes as "stop"


class Agent(ServiceHost, Timer):
    def __init__(self, link: _socket.socket | PipeLink, payload: bytes | None = None) -> None:
        self.payload = payload  # the loader and modules this agent came with (remote agents)
        self.host = _socket.gethostname()
        self.loop = Loop()
        self.uplink = Uplink(link, self.loop, self.link_lost)
        self.finishing = False
        self.stop_requested = 0  # the stop signal received (SIGTERM, SIGHUP), handled in tick
        self.stacks: StackTaker | None = None  # made at the first TakeStacks
        self.torch = TorchSupport(self.loop, self.send, self.host)  # error files; torchrun's agent store
        self.ranks = Ranks(self.loop, self.send, self.uplink.send_frame, lambda pid: self.reaper.watch_rank(pid))
        self.reaper = Reaper(self.ranks)
        self.shm = ShmWatch(self.ranks)
        self.reaper.before_kill = self.shm.look  # while the ranks still map their segments
        self.services = Services(self)
        self.ranks.services = self.services
        self.launches = Launches(self.ranks, self.services, self.torch, self.send, self.host)
        self.heartbeat = Heartbeat(self.uplink)
        self.uplink.stdin = self.ranks.queue_stdin
        self.uplink.handlers = self.handlers = {
            Launch: self.launches.launch,
            Check: self.check,
            Put: lambda message: self.send(PutDone(error=files.write_file(message.path, message.data))),
            Signal: self.signal,
            Kill: self.kill,
            Finish: self.finish,
            RelayHosts: self.start_relay,
            Drop: self.drop,
            TakeStacks: lambda message: stack_taker(self).handle(message),
            TakeUsage: lambda message: self.send(usage_of(message, self.ranks)),
            Ping: lambda message: None,  # any frame is a word from the launcher
            **self.services.dispatch_rows(),
        }

    @property
    def host_env(self) -> dict[str, str]:
        """The host's environment ranks start from (a remote one has the launcher's paths)."""
        return self.launches.host_env

    def send(self, message: Record) -> None:
        self.uplink.send(message)

    def link_lost(self) -> None:
        """The controller is gone: nobody will read output or decide policy any more."""
        self.reaper.link_lost = True
        self.reaper.terminate_all(ORPHAN_GRACE)
        self.finishing = True
        if self.uplink.relay is not None:
            self.uplink.relay.close_all()  # their agents stop as this one does

    # -- the controller's messages ----------------------------------------------------------
    def check(self, message: Check) -> None:
        if message.heartbeat:
            self.heartbeat.start(message.heartbeat)
        self.send(self.launches.check(message))

    def signal(self, message: Signal) -> None:
        if message.sig not in SIGNALS:
            raise wire.FrameError(f"signal {message.sig} out of range")
        self.ranks.signal_all(message.sig)

    def kill(self, message: Kill) -> None:
        if message.grace <= 0:
            self.reaper.kill_all(relayed_too=not self.uplink.open)
        else:
            self.reaper.terminate_all(message.grace)

    def finish(self, message: Finish) -> None:
        self.finishing = True
        self.reaper.terminate_all(message.grace)

    def start_relay(self, message: RelayHosts) -> None:
        """Tree spawn: start the agents of the hosts below this one, with our own code."""
        if self.payload is None:
            raise wire.FrameError("this agent was not started over SSH and cannot relay")
        if self.uplink.relay is None:
            from mpilaunch.agent.relay import Relay  # tree spawn only: a plain job never imports it

            relay = Relay(self.payload, self.uplink.send_frame, self.loop, self.ranks.os)
            self.uplink.relay = self.reaper.relay = relay
        for pid in self.uplink.relay.start(message, dict(os.environ)):
            self.reaper.watch(pid)  # a kill -9 of this agent cuts its children's links too

    def drop(self, message: Drop) -> None:
        if self.uplink.relay is not None:
            self.uplink.relay.drop(message.host)

    pmix_guess: Callable[[], tuple[str | None, str | None] | None] | None = None

    def warm_pmix(self) -> None:
        """An agent forked at the launcher's start whose command line will likely be served PMIx
        starts the server now, on a thread, while the launcher parses and plans. Not when the
        launch is already here: it decides at once, and the guess (reading the program) would
        only delay it."""
        if self.pmix_guess is None or select.select([self.uplink.link], [], [], 0)[0]:
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
        if self.uplink.relay is not None and not self.uplink.relay.done():
            return False
        return self.ranks.all_done()

    def tick(self, now: float) -> None:
        """A SIGTERM or SIGHUP to the agent: say so while the link still works, then act as if
        it were lost."""
        if self.stop_requested:
            sig, self.stop_requested = self.stop_requested, 0
            who = " by Slurm (scancel, or the job's time limit)" if os.environ.get("SLURM_STEP_ID") else ""
            try:
                self.send(Note(text=f"mpilaunch: the agent on {self.host} was sent {STOP_SIGNALS[sig]}{who}"))
            except OSError:
                pass
            self.uplink.lose()

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        self.stop_requested = signum

    def run(self) -> int:
        become_subreaper()
        spawn.close_on_exec_all()
        cgroup = None
        if os.environ.get("MPILAUNCH_CGROUP", "0") == "1":  # on request only (host/cgroup.py says why)
            from mpilaunch.host.cgroup import JobCgroup

            cgroup = self.reaper.cgroup = JobCgroup.create(f"mpilaunch-{os.getpid()}")
        self.reaper.guardian = Guardian(self.ranks.os, cgroup)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_stop_signal)
        # A handler, not SIG_IGN: an ignored signal would stay ignored in every rank we exec.
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        self.loop.watch(wake_r, _drain)
        self.loop.watch(self.uplink.link, self.uplink.read)
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
                self.uplink.hold()  # what one turn has to say (exits, output, PMI) goes in one write
                try:
                    self.loop.turn()
                finally:
                    self.uplink.release()
        finally:  # also after an exception: nothing this agent started may outlive it
            self.reaper.sweep()
            self.services.close()  # a PMIx server and its files
            self.shm.clean()  # what the ranks left in /dev/shm, now that none of them maps it
            self.torch.close()
            self.reaper.release()  # last: a folder the agent could not remove is the guardian's
        self.send(Bye())
        return 0


def stack_taker(agent: Agent) -> StackTaker:
    """The agent's stack taker, made at the first request: a plain job never imports it."""
    if agent.stacks is None:
        from mpilaunch.agent.stacks import StackTaker

        agent.stacks = StackTaker(agent.loop, agent.send, agent.ranks, agent.reaper.watch, agent.host_env)
    return agent.stacks


def usage_of(message: TakeUsage, ranks: Ranks) -> Usage:
    """Every running rank's use (agent/usage.py, imported at the first request)."""
    from mpilaunch.agent.usage import measure

    live = [(ident, rp.pid) for ident, rp in sorted(ranks.by_ident.items()) if rp.status is None]
    return Usage(snap=message.snap, ranks=measure(live), cpus=len(os.sched_getaffinity(0)))


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
