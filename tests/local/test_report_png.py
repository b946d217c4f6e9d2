"""The report's PNG (`mpilaunch report RUN.json -o X.png`), drawn by matplotlib where it is
installed (the `report` extra): any document draws, and it marks what the page marks. Here,
not in tests/unit: matplotlib starts a process (its font cache) when first imported."""

from __future__ import annotations

import pytest

from mpilaunch.picture.page import render
from tests.pagedom import parse
from tests.unit.test_report_page import MIB, T0, eight_ranks, restarted_run, rows


def test_the_png_of_any_document() -> None:
    """The PNG timeline (where matplotlib is installed) of the documents above and of an empty one."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'mpilaunch[report]')")
    from mpilaunch.picture.chart import png
    from tests.pagedom import png_size

    odd_text = eight_ranks(r1={"host": "$\\frac{"}, r2={"state": "planned", "started": None, "ended": None})
    odd_text["outcome"] = "$x^$ \udcff"  # matplotlib's math notation, and a byte that was not UTF-8
    for document in (restarted_run(), odd_text, {}):
        assert png_size(png(document))[0] == 1200


def test_the_png_marks_what_the_page_marks() -> None:
    """One rule marks ranks in both drawings: the failed rank and the ranks that stand out in
    time, CPU or memory, each with its words; the title names the cause (before: the PNG marked
    only the failed rank, the page only the slow one)."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'mpilaunch[report]')")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from mpilaunch.picture.chart import BAR, ODD_BAR, draw

    document = eight_ranks(
        r5={"ended": T0 + 25.0}, r2={"peak_rss_bytes": 900 * MIB}, r6={"cpu_seconds": 9.0},
        r3={"state": "failed", "exit_code": 1},
    )  # fmt: skip
    document.update(outcome="failed", exit_status=1, first_failure={
        **document["ranks"][3], "exception": {"type": "KeyError", "message": "'lr'"}})  # fmt: skip
    figure = draw(document)
    try:
        times, cpu, rss = figure.axes[:3]
        page = parse(render(document))
        title = "mpilaunch: failed, rank 3: KeyError: 'lr' (8 ranks)"
        assert times.get_title(loc="left") == page.find("title").text() == title  # one title, both drawings
        drawn = {label.get_text() for label in times.get_yticklabels() if "◆" in label.get_text()}
        on_page = {
            f"{r.attrs['data-host']}: rank {r.attrs['data-rank']} {r.find('span', 'mark').text()}"
            for r in rows(page)
            if r.find_all("span", "mark")
        }
        assert drawn == on_page == {
            "node1: rank 2 ◆ memory", "node1: rank 3 ◆ failed", "node2: rank 5 ◆ slow", "node2: rank 6 ◆ CPU"
        }  # fmt: skip
        legend = page.find("p", "marks").text()
        assert [t.get_text() for t in figure.texts] == [legend] and "among 3 ranks or more" in legend  # the rule
        colours = [[to_hex(bar.get_facecolor()) for bar in axes.patches] for axes in (cpu, rss)]
        assert colours == [
            [ODD_BAR if i == 6 else BAR for i in range(8)],
            [ODD_BAR if i == 2 else BAR for i in range(8)],
        ]
    finally:
        plt.close(figure)
    plain = draw(eight_ranks())
    assert plain.texts == [] and not any("◆" in t.get_text() for t in plain.axes[0].get_yticklabels())  # no mark
    plt.close(plain)
