"""Agents started by Slurm (`--launcher slurm`, and by default inside an allocation), as
`mpirun` (plm/slurm) and hydra (bootstrap slurm) start their daemons there.

One `srun` job step runs one agent per node, so the ranks run inside the step: its cgroup,
accounting and limits apply to them, and `scancel` reaches them. `srun` mixes its tasks'
stdio, so each agent connects back to the launcher over TCP (connect_back.py), presenting the
per-run secret from the step's environment and its node name. The step's command line and its
start before the launch are in slurm_step.py.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

from mpilaunch.plan.hosts import Host
from mpilaunch.transport.base import HostResult, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_payload
from mpilaunch.transport.connect_back import BackLink, Carrier, accept_agents
from mpilaunch.transport.slurm_step import StartedStep, claim_started_step, start_step
from mpilaunch.transport.sshcommon import SshOptions

ACCEPT_TIMEOUT = 60.0  # seconds for srun to start every node's agent and for each to connect back
MISSING = " before this node's agent connected back"  # after `srun exited with status 1`


class Step(Carrier):
    """The srun process of a run's agents."""

    program = "srun"
    ended = "its Slurm job step ended"


class SlurmTransport(Transport):
    """One srun step of agents that connect back. Both ends of each connection set TCP_NODELAY:
    with Nagle's algorithm a small frame written right after another (the agent's check reply
    after its hello, a rank's exit after another's) waits for the peer's delayed ACK each time."""

    name = "slurm"

    def __init__(self, options: SshOptions) -> None:
        self.options = options

    def start(self, hosts: Mapping[int, Host]) -> dict[int, HostResult]:
        if not hosts:
            return {}
        by_name = {host.name: index for index, host in hosts.items()}
        started = claim_started_step()  # the step entry.main started over the whole allocation, if it did
        if started is not None and started.nodes < len(hosts):  # not the allocation's hosts after all
            send_away(started)
            started = None
        if started is None:
            names = [hosts[i].name for i in sorted(hosts)]
            started = start_step(names, os.environ, self.options.python or sys.executable)
        listener = socket.socket(fileno=started.listener.detach())
        secret, expected = started.secret, started.nodes
        step = Step(started.pid)
        agent_payload()  # read (or built) while Slurm starts the step, not after the agents connect
        results = {index: HostResult(index) for index in hosts}
        try:
            # agents of nodes the job does not use are sent away; srun leaving early ends the wait
            joined = accept_agents(
                listener, by_name, secret, expected, lambda _: step.poll() is not None, ACCEPT_TIMEOUT
            )
        except BaseException:
            listener.close()
            step.end(0.5)
            raise
        listener.close()  # exactly the expected agents: no other connection is taken
        for name, index in by_name.items():
            if name not in joined:
                results[index].error = TransportError("agent", step.missing(ACCEPT_TIMEOUT, MISSING))
        payload = agent_payload()
        for name, (sock, rest) in joined.items():
            link = BackLink(name, sock, step)
            link.outbox += payload
            link.unread = rest  # what the agent sent behind its first line: its marker, perhaps more
            results[by_name[name]].address = f"slurm:{name}"
            results[by_name[name]].link = link
        return results


def discard_early_step() -> None:
    """End the step entry.main started if no launch took it (a refused command line): its
    agents are sent away as they connect, each ending with status 0, and srun leaves quietly."""
    early = claim_started_step()
    if early is not None:
        send_away(early)


def send_away(early: StartedStep, within: float = 10.0) -> None:
    """A step started early that no launch took: every agent is sent away as it connects back,
    then srun leaves (or is stopped, after `within`)."""
    listener = socket.socket(fileno=early.listener.detach())
    step = Step(early.pid)
    try:
        accept_agents(listener, {}, early.secret, early.nodes, lambda _: step.poll() is not None, within)
    finally:
        listener.close()
        step.end(step.grace)
