"""Every link between the docs lands: the file exists and, for `file.md#anchor`, a heading of
that file makes that anchor (GitHub's rule: lower case, punctuation but `-` and `_` dropped,
spaces to `-`). A guide rewritten by task must not leave links to headings that went."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]*\.md)?(#[^)\s]+)?\)")


def anchors(path: Path) -> set[str]:
    made = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            made.add("#" + re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return made


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_lands(page: Path) -> None:
    broken = []
    for target, anchor in LINK.findall(page.read_text()):
        if target.startswith(("http:", "https:")):
            continue
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{target}{anchor}: no such file")
        elif anchor and anchor not in anchors(path):
            broken.append(f"{target}{anchor}: no such heading")
    assert not broken, broken


def test_the_map_of_the_code_stays_short() -> None:
    """architecture.md is a map a newcomer reads whole (issue "House III": at most 500 lines);
    detail belongs in the docstrings it points to."""
    assert len((ROOT / "docs" / "architecture.md").read_text().splitlines()) <= 500
