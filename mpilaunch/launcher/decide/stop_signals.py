"""What a signal to the launcher does to the run, apart from any descriptor: forwarded, a stack
snapshot asked for, or the run stopped by it (signal_table.ACTIONS says which), and then, for a
stop, the grace after which the ranks still running are stopped, and the second signal that
kills them at once.

Part of the policy (policy.py), which owns the run's phase and its aborts; the tests replay
signal histories against both with a fake clock.
"""

from __future__ import annotations

import signal

from mpilaunch.launcher.decide.events import Forward, HardStop, StopNotice, WantStacks
from mpilaunch.launcher.decide.signal_table import ACTIONS, FORWARD, STACKS, STACKS_TWICE, STOP
from mpilaunch.launcher.decide.states import INTERRUPTED, RUNNING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    from mpilaunch.launcher.decide.events import SignalReceived
    from mpilaunch.plan.spec import Options
    from mpilaunch.protocol.record import Record

    class Run(Protocol):
        """What of the policy a signal acts on."""

        options: Options
        clock: Callable[[], float]
        publish: Callable[[Record], None]
        phase: str
        hydra: bool

        def abort(self, grace: float) -> None: ...
        def move(self, phase: str) -> None: ...
        def all_done(self) -> bool: ...


class StopSignals:
    def __init__(self, policy: Run) -> None:
        self.policy = policy
        self.first: int | None = None  # the first signal that stops the run (SIGINT, SIGTERM...)
        self.escalate_at: float | None = None  # after it: when the ranks still running are stopped
        self.escalate_grace = 0.0  # ... with this abort's grace (0: SIGKILL at once)
        self.stacks_asked: dict[int, float] = {}  # a STACKS signal -> when it last asked for stacks

    def take(self, event: SignalReceived) -> None:
        """A signal's row of signal_table.ACTIONS: forwarded, or the run stopped by it. After the
        first stop signal the ranks get a grace to end on their own (--kill-timeout, torchrun's
        --shutdown-timeout), then SIGTERM and SIGKILL; a second stop signal, of any kind (a
        SIGTERM after a closed terminal's SIGHUP, Ctrl-C twice), kills every rank at once, but
        for a SIGTERM under hydra's rules, which is forwarded as each one is."""
        policy, sig = self.policy, event.sig
        action, sent = ACTIONS.get(sig, (FORWARD, sig))
        if action == STACKS:  # a first one asks for stacks; a second within STACKS_TWICE stops the run
            now, last = policy.clock(), self.stacks_asked.pop(sig, None)
            if last is None or now - last > STACKS_TWICE:
                self.stacks_asked[sig] = now
                policy.publish(WantStacks(signal.Signals(sig).name))
                return
            action = STOP
        if action != STOP or (self.first is not None and policy.hydra and sig == signal.SIGTERM):
            policy.publish(Forward(sent))  # hydra's: every SIGTERM goes to the ranks
            return
        if self.first is not None:
            policy.publish(HardStop(sig))
            policy.abort(0)
            return
        self.first = sig
        if policy.phase == RUNNING:
            policy.move(INTERRUPTED)
        policy.publish(Forward(sent))
        if policy.phase != INTERRUPTED or policy.all_done():
            return  # an abort or the end is under way already: it stops what is left
        own = policy.options.signal_grace  # torchrun's: SIGKILL once it has passed
        grace = policy.options.kill_timeout if own is None else own
        self.escalate_grace = 0.0 if own is not None or sent == signal.SIGTERM else policy.options.kill_timeout
        self.escalate_at = policy.clock() + grace
        policy.publish(StopNotice(sig, sent, grace, self.escalate_grace > 0))

    def tick(self, now: float) -> None:
        """The grace after the first stop signal has passed: the ranks left are stopped."""
        if self.escalate_at is not None and now >= self.escalate_at:
            self.escalate_at = None
            if not self.policy.all_done():
                self.policy.abort(self.escalate_grace)
