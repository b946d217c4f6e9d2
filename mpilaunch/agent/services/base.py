"""What a rank-facing service (a PMI flavour, a guard) plugs into the agent, and the set of them.

A launch names the services its job uses (`Launch.services`, chosen by the planner). For each
rank the agent asks every one of them to prepare the rank's environment and say which of its
descriptors the rank inherits; after the spawn it tells them the pid (or that the spawn
failed). Services watch their own descriptors and timers on the agent's loop, send their own
messages up, handle the controller's messages they list in `handles`, and say what state a rank's
MPI is in for its exit report. So a new flavour (PMIx) is a new module and a registry row in
`services/registry.py`, with no branch in the agent's spawn or dispatch.
"""

from __future__ import annotations

import time

from mpilaunch.agent.loop import Loop, Timer
from mpilaunch.agent.services.registry import REGISTRY, service_class
from mpilaunch.protocol.messages import MessageError, PmiError, mixed_reason
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mpilaunch.protocol.messages import Launch, RankSpec


class ServiceError(Exception):
    """A service cannot serve this rank (prepare): the rank is not started, and this says why."""


class ServiceHost:
    """What services may use of the agent."""

    loop: Loop
    host_env: dict[str, str]  # the host's environment ranks start from (a remote one has the launcher's paths)

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
    protocol = ""  # "PMI" or "PMIx": what its ranks initialize MPI through, if they do
    handles: tuple[type, ...] = ()  # messages from the controller it handles

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

    def handle(self, message: Record) -> None:
        """A message from the controller of a type in `handles`."""

    def state_of(self, job: int, ident: int) -> str | None:
        """The rank's MPI state as this service saw it, or None if it does not know the rank."""
        return None

    def prestart(self, hint: object) -> None:
        """Begin what the first launch would begin (a guess: the launch may differ)."""


MIX_GRACE = 1.0  # seconds ranks of one job may be in MPI through PMI and PMIx at once (see spoke)


class Services(Timer):
    """The services this agent runs, started by name on first use (one instance each); a timer
    of the agent's loop for the check of jobs served PMI and PMIx (spoke)."""

    def __init__(self, host: ServiceHost) -> None:
        self.host = host
        self.running: dict[str, Service] = {}
        self.of_job: dict[int, list[Service]] = {}
        self.speakers: dict[int, dict[str, dict[int, int]]] = {}  # job -> protocol -> process id -> rank
        self.mixed: set[int] = set()  # jobs already reported
        self.suspects: dict[int, float] = {}  # job -> when to look again at ranks in MPI through both

    def start_job(self, launch: Launch) -> list[Service]:
        """The services of this launch's job, started where needed, each told of the launch."""
        found = []
        for name in launch.services:
            service = self.service(name)
            service.start_job(launch)
            found.append(service)
        self.of_job.setdefault(launch.job, [])
        self.of_job[launch.job] += [s for s in found if s not in self.of_job[launch.job]]
        return found

    def service(self, name: str) -> Service:
        """The running service of that name, started (and its module imported) on first use."""
        service = self.running.get(name)
        if service is None:
            if name not in REGISTRY:
                raise MessageError(f"no agent service is called {name!r}")
            service = self.running[name] = service_class(name)(self.host)  # imported on first use
            self.host.loop.add_timer(service)
        return service

    def prestart(self, name: str, hint: object) -> None:
        """Start a service before any launch names it, as the hint says (Service.prestart). A
        limit of this host that stops it (no thread, no pipe: `ulimit -u`, `ulimit -n`) leaves
        the start to the launch, which says what it finds."""
        try:
            self.service(name).prestart(hint)
        except (OSError, RuntimeError):
            pass

    def dispatch_rows(self) -> dict[type, object]:
        """Rows for the agent's dispatch table: every message a registered service handles goes to
        each running service that handles it (one that was never started has none to handle)."""
        return {kind: self.route for _, handles in REGISTRY.values() for kind in handles}

    def route(self, message: Record) -> None:
        for service in self.running.values():
            if type(message) in service.handles:
                service.handle(message)

    def exited(self, job: int, ident: int) -> None:
        for service in self.of_job.get(job, ()):
            service.exited(job, ident)

    def close(self) -> None:
        for service in self.running.values():
            service.close()

    def spoke(self, job: int, ident: int, rank: int, protocol: str) -> None:
        """Record that a rank of a job initialized through `protocol` ("PMI" or "PMIx"). An
        MPICH-family rank and an Open MPI rank cannot share one MPI_COMM_WORLD, and each would
        wait for the other in its first fence: when ranks of the job are in MPI through both,
        the job ends if they still are MIX_GRACE later (one program after another in a rank,
        the first still finalizing while the next starts, is no mix)."""
        by_protocol = self.speakers.setdefault(job, {})
        by_protocol.setdefault(protocol, {})[ident] = rank
        if len(by_protocol) > 1 and job not in self.mixed and job not in self.suspects:
            self.suspects[job] = time.monotonic() + MIX_GRACE  # looked at from the loop (tick), not here:
            # this runs while a service takes its upcalls, which state_of would take again

    def mix(self, job: int) -> tuple[int, str] | None:
        """(process id, reason) for the last rank to initialize through one protocol while a
        rank is still in MPI through the other; None for no such pair."""
        inside: list[tuple[int, int, str]] = []  # (process id, rank, protocol) of ranks in MPI now
        for protocol, ranks in list(self.speakers.get(job, {}).items()):
            service = next((s for s in self.of_job.get(job, ()) if s.protocol == protocol), None)
            if service is not None:
                inside += [(i, r, protocol) for i, r in list(ranks.items()) if service.state_of(job, i) == "init"]
        if len({protocol for _, _, protocol in inside}) < 2:
            return None
        ident, _, protocol = inside[-1]
        peer_rank, other = next((r, p) for _, r, p in inside if p != protocol)
        return ident, mixed_reason(protocol, other, peer_rank)

    def next_deadline(self) -> float | None:
        return min(self.suspects.values()) if self.suspects else None

    def tick(self, now: float) -> None:
        for job, due in list(self.suspects.items()):
            if due <= now:
                del self.suspects[job]
                found = self.mix(job)
                if found is not None:
                    self.mixed.add(job)
                    self.host.send(PmiError(proc=found[0], error=found[1]))

    def state_of(self, job: int, ident: int) -> str:
        """The furthest any of the job's services saw the rank go (a job served PMI and PMIx
        sees each rank use one of them)."""
        states = {service.state_of(job, ident) for service in self.of_job.get(job, ())}
        return next((state for state in ("finalized", "init") if state in states), "new")
