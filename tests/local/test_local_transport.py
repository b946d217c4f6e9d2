"""This machine's agents (transport/local.py): the agent forked early belongs to its transport,
is the first agent asked of it, and is ended and reaped when the job does not take it. Real
forked agents, greeting with their Hello."""

from __future__ import annotations

import select

from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import UP, Hello, decode
from mpilaunch.transport.local import LocalLink, LocalTransport
from tests.procs import stat_fields


def greeting(link: LocalLink) -> Hello:
    """The agent's first message: its Hello."""
    decoder = wire.Decoder()
    while True:
        assert select.select([link.fileno()], [], [], 60)[0], "no Hello from the agent within 60 s"
        data = link.recv()
        assert data, "the agent's link ended before its Hello"
        for kind, value in decoder.feed(data):
            if kind == wire.CONTROL:
                return decode(value, UP)  # type: ignore[arg-type, return-value]


def end(*links: LocalLink) -> None:
    for link in links:
        link.close()  # the agent stops at the end of its link
        link.wait()
    assert [link.pid for link in links if stat_fields(link.pid)] == []  # reaped, not left as zombies


def test_the_early_agent_is_its_transports_own_and_the_first_one_it_gives() -> None:
    ours, another = LocalTransport(), LocalTransport()
    ours.prestart()
    early = ours.early
    assert early is not None
    fresh = another.agent()  # another transport forks an agent of its own
    taken = ours.agent()
    try:
        assert taken is early and ours.early is None and fresh.pid != early.pid
        assert greeting(taken).pid == early.pid and greeting(fresh).pid == fresh.pid
    finally:
        end(taken, fresh)


def test_an_early_agent_the_job_does_not_take_is_ended_and_reaped() -> None:
    here = LocalTransport()
    here.prestart()
    early = here.early
    assert early is not None
    assert greeting(early).pid == early.pid
    here.discard(wait=False)  # a remote-only job: its connections start before the agent has left
    assert here.early is None and here.ending == [early]
    here.discard()
    assert here.ending == [] and not stat_fields(early.pid)
    later = here.agent()  # none is left to take: a new one
    try:
        assert later.pid != early.pid and greeting(later).pid == later.pid
    finally:
        end(later)
