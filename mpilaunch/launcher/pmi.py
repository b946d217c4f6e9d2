"""The job-wide half of PMI, kept by the controller: barriers across hosts, the name service,
MPI_Comm_spawn. Agents answer everything else locally (agent/services/pmi_job.py)."""

from __future__ import annotations

from mpilaunch.errors import LaunchError
from mpilaunch.launcher.events import SpawnRefused
from mpilaunch.plan.build import remote_hosts, spawn_plan
from mpilaunch.protocol.messages import (
    MessageError,
    PmiFence,
    PmiFenceDone,
    PmiName,
    PmiNameReply,
    PmiSpawn,
    PmiSpawnReply,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see protocol/record.py)
if TYPE_CHECKING:
    from mpilaunch.launcher.controller import Controller, HostLink
    from mpilaunch.plan.build import JobPlan


class JobKvs:
    """Collects each host's puts at a barrier of one job; once every host is in, all go to all."""

    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        self.entered: set[int] = set()
        self.batch: dict[str, str] = {}

    def fence(self, host: int, kvs: dict[str, str]) -> dict[str, str] | None:
        """Record one host's arrival; the merged puts when it was the last one, else None."""
        self.entered.add(host)
        self.batch.update(kvs)
        if len(self.entered) < self.hosts:
            return None
        merged, self.batch, self.entered = self.batch, {}, set()
        return merged


class NameService:
    """MPI_Publish_name and friends, shared by every job of the run."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def request(self, cmd: str, service: str, port: str | None) -> tuple[int, str, str]:
        """publish_name, unpublish_name or lookup_name: (rc, port, msg)."""
        if not service:
            return -1, "", "no_service_name"
        if cmd == "publish_name":
            if service in self.names:
                return -1, "", "service_already_published"
            self.names[service] = port or ""
            return 0, "", ""
        if cmd == "unpublish_name":
            if self.names.pop(service, None) is None:
                return -1, "", "service_not_published"
            return 0, "", ""
        if service not in self.names:
            return -1, "", "service_not_found"
        return 0, self.names[service], ""


class JobWidePmi:
    """The controller's rows for what agents send up for the whole job."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.kvs: dict[int, JobKvs] = {}
        self.names = NameService()

    def rows(self) -> dict[type, object]:
        return {PmiFence: self.fence, PmiName: self.name, PmiSpawn: self.spawn}

    def add_job(self, job: JobPlan) -> None:
        self.kvs[job.job] = JobKvs(len({r.host for r in job.ranks}))

    def fence(self, link: HostLink, message: PmiFence) -> None:
        kvs = self.kvs.get(message.job)
        if kvs is None:
            raise MessageError(f"job {message.job} is not one of the run's")
        merged = kvs.fence(link.index, message.kvs)
        if merged is not None:
            self.controller.broadcast(PmiFenceDone(job=message.job, kvs=merged))

    def name(self, link: HostLink, message: PmiName) -> None:
        rc, port, msg = self.names.request(message.cmd, message.service, message.port)
        reply = PmiNameReply(job=message.job, req=message.req, cmd=message.cmd, rc=rc, port=port, msg=msg)
        self.controller.send(link, reply)

    def spawn(self, link: HostLink, message: PmiSpawn) -> None:
        """MPI_Comm_spawn: a new job on free slots, with its own ranks, KVS and log directory."""
        controller = self.controller
        plan = controller.plan
        job_no = max(controller.jobs) + 1
        in_use = [0] * len(plan.hosts)
        for state in controller.policy.procs:
            if not state.done:
                in_use[state.rank.host] += 1
        preput: dict[str, str] = {}
        for app in message.apps:
            preput.update(app.preput)
        try:
            if controller.policy.ending:
                raise LaunchError("the job is ending")
            child = spawn_plan(plan, job_no, message.apps, in_use, preput)
            unreached = [i for i in remote_hosts(plan.hosts, child.ranks) if i not in controller.links]
            if unreached:
                name = plan.hosts[unreached[0]].name
                raise LaunchError(f"it would place ranks on {name!r}, which has no agent (no rank of job 1 runs there)")
            controller.output.add_job(job_no, controller.add_job(child))
        except LaunchError as exc:
            controller.events.publish(SpawnRefused(message.proc, str(exc)))
            controller.send(link, PmiSpawnReply(job=message.job, req=message.req, rc=-1, msg=str(exc)))
            return
        controller.launch(child)
        controller.send(link, PmiSpawnReply(job=message.job, req=message.req, rc=0))
