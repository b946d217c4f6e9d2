"""The HTML page of a run (`mpilaunch report RUN.json -o report.html`): one self-contained file,
inline CSS, no script, nothing fetched, so it opens anywhere (a CI artifact, a mail, offline).

Every rank is a row of one table, grouped by host (and by attempt when the run restarted): its
timeline bar coloured by outcome, what ended it, its CPU seconds and peak memory as bars scaled
to the largest. The first failure and its stderr come first; the ranks that stand out (the
failed one, the one that ran or used much more than the rest) are named above the table and
marked in it. Stack groups and attempts are drawn when the document has them.
"""

from __future__ import annotations

import html
import re
import shlex

from mpilaunch.picture.reading import (
    FAILED,
    OUTCOMES,
    STANDS_OUT,
    Row,
    cause_of,
    death_words,
    duration,
    integer,
    label,
    listed,
    mapping,
    mark_text,
    marks,
    number,
    odd_sets,
    rank_set,
    rows,
    seconds_of,
    size,
    span,
    status_of,
    text,
    title,
    utc,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:20px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 8px}
code,pre{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f6f6;padding:8px;margin:4px 0;white-space:pre-wrap;word-break:break-all}
.summary{color:#444}.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-weight:600}
.badge.success{background:#2e9d4f}.badge.failed,.badge.refused{background:#d62f2f}
.badge.timeout,.badge.interrupted{background:#f0a030}
.failure{border:2px solid #d62f2f;border-left-width:8px;background:#fff5f5;padding:8px 14px;margin:14px 0}
.failure h2{margin-top:4px;color:#a01818}.failure pre{background:#fff;border:1px solid #f0c8c8}
.standout li{margin:2px 0}.mark{color:#a01818;font-size:12px}.marks{color:#666;font-size:12px}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:14px;height:10px;
margin-right:4px;vertical-align:middle;border-radius:2px}
table.ranks{border-collapse:collapse;width:100%;table-layout:fixed}
.ranks th,.ranks td{padding:1px 6px;text-align:left;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.ranks thead th{font-weight:600;border-bottom:1px solid #ccc}
.ranks tr.host th{background:#eef1f5;border-top:1px solid #ccc;padding:3px 6px}
.ranks tr.rank td{border-bottom:1px solid #f0f0f0;height:18px}
.ranks tr.rank.failed td{background:#fff0f0}.ranks tr.rank.failed td:first-child{font-weight:700;color:#a01818}
.track,.meter{position:relative}
.bar{position:absolute;top:3px;bottom:3px;border-radius:2px;min-width:2px}
.bar.open{border-right:3px dashed #555}
.fail-line{position:absolute;top:0;bottom:0;width:0;border-left:1px dashed #d62f2f}
.fill{position:absolute;left:0;top:4px;bottom:4px;background:#7da7d9;border-radius:2px;min-width:1px}
.meter span{position:relative;padding-left:4px;font-size:12px}
td.odd .fill{background:#e0542b}td.odd span{font-weight:700}
.axis{position:relative;height:16px}.axis span{position:absolute;font-size:11px;color:#666;transform:translateX(-50%)}
.axis span:first-child{transform:none}.axis span:last-child{transform:translateX(-100%)}
.group{margin:6px 0}.group.odd .who{color:#a01818;font-weight:700}
table.attempts{border-collapse:collapse}.attempts td,.attempts th{padding:2px 10px;border-bottom:1px solid #eee;
text-align:left;white-space:nowrap}.attempts td:last-child{white-space:normal}h3{font-size:14px;margin:12px 0 4px}
footer{margin-top:24px;color:#888;font-size:12px}
"""
# What a rank's bytes may hold that a page must not act on: C0 controls but tab and newline, DEL,
# C1 controls, the bidi embeddings, overrides and isolates (they reorder the text around them),
# and lone surrogates (bytes that were not UTF-8, which the report keeps as \udcXX).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def shown(text: str) -> str:
    """Text with every control character written out, visibly: ESC is `\\x1b`, BEL `\\x07`, RLO
    `\\u202e`, a byte that was not UTF-8 `\\udce9` (as reading.text writes it). A rank's
    colours, bells and cursor moves are copied into the page as what they are, never as
    something the browser acts on or that cannot be encoded."""
    return _CONTROLS.sub(_written_out, text)


def _written_out(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(text: str, quote: bool = True) -> str:
    """HTML text of a value, its control characters written out (shown)."""
    return html.escape(shown(text), quote)


STYLE += "".join(f".bar.{name},.legend i.{name}{{background:{colour}}}\n" for name, (_, colour) in OUTCOMES.items())


def render(document: Mapping) -> str:
    """The page, as one string."""
    drawn = rows(document)
    window = span(document, drawn)
    parts = [header(document, drawn), failure(document, window)]
    parts += [standouts(drawn, window), timeline(document, drawn, window)]
    parts += [stacks(document, window), attempts(document, window), footer(document)]
    head = f"<title>{escape(title(document, len(drawn)))}</title><style>{STYLE}</style>"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{head}</head>\n<body>\n'
        + "\n".join(p for p in parts if p)
        + "\n</body></html>\n"
    )


def when(moment: float | None, window: tuple[float, float] | None) -> str:
    """`+1.52 s` from the timeline's start, or the UTC time when there is no start."""
    if moment is None:
        return "?"
    if window is None:
        return utc(moment)
    return f"+{duration(moment - window[0])}"


def header(document: Mapping, drawn: Sequence[Row]) -> str:
    outcome = text(document.get("outcome")) or "unknown"
    counts = {name: sum(1 for r in drawn if r.outcome == name) for name in OUTCOMES}
    tally = ", ".join(f"{n} {OUTCOMES[name][0]}" for name, n in counts.items() if n)
    hosts = len({r.host for r in drawn}) or len(listed(document.get("hosts")))
    started = number(document.get("started"))
    facts = [f"exit status {text(document.get('exit_status'))}", f"{len(drawn)} ranks on {hosts} host(s)"]
    if number(document.get("seconds")) is not None:
        facts.append(duration(number(document.get("seconds"))))
    if started is not None:
        facts.append(f"started {utc(started)}")
    if document.get("stop_signal"):
        facts.append(f"stopped by {text(document.get('stop_signal'))}")
    if document.get("aborted"):
        facts.append("the ranks still running were killed")
    command = shlex.join(text(word) for word in listed(document.get("command")))
    return (
        f'<header><h1>mpilaunch run <span class="badge {escape(outcome)}">{escape(outcome)}</span></h1>'
        f'<p class="summary">{escape(" · ".join(facts))}</p>'
        + (f'<p class="tally">{escape(tally)}</p>' if tally else "")
        + (f"<p><code>{escape(command)}</code></p>" if command else "")
        + "</header>"
    )


def failure(document: Mapping, window: tuple[float, float] | None) -> str:
    """The first failure, with its stderr tail; or why the run ended when no rank failed."""
    first = mapping(document.get("first_failure"))
    outcome = text(document.get("outcome"))
    if not first:
        if outcome == "refused":
            error = escape(text(document.get("error")))
            return f'<section class="failure" id="failure"><h2>Refused</h2><p>{error}</p></section>'
        if outcome in ("timeout", "interrupted"):
            why = "the time limit ended the run" if outcome == "timeout" else "a signal stopped the run"
            return f'<section class="failure" id="failure"><h2>No rank failed: {why}</h2></section>'
        return ""
    who = f"rank {integer(first.get('rank'))}"
    if integer(first.get("job"), 1) != 1:
        who = f"job {integer(first.get('job'), 1)} {who}"
    if listed(document.get("attempts")):  # a run that restarted
        who += f" (attempt {integer(first.get('attempt'))})"
    what = [cause_of(first)]
    if what[0] != status_of(first):
        what.append(f"ended by {status_of(first)}")
    if number(first.get("abort_code")) is not None:
        what.append(f"abort code {int(number(first.get('abort_code')))}")  # type: ignore[arg-type]
    if first.get("reason"):
        what.append(text(first.get("reason")))
    what += death_words(mapping(first.get("death")))
    started, ended = number(first.get("started")), number(first.get("ended"))
    timing = f"pid {text(first.get('pid'))}, started {when(started, window)}, ended {when(ended, window)}"
    command = shlex.join(text(word) for word in listed(first.get("command")))
    tail = "\n".join(text(line) for line in listed(first.get("last_stderr")))
    return (
        f'<section class="failure" id="failure"><h2>First failure: {escape(who)} on '
        f"{escape(text(first.get('host')))}: {escape(what[0])}</h2>"
        + "".join(f"<p><b>{escape(line)}</b></p>" for line in what[1:])
        + f"<p>{escape(timing)}</p>"
        + (f"<p>command: <code>{escape(command)}</code></p>" if command else "")
        + (f'<p>last stderr lines:</p><pre class="stderr">{escape(tail)}</pre>' if tail else "<p>(no stderr)</p>")
        + "</section>"
    )


def standouts(drawn: Sequence[Row], window: tuple[float, float] | None) -> str:
    several = len({r.job for r in drawn}) > 1
    odd = odd_sets(drawn, window)
    end = window[1] if window else 0.0
    lines = [
        ", ".join([f"{label(r, several)} on {r.host} failed: {r.status}", *death_words(mapping(r.entry.get("death")))])
        for r in drawn
        if r.outcome == FAILED
    ]
    for key, what in (("time", "ran"), ("cpu", "used"), ("rss", "held")):
        for i in sorted(odd[key]):
            r = drawn[i]
            if key == "time" and r.outcome == FAILED:
                continue  # named above; its bar shows how long it ran
            value = {"time": duration(seconds_of(r, end)), "cpu": f"{duration(r.cpu)} of CPU", "rss": size(r.rss)}[key]
            lines.append(f"{label(r, several)} on {r.host} {what} {value}, more than the others")
    if not lines:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return f'<section class="standout" id="standout"><h2>What stands out</h2><ul>{items}</ul></section>'


def percent(value: float, window: tuple[float, float]) -> float:
    width = window[1] - window[0]
    return 0.0 if width <= 0 else max(0.0, min(100.0, (value - window[0]) / width * 100))


def bar(row: Row, window: tuple[float, float] | None, failed_at: float | None) -> str:
    """The rank's timeline cell: a bar from its start to its end (open-ended if unknown)."""
    if window is None or row.started is None:
        return '<td class="track"></td>'
    left = percent(row.started, window)
    right = percent(row.ended if row.ended is not None else window[1], window)
    open_end = " open" if row.ended is None else ""
    line = "" if failed_at is None else f'<div class="fail-line" style="left:{percent(failed_at, window):.2f}%"></div>'
    tip = f"{when(row.started, window)} to {when(row.ended, window)}"
    return (
        f'<td class="track">{line}<div class="bar {row.outcome}{open_end}" title="{escape(tip)}" '
        f'style="left:{left:.2f}%;width:{max(right - left, 0.2):.2f}%"></div></td>'
    )


def meter(value: float | None, largest: float, words: str, odd: bool) -> str:
    if value is None:
        return '<td class="meter">?</td>'
    width = 0.0 if largest <= 0 else value / largest * 100
    return (
        f'<td class="meter{" odd" if odd else ""}"><div class="fill" style="width:{width:.1f}%"></div>'
        f"<span>{escape(words)}</span></td>"
    )


def timeline(document: Mapping, drawn: Sequence[Row], window: tuple[float, float] | None) -> str:
    legend = "".join(f'<span><i class="{name}"></i>{escape(words)}</span>' for name, (words, _) in OUTCOMES.items())
    if not drawn:
        return f'<section id="ranks"><h2>Ranks</h2><p>No rank ran.</p><p class="legend">{legend}</p></section>'
    several = len({r.job for r in drawn}) > 1
    restarts = bool(listed(document.get("attempts"))) or any(r.attempt for r in drawn)
    slots = {text(mapping(h).get("name")): mapping(h).get("slots") for h in listed(document.get("hosts"))}
    failed_at = number(mapping(document.get("first_failure")).get("ended"))
    odd = odd_sets(drawn, window)
    marked = marks(drawn, window)
    top_cpu = max((r.cpu for r in drawn if r.cpu is not None), default=0.0)
    top_rss = max((r.rss for r in drawn if r.rss is not None), default=0.0)
    axis = ""
    if window is not None:
        ticks = [window[0] + (window[1] - window[0]) * k / 4 for k in range(5)]
        axis = "".join(f'<span style="left:{percent(t, window):.0f}%">{escape(when(t, window))}</span>' for t in ticks)
    out = [
        f'<section id="ranks"><h2>Ranks</h2><p class="legend">{legend}</p><p class="marks">{escape(STANDS_OUT)}</p>',
        '<table class="ranks"><colgroup><col style="width:10em"><col><col style="width:13em">'
        '<col style="width:11em"><col style="width:11em"></colgroup>',
        f'<thead><tr><th>rank</th><th><div class="axis">{axis}</div></th><th>ended by</th>'
        "<th>CPU</th><th>peak memory</th></tr></thead>",
    ]
    group = None
    for i, row in enumerate(drawn):
        if (row.attempt, row.host) != group:
            group = (row.attempt, row.host)
            count = sum(1 for r in drawn if (r.attempt, r.host) == group)
            head = f"{row.host or '?'}: {count} rank{'s' if count > 1 else ''}"
            if slots.get(row.host) is not None:
                head += f", {text(slots[row.host])} slots"
            if restarts:
                head = f"attempt {row.attempt}, {head}"
            out.append(f'<tr class="host" data-host="{escape(row.host)}"><th colspan="5">{escape(head)}</th></tr>')
        extra = death_words(mapping(row.entry.get("death")))
        if row.entry.get("reason"):
            extra.append(text(row.entry.get("reason")))
        ended_by = row.status + (", killed" if row.outcome == "killed" else "")
        if mapping(row.entry.get("death")).get("oom"):
            ended_by += ", OOM"
        long = " long" if i in odd["time"] else ""
        words = marked.get(i, [])
        mark = f' <span class="mark">{escape(mark_text(words))}</span>' if words else ""
        out.append(
            f'<tr class="rank {row.outcome}{long}" data-job="{row.job}" data-rank="{row.rank}" '
            f'data-attempt="{row.attempt}" data-outcome="{row.outcome}" data-host="{escape(row.host)}" '
            f'data-marks="{escape(" ".join(words))}">'
            f"<td>{escape(label(row, several))}{mark}</td>{bar(row, window, failed_at)}"
            f'<td title="{escape("; ".join(extra))}">{escape(ended_by)}{" *" if extra else ""}</td>'
            + meter(row.cpu, top_cpu, duration(row.cpu), i in odd["cpu"])
            + meter(row.rss, top_rss, size(row.rss), i in odd["rss"])
            + "</tr>"
        )
    out.append("</table></section>")
    return "\n".join(out)


def stacks(document: Mapping, window: tuple[float, float] | None) -> str:
    """Each snapshot of stacks: groups of ranks with equal stacks, largest first, the odd ones marked."""
    snapshots = [mapping(s) for s in listed(document.get("stacks"))]
    if not snapshots:
        return ""
    out = ['<section id="stacks"><h2>Stacks</h2>']
    for snapshot in snapshots:
        groups = [mapping(g) for g in listed(snapshot.get("groups"))]
        groups.sort(key=lambda g: -len(listed(g.get("ranks"))))
        taken = when(number(snapshot.get("taken")), window)
        why = text(snapshot.get("why")) or "?"
        out.append(f'<div class="snapshot"><h3>taken {escape(taken)} ({escape(why)})</h3>')
        largest = len(listed(groups[0].get("ranks"))) if groups else 0
        for group in groups:
            count = len(listed(group.get("ranks")))
            who = f"{rank_set(group.get('ranks'))} ({count})"
            frames = "\n".join(text(frame) for frame in listed(group.get("frames")))
            out.append(
                f'<div class="group{" odd" if count < largest else ""}">'
                f'<div class="who">{escape(who)}</div><pre>{escape(frames)}</pre></div>'
            )
        missing = [mapping(m) for m in listed(snapshot.get("missing"))]
        if missing:
            named = [(rank_set([[m.get("job", 1), m.get("rank")]]), text(m.get("why"))) for m in missing]
            items = "".join(f"<li>{escape(who)}: {escape(why)}</li>" for who, why in named)
            out.append(f'<p>Stacks not taken:</p><ul class="missing">{items}</ul>')
        out.append("</div>")
    out.append("</section>")
    return "\n".join(out)


def attempts(document: Mapping, window: tuple[float, float] | None) -> str:
    """The attempts of a run that restarted, one row each, with what ended it."""
    tries = [mapping(a) for a in listed(document.get("attempts"))]
    if not tries:
        return ""
    out = [
        '<section id="attempts"><h2>Attempts</h2><table class="attempts"><tr><th>attempt</th><th>started</th>'
        "<th>ended</th><th>ran</th><th>exit status</th><th>outcome</th><th>first failure</th></tr>"
    ]
    for attempt in tries:
        started, ended = number(attempt.get("started")), number(attempt.get("ended"))
        ran = duration(ended - started) if started is not None and ended is not None else "?"
        first = mapping(attempt.get("first_failure"))
        failed = ""
        if first:
            failed = f"rank {integer(first.get('rank'))} on {text(first.get('host'))}: {status_of(first)}"
            failed += "".join(f"; {w}" for w in death_words(mapping(first.get("death"))))
        cells = [text(attempt.get("attempt")), when(started, window), when(ended, window), ran,
                 text(attempt.get("exit_status")), text(attempt.get("outcome")), failed]  # fmt: skip
        tds = "".join(f"<td>{escape(c)}</td>" for c in cells)
        out.append(f'<tr class="attempt {escape(text(attempt.get("outcome")))}">{tds}</tr>')
    out.append("</table></section>")
    return "\n".join(out)


def footer(document: Mapping) -> str:
    return (
        f"<footer>mpilaunch {escape(text(document.get('mpilaunch')))}, report schema "
        f"{escape(text(document.get('schema')))}, job id {escape(text(document.get('job_id')))}</footer>"
    )
