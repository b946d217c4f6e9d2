"""This machine's answers to the planner (plan.build.Here): a free port, its facts and sockets."""

from __future__ import annotations

from collections.abc import Mapping

from mpilaunch.host.hostinfo import probe, this_machine_address
from mpilaunch.host.programs import probe_port
from mpilaunch.plan.build import Here


class ThisMachine(Here):
    def free_port(self) -> int:
        return probe_port(0)[0]

    def facts(self, request: Mapping[str, object], path: str) -> dict:
        info = probe(bool(request.get("gpus")), request.get("hccn"), path)  # type: ignore[arg-type]
        if request.get("hccn"):
            info["address"] = this_machine_address()
        return info

    def sockets(self) -> int:
        from mpilaunch.host.binding import cpu_groups

        return max(1, len(cpu_groups("socket")))

    def in_job_step(self) -> bool:
        from mpilaunch.host.procfs import has_ancestor

        return has_ancestor("slurmstepd")
