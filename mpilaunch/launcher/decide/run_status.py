"""The run's exit status, from the policy's state once the run ended (or as it stands): each
launcher's rule, Open MPI's, hydra's and torchrun's (docs/reference.md, "Exit statuses")."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Protocol

    from mpilaunch.launcher.decide.states import RankState
    from mpilaunch.plan.spec import Options

    class Policy(Protocol):
        """What of the policy's state the status is read from."""

        options: Options
        procs: list[RankState]
        first_failure: RankState | None
        failed: Sequence[int]
        stop_signal: int | None
        timed_out: bool
        aborted: bool
        elsewhere: str | None
        hydra: bool


TIMEOUT_STATUS = 124


def exit_status(policy: Policy) -> int:
    status = mpirun_status(policy)
    if policy.options.torch is not None and status != TIMEOUT_STATUS and (status or policy.stop_signal is not None):
        return 1  # torchrun's: any failed worker, or the launcher stopped by a signal (its ranks' ends aside)
    return status


def mpirun_status(policy: Policy) -> int:
    """mpirun's exit status: the first failure's, or the signal's that stopped the run; hydra's
    where no failure ended the run (the ranks' exit codes ORed)."""
    if policy.timed_out:
        return TIMEOUT_STATUS
    failure, stop = policy.first_failure, policy.stop_signal
    if failure is None and policy.elsewhere is not None:
        return 1
    if policy.hydra and failure is not None and not policy.aborted:
        return ored_exits(policy)
    if failure is None:
        return 128 + stop if stop is not None and policy.failed else 0
    if failure.abort_code is not None:
        return abort_status(failure.abort_code)
    status = failure.status if failure.status is not None else 1
    return 128 - status if status < 0 else status


def ored_exits(policy: Policy) -> int:
    """hydra's status for a run no failure ended: every rank's exit code ORed."""
    status = 0
    for state in policy.procs:
        if state.status is not None and state.status > 0:
            status |= state.status
    return status & 0xFF


def abort_status(code: int) -> int:
    """The launcher's exit status for MPI_Abort(code): its low byte, but never 0 (success)."""
    return code & 0xFF or 1
