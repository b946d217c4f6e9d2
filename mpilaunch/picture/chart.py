"""The run's timeline as a PNG (`mpilaunch report RUN.json -o report.png`), drawn with matplotlib
(the `report` extra), which is imported only here: one horizontal bar per rank, from its start
to its end, coloured by outcome, grouped by host, beside its CPU seconds and peak memory."""

from __future__ import annotations

import io
import warnings

from mpilaunch.picture.reading import (
    OUTCOMES,
    STANDS_OUT,
    label,
    mapping,
    mark_text,
    marks,
    number,
    rows,
    span,
    title,
)

BAR, ODD_BAR = "#7da7d9", "#e0542b"  # as the page's meters
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def plain(words: str) -> str:
    """Text matplotlib draws as it is: a `$` would start its math notation."""
    return words.replace("$", r"\$")


def png(document: Mapping) -> bytes:
    """The picture's bytes; ImportError when matplotlib is not installed."""
    import matplotlib.pyplot as plt

    with warnings.catch_warnings():  # a glyph no font has, a crowded layout: the picture is still drawn
        warnings.simplefilter("ignore")
        figure = draw(document)
        out = io.BytesIO()
        figure.savefig(out, format="png", dpi=100)
    plt.close(figure)
    return out.getvalue()


def draw(document: Mapping):  # type: ignore[no-untyped-def]
    """The matplotlib figure (closed by the caller)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is all that is drawn
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    drawn = rows(document)
    window = span(document, drawn) or (0.0, 1.0)
    start, end = window
    several = len({r.job for r in drawn}) > 1
    marked = marks(drawn, window)
    height = max(2.5, 0.9 + 0.24 * len(drawn))
    figure, (times, cpu, rss) = plt.subplots(
        1, 3, figsize=(12, height), sharey=True, gridspec_kw={"width_ratios": [6, 1.3, 1.3]}
    )
    names = []
    for y, row in enumerate(drawn):
        mark = f" {mark_text(marked[y])}" if y in marked else ""
        names.append(plain(f"{row.host}: {label(row, several)}{mark}"))
        colour = OUTCOMES[row.outcome][1]
        if row.started is not None:
            stop = row.ended if row.ended is not None else end
            times.barh(y, max(stop - row.started, (end - start) / 500), left=row.started - start, color=colour)
        said = marked.get(y, [])  # the page's odd cells: a CPU or memory that stands out
        cpu.barh(y, row.cpu or 0.0, color=ODD_BAR if "CPU" in said else BAR)
        rss.barh(y, (row.rss or 0.0) / (1 << 20), color=ODD_BAR if "memory" in said else BAR)
    for y in range(1, len(drawn)):  # a line between hosts
        if (drawn[y].attempt, drawn[y].host) != (drawn[y - 1].attempt, drawn[y - 1].host):
            for axes in (times, cpu, rss):
                axes.axhline(y - 0.5, color="#999", linewidth=0.8)
    times.set_yticks(range(len(drawn)))
    times.set_yticklabels(names, fontsize=8)
    for y in marked:
        times.get_yticklabels()[y].set_color(OUTCOMES["failed"][1])
    times.invert_yaxis()
    times.set_xlim(0, max(end - start, 1e-3))
    times.set_xlabel("seconds from the start")
    cpu.set_xlabel("CPU seconds")
    rss.set_xlabel("peak memory (MiB)")
    times.set_title(plain(title(document, len(drawn))), loc="left")
    present = [name for name in OUTCOMES if any(r.outcome == name for r in drawn)]
    if present:
        handles = [Patch(color=OUTCOMES[name][1], label=OUTCOMES[name][0]) for name in present]
        times.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(handles), fontsize=8,
                     frameon=False)  # fmt: skip
    failed_at = number(mapping(document.get("first_failure")).get("ended"))
    if failed_at is not None:
        times.axvline(failed_at - start, color=OUTCOMES["failed"][1], linestyle="--", linewidth=0.8)
    if marked:  # what the marks mean, under the picture, as the page's legend says it
        figure.text(0.01, 0.01, plain(STANDS_OUT), fontsize=7, color="#555", ha="left", va="bottom", wrap=True)
        figure.tight_layout(rect=(0, 0.3 / height, 1, 1))
    else:
        figure.tight_layout()
    return figure
