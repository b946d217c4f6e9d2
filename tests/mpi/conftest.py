"""After every MPI test: nothing of Open MPI's or of a PMIx server left in /dev/shm."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

OPEN_MPI_SHM = ("mpilaunch-pmix-", "vader", "sm_segment", "pmix")


def _left(name: str) -> bool:
    """An agent's PMIx folder (mpilaunch-pmix-PID-...) is left only once its agent is gone: a
    live one is another run's, still in use. Open MPI's segments carry no pid."""
    if not name.startswith("mpilaunch-pmix-"):
        return True
    pid = name[len("mpilaunch-pmix-") :].split("-", 1)[0]
    return not (pid.isdigit() and os.path.exists(f"/proc/{pid}"))


@pytest.fixture(autouse=True)
def nothing_left_in_dev_shm() -> Iterator[None]:
    before = set(os.listdir("/dev/shm"))
    yield
    made = set(os.listdir("/dev/shm")) - before
    left = sorted(name for name in made if name.startswith(OPEN_MPI_SHM) and _left(name))
    assert not left, f"left in /dev/shm: {left}"
