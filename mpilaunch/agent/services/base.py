"""What a rank-facing service (a PMI flavour, a guard) plugs into the agent, and the set of them.

A launch names the services its job uses (`Launch.services`, chosen by the planner). For each
rank the agent asks every one of them to prepare the rank's environment and say which of its
descriptors the rank inherits; after the spawn it tells them the pid (or that the spawn
failed). Services watch their own descriptors and timers on the agent's loop, send their own
messages up, take the controller's messages they list in `takes`, and say what state a rank's
MPI is in for its exit report. So a new flavour (PMIx) is a new module and a registry row in
`services/registry.py`, with no branch in the agent's spawn or dispatch.
"""

from __future__ import annotations

from mpilaunch.agent.loop import Loop, Timer
from mpilaunch.host.mpi_family import mixed_reason
from mpilaunch.protocol.messages import MessageError
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see protocol/record.py)
if TYPE_CHECKING:
    from mpilaunch.protocol.messages import Launch, RankSpec


class ServiceError(Exception):
    """A service cannot serve this rank (prepare): the rank is not started, and this says why."""


class ServiceHost:
    """What services may use of the agent."""

    loop: Loop

    def send(self, message: Record) -> None:
        raise NotImplementedError

    def rank_running(self, ident: int) -> bool:
        """The rank was started by this agent and has not been reaped."""
        raise NotImplementedError

    def mpi_state(self, job: int, ident: int) -> str:
        """new, init or finalized: what the job's services saw of the rank's MPI."""
        raise NotImplementedError

    def spoke(self, job: int, ident: int, rank: int, protocol: str) -> None:
        """A rank initialized through `protocol` ("PMI" or "PMIx")."""
        raise NotImplementedError


class Service(Timer):
    name = ""
    takes: tuple[type, ...] = ()  # messages from the controller it handles

    def __init__(self, host: ServiceHost) -> None:
        self.host = host

    def start_job(self, launch: Launch) -> None:
        """A launch of a job that uses this service (called once per launch, before its ranks)."""

    def prepare(self, job: int, spec: RankSpec, env: dict[str, str]) -> list[int]:
        """Set the rank's variables; return the descriptors it must inherit (the agent passes them).
        ServiceError: the rank cannot be served here and must not start."""
        return []

    def spawned(self, job: int, spec: RankSpec, pid: int) -> None:
        """The rank is running (its inherited descriptors may be closed here now)."""

    def not_spawned(self, job: int, spec: RankSpec) -> None:
        """The spawn failed: forget the rank."""

    def exited(self, job: int, ident: int) -> None:
        """The rank was reaped."""

    def close(self) -> None:
        """The agent is done: give back what the service holds (a server, its files)."""

    def take(self, message: Record) -> None:
        """A message from the controller of a type in `takes`."""

    def state_of(self, job: int, ident: int) -> str | None:
        """The rank's MPI state as this service saw it, or None if it does not know the rank."""
        return None


class Services:
    """The services this agent runs, started by name on first use (one instance each)."""

    def __init__(self, host: ServiceHost, registry: dict[str, tuple[str, tuple[type, ...]]]) -> None:
        self.host = host
        self.registry = registry
        self.running: dict[str, Service] = {}
        self.of_job: dict[int, list[Service]] = {}
        self.first_speaker: dict[int, dict[str, int]] = {}  # job -> protocol -> the first rank to use it

    def start_job(self, launch: Launch) -> list[Service]:
        """The services of this launch's job, started where needed, each told of the launch."""
        found = []
        for name in launch.services:
            service = self.running.get(name)
            if service is None:
                if name not in self.registry:
                    raise MessageError(f"no agent service is called {name!r}")
                module, _, cls = self.registry[name][0].partition(":")
                kind = getattr(__import__(module, fromlist=[cls]), cls)  # imported on first use
                service = self.running[name] = kind(self.host)
                self.host.loop.add_timer(service)
            service.start_job(launch)
            found.append(service)
        self.of_job.setdefault(launch.job, [])
        self.of_job[launch.job] += [s for s in found if s not in self.of_job[launch.job]]
        return found

    def takes(self) -> dict[type, object]:
        """Rows for the agent's dispatch table: every message a registered service takes goes to
        each running service that takes it (one that was never started has none to take)."""
        return {kind: self.route for _, takes in self.registry.values() for kind in takes}

    def route(self, message: Record) -> None:
        for service in self.running.values():
            if type(message) in service.takes:
                service.take(message)

    def exited(self, job: int, ident: int) -> None:
        for service in self.of_job.get(job, ()):
            service.exited(job, ident)

    def close(self) -> None:
        for service in self.running.values():
            service.close()

    def spoke(self, job: int, rank: int, protocol: str) -> str | None:
        """Record that a rank of a job served PMI and PMIx initialized through `protocol`; the
        reason to end the job when another rank already used the other one (an MPICH-family
        rank and an Open MPI rank cannot share one MPI_COMM_WORLD, and each would wait for the
        other in its first fence)."""
        first = self.first_speaker.setdefault(job, {}).setdefault(protocol, rank)
        other = next(((p, r) for p, r in self.first_speaker[job].items() if p != protocol), None)
        if other is None or first != rank:
            return None
        return mixed_reason(protocol, *other)

    def state_of(self, job: int, ident: int) -> str:
        """The furthest any of the job's services saw the rank go (a job served PMI and PMIx
        sees each rank use one of them)."""
        states = {service.state_of(job, ident) for service in self.of_job.get(job, ())}
        return next((state for state in ("finalized", "init") if state in states), "new")
