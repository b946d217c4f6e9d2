"""What the controller always runs for stacks and `mpilaunch top`: the job's socket, opened at the
start so `mpilaunch stacks`/`top` find the job, and the --hang-timeout watch (the time since the
last byte any rank wrote). The snapshot code (snapshots.py, with stack_text.py and
stack_groups.py) and the measurements (usage.py) are imported when first needed: a request on
the socket, a SIGQUIT, a silence as long as --hang-timeout, or an agent's answer. A plain run
never loads them.
"""

from __future__ import annotations

from mpilaunch.launcher.decide.events import Silent, WantStacks
from mpilaunch.protocol.messages import Stacks, Usage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from selectors import BaseSelector

    from mpilaunch.launcher.decide.policy import Policy
    from mpilaunch.launcher.loop.links import Links
    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.launcher.stacks.snapshots import StackSnapshots
    from mpilaunch.launcher.stacks.stacks_socket import StacksServer
    from mpilaunch.launcher.stacks.usage import UsageSnapshots
    from mpilaunch.plan.build import LaunchPlan
    from mpilaunch.protocol.record import Record


class StacksWatch:
    def __init__(
        self, plan: LaunchPlan, policy: Policy, links: Links, output: OutputSink, clock: Callable[[], float]
    ) -> None:
        self.plan, self.policy, self.links, self.output, self.clock = plan, policy, links, output, clock
        self.hang = plan.options.hang_timeout
        self.last_output = clock()  # the controller's frames set it at every chunk of rank output
        self.taken: list[dict[str, object]] = []  # --report-json's "stacks", filled by the snapshots
        self.server: StacksServer | None = None
        self._snapshots: StackSnapshots | None = None
        self._usage: UsageSnapshots | None = None

    def snapshots(self) -> StackSnapshots:
        if self._snapshots is None:
            from mpilaunch.launcher.stacks.snapshots import StackSnapshots

            self._snapshots = StackSnapshots(self.plan, self.policy, self.links, self.output, self.clock, self.taken)
        return self._snapshots

    def usage(self) -> UsageSnapshots:
        if self._usage is None:
            from mpilaunch.launcher.stacks.usage import UsageSnapshots

            self._usage = UsageSnapshots(self.plan, self.policy, self.links, self.output, self.clock)
        return self._usage

    def rows(self) -> dict[type, Callable]:
        """The controller's rows for what agents send: answers to what was asked."""
        return {
            Stacks: lambda link, message: self.snapshots().took(link, message),
            Usage: lambda link, message: self.usage().took(link, message),
        }

    def __call__(self, event: Record) -> None:
        """A subscriber of the run's events: WantStacks (a SIGQUIT, a timeout's, a hang's)."""
        if type(event) is WantStacks:
            self.snapshots().want(event.why)

    def serve(self, sel: BaseSelector) -> None:
        """The job's socket for `mpilaunch stacks` and `mpilaunch top` (stacks_socket.py)."""
        from mpilaunch.launcher.stacks.stacks_socket import StacksServer

        asked = {"stacks": lambda c: self.snapshots().client_asked(c), "top": lambda c: self.usage().client_asked(c)}
        self.server = StacksServer(sel, asked)
        problem = self.server.open()
        if problem and not self.plan.options.quiet:
            self.output.say(f"mpilaunch: `mpilaunch stacks` cannot reach this job: {problem}")

    def hang_due(self) -> float | None:
        return self.last_output + self.hang if self.hang else None

    def next_deadline(self) -> float | None:
        due = [self.hang_due()]
        due += [part.next_deadline() for part in (self._snapshots, self._usage) if part is not None]
        found = [t for t in due if t is not None]
        return min(found) if found else None

    def tick(self, now: float) -> None:
        for part in (self._snapshots, self._usage):
            if part is not None:
                part.tick(now)
        due = self.hang_due()
        if due is not None and now >= due:
            self.last_output = now  # again after a further silence as long
            self.policy.handle(Silent(self.hang))  # type: ignore[arg-type]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
