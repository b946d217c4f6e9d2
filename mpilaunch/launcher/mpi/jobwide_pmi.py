"""The job-wide half of PMI and PMIx, kept by the controller: barriers and fences across hosts
and the name services; PMIx's collectives across jobs and its names are launcher/mpi/pmix_joins.py's
(MPI_Comm_spawn starts a job: launcher/mpi/spawns.py). Agents answer everything else locally
(agent/services/)."""

from __future__ import annotations

import time

from mpilaunch.launcher.loop.links import HostLink, Links
from mpilaunch.launcher.mpi.pmix_joins import PmixJoins, PmixNameService, decoded_blob, encoded_blob
from mpilaunch.plan.build import JobPlan
from mpilaunch.protocol.messages import (
    MessageError,
    PmiError,
    PmiFence,
    PmiFenceDone,
    PmiName,
    PmiNameReply,
    PmixDmodex,
    PmixDmodexAsk,
    PmixDmodexData,
    PmixDmodexDone,
    PmixFence,
    PmixFenceDone,
    PmixJoin,
    PmixJoinDone,
    mixed_reason,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.launcher.decide.policy import Policy

MIX_GRACE = 1.0  # seconds a job's hosts may be in a PMI barrier and a PMIx fence at once (see entered)


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


class PmixFences:
    """PMIx fences across hosts: each host's server calls up once per fence with its
    participants' data; once every host with a participant is in, all of it goes to each."""

    def __init__(self) -> None:
        self.hosts_of: dict[int, list[int]] = {}  # job -> the host of each rank
        self.open: dict[tuple[int, str], dict[int, bytes]] = {}  # (job, fence) -> host -> data

    def add_job(self, job: JobPlan) -> None:
        self.hosts_of[job.job] = [r.host for r in job.ranks]

    def enter(self, host: int, message: PmixFence) -> tuple[set[int], bytes] | None:
        """Record one host's part; (the participating hosts, every part joined) when it was the last."""
        hosts_of = self.hosts_of.get(message.job)
        if hosts_of is None:
            raise MessageError(f"job {message.job} is not one of the run's")
        if any(not 0 <= rank < len(hosts_of) for rank in message.ranks):
            raise MessageError(f"a PMIx fence of job {message.job} names a rank it does not have")
        hosts = {hosts_of[rank] for rank in message.ranks} if message.ranks else set(hosts_of)
        if host not in hosts:
            raise MessageError(f"host {host} has no participant in PMIx fence {message.key!r}")
        data = decoded_blob(message.blob, "a PMIx fence's")
        parts = self.open.setdefault((message.job, message.key), {})
        parts[host] = data
        if not hosts <= set(parts):
            return None
        del self.open[(message.job, message.key)]
        return hosts, b"".join(parts.values())  # PMIx reads each host's part whole, in any order


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

    def __init__(
        self,
        links: Links,
        policy: Policy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.links = links
        self.policy = policy
        self.clock = clock
        self.both: set[int] = set()  # jobs served PMI and PMIx
        self.suspects: dict[int, float] = {}  # job -> when to look again at its open fences
        self.mixed: set[int] = set()
        self.kvs: dict[int, JobKvs] = {}
        self.fences = PmixFences()
        self.names = NameService()
        self.nspaces: dict[int, str] = {}  # job -> its PMIx namespace
        self.joins = PmixJoins(self.fences.hosts_of)
        self.pmix_names = PmixNameService(links, self.nspaces, clock)

    def rows(self) -> dict[type, object]:
        return {
            PmiFence: self.fence,
            PmiName: self.name,
            PmixFence: self.pmix_fence,
            PmixDmodex: self.dmodex,
            PmixDmodexData: self.dmodex_data,
            PmixJoin: self.pmix_join,
            **self.pmix_names.rows(),
        }

    def pmix_join(self, link: HostLink, message: PmixJoin) -> None:
        """A PMIx collective over ranks of several jobs (MPI_Comm_spawn's connect, MPI_Comm_disconnect)."""
        done = self.joins.enter(link.index, message)
        if done is not None:
            self.links.send_to(done[0], PmixJoinDone(key=message.key, blob=encoded_blob(done[1])))

    def dmodex(self, link: HostLink, message: PmixDmodex) -> None:
        """PMIx's direct modex: the request goes to the host of the rank whose data is wanted."""
        hosts_of = self.fences.hosts_of.get(message.job)
        if hosts_of is None or not 0 <= message.rank < len(hosts_of):
            raise MessageError(f"a PMIx direct modex names rank {message.rank} of job {message.job}, which it has not")
        target = self.links.get(hosts_of[message.rank])
        ask = PmixDmodexAsk(job=message.job, rank=message.rank, host=link.index, req=message.req, key=message.key)
        if target is not None and target.open:
            self.links.send(target, ask)
        else:  # its host is gone: PMIx's "not found" (the job is ending anyway)
            gone = PmixDmodexDone(job=message.job, rank=message.rank, req=message.req, blob="", status=-46)
            self.links.send(link, gone)

    def dmodex_data(self, link: HostLink, message: PmixDmodexData) -> None:
        asking = self.links.get(message.host)
        if asking is not None and asking.open:
            done = PmixDmodexDone(
                job=message.job, rank=message.rank, req=message.req, blob=message.blob, status=message.status
            )
            self.links.send(asking, done)

    def add_job(self, job: JobPlan) -> None:
        self.kvs[job.job] = JobKvs(len({r.host for r in job.ranks}))
        if job.pmi is not None and job.pmix is not None:
            self.both.add(job.job)
        if job.pmix is not None:
            self.nspaces[job.job] = job.pmix.nspace
        self.fences.add_job(job)

    def pmix_fence(self, link: HostLink, message: PmixFence) -> None:
        done = self.fences.enter(link.index, message)
        self.entered(message.job)
        if done is not None:
            hosts, data = done
            self.links.send_to(hosts, PmixFenceDone(job=message.job, key=message.key, blob=encoded_blob(data)))

    def entered(self, job: int) -> None:
        """A host entered a PMI barrier or a PMIx fence. Hosts in a PMI barrier and a PMIx fence
        of one job at once hold ranks of both MPI families, which would wait for each other for
        ever: if both are still open MIX_GRACE later, the job ends (one host with both is its
        agent's to see: agent/services/base.Services.spoke)."""
        if job in self.both and job not in self.mixed and job not in self.suspects and self.open_fences(job):
            self.suspects[job] = self.clock() + MIX_GRACE

    def open_fences(self, job: int) -> tuple[int, int] | None:
        """(a host in the job's open PMI barrier, one in an open PMIx fence), or None."""
        kvs = self.kvs.get(job)
        pmix = next((min(parts) for (j, _), parts in self.fences.open.items() if j == job and parts), None)
        return (min(kvs.entered), pmix) if kvs is not None and kvs.entered and pmix is not None else None

    def next_deadline(self) -> float | None:
        due = [*self.suspects.values(), self.pmix_names.next_deadline()]
        return min((t for t in due if t is not None), default=None)

    def tick(self, now: float) -> None:
        self.pmix_names.tick(now)
        for job, due in list(self.suspects.items()):
            if due > now:
                continue
            del self.suspects[job]
            hosts = self.open_fences(job)
            if hosts is not None:
                self.mixed.add(job)
                pmi_host, pmix_host = hosts
                self.mixed_families(job, pmix_host, "PMIx", pmi_host, "PMI")

    def mixed_families(self, job: int, host: int, protocol: str, other_host: int, other: str) -> None:
        """Ranks of both MPI families in one job, on different hosts: ended as the agent ends
        them on one host (agent/services/base.Services.spoke)."""
        ranks = sorted((s for s in self.policy.procs if s.job == job), key=lambda s: s.rank.rank)
        here = next(s for s in ranks if s.rank.host == host)
        there = next(s for s in ranks if s.rank.host == other_host)
        self.policy.handle(PmiError(proc=here.proc, error=mixed_reason(protocol, other, there.rank.rank)))

    def fence(self, link: HostLink, message: PmiFence) -> None:
        kvs = self.kvs.get(message.job)
        if kvs is None:
            raise MessageError(f"job {message.job} is not one of the run's")
        merged = kvs.fence(link.index, message.kvs)
        self.entered(message.job)
        if merged is not None:
            self.links.broadcast(PmiFenceDone(job=message.job, kvs=merged))

    def name(self, link: HostLink, message: PmiName) -> None:
        rc, port, msg = self.names.request(message.cmd, message.service, message.port)
        reply = PmiNameReply(job=message.job, req=message.req, cmd=message.cmd, rc=rc, port=port, msg=msg)
        self.links.send(link, reply)
