"""The job-wide half of PMI, kept by the controller: barriers across hosts and the name service
(MPI_Comm_spawn starts a job: Controller.spawn). Agents answer everything else locally
(agent/services/)."""

from __future__ import annotations

from mpilaunch.launcher.links import HostLink, Links
from mpilaunch.plan.build import JobPlan
from mpilaunch.protocol.messages import MessageError, PmiFence, PmiFenceDone, PmiName, PmiNameReply


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
    """The controller's rows for barriers and names (spawning a job is the controller's own)."""

    def __init__(self, links: Links) -> None:
        self.links = links
        self.kvs: dict[int, JobKvs] = {}
        self.names = NameService()

    def rows(self) -> dict[type, object]:
        return {PmiFence: self.fence, PmiName: self.name}

    def add_job(self, job: JobPlan) -> None:
        self.kvs[job.job] = JobKvs(len({r.host for r in job.ranks}))

    def fence(self, link: HostLink, message: PmiFence) -> None:
        kvs = self.kvs.get(message.job)
        if kvs is None:
            raise MessageError(f"job {message.job} is not one of the run's")
        merged = kvs.fence(link.index, message.kvs)
        if merged is not None:
            self.links.broadcast(PmiFenceDone(job=message.job, kvs=merged))

    def name(self, link: HostLink, message: PmiName) -> None:
        rc, port, msg = self.names.request(message.cmd, message.service, message.port)
        reply = PmiNameReply(job=message.job, req=message.req, cmd=message.cmd, rc=rc, port=port, msg=msg)
        self.links.send(link, reply)
