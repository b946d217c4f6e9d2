"""--report-json PATH: what happened in a run, as one JSON document, for CI systems and
post-mortems to read instead of scraping the console. Written when the run ends, whatever
ended it (success, a failure, an abort, the timeout, Ctrl-C); docs/reference.md has the schema.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from mpilaunch import __version__
from mpilaunch.launcher.decide.events import RunEnded, table
from mpilaunch.launcher.decide.policy import Policy
from mpilaunch.launcher.decide.signal_table import name_of
from mpilaunch.launcher.decide.states import RankState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.plan.build import JobPlan, LaunchPlan
    from mpilaunch.protocol.messages import Death
    from mpilaunch.protocol.record import Record

SCHEMA = 1


def status_fields(status: int | None) -> dict[str, object]:
    """exit_code, or signal (its name) for a rank a signal ended; both None if it never ended."""
    if status is None or status >= 0:
        return {"exit_code": status, "signal": None}
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return {"exit_code": None, "signal": name}


def death_fields(death: Death) -> dict[str, object]:
    """How a signal killed the rank, as its agent found out (picture/reading.py draws it)."""
    return {"oom": death.oom, "limit_bytes": death.limit_bytes, "peak_rss": death.peak_rss, "core": death.core}


class JsonReport:
    """A subscriber of the run's events that writes the report at RunEnded."""

    def __init__(
        self,
        path: str,
        plan: LaunchPlan,
        policy: Policy,
        jobs: Mapping[int, JobPlan],
        output: OutputSink,
        command: Sequence[str],
        earlier: list[dict[str, object]] | None = None,
        stacks: list[dict[str, object]] | None = None,
    ) -> None:
        """earlier: the documents of the run's earlier attempts (--max-restarts), which the
        report lists with this one; stacks: the run's snapshots of stacks (launcher/stacks/snapshots.py)."""
        self.path = path
        self.earlier = earlier
        self.last: dict[str, object] | None = None  # this attempt's document, once written
        self.lost = False  # the document could not be written (said on stderr)
        self.plan = plan
        self.policy = policy
        self.jobs = jobs
        self.output = output
        self.command = list(command)
        self.stacks = stacks if stacks is not None else []
        self.wall_offset = time.time() - time.monotonic()  # the policy's clock is monotonic
        self.started = time.time()
        self.dispatch = table({RunEnded: self.write})

    def __call__(self, event: Record) -> None:
        self.dispatch(event)

    def when(self, monotonic: float | None) -> float | None:
        return None if monotonic is None else round(monotonic + self.wall_offset, 6)

    def rank(self, state: RankState) -> dict[str, object]:
        death = state.death
        known = {"death": death_fields(death)} if death is not None else {}
        return {
            "attempt": len(self.earlier) if self.earlier is not None else self.plan.attempt,  # which start of the ranks
            "job": state.job,
            "rank": state.rank.rank,
            "app": state.rank.app,
            "host": self.plan.hosts[state.rank.host].name,
            "pid": state.pid,
            "state": state.state,
            "started": self.when(state.started_at),
            "ended": self.when(state.ended_at),
            **status_fields(state.status),
            "killed": state.killed,
            "reason": state.reason,
            "cpu_seconds": state.cpu,
            "peak_rss_bytes": state.rss,
            **known,
        }

    def document(self, status: int) -> dict[str, object]:
        policy = self.policy
        failure = policy.first_failure
        first = None
        if failure is not None:
            first = {
                **self.rank(failure),
                "abort_code": failure.abort_code,
                "command": list(self.jobs[failure.job].argvs[failure.rank.app]),
                "last_stderr": self.output.last_lines(failure.proc),
            }
            from mpilaunch.launcher.report.root_cause import root_cause

            cause = root_cause(failure.error, failure.error_file, self.output.last_lines(failure.proc, 200))
            first["exception"] = cause.as_json() if cause is not None else None
        if policy.timed_out:
            outcome = "timeout"
        elif policy.stop_signal is not None:
            outcome = "interrupted"
        else:
            outcome = "failed" if failure is not None else "success"
        ended = time.time()
        return {
            "mpilaunch": __version__,
            "schema": SCHEMA,
            "command": self.command,
            "job_id": self.plan.job_id,
            "hosts": [
                {"name": host.name, "slots": host.slots, "ranks": sum(1 for s in policy.procs if s.rank.host == i)}
                for i, host in enumerate(self.plan.hosts)
            ],
            "started": round(self.started, 6),
            "ended": round(ended, 6),
            "seconds": round(ended - self.started, 6),
            "exit_status": status,
            "outcome": outcome,
            "aborted": policy.aborted,
            "stop_signal": name_of(policy.stop_signal) if policy.stop_signal is not None else None,
            "timed_out_by": policy.timed_out_by or None,
            "first_failure": first,
            "ranks": [self.rank(state) for state in policy.procs],
            **({"stacks": self.stacks} if self.stacks else {}),
        }

    def with_attempts(self, document: dict[str, object]) -> dict[str, object]:
        """A run with --max-restarts: every attempt in order, and the ranks of all of them."""
        if self.earlier is None:
            return document
        runs = [*self.earlier, document]
        keys = ("started", "ended", "seconds", "exit_status", "outcome", "stop_signal", "first_failure")
        attempts = [{"attempt": n, "job_id": d["job_id"], **{k: d[k] for k in keys}} for n, d in enumerate(runs)]
        ranks = [rank for d in runs for rank in d["ranks"]]  # type: ignore[attr-defined]
        return {**document, "started": runs[0]["started"], "attempts": attempts, "ranks": ranks}

    def write(self, event: RunEnded) -> None:
        from mpilaunch.host.files import console_stream, write_file

        document = self.last = self.document(event.status)
        text = json.dumps(self.with_attempts(document), indent=1) + "\n"  # ASCII: other bytes as \udcXX
        stream = console_stream(self.path)
        if stream is not None:  # /dev/stdout: after the rank output queued for it, not before
            self.output.writer.write(stream, text.encode(), notice=True)
            return
        error = write_file(self.path, text)
        if error:  # said once; the run's status is 2 if the ranks' was 0 (launch.run_attempt)
            self.lost = True
            self.output.say(f"mpilaunch: --report-json: {error}")  # in order with the summary


def write_refused(path: str, plan: LaunchPlan | None, command: Sequence[str], error: Exception) -> None:
    """The report of a run refused before any rank started (bad input, a host that fails its
    checks): the error, status 2, no ranks."""
    from mpilaunch.host.files import write_file

    document = {
        "mpilaunch": __version__,
        "schema": SCHEMA,
        "command": list(command),
        "job_id": plan.job_id if plan is not None else None,
        "hosts": [{"name": h.name, "slots": h.slots, "ranks": 0} for h in plan.hosts] if plan is not None else [],
        "exit_status": getattr(error, "status", 2),
        "outcome": "refused",
        "error": str(error),
        "ranks": [],
    }
    problem = write_file(path, json.dumps(document, indent=1) + "\n")
    if problem:
        sys.stderr.write(f"mpilaunch: --report-json: {problem}\n")
