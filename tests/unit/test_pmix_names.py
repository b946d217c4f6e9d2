"""The launcher's half of PMIx across jobs (launcher/mpi/pmix_joins.py), in process: published names
(a duplicate refused, gone once read when asked, a job's own removed), lookups that wait for a
publish or time out, and collectives over ranks of several jobs joined once every host with a
participant is in."""

from __future__ import annotations

import base64

import pytest

from mpilaunch.launcher.mpi.pmix_joins import (
    ERR_DUPLICATE_KEY,
    ERR_NOT_FOUND,
    ERR_TIMEOUT,
    SUCCESS,
    PmixJoins,
    PmixNames,
    PmixNameService,
)
from mpilaunch.protocol.messages import (
    MessageError,
    PmixDatum,
    PmixGroup,
    PmixJoin,
    PmixLookup,
    PmixNamesReply,
    PmixPublish,
    PmixUnpublish,
)


def publish(job: int, req: int, once: bool = False, **data: str) -> PmixPublish:
    return PmixPublish(
        job=job, proc=0, rank=0, req=req, data=tuple(PmixDatum(k, v) for k, v in data.items()), once=once
    )


def test_names_duplicates_once_read_and_a_jobs_own() -> None:
    names = PmixNames()
    assert names.publish(1, "ns.1", publish(1, 1, port="p1")) == SUCCESS
    assert names.publish(2, "ns.2", publish(2, 2, port="p2")) == ERR_DUPLICATE_KEY
    assert names.publish(2, "ns.2", publish(2, 3, once=True, ticket="t")) == SUCCESS
    found = names.find(("port", "ticket"), every=True)
    assert found == (PmixDatum("port", "p1", False, "ns.1", 0), PmixDatum("ticket", "t", False, "ns.2", 0))
    assert names.find(("ticket",), every=False) == ()  # gone once read
    assert names.find(("port", "ticket"), every=True) is None
    assert names.unpublish(2, ("port",)) == ERR_NOT_FOUND  # job 1's
    assert names.unpublish(1, ()) == SUCCESS
    assert names.find(("port",), every=False) == ()


class Recorded:
    """Stands in for the controller's links: what would be sent to which host."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, object]] = []

    def send(self, link: object, message: object) -> None:
        self.sent.append((link, message))


def test_a_lookup_that_waits_is_answered_by_the_publish_or_its_timeout() -> None:
    links, now = Recorded(), [100.0]
    service = PmixNameService(links, {1: "ns.1", 2: "ns.2"}, lambda: now[0])  # type: ignore[arg-type]
    service.lookup("host0", PmixLookup(job=2, proc=3, req=7, keys=("a",), wait=True, timeout=5.0))  # type: ignore[arg-type]
    service.lookup("host0", PmixLookup(job=2, proc=3, req=8, keys=("b",), wait=True, timeout=0.0))  # type: ignore[arg-type]
    service.lookup("host1", PmixLookup(job=1, proc=0, req=9, keys=("c",)))  # type: ignore[arg-type]
    assert links.sent == [("host1", PmixNamesReply(job=1, req=9, status=ERR_NOT_FOUND))]
    assert service.next_deadline() == 105.0
    service.publish("host1", publish(1, 10, once=True, a="x"))  # type: ignore[arg-type]
    datum = PmixDatum("a", "x", False, "ns.1", 0)
    assert links.sent[1:] == [
        ("host1", PmixNamesReply(job=1, req=10, status=SUCCESS)),
        ("host0", PmixNamesReply(job=2, req=7, status=SUCCESS, found=(datum,))),
    ]
    assert service.next_deadline() is None  # the other waits with no limit
    service.tick(200.0)
    assert len(links.sent) == 3
    service.lookup("host0", PmixLookup(job=2, proc=3, req=11, keys=("d",), wait=True, timeout=1.0))  # type: ignore[arg-type]
    service.tick(102.0)
    assert links.sent[3:] == [("host0", PmixNamesReply(job=2, req=11, status=ERR_TIMEOUT))]
    service.unpublish("host1", PmixUnpublish(job=1, proc=0, req=12, keys=("a",)))  # type: ignore[arg-type]
    assert links.sent[4:] == [("host1", PmixNamesReply(job=1, req=12, status=ERR_NOT_FOUND))]  # read once: gone


def join(key: str, *groups: PmixGroup, data: bytes = b"") -> PmixJoin:
    return PmixJoin(key=key, groups=groups, blob=base64.b64encode(data).decode())


def test_a_collective_across_jobs_waits_for_every_host_with_a_participant() -> None:
    joins = PmixJoins({1: [0, 1], 2: [1, 2, 2]})  # job -> the host of each rank
    every = (PmixGroup(1, (0,)), PmixGroup(2, ()))  # rank 0 of job 1, all of job 2: hosts 0, 1, 2
    assert joins.enter(0, join("k#0", *every, data=b"a")) is None
    assert joins.enter(2, join("k#0", *every, data=b"c")) is None
    hosts, data = joins.enter(1, join("k#0", *every, data=b"b"))  # type: ignore[misc]
    assert hosts == {0, 1, 2} and sorted(data) == sorted(b"acb")
    assert joins.enter(1, join("k#1", PmixGroup(1, (1,)), PmixGroup(2, (0,)))) == ({1}, b"")  # one host: done


@pytest.mark.parametrize(
    ("host", "message", "words"),
    [
        (0, join("k", PmixGroup(3, ())), "job 3 is not one of the run's"),
        (0, join("k", PmixGroup(1, (5,))), "names a rank job 1 does not have"),
        (2, join("k", PmixGroup(1, (0,))), "host 2 has no participant"),
        (0, PmixJoin(key="k", groups=(PmixGroup(1, (0,)),), blob="!!"), "not base64"),
    ],
)
def test_a_collective_that_cannot_be_is_a_bad_message(host: int, message: PmixJoin, words: str) -> None:
    with pytest.raises(MessageError, match=words):
        PmixJoins({1: [0, 1]}).enter(host, message)
