"""Every picture the README and docs show is drawn from the input it names, as that input is now.

Why: docs/img/queueing-vs-load.png was drawn before the capacity report it illustrates; nothing noticed.
`deepres report plots` writes into each PNG what it drew from and a fingerprint of it
(devtools/plotsource.py); this recomputes the fingerprint from the tree and fails when they differ.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from devtools import plotsource

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_picture_the_docs_show_has_a_known_source() -> None:
    shown = {Path(m).name for page in PAGES for m in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text())}
    assert shown, "no pictures found in the docs (the pattern is wrong)"
    assert shown <= set(plotsource.SOURCES), f"pictures with no source rule: {shown - set(plotsource.SOURCES)}"
    assert {p.name for p in IMG.glob("*.png")} == set(plotsource.SOURCES)


@pytest.mark.parametrize("name", sorted(plotsource.SOURCES))
def test_a_plot_is_not_older_than_what_it_was_drawn_from(name: str) -> None:
    written = plotsource.png_text(IMG / name).get(plotsource.KEY)
    assert written, f"docs/img/{name} says nothing of its source: run `deepres report plots`"
    now = plotsource.SOURCES[name]()
    assert written == now, (f"docs/img/{name} was drawn from {written!r}, but that input is now {now!r}: "
                            "run `deepres report plots` and commit the pictures")


def test_a_changed_report_makes_its_plot_stale(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(ROOT / "reports", reports, ignore=shutil.ignore_patterns("*.png", "_work", ".*"))
    before = plotsource.interference_source(reports)
    text = (reports / "interference.json").read_text()
    (reports / "interference.json").write_text(text.replace('"groups": ', '"groups":  ', 1))  # same JSON
    assert plotsource.interference_source(reports) == before, "formatting alone is no change"
    doc = (reports / "interference.json").read_text().replace("leave_one_group_out", "leave_one_group_out_", 1)
    (reports / "interference.json").write_text(doc)
    assert plotsource.interference_source(reports) != before


def test_the_stamp_is_read_back_and_replaced(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    shutil.copy(IMG / "interference-model.png", png)
    plotsource.stamp(png, "first")
    plotsource.stamp(png, "second")
    assert plotsource.png_text(png)[plotsource.KEY] == "second"
    assert png.read_bytes().endswith(b"IEND\xaeB`\x82")  # still a whole PNG
