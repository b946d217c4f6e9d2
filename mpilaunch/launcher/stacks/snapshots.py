"""Snapshots of every rank's stack: asked for (SIGQUIT, `mpilaunch stacks`, --timeout with
--get-stack-traces, --hang-timeout), taken by each host's agent (agent/stacks.py), gathered here,
grouped (stack_groups.py) and given out: printed, written to the log tree as
DIR/JOB/rank.N/stack.K, kept for --report-json, answered to `mpilaunch stacks`.

One snapshot at a time: a request that comes while one is being taken joins it. A host that does
not answer in time, or whose agent is lost, has its ranks listed without a stack, with why; the
snapshot never waits for ever, so a kill that waits for it (policy.kill_after_stacks) comes.
Imported when the first snapshot is asked for (watch.py keeps the socket and the hang watch).
"""

from __future__ import annotations

import time

from mpilaunch.launcher.decide.events import StacksTaken
from mpilaunch.launcher.decide.states import RUNNING, STOPPING
from mpilaunch.launcher.loop.links import own_proc
from mpilaunch.protocol.messages import RankStack, Stacks, TakeStacks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.launcher.decide.policy import Policy
    from mpilaunch.launcher.loop.links import HostLink, Links
    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.launcher.stacks.stacks_socket import Client
    from mpilaunch.plan.build import LaunchPlan

LIMIT = 5.0  # seconds each tool gets per rank
PARALLEL = 16  # tools an agent runs at once (agent/stacks.py)
MARGIN = 5.0  # more seconds for the answers to come up the links
ASKED_BY_CLIENT = "mpilaunch stacks"
DEBUG_HINT = "pip install 'mpilaunch[debug]'"
LACKS = {
    "py-spy": "has no py-spy: its Python ranks' stacks are native frames ({hint} for their Python frames)",
    "tools": "has no py-spy, eu-stack or gdb: no stacks taken there ({hint} gives py-spy; elfutils gives eu-stack)",
}
WHY_WORDS = {"hang": "no output for {hang:g} s", "timeout": "--timeout", ASKED_BY_CLIENT: "asked by mpilaunch stacks"}


class Snapshot:
    def __init__(self, number: int, why: str, now: float, wait: float) -> None:
        self.number = number  # K of stack.K
        self.whys = [why]
        self.clients: list[Client] = []
        self.taken = time.time()
        self.wait = wait
        self.deadline = now + wait
        self.waiting: set[int] = set()  # hosts not answered yet
        self.stacks: dict[int, RankStack] = {}
        self.notes: list[tuple[int, str]] = []  # (host, line), said before the stacks in host order
        self.asked: list[int] = []  # the process ids running when it was asked for


class StackSnapshots:
    def __init__(
        self,
        plan: LaunchPlan,
        policy: Policy,
        links: Links,
        output: OutputSink,
        clock: Callable[[], float],
        taken: list[dict[str, object]],
    ) -> None:
        """taken: --report-json's "stacks", where each snapshot is added."""
        self.plan = plan
        self.policy = policy
        self.links = links
        self.output = output
        self.clock = clock
        self.current: Snapshot | None = None
        self.count = 0
        self.taken = taken
        self.hang = plan.options.hang_timeout

    # -- asking --------------------------------------------------------------------------------
    def client_asked(self, client: Client) -> None:
        who = f" (pid {client.pid})" if client.pid else ""
        asker = "mpilaunch top" if client.ranks else "mpilaunch stacks"  # top asks for the ranks it shows
        self.output.say(f"mpilaunch: every rank's stack asked for by `{asker}`{who}")
        self.want(ASKED_BY_CLIENT, client)

    def want(self, why: str, client: Client | None = None) -> None:
        if why == "SIGQUIT":
            self.output.say("mpilaunch: SIGQUIT: taking every rank's stack (again within 1 s: stop the job)")
        snap = self.current
        if snap is None:
            snap = self.begin(why)
        elif why not in snap.whys:
            snap.whys.append(why)
        if client is not None:
            snap.clients.append(client)
        if not snap.waiting:
            self.complete()

    def begin(self, why: str) -> Snapshot:
        self.count += 1
        asked = [s for s in self.policy.procs if s.state in (RUNNING, STOPPING) and s.pid is not None]
        per_host: dict[int, int] = {}
        for state in asked:
            per_host[state.rank.host] = per_host.get(state.rank.host, 0) + 1
        waves = -(-max(per_host.values(), default=1) // PARALLEL)
        snap = self.current = Snapshot(self.count, why, self.clock(), LIMIT * waves + MARGIN)
        snap.asked = [s.proc for s in asked]
        snap.waiting = {host for host in per_host if self.links.is_open(host)}
        self.links.send_to(snap.waiting, TakeStacks(snap=snap.number, limit=LIMIT))
        return snap

    # -- answers ---------------------------------------------------------------------------------
    def took(self, link: HostLink, message: Stacks) -> None:
        for stack in message.stacks:
            own_proc(self.policy.procs, link, stack.proc)
        snap = self.current
        if snap is None or message.snap != snap.number or link.index not in snap.waiting:
            return  # the answer to a snapshot given up on
        snap.stacks.update((s.proc, s) for s in message.stacks)
        if message.lacks in LACKS:
            said = LACKS[message.lacks].format(hint=DEBUG_HINT)
            snap.notes.append((link.index, f"mpilaunch: host {self.plan.hosts[link.index].name} {said}"))
        snap.waiting.discard(link.index)
        if not snap.waiting:
            self.complete()

    def next_deadline(self) -> float | None:
        return self.current.deadline if self.current else None

    def tick(self, now: float) -> None:
        snap = self.current
        if snap is not None and (now >= snap.deadline or not any(self.links.is_open(h) for h in snap.waiting)):
            self.complete()

    # -- the snapshot, given out ------------------------------------------------------------------
    def complete(self) -> None:
        from mpilaunch.launcher.stacks.stack_groups import frame_lines, group, snapshot_lines
        from mpilaunch.launcher.stacks.stack_text import threads_of

        snap = self.current
        assert snap is not None
        self.current = None
        procs = self.policy.procs
        found, missing = {}, []
        for proc in snap.asked:
            state = procs[proc]
            who = (state.job, state.rank.rank)
            stack = snap.stacks.get(proc)
            if stack is None:
                missing.append((who, self.unanswered(state.rank.host, snap)))
                continue
            threads, why = threads_of(stack.tool, stack.text) if not stack.why else ((), stack.why)
            if threads:
                found[who] = threads
            else:
                missing.append((who, f"{why} (host {self.plan.hosts[state.rank.host].name})"))
            if stack.text or why:
                self.output.keep(proc, f"stack.{snap.number}", (stack.text or f"no stack: {why}\n").encode())
        groups = group(found)

        self.taken.append(
            {
                "taken": round(snap.taken, 6),
                "why": snap.whys[0],
                "groups": [{"ranks": [list(r) for r in g.ranks], "frames": frame_lines(g.threads)} for g in groups],
                "missing": [{"job": job, "rank": rank, "why": why} for (job, rank), why in missing],
            }
        )
        notes = [note for _, note in sorted(snap.notes)]
        text = "\n".join([*notes, self.header(snap, len(found), len(groups)), *snapshot_lines(groups, missing)])
        for client in snap.clients:
            if client.ranks:  # `mpilaunch top`'s selected ranks: their stacks alone
                mine = {who: threads for who, threads in found.items() if who in client.ranks}
                lost = [(who, why) for who, why in missing if who in client.ranks]
                client.reply("\n".join(snapshot_lines(group(mine), lost)) + "\n")
            else:
                client.reply(text + "\n")
        if any(why != ASKED_BY_CLIENT for why in snap.whys):
            self.output.say(text)
        for why in snap.whys:
            self.policy.handle(StacksTaken(why))

    def unanswered(self, host: int, snap: Snapshot) -> str:
        name = self.plan.hosts[host].name
        if not self.links.is_open(host):
            return f"the agent of host {name} was lost"
        return f"no answer from the agent of host {name} in {snap.wait:g} s"

    def header(self, snap: Snapshot, taken: int, groups: int) -> str:
        whys = "; ".join(WHY_WORDS.get(w, w).format(hang=self.hang or 0) for w in snap.whys)
        tree = self.output.trees.get(1)
        where = f"; each rank's in {tree.root}/rank.N/stack.{snap.number}" if tree is not None else ""
        if not snap.asked:
            return f"mpilaunch: no stacks ({whys}): no rank is running"
        if not taken:
            return f"mpilaunch: no stack of the {len(snap.asked)} running ranks could be taken ({whys})"
        return (
            f"mpilaunch: stacks of {taken} of {len(snap.asked)} running ranks ({whys}): "
            f"{groups} group{'s' if groups != 1 else ''}, largest first{where}"
        )
