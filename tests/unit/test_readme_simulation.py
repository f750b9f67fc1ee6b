"""The simulation figures of docs/evaluation.md are the report's (reports/simulation.json and .md).

Why: the docs state conclusions from the replay and its ablations; a regenerated report (such as
the one after the ablations were made to follow observed peaks) must not leave the docs quoting
the previous run's figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "docs" / "evaluation.md").read_text()
REPORT = json.loads((ROOT / "reports" / "simulation.json").read_text())
MARKDOWN = (ROOT / "reports" / "simulation.md").read_text()
RESULTS = README[README.index("Results (`reports/simulation.md`"):]
RESULTS_FLAT = " ".join(RESULTS.split())


def number(text: str) -> float:
    return float(text.replace(",", ""))


def table_row(first_cell: str) -> list[str]:
    """The cells of the report table row that starts with `first_cell` (the first such row)."""
    for line in MARKDOWN.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in reports/simulation.md")


def find(pattern: str) -> re.Match[str]:
    found = re.search(pattern, RESULTS_FLAT)
    assert found is not None, f"docs/evaluation.md's simulation results do not say {pattern!r}"
    return found


def test_the_ablations_follow_observed_peaks_in_the_report() -> None:
    assert REPORT["replay_memory"]["ablations_follow_usage"] is True


def test_packing_figures_are_the_reports() -> None:
    default = REPORT["packing"]["default"]
    m = find(r"DeepRes ([\d.]+) % \(([\d.]+) % at 100 %\), FGD ([\d.]+) %.*?BestFit ([\d.]+) %, Random ([\d.]+) %, "
             r"DeepRes without the fragmentation term ([\d.]+) %")
    assert number(m[1]) == default["deepres"]["alloc_ratio_130"]
    assert number(m[2]) == default["deepres"]["alloc_ratio_100"]
    assert number(m[3]) == default["fgd"]["alloc_ratio_130"]
    assert number(m[4]) == default["bestfit"]["alloc_ratio_130"]
    assert number(m[5]) == default["random"]["alloc_ratio_130"]
    assert number(m[6]) == number(table_row("DeepRes (no frag term)")[2])


def test_replay_figures_are_the_reports() -> None:
    replay = REPORT["replay_memory"]
    m = find(r"DeepRes's mean JCT is ([\d.]+) % (better|worse) than static \(([\d,]+) s vs ([\d,]+) s\)")
    gain = replay["deepres_vs_static"]["mean_jct_improvement"]
    assert (number(m[1]), m[2]) == (round(abs(100 * gain), 1), "better" if gain >= 0 else "worse")
    assert number(m[3]) == round(replay["deepres"]["mean_jct_s"])
    assert number(m[4]) == round(replay["static"]["mean_jct_s"])
    m = find(r"OOM kills (\d+) \(request sharing: ([\d.]+) % of jobs\)")
    assert number(m[1]) == number(table_row("deepres")[6])
    assert number(m[2]) == round(100 * replay["request"]["oom_rate"], 2)
    m = find(r"LS deadline misses ([\d.]+) % \(static ([\d.]+) %\)")
    assert number(m[1]) == round(100 * replay["deepres"]["deadline_miss_rate"], 1)
    assert number(m[2]) == round(100 * replay["static"]["deadline_miss_rate"], 1)
    m = find(r"preemptions (\d+)")
    assert number(m[1]) == replay["deepres"]["preemptions"]


def test_ablation_figures_are_the_reports() -> None:
    static = number(table_row("static")[2])
    for name in ("deepres-pack", "deepres-nofrag"):
        m = find(rf"`{name}`[^%]*?mean JCT ([\d,]+) s, ([\d.]+) % (better|worse) than static")
        ours = number(table_row(name)[2])
        assert number(m[1]) == ours
        gain = 1 - ours / static
        assert (number(m[2]), m[3]) == (round(abs(100 * gain), 1), "better" if gain >= 0 else "worse")
