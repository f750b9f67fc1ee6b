"""The compute-aware replay paragraph of docs/evaluation.md is the report's (reports/simulation.json "replay"),
rendered by `compute.readme_section`; a regenerated report must not leave the docs quoting old figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extender.simulate.compute import readme_section

ROOT = Path(__file__).resolve().parents[2]
REPORT = json.loads((ROOT / "reports" / "simulation.json").read_text(encoding="utf-8"))
README = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")


@pytest.mark.skipif("model" not in REPORT.get("replay", {}), reason="the compute replay has not been run")
def test_readme_quotes_the_compute_replay_of_the_report() -> None:
    section = readme_section(REPORT["replay"])
    assert section in README, "docs/evaluation.md's compute-aware replay paragraph differs from the report: rerun " \
                              "`deepres simulate --experiment compute` and paste what it prints"
    assert f"{REPORT['replay']['seeds']} seeds" in section
