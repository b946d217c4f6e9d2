"""The job-wide half of PMIx's calls across jobs (agent/services/pmix_dyn.py is each host's):
collectives over ranks of several jobs, and published names. MPI_Comm_spawn itself is
launcher/mpi/spawns.py's.

Open MPI connects two jobs (MPI_Comm_spawn, MPI_Comm_accept/connect) by publishing each side's
members under the port's name, looking up the other side's (waiting for it), and calling
PMIx_Connect over both; MPI_Comm_disconnect is a PMIx_Fence over both. Each host's server calls
up once per such collective with its participants' part; once every host with a participant is
in, all of it goes to each (PmixJoinDone). Names live here, shared by every job of the run.
"""

from __future__ import annotations

from mpilaunch.protocol.messages import (
    MessageError,
    PmixDatum,
    PmixJoin,
    PmixLookup,
    PmixNamesReply,
    PmixPublish,
    PmixUnpublish,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.launcher.loop.links import HostLink, Links

# PMIx's status codes (pmix_common.h) that the name service answers with
SUCCESS, ERR_TIMEOUT, ERR_NOT_FOUND, ERR_DUPLICATE_KEY = 0, -24, -46, -53


def encoded_blob(data: bytes) -> str:
    """Every part of a fence or collective, as its Done message carries it."""
    import base64

    return base64.b64encode(data).decode()


def decoded_blob(blob: str, whose: str) -> bytes:
    """A fence's or collective's data, sent base64 in a frame; MessageError if it is not."""
    import base64  # PMIx jobs only: a plain run does not pay for it

    try:
        return base64.b64decode(blob, validate=True)
    except ValueError:
        raise MessageError(f"{whose} data is not base64") from None


class PmixJoins:
    """Collectives over ranks of several jobs: the hosts with a participant, and their parts."""

    def __init__(self, hosts_of: dict[int, list[int]]) -> None:
        self.hosts_of = hosts_of  # job -> the host of each rank (launcher/mpi/jobwide_pmi.PmixFences keeps it)
        self.open: dict[str, tuple[set[int], dict[int, bytes]]] = {}  # key -> (hosts, host -> part)

    def enter(self, host: int, message: PmixJoin) -> tuple[set[int], bytes] | None:
        """Record one host's part; (the participating hosts, every part joined) when it was the last."""
        hosts: set[int] = set()
        for group in message.groups:
            hosts_of = self.hosts_of.get(group.job)
            if hosts_of is None:
                raise MessageError(f"job {group.job} is not one of the run's")
            if any(not 0 <= rank < len(hosts_of) for rank in group.ranks):
                raise MessageError(f"a PMIx collective names a rank job {group.job} does not have")
            hosts |= {hosts_of[rank] for rank in group.ranks} if group.ranks else set(hosts_of)
        if host not in hosts:
            raise MessageError(f"host {host} has no participant in PMIx collective {message.key!r}")
        data = decoded_blob(message.blob, "a PMIx collective's")
        expected, parts = self.open.setdefault(message.key, (hosts, {}))
        if expected != hosts:
            raise MessageError(f"hosts disagree on the participants of PMIx collective {message.key!r}")
        parts[host] = data
        if not expected <= set(parts):
            return None
        del self.open[message.key]
        return expected, b"".join(parts.values())


class PmixNames:
    """The published names: key -> (datum, publishing job, gone once looked up)."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[PmixDatum, int, bool]] = {}

    def publish(self, job: int, nspace: str, message: PmixPublish) -> int:
        if any(datum.key in self.data for datum in message.data):
            return ERR_DUPLICATE_KEY
        for datum in message.data:  # the publisher as the controller knows it
            self.data[datum.key] = (datum._replace(nspace=nspace, rank=message.rank), job, message.once)
        return SUCCESS

    def find(self, keys: tuple[str, ...], every: bool) -> tuple[PmixDatum, ...] | None:
        """The data of these keys (every one of them, or None, when every), the once-read gone."""
        found = tuple(self.data[key][0] for key in keys if key in self.data)
        if every and len(found) < len(set(keys)):
            return None
        for datum in found:
            if self.data[datum.key][2]:
                del self.data[datum.key]
        return found

    def unpublish(self, job: int, keys: tuple[str, ...]) -> int:
        """Remove the job's names among keys (all of the job's when keys is empty)."""
        mine = [key for key, (_, owner, _) in self.data.items() if owner == job and (not keys or key in keys)]
        for key in mine:
            del self.data[key]
        return SUCCESS if mine else ERR_NOT_FOUND


class PmixNameService:
    """Publish, lookup and unpublish from the agents, with lookups that wait for names not yet
    published (for their timeout at most) answered when a publish brings them."""

    def __init__(self, links: Links, nspaces: dict[int, str], clock: Callable[[], float]) -> None:
        self.links = links
        self.nspaces = nspaces  # job -> its PMIx namespace
        self.clock = clock
        self.names = PmixNames()
        self.parked: list[tuple[HostLink, PmixLookup, float | None]] = []  # waiting lookups, with their deadline

    def rows(self) -> dict[type, object]:
        return {PmixPublish: self.publish, PmixLookup: self.lookup, PmixUnpublish: self.unpublish}

    def publish(self, link: HostLink, message: PmixPublish) -> None:
        status = self.names.publish(message.job, self.nspaces.get(message.job, ""), message)
        self.links.send(link, PmixNamesReply(job=message.job, req=message.req, status=status))
        if status == SUCCESS and self.parked:
            parked, self.parked = self.parked, []
            for waiting, lookup, deadline in parked:
                if not self.answer(waiting, lookup):
                    self.parked.append((waiting, lookup, deadline))

    def lookup(self, link: HostLink, message: PmixLookup) -> None:
        if self.answer(link, message):
            return
        if not message.wait:
            self.links.send(link, PmixNamesReply(job=message.job, req=message.req, status=ERR_NOT_FOUND))
            return
        deadline = self.clock() + message.timeout if message.timeout > 0 else None
        self.parked.append((link, message, deadline))

    def answer(self, link: HostLink, message: PmixLookup) -> bool:
        """Answer a lookup that can be: all its keys when it waits, any of them when not."""
        found = self.names.find(message.keys, every=message.wait)
        if not found:
            return False
        self.links.send(link, PmixNamesReply(job=message.job, req=message.req, status=SUCCESS, found=found))
        return True

    def unpublish(self, link: HostLink, message: PmixUnpublish) -> None:
        status = self.names.unpublish(message.job, message.keys)
        self.links.send(link, PmixNamesReply(job=message.job, req=message.req, status=status))

    def next_deadline(self) -> float | None:
        return min((deadline for _, _, deadline in self.parked if deadline is not None), default=None)

    def tick(self, now: float) -> None:
        late = [entry for entry in self.parked if entry[2] is not None and entry[2] <= now]
        if not late:
            return
        self.parked = [entry for entry in self.parked if entry not in late]
        for link, message, _ in late:
            self.links.send(link, PmixNamesReply(job=message.job, req=message.req, status=ERR_TIMEOUT))
