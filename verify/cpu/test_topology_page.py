"""`repro topology --predict PROFILE -o DIR` writes the page and figure docs/TOPOLOGY.md carries: every table
row of the two boxes' pages (the prediction and the observed figures beside it) is in the doc as generated."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.cli import main

DOC = Path(__file__).parents[2] / "docs" / "TOPOLOGY.md"


@pytest.mark.parametrize("profile", ["k26-pro6000-tp8", "k26-b300-tp8"])
def test_doc_tables_are_the_generated_page(profile: str, tmp_path: Path, capsys) -> None:
    """The page's table rows (predictions and comparisons) appear verbatim in docs/TOPOLOGY.md; a PNG is written."""
    assert main(["topology", "--predict", profile, "-o", str(tmp_path)]) == 0
    page = (tmp_path / f"{profile}.md").read_text()
    assert (tmp_path / f"{profile}.png").read_bytes().startswith(b"\x89PNG")
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    assert any("reported run" in r or "InferenceX" in r for r in rows), "no observed figure beside the model"
    doc = DOC.read_text().splitlines()
    missing = [r for r in rows if r not in doc]
    assert not missing, f"docs/TOPOLOGY.md lacks {len(missing)} rows of {profile}'s page, e.g. {missing[0]}"
