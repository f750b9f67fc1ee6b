"""`deepres evaluate` end to end on a small synthetic frame: the report's keys (other tools read them),
the grouped split's promise (no architecture on both sides) and the resumable cache."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from extender.cli import main
from predictor.baselines import BASELINES
from tests.unit._predictor_frames import synthetic_jobs

MODELS = ("transformer_bigru_paper", "transformer_bigru_tuned", "lightgbm")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("evaluate")
    frame = synthetic_jobs(240, seed=1)
    # architecture groups of 4 rows each and a family column distinct from model_type
    frame["group"] = [f"arch{i // 4}" for i in range(len(frame))]
    frame["family"] = frame["model_type"].map(lambda f: "vision" if f in ("cnn", "resnet", "vit") else f)
    frame.to_csv(root / "jobs.csv", index=False)
    args = ["evaluate", "--data", str(root / "jobs.csv"), "--out", str(root / "rep"), "--models", ",".join(MODELS),
            "--family-models", "transformer_bigru_tuned", "--epochs-scale", "0.02", "--fold-epochs-scale", "0.02",
            "--no-tune", "--no-runtime", "--exact-runs", "0"]
    assert main(args) == 0
    return root / "rep", " ".join(args)


def test_report_has_the_issue_keys(evaluated: tuple[Path, str]) -> None:
    report = json.loads((evaluated[0] / "predictor.json").read_text())
    assert set(report["splits"]) == {"grouped", "leave_family_out", "random"}
    for model in MODELS:
        memory = report["splits"]["grouped"]["memory"][model]
        for key in ("median_abs_rel_err", "p90_abs_rel_err", "under_rate", "over_reservation", "rmse"):
            assert isinstance(memory[key], float), (model, key)
        assert 0.0 <= memory["under_rate"] <= 1.0 and memory["p90_abs_rel_err"] >= memory["median_abs_rel_err"]
        assert "rmse" in report["splits"]["random"]["memory"][model]
    assert set(report["splits"]["leave_family_out"]["memory"]) == {"transformer_bigru_tuned"}
    # the coverage trade-off: the same fits recalibrated; the run's own coverage gives the reported figures
    for split in ("grouped", "leave_family_out"):
        curve = report["splits"][split]["coverage_curve"]["transformer_bigru_tuned"]
        assert [c["coverage"] for c in curve] == [0.90, 0.95, 0.97] == sorted({0.90, 0.95, 0.97})
        unders, overs = [c["under_rate"] for c in curve], [c["over_reservation"] for c in curve]
        assert unders == sorted(unders, reverse=True) and overs == sorted(overs)
        at_run = next(c for c in curve if c["coverage"] == report["upper_coverage"])
        memory = report["splits"][split]["memory"]["transformer_bigru_tuned"]
        assert at_run["under_rate"] == pytest.approx(memory["under_rate"], abs=1e-6)
        assert at_run["over_reservation"] == pytest.approx(memory["over_reservation"], abs=1e-5)
    # leave-family-out folds follow the `family` column, not model_type
    assert "vision" in report["splits"]["leave_family_out"]["memory_by_family"]
    assert set(report["exact"]) >= {"median_abs_rel_err", "under_rate"}
    assert set(report["runtime"]) >= {"imports_torch", "p99_ms"}
    text = (evaluated[0] / "predictor.md").read_text()
    assert text.index("grouped split") < text.index("Random split")
    for png in ("predictor-metrics.png", "predictor-pred-vs-actual.png", "predictor-coverage.png"):
        assert (evaluated[0] / png).stat().st_size > 1000


def test_second_run_reuses_every_fit(evaluated: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    first = json.loads((evaluated[0] / "predictor.json").read_text())
    capsys.readouterr()
    assert main(evaluated[1].split()) == 0
    out = capsys.readouterr().out
    fits = [line for line in out.splitlines() if line.startswith("[")]
    assert fits and all("(cached)" in line for line in fits)
    assert json.loads((evaluated[0] / "predictor.json").read_text())["splits"] == first["splits"]


def test_unknown_model_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pd.DataFrame().to_csv(tmp_path / "empty.csv")
    assert main(["evaluate", "--data", str(tmp_path / "empty.csv"), "--models", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert len(BASELINES) == 7


def test_exact_path_on_held_out_measured_runs(tmp_path: Path) -> None:
    """A few of the public MLP runs the calibration held out: traced exactly, the exact path's memory
    is within a few percent of nvidia-smi's and its bound covers them (the issue's exact targets)."""
    from predictor.evaluate import exact_heldout

    figures = exact_heldout(tmp_path, 8)
    mlp = figures["mlp"]
    assert mlp["n"] == 8
    assert mlp["median_abs_rel_err"] < 0.06 and mlp["under_rate"] <= 0.125
    assert (tmp_path / "exact-heldout-8-0.json").exists()  # traced peaks cached for the next run
    assert exact_heldout(tmp_path, 8) == figures


def test_exact_figures_pool_the_real_gpu_campaign_with_the_mlp_runs(tmp_path: Path) -> None:
    """Every measured campaign row the exact table can answer is counted, on its own and in the
    headline: the headline is not the MLP runs' alone once real measurements exist."""
    import csv

    from predictor import exact
    from predictor.dataset.campaign import MEASURED_DIR
    from predictor.evaluate import exact_heldout

    tables = sorted(MEASURED_DIR.glob("*.csv"))
    assert tables, "the campaign's measured table is in the repo"
    known = set(exact.names())
    with tables[0].open(newline="") as handle:
        answerable = sum(1 for row in csv.DictReader(handle) if row["status"] == "ok" and row["name"] in known)
    figures = exact_heldout(tmp_path, 4)
    campaign = figures[f"campaign_{tables[0].stem}"]
    assert campaign["all_rows"]["n"] == answerable > 300
    assert 0.2 * answerable < campaign["n"] < 0.45 * answerable  # the held-out groups' rows alone
    assert figures["n"] == 4 + sum(figures[k]["n"] for k in figures if k.startswith("campaign_"))
    assert 0.0 <= campaign["under_rate"] <= 1.0


def test_the_hindsight_bound_is_the_test_jobs_own_quantile(tmp_path: Path, evaluated: tuple[Path, str]) -> None:
    """By hand: points that under-estimate job k of 100 by exp(k / 100) need the margin of the 95th
    smallest error (0.94: the tightest margin leaving at most 5% under), which leaves 5 jobs under and
    reserves mean(exp(0.94 - k/100)) - 1."""
    import numpy as np

    from predictor.evaluate import Predictions, hindsight_bound
    from predictor.trainset import load_dataset

    data = load_dataset(evaluated[0].parent / "jobs.csv")
    rows = np.arange(100, dtype=np.int64)
    truth = data.y[rows, 0]
    k = np.arange(100)
    preds = Predictions()
    preds.add(rows, np.column_stack([truth / np.exp(k / 100), truth]), truth)
    figures = hindsight_bound(data, preds, 0.95)
    assert figures["margin"] == pytest.approx(0.94)
    assert figures["under_rate"] == pytest.approx(0.05)
    assert figures["over_reservation"] == pytest.approx(float(np.mean(np.exp(0.94 - k / 100)) - 1), abs=1e-5)
    report = json.loads((evaluated[0] / "predictor.json").read_text())
    assert set(report["splits"]["grouped"]["hindsight_bound"]["transformer_bigru_tuned"]) == {
        "coverage", "margin", "under_rate", "over_reservation"}
