"""The agent's services by name: what a launch's `services` may ask for (see base.py); a new
flavour is a module of its own and a row here."""

from __future__ import annotations

from mpilaunch.agent.services.base import Service
from mpilaunch.agent.services.openmpi_guard import OpenMpiGuard
from mpilaunch.agent.services.pmi import PmiFd, PmiTcp

REGISTRY: dict[str, type[Service]] = {kind.name: kind for kind in (PmiFd, PmiTcp, OpenMpiGuard)}
