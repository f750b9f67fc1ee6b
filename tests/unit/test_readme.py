"""The README is the front door: short, every link resolves, its figures are the reports'.

Why: the README had grown to 1,883 lines with sentences the code no longer backed; the guides live in
docs/ (a site built strictly by `make docs`), and the README's figures are rendered from reports/.
"""

from __future__ import annotations

import re
from pathlib import Path

from devtools import docsgen

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 300


def test_every_link_of_the_readme_resolves() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert links, "the README links nowhere"
    broken = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            broken.append(link)
        elif anchor and target.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            if anchor not in slugs:
                broken.append(link)
    assert not broken, f"README links that do not resolve: {broken}"


def test_the_headline_figures_are_the_reports() -> None:
    assert docsgen.render_readme(README) == README, "README's figures differ from reports/: run `deepres report docs`"
