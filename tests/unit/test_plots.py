"""`deepres report plots` draws from the reports: the capacity rows when the report has them (per rate and
policy), the compute sweep otherwise, and the interference groups; a missing report is a skip with why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is the train extra")

from devtools import plots

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG"


def test_capacity_rows_give_one_series_per_policy(tmp_path: Path) -> None:
    rows = [{"arrival_rate_per_h": r, "policy": p, "p95_queue_s": q, "mean_queue_s": q / 2,
             "mean_bounded_slowdown": b} for r, p, q, b in
            [(2, "static", 60, 1.5), (1, "static", 10, 1.1), (1, "deepres", 5, 1.0), (2, "deepres", 20, 1.2)]]
    series, queue, slowdown = plots.capacity_series({"rows": rows})
    assert (queue, slowdown) == ("p95_queue_s", "mean_bounded_slowdown")
    assert series == {"static": [(1.0, 10.0, 1.1), (2.0, 60.0, 1.5)], "deepres": [(1.0, 5.0, 1.0), (2.0, 20.0, 1.2)]}
    note = plots.plot_load(tmp_path / "load.png", {"capacity": rows})
    assert "capacity" in note and (tmp_path / "load.png").read_bytes().startswith(PNG)


def test_rows_without_a_slowdown_column_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="slowdown"):
        plots.capacity_series([{"rate": 1, "policy": "static", "p95_queue_s": 3}])


def test_the_shipped_reports_draw(tmp_path: Path) -> None:
    simulation = json.loads((ROOT / "reports" / "simulation.json").read_text())
    plots.plot_load(tmp_path / "load.png", simulation)
    interference = json.loads((ROOT / "reports" / "interference.json").read_text())
    plots.plot_interference(tmp_path / "interference.png", interference)
    assert (tmp_path / "load.png").read_bytes().startswith(PNG)
    assert (tmp_path / "interference.png").read_bytes().startswith(PNG)


def test_a_missing_report_is_skipped_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "memory_points", lambda: {})  # the measured rows are not what this test is about
    drawn = plots.draw_all(reports=tmp_path / "none", img=tmp_path / "img")
    assert drawn["queueing-vs-load.png"].startswith("skipped") and "simulation.json" in drawn["queueing-vs-load.png"]
