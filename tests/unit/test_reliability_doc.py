"""docs/reliability.md names a test for every scenario (as `folder/test_file.py::name`): each must exist."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def test_every_test_named_in_reliability_md_exists() -> None:
    text = (ROOT / "docs" / "reliability.md").read_text()
    named = re.findall(r"`(?:tests/)?(\w+/test_\w+\.py)::(test_\w+)", text)
    assert len(named) > 40
    missing = []
    for filename, name in named:
        path = ROOT / "tests" / filename
        if not path.exists() or not re.search(rf"^def {name}\(", path.read_text(), re.M):
            missing.append(f"{filename}::{name}")
    defined = {
        m for f in (ROOT / "tests").glob("*/test_*.py") for m in re.findall(r"^def (test_\w+)\(", f.read_text(), re.M)
    }
    missing += [name for name in re.findall(r"`(test_\w+)`", text) if name not in defined]  # named without a file
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"
