"""What every rank of a running job uses now, for `mpilaunch top`: asked of every host's agent
(agent/usage.py), gathered here with what the launcher itself knows (each rank's state and the
time since its last output), and answered on the job's socket as one JSON document.

One measurement at a time: a request that comes while one is under way joins it, so many
viewers cost one. A host that does not answer within WAIT seconds is left out (its ranks show
no measurement); nothing is stopped or signalled to measure.
"""

from __future__ import annotations

import time

from mpilaunch.launcher.loop.links import own_proc
from mpilaunch.protocol.messages import RankUsage, TakeUsage, Usage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.launcher.decide.policy import Policy
    from mpilaunch.launcher.loop.links import HostLink, Links
    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.launcher.stacks.stacks_socket import Client
    from mpilaunch.plan.build import LaunchPlan

WAIT = 2.0  # seconds a measurement waits for the hosts' answers
SCHEMA = 1


class Measurement:
    def __init__(self, number: int, deadline: float) -> None:
        self.number = number
        self.deadline = deadline
        self.clients: list[Client] = []
        self.waiting: set[int] = set()
        self.found: dict[int, RankUsage] = {}
        self.cpus: dict[int, int] = {}


class UsageSnapshots:
    def __init__(
        self, plan: LaunchPlan, policy: Policy, links: Links, output: OutputSink, clock: Callable[[], float]
    ) -> None:
        self.plan, self.policy, self.links, self.output, self.clock = plan, policy, links, output, clock
        self.current: Measurement | None = None
        self.count = 0

    def client_asked(self, client: Client) -> None:
        """A `mpilaunch top` wants a measurement: it joins the one under way, or starts one."""
        current = self.current
        if current is None:
            self.count += 1
            current = self.current = Measurement(self.count, self.clock() + WAIT)
            hosts = {s.rank.host for s in self.policy.procs if not s.done and s.pid is not None}
            current.waiting = {host for host in hosts if self.links.is_open(host)}
            self.links.send_to(current.waiting, TakeUsage(snap=current.number))
        current.clients.append(client)
        if not current.waiting:
            self.complete()

    def took(self, link: HostLink, message: Usage) -> None:
        for usage in message.ranks:
            own_proc(self.policy.procs, link, usage.proc)
        current = self.current
        if current is None or message.snap != current.number or link.index not in current.waiting:
            return  # the answer to a measurement given up on
        current.found.update((u.proc, u) for u in message.ranks)
        current.cpus[link.index] = message.cpus
        current.waiting.discard(link.index)
        if not current.waiting:
            self.complete()

    def next_deadline(self) -> float | None:
        return self.current.deadline if self.current is not None else None

    def tick(self, now: float) -> None:
        current = self.current
        if current is not None and (now >= current.deadline or not any(self.links.is_open(h) for h in current.waiting)):
            self.complete()

    def complete(self) -> None:
        import json  # only when someone asks

        current = self.current
        assert current is not None
        self.current = None
        text = json.dumps(self.document(current), separators=(",", ":")) + "\n"
        for client in current.clients:
            client.reply(text)

    def document(self, current: Measurement) -> dict[str, object]:
        """The job as `mpilaunch top` shows it: every rank of every job, running or not."""
        now = self.clock()
        started = self.policy.started_at
        hosts = self.plan.hosts
        ranks = []
        for state in self.policy.procs:
            usage = current.found.get(state.proc)
            written = self.output.written_at.get(state.proc)
            ranks.append(
                {
                    "job": state.job,
                    "rank": state.rank.rank,
                    "host": hosts[state.rank.host].name,
                    "pid": state.pid,
                    "state": state.state,
                    "status": state.status,
                    "cpu": usage.cpu if usage else state.cpu,
                    "rss": usage.rss if usage else state.rss,
                    "proc_state": usage.state if usage else None,
                    "processes": usage.processes if usage else None,
                    "quiet": round(now - (written if written is not None else state.started_at or now), 3),
                    "wrote": written is not None,
                }
            )
        return {
            "schema": SCHEMA,
            "taken": round(time.time(), 3),
            "elapsed": round(now - started, 3) if started is not None else 0.0,
            "command": list(self.plan.job.argvs[0]),
            "hosts": [{"name": hosts[i].name, "cpus": n} for i, n in sorted(current.cpus.items())],
            "unanswered": [hosts[i].name for i in sorted(current.waiting)],
            "ranks": ranks,
        }
