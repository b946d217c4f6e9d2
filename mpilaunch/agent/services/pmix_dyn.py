"""MPI_Comm_spawn, connect/accept, disconnect and published names for the Open MPI ranks of a
host's PMIx server (services/pmix.py hosts it).

Open MPI 4.1 and 5.0 spawn with PMIx_Spawn, then connect the two jobs as MPI_Comm_accept and
MPI_Comm_connect do: each side's root publishes its members under the port's name and looks
the other side's up (waiting for it), every rank of both sides calls PMIx_Connect, and
MPI_Comm_disconnect is a PMIx_Fence over both jobs' ranks. Here a spawn goes to the controller
(PmixSpawn), which plans and launches the job as it does MPICH's and answers once every new
rank started; connect, disconnect and a fence across jobs are collectives of the hosts with
participants (PmixJoin), joined by the controller; publish and lookup are the controller's
name service. PMIx frees what it passes to an upcall once the upcall answers: everything is
copied on PMIx's thread before the loop sees it.
"""

from __future__ import annotations

import base64
import ctypes
import os

from mpilaunch.agent.services import pmix_lib as lib
from mpilaunch.agent.services.pmix_modex import PmixModex
from mpilaunch.protocol.messages import (
    Note,
    PmixDatum,
    PmixGroup,
    PmixJoin,
    PmixLookup,
    PmixPublish,
    PmixSpawn,
    PmixUnpublish,
    SpawnApp,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.services.pmix_served import PmixSide, ServedJob
    from mpilaunch.protocol.messages import PmixJoinDone, PmixNamesReply, PmixSpawnReply

AGENT_NAMES = (  # what each agent sets in its own Open MPI ranks (PmixService.prepare): never a spawning rank's
    "OMPI_MCA_btl_vader_backing_directory",
    "OMPI_MCA_btl_sm_backing_directory",
    "OMPI_MCA_mpi_oversubscribe",
)
PARENTS_OWN = (  # facts of its own job Open MPI 4.1 puts in a rank's environment (ess/pmi), which a
    # spawning rank passes on with the rest of its OMPI_MCA_* and the new job would then take as its own
    "OMPI_MCA_orte_ess_num_procs",
    "OMPI_MCA_orte_app_num",
    "OMPI_MCA_orte_precondition_transports",
)
WDIR, WAIT, TIMEOUT, PERSISTENCE = "pmix.wdir", "pmix.wait", "pmix.timeout", "pmix.persist"
HOST = "pmix.host"  # an app's hosts: Open MPI's MPI_Info "host"
DIRECTIVES = frozenset(  # keys of a publish's info that say how, not what (PMIx_Publish)
    (PERSISTENCE, "pmix.range", "pmix.euid", "pmix.egid", TIMEOUT, "pmix.aperms", "pmix.auids", "pmix.agids")
)


def guarded(upcall: Callable[..., int]) -> Callable[..., int]:
    """An upcall that raises answers PMIX_ERROR (ctypes would answer 0: success, and the rank
    would wait for ever)."""

    def run(*args: object) -> int:
        try:
            return upcall(*args)
        except Exception:
            import traceback

            traceback.print_exc()
            return lib.ERROR

    return run


def requester(who) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    return who.contents.nspace.decode(errors="replace"), int(who.contents.rank)


def read_app(app: lib.App) -> SpawnApp:
    """One pmix_app_t as the controller plans it: argv[0] is the program (cmd), wdir from
    PMIX_WDIR (Open MPI always sends it) or cwd, its hosts from PMIX_HOST, the variables the
    spawning rank passes (Open MPI's OMPI_PARENT_PORT and its OMPI_MCA_* ones) less those each
    agent sets itself."""
    cmd = (app.cmd or b"").decode(errors="surrogateescape")
    argv = lib.strings(app.argv)
    info = {key: value for key, _, value in lib.infos(app.info, app.ninfo)}
    wdir = info.get(WDIR) or (app.cwd or b"").decode(errors="surrogateescape") or None
    env = {}
    for line in lib.strings(app.env):
        name, _, value = line.partition("=")
        if name not in AGENT_NAMES and name not in PARENTS_OWN:
            env[name] = value
    program = cmd or (argv[0] if argv else "")
    return SpawnApp(
        nprocs=int(app.maxprocs),
        argv=(program, *argv[1:]),
        preput={},
        info={"host": str(info[HOST])} if info.get(HOST) else {},
        wdir=str(wdir) if wdir else None,
        env=env,
    )


Entry = tuple  # (how to answer, the PMIx callback, its cbdata)


class PmixDyn:
    """Spawn, collectives across jobs and names, for one agent's PMIx server."""

    def __init__(self, service: PmixSide) -> None:
        self.service = service
        self.modex = PmixModex(service, self.join)  # a fence across jobs is one of the collectives here
        self.last_req = 0
        self.pending: dict[int, Entry] = {}  # req -> (how to answer, callback, cbdata)
        self.joins: dict[str, Entry] = {}  # collective key -> the same
        self.counts: dict[str, int] = {}  # a collective's participants -> how many came before

    def upcalls(self) -> dict[int, object]:
        return {
            lib.SPAWN: lib.SPAWN_FN(guarded(self._spawn)),
            lib.CONNECT: lib.PROCS_FN(guarded(lambda *args: self._procs("connect", *args))),
            lib.DISCONNECT: lib.PROCS_FN(guarded(lambda *args: self._procs("disconnect", *args))),
            lib.PUBLISH: lib.PUBLISH_FN(guarded(self._publish)),
            lib.LOOKUP: lib.LOOKUP_FN(guarded(self._lookup)),
            lib.UNPUBLISH: lib.UNPUBLISH_FN(guarded(self._unpublish)),
        }

    # -- upcalls, on PMIx's thread: copied and queued for the loop ------------------------------
    def _spawn(self, who, job_info, ninfo, apps, napps, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        programs = tuple(read_app(apps[i]) for i in range(napps))
        if not programs or any(app.nprocs < 1 or not app.argv[0] for app in programs):
            self.service.post(cb, lib.ERR_BAD_PARAM, None, cbdata)
        else:
            self.service.post(self.spawn, *requester(who), programs, cb, cbdata)
        return lib.SUCCESS  # answered through cb once the new ranks started, or could not

    def _procs(self, kind: str, procs, nprocs, info, ninfo, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        members = sorted({(procs[i].nspace.decode(errors="replace"), int(procs[i].rank)) for i in range(nprocs)})
        self.service.post(self.join, kind, members, b"", cb, cbdata)
        return lib.SUCCESS  # answered through cb when every host with a participant is in

    def _publish(self, who, info, ninfo, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        data: list[PmixDatum] = []
        once, wrong = False, False
        for key, kind, value in lib.infos(info, ninfo):
            if key == PERSISTENCE:
                once = value == lib.PERSIST_FIRST_READ
            elif key in DIRECTIVES:
                continue
            elif kind == lib.STRING:
                data.append(PmixDatum(key=key, value=str(value)))
            elif kind == lib.BYTE_OBJECT:
                data.append(PmixDatum(key=key, value=base64.b64encode(value).decode(), binary=True))  # type: ignore[arg-type]
            else:
                wrong = True  # names are strings (MPI's ports) or bytes (Open MPI's context ids)
        if wrong or not data:  # answered through cb too: PMIx 4.2's client waits for ever on a refusal here
            status = lib.ERR_NOT_SUPPORTED if wrong else lib.ERR_BAD_PARAM
            self.service.post(answer_op, self.modex, cb, cbdata, status, b"")
        else:
            self.service.post(self.publish, *requester(who), tuple(data), once, cb, cbdata)
        return lib.SUCCESS

    def _lookup(self, who, keys, info, ninfo, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        rows = {key: value for key, _, value in lib.infos(info, ninfo)}
        wait = WAIT in rows and rows[WAIT] is not False  # a bool, or a count of values (0: all)
        timeout = rows.get(TIMEOUT)
        seconds = float(timeout) if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout > 0 else 0.0
        self.service.post(self.lookup, *requester(who), tuple(lib.strings(keys)), wait, seconds, cb, cbdata)
        return lib.SUCCESS

    def _unpublish(self, who, keys, info, ninfo, cb, cbdata) -> int:  # type: ignore[no-untyped-def]
        self.service.post(self.unpublish, *requester(who), tuple(lib.strings(keys)), cb, cbdata)
        return lib.SUCCESS

    # -- the loop's side ------------------------------------------------------------------------
    def request(self, answer: Callable[..., None], cb: object, cbdata: int) -> int:
        self.last_req += 1
        self.pending[self.last_req] = (answer, cb, cbdata)
        return self.last_req

    def spawn(self, nspace: str, rank: int, apps: tuple[SpawnApp, ...], cb: object, cbdata: int) -> None:
        found = self.service.ident(nspace, rank)
        if found is None:
            cb(lib.ERR_NOT_FOUND, None, cbdata)  # type: ignore[operator]
            return
        served, ident = found
        req = self.request(answer_spawn, cb, cbdata)
        problem = self.problem(served, apps)
        self.service.host.send(PmixSpawn(job=served.number, proc=ident, req=req, apps=apps, problem=problem))

    def problem(self, served: ServedJob, apps: tuple[SpawnApp, ...]) -> str:
        """Why a program would not start, looked at here first: the new ranks may run on another
        host, but a program missing here is most often missing there (a typing error)."""
        from mpilaunch.host.programs import program_problem

        for app in apps:
            if app.wdir is None:
                continue
            path = app.env.get("PATH") or served.path or self.service.host.host_env.get("PATH", os.defpath)
            problem = program_problem(app.argv[0], app.wdir, path, mpi=False)
            if problem:
                return problem
        return ""

    def join(self, kind: str, members: list[tuple[str, int]], blob: bytes, cb: object, cbdata: int) -> None:
        """A collective of ranks of several jobs: each host with a participant sends its part up,
        under a key every one of them makes alike (the participants and how many came before)."""
        answer = answer_fence if kind == "fence" else answer_op
        groups: dict[int, set[int]] = {}
        for nspace, rank in members:
            job = self.service.job_number(nspace)
            if job is None:  # not a job of this run
                answer(self.modex, cb, cbdata, lib.ERR_NOT_FOUND, b"")
                return
            groups.setdefault(job, set()).add(rank)
        parts = tuple(
            PmixGroup(job=job, ranks=() if lib.RANK_WILDCARD in ranks else tuple(sorted(ranks)))
            for job, ranks in sorted(groups.items())
        )
        who = kind + ":" + ";".join(f"{part.job}:{','.join(map(str, part.ranks)) or '*'}" for part in parts)
        count = self.counts.get(who, 0)
        self.counts[who] = count + 1
        import hashlib  # a collective across jobs only

        key = f"{kind}:{hashlib.sha1(who.encode()).hexdigest()[:16]}#{count}"
        self.joins[key] = (answer, cb, cbdata)
        self.service.host.send(PmixJoin(key=key, groups=parts, blob=base64.b64encode(blob).decode()))

    def joined(self, message: PmixJoinDone) -> None:
        entry = self.joins.pop(message.key, None)
        if entry is None:
            said = f"mpilaunch agent: a PMIx collective {message.key!r} that nobody waits for"
            self.service.host.send(Note(text=said))
            return
        answer, cb, cbdata = entry
        answer(self.modex, cb, cbdata, message.status, base64.b64decode(message.blob))

    def publish(self, nspace: str, rank: int, data: tuple[PmixDatum, ...], once: bool, cb: object, cbdata: int) -> None:
        found = self.service.ident(nspace, rank)
        if found is None:
            cb(lib.ERR_NOT_FOUND, cbdata)  # type: ignore[operator]
            return
        req = self.request(answer_names, cb, cbdata)
        message = PmixPublish(job=found[0].number, proc=found[1], rank=rank, req=req, data=data, once=once)
        self.service.host.send(message)

    def lookup(
        self, nspace: str, rank: int, keys: tuple[str, ...], wait: bool, timeout: float, cb: object, cbdata: int
    ) -> None:
        found = self.service.ident(nspace, rank)
        if found is None or not keys:
            cb(lib.ERR_NOT_FOUND if keys else lib.ERR_BAD_PARAM, None, 0, cbdata)  # type: ignore[operator]
            return
        req = self.request(answer_lookup, cb, cbdata)
        message = PmixLookup(job=found[0].number, proc=found[1], req=req, keys=keys, wait=wait, timeout=timeout)
        self.service.host.send(message)

    def unpublish(self, nspace: str, rank: int, keys: tuple[str, ...], cb: object, cbdata: int) -> None:
        found = self.service.ident(nspace, rank)
        if found is None:
            cb(lib.ERR_NOT_FOUND, cbdata)  # type: ignore[operator]
            return
        req = self.request(answer_names, cb, cbdata)
        self.service.host.send(PmixUnpublish(job=found[0].number, proc=found[1], req=req, keys=keys))

    def answered(self, message: PmixSpawnReply | PmixNamesReply) -> None:
        """The controller's answer to a spawn or a name request, to the callback that waits for it."""
        entry = self.pending.pop(message.req, None)
        if entry is None:
            self.service.host.send(Note(text=f"mpilaunch agent: a PMIx answer nobody waits for: {message!r}"[:300]))
            return
        answer, cb, cbdata = entry
        answer(cb, cbdata, message)


# -- how each request's callback is answered ----------------------------------------------------
def answer_spawn(cb: object, cbdata: int, message: PmixSpawnReply) -> None:
    nspace = message.nspace.encode() if message.status == lib.SUCCESS else None
    cb(message.status, nspace, cbdata)  # type: ignore[operator]


def answer_names(cb: object, cbdata: int, message: PmixNamesReply) -> None:
    cb(message.status, cbdata)  # type: ignore[operator]


def answer_lookup(cb: object, cbdata: int, message: PmixNamesReply) -> None:
    """The data found, as pmix_pdata_t: PMIx copies it before the callback returns."""
    array = (lib.PData * max(1, len(message.found)))()
    keep = []
    for slot, datum in zip(array, message.found):
        slot.proc = lib.proc(datum.nspace, datum.rank)
        slot.key = datum.key.encode()[:511]
        if datum.binary:
            data = base64.b64decode(datum.value)
            buffer = ctypes.create_string_buffer(data, max(1, len(data)))
            slot.value.type = lib.BYTE_OBJECT
            slot.value.data.bo = lib.ByteObject(ctypes.cast(buffer, ctypes.c_void_p), len(data))
        else:
            buffer = ctypes.create_string_buffer(datum.value.encode(errors="surrogateescape"))
            slot.value.type = lib.STRING
            slot.value.data.string = ctypes.cast(buffer, ctypes.c_char_p)
        keep.append(buffer)
    found = ctypes.cast(array, ctypes.c_void_p) if message.found else None
    cb(message.status, found, len(message.found), cbdata)  # type: ignore[operator]


def answer_op(modex: PmixModex, cb: object, cbdata: int, status: int, data: bytes) -> None:
    cb(status, cbdata)  # type: ignore[operator]


def answer_fence(modex: PmixModex, cb: object, cbdata: int, status: int, data: bytes) -> None:
    modex.answer((cb, cbdata), status, data)
