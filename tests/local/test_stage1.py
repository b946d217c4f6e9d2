"""Stage 1 of an agent's start (transport/stage1.py), run for real: an agent of a node the job
leaves without ranks is sent away (transport/connect_back.send_away)."""

from __future__ import annotations


def test_an_agent_sent_away_ends_with_status_0() -> None:
    """An agent of a node the job leaves without ranks (a step over the whole allocation) is
    sent a program that ends it: status 0, which --kill-on-bad-exit leaves alone."""
    import socket
    import subprocess
    import sys

    from mpilaunch.transport.connect_back import send_away
    from mpilaunch.transport.stage1 import STAGE1

    ours, theirs = socket.socketpair()
    with theirs:
        agent = subprocess.Popen([sys.executable, "-S", "-c", STAGE1], stdin=theirs, stdout=theirs)
    assert ours.recv(64) == b"\0mpilaunch-agent\0"
    send_away(ours)
    assert agent.wait(timeout=30) == 0
