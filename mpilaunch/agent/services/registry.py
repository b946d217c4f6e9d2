"""The agent's services by name: what a launch's `services` may ask for (see base.py); a new
flavour is a module of its own and a row here. Each row names the class (imported when a launch
first asks for it: the PMIx server's ctypes is no cost to a job that does not use it) and the
controller's messages it handles (the agent's dispatch table needs them before any is started;
tests/unit/test_messages.py checks them against the class)."""

from __future__ import annotations

from mpilaunch.protocol.messages import (
    PmiFenceDone,
    PmiNameReply,
    PmiSpawnReply,
    PmixDmodexAsk,
    PmixDmodexDone,
    PmixFenceDone,
    PmixJoinDone,
    PmixNamesReply,
    PmixNspace,
    PmixSpawnReply,
)

PMIX_HANDLES = (PmixFenceDone, PmixDmodexAsk, PmixDmodexDone, PmixNspace, PmixSpawnReply, PmixJoinDone, PmixNamesReply)

REGISTRY: dict[str, tuple[str, tuple[type, ...]]] = {
    "pmi": ("mpilaunch.agent.services.pmi_service:PmiFd", (PmiFenceDone, PmiNameReply, PmiSpawnReply)),
    "pmi-tcp": ("mpilaunch.agent.services.pmi_tcp:PmiTcp", (PmiFenceDone, PmiNameReply, PmiSpawnReply)),
    "openmpi-guard": ("mpilaunch.agent.services.openmpi_guard:OpenMpiGuard", ()),
    "pmix": ("mpilaunch.agent.services.pmix:PmixService", PMIX_HANDLES),
}


def service_class(name: str) -> type:
    """The class of a registered service, imported now (KeyError for an unknown name)."""
    module, _, cls = REGISTRY[name][0].partition(":")
    return getattr(__import__(module, fromlist=[cls]), cls)  # type: ignore[no-any-return]
