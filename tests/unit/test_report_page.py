"""picture/page.render on report documents made here: what the page shows of every key the
document may hold (stack snapshots, attempts, a rank the OOM killer ended, a lost host, a rank
that never started), the odd rank marked, and no document, however partial or malformed, makes
it fail or lets text of the document out of its escaping."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.picture.page import render
from mpilaunch.picture.reading import rank_set
from tests.pagedom import Element, parse

T0 = 1795000000.0
MIB = 1 << 20


def rank(job: int, number: int, host: str, start: float | None, end: float | None, **fields: object) -> dict:
    entry = {
        "job": job, "rank": number, "app": 0, "host": host, "pid": 1000 + number, "state": "exited",
        "started": None if start is None else T0 + start, "ended": None if end is None else T0 + end,
        "exit_code": 0, "signal": None, "killed": False, "reason": None, "cpu_seconds": 1.0,
        "peak_rss_bytes": 50 * MIB,
    }  # fmt: skip
    entry.update(fields)
    return entry


def restarted_run() -> dict:
    """Two attempts on two hosts: in attempt 0 the OOM killer ends rank 2 and the others are
    killed; attempt 1 succeeds. Stacks were taken once, in attempt 0, when it hung."""
    oom = {"oom": True, "limit_bytes": 100 * MIB, "peak_rss": 96 * MIB, "core": "/var/crash/core.4242"}
    first = rank(1, 2, "node2", 0.5, 9.0, state="failed", exit_code=None, signal="SIGKILL", attempt=0, death=oom)
    first.update(abort_code=None, command=["python", "train.py"], last_stderr=["loading shard 2", "Killed"])
    ranks = [
        rank(1, 0, "node1", 0.5, 9.5, state="failed", exit_code=None, signal="SIGTERM", killed=True, attempt=0),
        rank(1, 1, "node1", 0.5, 9.5, state="failed", exit_code=None, signal="SIGTERM", killed=True, attempt=0),
        {k: v for k, v in first.items() if k not in ("abort_code", "command", "last_stderr")},
        rank(1, 3, "node2", 0.5, 9.5, state="failed", exit_code=None, signal="SIGTERM", killed=True, attempt=0),
        *(rank(1, r, "node1" if r < 2 else "node2", 10.0, 20.0, attempt=1) for r in range(4)),
    ]
    return {
        "mpilaunch": "0.1.0", "schema": 1, "command": ["mpilaunch", "-n", "4", "python", "train.py"],
        "job_id": "abc123",
        "hosts": [{"name": "node1", "slots": 2, "ranks": 2}, {"name": "node2", "slots": 2, "ranks": 2}],
        "started": T0, "ended": T0 + 20.5, "seconds": 20.5, "exit_status": 0, "outcome": "success",
        "aborted": False, "stop_signal": None, "first_failure": first, "ranks": ranks,
        "attempts": [
            {"attempt": 0, "started": T0, "ended": T0 + 9.6, "exit_status": 137, "outcome": "failed",
             "first_failure": first},
            {"attempt": 1, "started": T0 + 9.8, "ended": T0 + 20.5, "exit_status": 0, "outcome": "success",
             "first_failure": None},
        ],
        "stacks": [{
            "taken": T0 + 5.0, "why": "hang",
            "groups": [
                {"ranks": [[1, 2]], "frames": ["train.py:40 in main", "loader.py:12 in stuck_here"]},
                {"ranks": [[1, 0], [1, 1], [1, 3]], "frames": ["train.py:88 in step", "dist.py:7 in all_reduce"]},
            ],
            "missing": [{"job": 1, "rank": 5, "why": "py-spy is not installed on node3"}],
        }],
    }  # fmt: skip


def rows(page: Element) -> list[Element]:
    return page.find_all("tr", "rank")


def test_stack_groups_largest_first_the_odd_one_marked() -> None:
    page = parse(render(restarted_run()))
    section = page.find("section", id="stacks")
    assert "taken +5.00 s (hang)" in section.find("h3").text()
    groups = section.find_all("div", "group")
    assert [g.find("div", "who").text() for g in groups] == ["ranks 0-1,3 (3)", "rank 2 (1)"]
    assert "odd" not in groups[0].classes and "odd" in groups[1].classes
    assert groups[1].find("pre").text() == "train.py:40 in main\nloader.py:12 in stuck_here"
    assert section.find("ul", "missing").text() == "rank 5: py-spy is not installed on node3"


def test_attempts_and_the_ranks_of_each() -> None:
    page = parse(render(restarted_run()))
    table = page.find("section", id="attempts")
    attempts = table.find_all("tr", "attempt")
    assert [a.classes - {"attempt"} for a in attempts] == [{"failed"}, {"success"}]
    cells = [td.text() for td in attempts[0].find_all("td")]
    assert cells[:2] == ["0", "+0 s"] and cells[4:6] == ["137", "failed"]
    assert cells[6] == (
        "rank 2 on node2: SIGKILL; killed by the out-of-memory killer (limit 100 MiB; peak RSS 96 MiB); "
        "core file: /var/crash/core.4242"
    )
    heads = [h.text() for h in page.find_all("tr", "host")]
    assert heads == [
        "attempt 0, node1: 2 ranks, 2 slots", "attempt 0, node2: 2 ranks, 2 slots",
        "attempt 1, node1: 2 ranks, 2 slots", "attempt 1, node2: 2 ranks, 2 slots",
    ]  # fmt: skip
    outcomes = [(r.attrs["data-attempt"], r.attrs["data-rank"], r.attrs["data-outcome"]) for r in rows(page)]
    assert outcomes == [
        ("0", "0", "killed"), ("0", "1", "killed"), ("0", "2", "failed"), ("0", "3", "killed"),
        ("1", "0", "ok"), ("1", "1", "ok"), ("1", "2", "ok"), ("1", "3", "ok"),
    ]  # fmt: skip


def test_the_oom_death_is_named_in_the_failure_and_its_row() -> None:
    page = parse(render(restarted_run()))
    failure = page.find("section", id="failure")
    assert failure.find("h2").text() == "First failure: rank 2 (attempt 0) on node2: killed by the out-of-memory killer"
    assert "ended by SIGKILL" in failure.text()
    assert page.find("title").text() == "mpilaunch: success, rank 2: killed by the out-of-memory killer (8 ranks)"
    text = failure.text()
    assert "killed by the out-of-memory killer (limit 100 MiB; peak RSS 96 MiB)" in text
    assert "core file: /var/crash/core.4242" in text
    assert failure.find("pre", "stderr").text() == "loading shard 2\nKilled"
    oom_row = rows(page)[2]
    assert oom_row.find_all("td")[2].text() == "SIGKILL, OOM *"
    assert "killed by the out-of-memory killer" in oom_row.find_all("td")[2].attrs["title"]
    assert [li.text() for li in page.find("section", id="standout").find_all("li")] == [
        "rank 2 on node2 failed: SIGKILL, killed by the out-of-memory killer (limit 100 MiB; peak RSS 96 MiB), "
        "core file: /var/crash/core.4242"
    ]


def eight_ranks(**changes: dict) -> dict:
    """8 ranks alike (2 s, 1 s of CPU, 50 MiB), with the given ranks' fields changed."""
    ranks = [rank(1, r, "node1" if r < 4 else "node2", 0.1, 2.1) for r in range(8)]
    for number, fields in changes.items():
        ranks[int(number[1:])].update(fields)
    return {"schema": 1, "outcome": "success", "exit_status": 0, "started": T0, "ended": T0 + 30, "ranks": ranks}


def test_the_odd_rank_stands_out() -> None:
    odd = eight_ranks(r5={"ended": T0 + 25.0}, r2={"peak_rss_bytes": 900 * MIB}, r6={"cpu_seconds": 9.0})
    page = parse(render(odd))
    long = [r.attrs["data-rank"] for r in rows(page) if "long" in r.classes]
    assert long == ["5"]
    cells = [(r.attrs["data-rank"], i, td) for r in rows(page) for i, td in enumerate(r.find_all("td"))]
    marked = {(number, i) for number, i, td in cells if "odd" in td.classes}
    assert marked == {("6", 3), ("2", 4)}
    marks = {r.attrs["data-rank"]: r.find("span", "mark").text() for r in rows(page) if r.find_all("span", "mark")}
    assert marks == {"5": "◆ slow", "6": "◆ CPU", "2": "◆ memory"}  # each mark says what it marks
    assert page.find("p", "marks").text() == (
        "◆ marks a failed rank (failed) and a rank that stands out: its run time (slow), CPU seconds (CPU) or peak "
        "memory (memory) 1.5 times the ranks' median or more, and more than 0.50 s, 0.20 s or 16 MiB above it, "
        "among 3 ranks or more"
    )  # the rule, whole, as the page's legend
    lines = [li.text() for li in page.find("section", id="standout").find_all("li")]
    assert lines == [
        "rank 5 on node2 ran 24.9 s, more than the others",
        "rank 6 on node2 used 9.00 s of CPU, more than the others",
        "rank 2 on node1 held 900 MiB, more than the others",
    ]
    assert not parse(render(eight_ranks())).find_all("section", "standout")  # nothing odd: no list


def test_every_outcome_has_its_class() -> None:
    document = eight_ranks(
        r1={"state": "failed", "exit_code": None, "signal": None,
            "reason": "host node1 lost; its ranks could not be confirmed ended"},
        r2={"state": "planned", "started": None, "ended": None, "exit_code": None, "pid": None},
        r3={"state": "failed", "exit_code": None, "signal": "SIGTERM", "killed": True},
        r4={"state": "running", "ended": None, "exit_code": None},
        r5={"state": "failed", "exit_code": 1},
    )  # fmt: skip
    page = parse(render(document))
    found = [(r.attrs["data-outcome"], r.find_all("td")[2].text()) for r in rows(page)]
    assert found == [
        ("ok", "exit 0"), ("lost", "end unconfirmed *"), ("never", "never started"), ("killed", "SIGTERM, killed"),
        ("lost", "end unconfirmed"), ("failed", "exit 1"), ("ok", "exit 0"), ("ok", "exit 0"),
    ]  # fmt: skip
    bars = {r.attrs["data-rank"]: r.find_all("div", "bar") for r in rows(page)}
    assert bars["2"] == [] and "open" in bars["4"][0].classes  # no start, no bar; no end: open to the run's end
    assert bars["4"][0].attrs["style"].endswith("width:99.67%")


def test_text_of_the_document_is_escaped() -> None:
    document = eight_ranks(r0={"state": "failed", "exit_code": 1, "host": "<b>node</b>"})
    stderr = ["<script>alert(1)</script>", "bad \udcff byte"]
    document["first_failure"] = {**document["ranks"][0], "last_stderr": stderr}
    document["command"] = ["mpilaunch", "echo", "</code><img src=http://x>"]
    page_text = render(document)
    page_text.encode("utf-8")  # the lone surrogate became its escape, so the page is UTF-8
    page = parse(page_text)
    assert not page.find_all("script") and not page.find_all("img") and not page.find_all("b")
    assert page.find("pre", "stderr").text() == "<script>alert(1)</script>\nbad \\udcff byte"
    assert rows(page)[0].attrs["data-host"] == "<b>node</b>"


def test_a_refused_run_and_an_empty_document() -> None:
    refused = {"schema": 1, "outcome": "refused", "exit_status": 2, "error": "unknown option '-genvx'", "ranks": []}
    page = parse(render(refused))
    assert page.find("section", id="failure").text() == "Refusedunknown option '-genvx'"
    assert "No rank ran." in page.find("section", id="ranks").text()
    assert parse(render({})).find("h1").text() == "mpilaunch run unknown"


def test_rank_sets() -> None:
    assert rank_set([[1, 0], [1, 1], [1, 2], [1, 5]]) == "ranks 0-2,5"
    assert rank_set([[2, 0], [1, 3]]) == "job 1 rank 3; job 2 rank 0"
    assert rank_set("nonsense") == "no rank"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
KEYS = ["outcome", "exit_status", "started", "ended", "seconds", "command", "hosts", "first_failure", "stacks",
        "attempts"]  # fmt: skip
RANK_KEYS = ["job", "rank", "attempt", "host", "state", "started", "ended", "exit_code", "signal", "killed", "reason",
             "cpu_seconds", "peak_rss_bytes", "death"]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    st.fixed_dictionaries({}, optional={k: JSON for k in KEYS}),
    st.lists(st.fixed_dictionaries({}, optional={k: JSON for k in RANK_KEYS}) | JSON, max_size=5),
)
def test_no_document_makes_it_fail(document: dict, ranks: list) -> None:
    """Any value under any key (a later schema, a file edited by hand): a page, never an error."""
    document = {**document, "ranks": ranks}
    page = render(json.loads(json.dumps(document)))
    page.encode("utf-8")
    assert page.endswith("</body></html>\n") and "<script" not in page


def test_control_characters_of_a_rank_are_shown_not_copied() -> None:
    """A rank's colours, bell, backspaces and a right-to-left override reached the page as raw
    bytes (issue 35, "Never silent, never wrong"): the browser drew nothing for them, a bidi
    override reordered the text after it. Now each is written out where it was: `\\x1b`, `\\u202e`."""
    said = "\x1b[31mred\x1b[0m \x07 back\x08 del\x7f csi\x9b \u202eevil \u2066iso\u2069 nul\x00 tab\tend"
    document = eight_ranks(r3={"state": "failed", "exit_code": 1, "host": "node\x1b]0;title\x07"})
    document["first_failure"] = {**document["ranks"][3], "last_stderr": [said, "line\rover"]}
    document["command"] = ["mpilaunch", "-n", "8", "sh", "-c", "printf '\x1b[2J'"]
    page_text = render(document)
    controls = [c for c in page_text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert not controls and not any(c in page_text for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
    page = parse(page_text)
    assert page.find("pre", "stderr").text() == (
        "\\x1b[31mred\\x1b[0m \\x07 back\\x08 del\\x7f csi\\x9b \\u202eevil \\u2066iso\\u2069 nul\\x00 tab\tend\n"
        "line\\x0dover"
    )
    (row,) = [r for r in rows(page) if r.attrs["data-rank"] == "3"]
    assert row.attrs["data-host"] == "node\\x1b]0;title\\x07"
    assert "printf" in page.find("header").text() and "\\x1b[2J" in page.find("header").text()


def test_the_title_names_the_cause_the_report_found() -> None:
    """The first failure's title names its Python exception (first line, shortened), else the
    signal, MPI_Abort's code or the exit status (before, issue "The front door": `exit 1` where
    the rank died of FileNotFoundError)."""
    failed = {"state": "failed", "exit_code": 1}
    cases = [
        ({"type": "FileNotFoundError", "message": "[Errno 2] No such file or directory: 'data.csv'\nmore"},
         {}, "FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'"),
        ({"type": "ValueError", "message": "x" * 300}, {}, "ValueError: " + "x" * 58 + " ... " + "x" * 35),
        ({"type": "FileNotFoundError", "message": f"[Errno 2] No such file or directory: '/{'d/' * 60}data.csv'"},
         {}, "FileNotFoundError: [Errno 2] No such file or directory: '/d/d/d/d/d/d/ ... "
         "d/d/d/d/d/d/d/d/d/d/d/d/d/data.csv'"),
        (None, {"exit_code": None, "signal": "SIGSEGV"}, "killed by SIGSEGV"),
        (None, {"abort_code": 7}, "MPI_Abort with code 7"),
        (None, {}, "exit 1"),
    ]  # fmt: skip
    for exception, fields, cause in cases:
        document = eight_ranks(r3={**failed, **fields})
        first = {**document["ranks"][3], "exception": exception}
        document.update(outcome="failed", exit_status=1, first_failure=first)
        page = parse(render(document))
        assert page.find("title").text() == f"mpilaunch: failed, rank 3: {cause} (8 ranks)"
        assert page.find("section", id="failure").find("h2").text() == f"First failure: rank 3 on node1: {cause}"
        assert page.find("tr", "failed").find("span", "mark").text().startswith("◆ failed")


def test_the_rule_that_marks_ranks_has_a_floor_and_needs_ranks() -> None:
    """reading.marks, the one rule of the page and the PNG: a value 1.5 times the median marks
    a rank only when it is also more than the floor above it (1 s of CPU against 0.5 s is no
    outlier), and only among 3 ranks or more; the failed rank is marked whatever its values."""
    from mpilaunch.picture.reading import marks, rows, span

    def marked(document: dict) -> dict[int, list[str]]:
        drawn = rows(document)
        return {drawn[i].rank: words for i, words in marks(drawn, span(document, drawn)).items()}

    little = {f"r{r}": {"cpu_seconds": 0.1} for r in range(8)}
    under_floor = eight_ranks(**{**little, "r4": {"cpu_seconds": 0.29}})
    assert marked(under_floor) == {}  # 2.9 times the median, 0.19 s above it
    over_floor = eight_ranks(**{**little, "r4": {"cpu_seconds": 0.31}})
    assert marked(over_floor) == {4: ["CPU"]}
    two = eight_ranks(r1={"peak_rss_bytes": 900 * MIB})
    two["ranks"] = two["ranks"][:2]
    assert marked(two) == {}  # two ranks have no median to stand out from
    failed = eight_ranks(r3={"state": "failed", "exit_code": 1, "ended": T0 + 25.0, "peak_rss_bytes": 900 * MIB})
    failed["first_failure"] = failed["ranks"][3]
    assert marked(failed) == {3: ["failed", "slow", "memory"]}
