"""What the helpers of the PMIx service (services/pmix_modex.py, pmix_dyn.py) use of it: the
jobs its server knows, its loop's queue and the agent (services/pmix.py is the real one)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.services import pmix_lib as lib
    from mpilaunch.agent.services.base import ServiceHost
    from mpilaunch.protocol.messages import PmixJob


class ServedJob:
    """A job with ranks on this host, as its server knows it."""

    def __init__(self, number: int, spec: PmixJob) -> None:
        self.number = number
        self.spec = spec
        self.idents: dict[int, int] = {}  # rank -> process id
        self.states: dict[int, str] = {}  # process id -> new, init or finalized
        self.fences: dict[str, int] = {}  # participants -> fences so far (the next one's number)
        self.path: str | None = None  # the PATH its ranks were given (-x PATH), if any


class PmixSide:
    """The service as its helpers see it."""

    host: ServiceHost
    server: lib.Server | None
    jobs: dict[int, ServedJob]  # by job number: the jobs with ranks here
    by_nspace: dict[str, ServedJob]
    refused: dict[int, str]  # job -> why its ranks cannot be served here

    def post(self, handler: Callable[..., None], *args: object) -> None:
        """From PMIx's thread: run handler(*args) on the agent's loop."""
        raise NotImplementedError

    def job_number(self, nspace: str) -> int | None:
        """The run's number of a job registered here (with ranks here or not)."""
        raise NotImplementedError

    def ident(self, nspace: str, rank: int) -> tuple[ServedJob, int] | None:
        """(job, process id) of a rank of this host."""
        raise NotImplementedError
