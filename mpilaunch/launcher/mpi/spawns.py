"""MPI_Comm_spawn: a new job on free slots, with its own ranks, KVS or PMIx namespace and log
directory, planned as job 1 was (plan/build.spawn_plan) and launched by the controller.

MPICH's ranks ask over PMI (PmiSpawn) and are answered once the job is launched. Open MPI's ask
over PMIx (PmixSpawn), and are answered as PMIx_Spawn promises: once every new rank started,
or at the first that could not, with PMIx's status; a job that cannot be placed, or a program
the spawning rank's agent could not find, is refused at once. Every agent of the run registers
the new job's namespace, and the new job's agents every other job's (Launch.others), as PRRTE's
daemons know every job, so that ranks of the two jobs can connect.
"""

from __future__ import annotations

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.decide.events import RankEnded, RankNotStarted, RankStarted, SpawnRefused, table
from mpilaunch.plan.build import remote_hosts, spawn_plan
from mpilaunch.protocol.messages import (
    MessageError,
    PmiSpawn,
    PmiSpawnReply,
    PmixNspace,
    PmixSpawn,
    PmixSpawnReply,
)
from mpilaunch.transport.base import close_and_wait, host_problems

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from mpilaunch.launcher.decide.events import Events
    from mpilaunch.launcher.decide.policy import Policy
    from mpilaunch.launcher.loop.links import HostLink, Links
    from mpilaunch.launcher.mpi.spawn_agents import AgentStarts
    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.plan.build import JobPlan, LaunchPlan
    from mpilaunch.protocol.messages import SpawnApp
    from mpilaunch.protocol.record import Record
    from mpilaunch.transport.base import HostResult, Link

# PMIx's status codes (pmix_common.h) a refused spawn is answered with
PMIX_ERR_OUT_OF_RESOURCE, PMIX_ERR_JOB_FAILED_TO_LAUNCH = -29, -181


class Spawner:
    """The controller's rows for spawn requests, and the PMIx spawns waiting for their ranks.
    add_job adds a planned job to the run (its process ids); launch starts it on the agents;
    starts (None: no remote host may be added) starts agents on hosts that have none, and adopt
    makes each greeted one a link of the run."""

    def __init__(
        self,
        plan: LaunchPlan,
        policy: Policy,
        links: Links,
        events: Events,
        output: OutputSink,
        jobs: Mapping[int, JobPlan],
        add_job: Callable[[JobPlan], list[int]],
        launch: Callable[[JobPlan], None],
        starts: AgentStarts | None = None,
        adopt: Callable[[int, Link], None] | None = None,
    ) -> None:
        self.plan, self.policy, self.links, self.events, self.output = plan, policy, links, events, output
        self.jobs, self.add_job, self.launch = jobs, add_job, launch
        self.starts, self.adopt = starts, adopt
        self.waiting: dict[int, tuple[HostLink, PmixSpawn]] = {}  # new job -> the request its start answers
        self.starting: dict[int, JobPlan] = {}  # new jobs whose hosts' agents are being started
        events.subscribe(table({RankStarted: self.settle, RankNotStarted: self.settle, RankEnded: self.settle}))

    def rows(self) -> dict[type, object]:
        return {PmiSpawn: self.pmi_spawn, PmixSpawn: self.pmix_spawn}

    def new_job(
        self, apps: Sequence[SpawnApp], preput: Mapping[str, str], parent: tuple[str, int] | None = None
    ) -> tuple[JobPlan, list[int]]:
        """The job planned on the slots no running rank holds (nor a job whose agents are being
        started), and the remote hosts it needs an agent on."""
        plan = self.plan
        job_no = max([*self.jobs, *self.starting]) + 1
        in_use = [0] * len(plan.hosts)
        for state in self.policy.procs:
            if not state.done:
                in_use[state.rank.host] += 1
        for starting in self.starting.values():
            for rank in starting.ranks:
                in_use[rank.host] += 1
        if self.policy.ending:
            raise LaunchError("the job is ending")
        child = spawn_plan(plan, job_no, apps, in_use, preput, parent)
        unreached = [i for i in remote_hosts(plan.options, plan.hosts, child.ranks) if i not in self.links]
        if unreached and self.starts is None:
            name = plan.hosts[unreached[0]].name
            raise LaunchError(f"it would place ranks on {name!r}, which has no agent (no rank of job 1 runs there)")
        return child, unreached

    def begin(
        self, child: JobPlan, unreached: list[int], answer: Callable[[], None], refuse: Callable[[str], None]
    ) -> None:
        """Add the job to the run and answer, once every host it needs has an agent: at once, or
        when the agents started for it greeted (refused if one could not be started or checked)."""
        if not unreached:
            self.admit(child)
            answer()
            return
        self.starting[child.job] = child
        assert self.starts is not None

        def started(results: dict[int, HostResult]) -> None:
            del self.starting[child.job]
            problems = host_problems(results, lambda index: self.plan.hosts[index].name)
            if problems or self.policy.ending:
                close_and_wait(r.link for r in results.values())
                refuse("; ".join(problems) or "the job is ending")
                return
            for index, result in results.items():
                self.adopt(index, result.link)  # type: ignore[misc, arg-type]
            self.admit(child)
            answer()

        self.starts.start(unreached, child, started)

    def admit(self, child: JobPlan) -> None:
        self.output.add_job(child.job, self.add_job(child))

    def pmi_spawn(self, link: HostLink, message: PmiSpawn) -> None:
        preput = {key: value for app in message.apps for key, value in app.preput.items()}

        def refuse(why: str) -> None:
            self.events.publish(SpawnRefused(message.proc, why))
            self.links.send(link, PmiSpawnReply(job=message.job, req=message.req, rc=-1, msg=why))

        def answer() -> None:
            self.launch(child)
            self.links.send(link, PmiSpawnReply(job=message.job, req=message.req, rc=0))

        try:
            child, unreached = self.new_job(message.apps, preput)
        except LaunchError as exc:
            refuse(str(exc))
            return
        self.begin(child, unreached, answer, refuse)

    def pmix_spawn(self, link: HostLink, message: PmixSpawn) -> None:
        spawner = self.policy.procs[message.proc]
        parent = self.jobs.get(message.job)
        if spawner.job != message.job or parent is None or parent.pmix is None:
            raise MessageError(f"process {message.proc} is no PMIx rank of job {message.job}")

        def refuse(why: str, status: int = PMIX_ERR_OUT_OF_RESOURCE) -> None:
            self.events.publish(SpawnRefused(message.proc, why))
            self.links.send(link, PmixSpawnReply(job=message.job, req=message.req, status=status, msg=why))

        def answer() -> None:
            self.launch(child)
            if child.pmix is not None:
                hosts = {rank.host for rank in child.ranks}
                for other in self.links:
                    if other.index not in hosts:
                        self.links.send(other, PmixNspace(pmix=child.pmix))
            self.waiting[child.job] = (link, message)

        if message.problem:
            refuse(message.problem, PMIX_ERR_JOB_FAILED_TO_LAUNCH)
            return
        try:
            child, unreached = self.new_job(message.apps, {}, (parent.pmix.nspace, spawner.rank.rank))
        except LaunchError as exc:
            refuse(str(exc))
            return
        self.begin(child, unreached, answer, lambda why: refuse(why, PMIX_ERR_JOB_FAILED_TO_LAUNCH))

    def settle(self, event: Record) -> None:
        """A rank started, ended or could not start: a PMIx spawn waiting for its job is answered
        once every rank of it started, or at the first that could not."""
        job = self.policy.procs[event.proc].job  # type: ignore[attr-defined]
        entry = self.waiting.get(job)
        if entry is None:
            return
        states = [state for state in self.policy.procs if state.job == job]
        lost = isinstance(event, RankNotStarted) or any(state.done and state.started_at is None for state in states)
        if not lost and any(state.started_at is None for state in states):
            return
        del self.waiting[job]
        link, message = entry
        if lost:
            why = event.error if isinstance(event, RankNotStarted) else "a rank of the new job could not start"
            reply = PmixSpawnReply(job=message.job, req=message.req, status=PMIX_ERR_JOB_FAILED_TO_LAUNCH, msg=why)
        else:
            pmix = self.jobs[job].pmix
            reply = PmixSpawnReply(job=message.job, req=message.req, status=0, nspace=pmix.nspace if pmix else "")
        self.links.send(link, reply)
