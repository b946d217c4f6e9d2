"""The --report-json document as the picture draws it: one row per rank with its outcome, the
run's time span, and the ranks that stand out. Pure, and forgiving: a key that is absent, or of
another type than the schema's, is read as unknown, never an error (documents of later schemas
and hand-edited ones are drawn as far as they can be)."""

from __future__ import annotations

import math
import time

from mpilaunch.launcher.report.report_text import ranges
from mpilaunch.launcher.report.report_text import size as byte_size
from mpilaunch.protocol.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# Outcomes of a rank, in the order of the legend; each is a CSS class and a colour.
OK, FAILED, KILLED, LOST, NEVER = "ok", "failed", "killed", "lost", "never"
OUTCOMES: dict[str, tuple[str, str]] = {
    OK: ("ok", "#2e9d4f"),
    FAILED: ("failed", "#d62f2f"),
    KILLED: ("killed by mpilaunch", "#f0a030"),
    LOST: ("host lost / end unconfirmed", "#8e5cc4"),
    NEVER: ("never started", "#a8a8a8"),
}
# A rank stands out when its run time, CPU seconds or peak memory is ODD times the ranks' median
# or more, and more than its floor above the median (a few tenths of a second or MiB among ranks
# that barely ran is no outlier), among at least FEW ranks.
ODD = 1.5
FLOORS = {"time": 0.5, "cpu": 0.2, "rss": float(16 << 20)}
FEW = 3


def number(value: object) -> float | None:
    """A finite number, or None (a bool, a string or null is no number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def text(value: object) -> str:
    """A value as text: '' for null; bytes that were not UTF-8 stay as their \\udcXX escapes."""
    if value is None:
        return ""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def listed(value: object) -> list:
    return value if isinstance(value, list) else []


def mapping(value: object) -> dict:
    return value if isinstance(value, dict) else {}


class Row(Record):
    """One rank as drawn."""

    job: int
    rank: int
    attempt: int
    host: str
    outcome: str
    status: str  # what ended it, in words: `exit 3`, `SIGTERM`, `never started`
    started: float | None
    ended: float | None
    cpu: float | None
    rss: float | None
    entry: dict  # the rank's object in the document, for what else it says


def integer(value: object, default: int = 0) -> int:
    found = number(value)
    return int(found) if found is not None and found == int(found) else default


def is_failure(entry: Mapping, first: Mapping) -> bool:
    """Whether entry is the rank the document names as the first failure."""
    keys = ("job", "rank", "attempt")
    return bool(first) and all(integer(entry.get(k)) == integer(first.get(k)) for k in keys)


def status_of(entry: Mapping) -> str:
    """How the rank ended, in a few words."""
    code, sig = number(entry.get("exit_code")), entry.get("signal")
    if code is not None:
        return f"exit {int(code)}"
    if sig:
        return text(sig)
    if number(entry.get("started")) is None:
        return "never started"
    return "end unconfirmed" if number(entry.get("ended")) is None or entry.get("state") == "failed" else "ended"


def outcome_of(entry: Mapping, first: Mapping) -> str:
    """ok, failed, killed (by mpilaunch), lost (its host lost, or its end never reported) or never (started)."""
    state, reason = entry.get("state"), text(entry.get("reason"))
    known_end = number(entry.get("exit_code")) is not None or bool(entry.get("signal"))
    if is_failure(entry, first) or mapping(entry.get("death")).get("oom"):
        return FAILED
    if " lost" in reason or state in ("running", "stopping"):
        return LOST
    if number(entry.get("started")) is None and not known_end:
        return NEVER
    if state == "exited":
        return OK
    if entry.get("killed") is True:
        return KILLED
    return FAILED if known_end or state == "failed" else LOST


def rows(document: Mapping) -> list[Row]:
    """Every rank, grouped by attempt then host (hosts in the document's order), then by job and rank."""
    first = mapping(document.get("first_failure"))
    hosts = [text(mapping(h).get("name")) for h in listed(document.get("hosts"))]
    found = []
    for entry in listed(document.get("ranks")):
        if not isinstance(entry, dict):
            continue
        host = text(entry.get("host"))
        found.append(
            Row(
                integer(entry.get("job"), 1),
                integer(entry.get("rank")),
                integer(entry.get("attempt")),
                host,
                outcome_of(entry, first),
                status_of(entry),
                number(entry.get("started")),
                number(entry.get("ended")),
                number(entry.get("cpu_seconds")),
                number(entry.get("peak_rss_bytes")),
                entry,
            )
        )
    place = {name: i for i, name in reversed(list(enumerate(hosts)))}
    return sorted(found, key=lambda r: (r.attempt, place.get(r.host, len(hosts)), r.host, r.job, r.rank))


def span(document: Mapping, drawn: Sequence[Row]) -> tuple[float, float] | None:
    """(first, last) moment of the timeline: the run's and every rank's times; None if none is known."""
    times = [number(document.get(k)) for k in ("started", "ended")]
    times += [t for r in drawn for t in (r.started, r.ended)]
    for attempt in listed(document.get("attempts")):
        times += [number(mapping(attempt).get(k)) for k in ("started", "ended")]
    known = [t for t in times if t is not None]
    return (min(known), max(known)) if known else None


def seconds_of(row: Row, end: float) -> float | None:
    """How long the rank ran (to the end of the run when its end is unknown)."""
    if row.started is None:
        return None
    return max(0.0, (row.ended if row.ended is not None else end) - row.started)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def odd_ones(values: Mapping[int, float], floor: float) -> set[int]:
    """The rows whose value is ODD times the median or more (and more than floor above it): the
    one rank that ran much longer, or held much more memory, among many alike."""
    if len(values) < FEW:
        return set()
    middle = median(list(values.values()))
    return {i for i, v in values.items() if v >= ODD * middle and v - middle > floor}


def label(row: Row, several_jobs: bool) -> str:
    return f"job {row.job} rank {row.rank}" if several_jobs else f"rank {row.rank}"


def rank_set(pairs: object) -> str:
    """[[1, 0], [1, 1], [1, 5]] -> 'ranks 0-1,5'; the ranks of other jobs named by job."""
    by_job: dict[int, list[int]] = {}
    for pair in listed(pairs):
        if isinstance(pair, list) and len(pair) == 2:
            by_job.setdefault(integer(pair[0], 1), []).append(integer(pair[1]))
    parts = []
    for job in sorted(by_job):
        numbers = sorted(set(by_job[job]))
        words = f"rank{'s' if len(numbers) > 1 else ''} {ranges(numbers)}"
        parts.append(words if list(by_job) == [1] else f"job {job} {words}")
    return "; ".join(parts) or "no rank"


def size(value: float | None) -> str:
    """Bytes for people (report_text.size), `?` when unknown."""
    return "?" if value is None else byte_size(int(value))


def utc(moment: float) -> str:
    """Seconds since the epoch as a UTC date and time (as a number when out of the calendar's range)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(moment))
    except (OverflowError, OSError, ValueError):
        return f"{moment:.0f} s after the epoch"


def duration(value: float | None) -> str:
    if value is None:
        return "?"
    if value == 0:
        return "0 s"
    if value < 0.1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"
    minutes, secs = divmod(value, 60)
    return f"{int(minutes)} min {secs:.0f} s" if minutes < 60 else f"{minutes / 60:.1f} h"


def death_words(death: Mapping) -> list[str]:
    """What the document knows of how a rank died: the OOM killer, its limit, a core file."""
    words = []
    if death.get("oom"):
        limits = []
        if number(death.get("limit_bytes")) is not None:
            limits.append(f"limit {size(number(death.get('limit_bytes')))}")
        if number(death.get("peak_rss")) is not None:
            limits.append(f"peak RSS {size(number(death.get('peak_rss')))}")
        words.append("killed by the out-of-memory killer" + (f" ({'; '.join(limits)})" if limits else ""))
    if death.get("core"):
        words.append(f"core file: {text(death.get('core'))}")
    return words


CAUSE_WIDTH = 110  # characters of an exception's first line kept in a title


def shortened(words: str, width: int = CAUSE_WIDTH) -> str:
    """words in at most width characters: its start and its end around ` ... `, where an
    exception says what (`FileNotFoundError: [Errno 2]`) and which (`'data.csv'`)."""
    if len(words) <= width:
        return words
    tail = (width - 5) // 3
    return f"{words[: width - 5 - tail].rstrip()} ... {words[-tail:].lstrip()}"


def cause_of(first: Mapping) -> str:
    """The first failure in a few words, for the titles: its Python exception when the report
    found one, else the out-of-memory killer, its signal, MPI_Abort's code, or its exit status."""
    exception = mapping(first.get("exception"))
    if exception.get("type"):
        message = text(exception.get("message")).strip().split("\n", 1)[0]
        return shortened(f"{text(exception.get('type'))}: {message}" if message else text(exception.get("type")))
    if mapping(first.get("death")).get("oom"):
        return "killed by the out-of-memory killer"
    if first.get("signal") and number(first.get("exit_code")) is None:
        return f"killed by {text(first.get('signal'))}"
    if number(first.get("abort_code")) is not None:
        return f"MPI_Abort with code {int(number(first.get('abort_code')))}"  # type: ignore[arg-type]
    return status_of(first)


def title(document: Mapping, ranks: int) -> str:
    """The title of both drawings: the run's outcome and, when a rank failed, which and its cause."""
    words = f"mpilaunch: {text(document.get('outcome')) or 'run'}"
    first = mapping(document.get("first_failure"))
    if first:
        words += f", rank {integer(first.get('rank'))}: {cause_of(first)}"
    return f"{words} ({ranks} ranks)"


MARKS = {"time": "slow", "cpu": "CPU", "rss": "memory"}  # what stands out: the mark's word


STANDS_OUT = (
    f"◆ marks a failed rank (failed) and a rank that stands out: its run time (slow), CPU seconds (CPU) or peak "
    f"memory (memory) {ODD:g} times the ranks' median or more, and more than {duration(FLOORS['time'])}, "
    f"{duration(FLOORS['cpu'])} or {size(FLOORS['rss'])} above it, among {FEW} ranks or more"
)  # the legend of both drawings' marks


def odd_sets(drawn: Sequence[Row], window: tuple[float, float] | None) -> dict[str, set[int]]:
    """Which rows stand out in run time, CPU seconds and peak memory (indices into drawn), by
    odd_ones with each measure's floor."""
    end = window[1] if window else 0.0
    values: dict[str, dict[int, float]] = {
        "time": {i: s for i, r in enumerate(drawn) if (s := seconds_of(r, end)) is not None},
        "cpu": {i: r.cpu for i, r in enumerate(drawn) if r.cpu is not None},
        "rss": {i: r.rss for i, r in enumerate(drawn) if r.rss is not None},
    }
    return {key: odd_ones(found, FLOORS[key]) for key, found in values.items()}


def marks(drawn: Sequence[Row], window: tuple[float, float] | None) -> dict[int, list[str]]:
    """The one rule both drawings (page and chart) mark ranks by: each marked row (index into
    drawn) with its words, `failed` and what stands out (`slow`, `CPU`, `memory`)."""
    odd = odd_sets(drawn, window)
    found: dict[int, list[str]] = {}
    for i, row in enumerate(drawn):
        words = ["failed"] if row.outcome == FAILED else []
        words += [word for key, word in MARKS.items() if i in odd[key]]
        if words:
            found[i] = words
    return found


def mark_text(words: Sequence[str]) -> str:
    """A mark as both drawings write it beside the rank: `◆ slow, CPU`."""
    return "◆ " + ", ".join(words)
