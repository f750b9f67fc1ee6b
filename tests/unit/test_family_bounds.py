"""The family path's bound earned per family and batch regime (predictor.family_bounds), its held-out
evaluation (predictor.family_eval) and the traced-table neighbours' point (predictor.family_table)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from predictor import family_bounds, family_eval, family_table
from predictor import features as feats
from predictor.runtime import Predictor
from predictor.spec import JobSpec

RESNET = JobSpec("resnet", params_millions=25, batch_size=32, input_dim=224, num_layers=50, precision="amp",
                 optimizer="adam")
CNN_SMALL = JobSpec("cnn", params_millions=12, batch_size=8, input_dim=224, num_layers=50, optimizer="sgd")


def _fixed_mib(predictor: Predictor, spec: JobSpec) -> float:
    cal = predictor.metadata["memory_calibration"]
    terms = feats.decomposition(feats.columns_from_specs([spec]), float(cal["context_mib"]), float(cal["factor"]))
    return float(cal["context_mib"]) + float(cal["factor"]) * float(terms.fixed_mib[0])


def _widening(predictor: Predictor, spec: JobSpec) -> float:
    """How much the bound widens the learned term (what is not weights and optimizer state)."""
    demand = predictor.predict(spec)
    fixed = _fixed_mib(predictor, spec)
    return (demand.memory_mib_upper - fixed) / (demand.memory_mib - fixed)


def test_precise_families_get_tighter_bounds_than_uncertain_ones() -> None:
    data = family_bounds.load()
    margins = {f: v.get("any") for f, v in data["margins"].items()}
    assert margins["resnet"] < data["pooled"], "resnet errs least on held-out groups: below the pooled margin"
    assert "gpt" not in data["margins"], "4 held-out text groups earn no margin of their own"
    assert len({round(v, 3) for v in margins.values() if v is not None}) > 1


def test_margin_falls_back_from_regime_to_family_to_the_artifact(tmp_path: Path) -> None:
    path = tmp_path / "bounds.json"
    path.write_text(json.dumps({"pooled": 0.9, "margins": {"vit": {"small": 0.4, "any": 0.6}, "cnn": {"any": 0.7}}}))
    assert family_bounds.margin("vit", 8, str(path)) == 0.4
    assert family_bounds.margin("vit", 64, str(path)) == 0.6
    assert family_bounds.margin("cnn", 8, str(path)) == 0.7
    assert family_bounds.margin("gru", 8, str(path)) is None  # no margin earned: the artifact's stays
    assert family_bounds.margin("vit", 8, str(tmp_path / "absent.json")) is None
    assert family_bounds.regime(16) == "small" and family_bounds.regime(17) == "large"


def test_weighted_quantile_weighs_groups_alike() -> None:
    # 99 jobs of one group at 0 and one job of another at 1: by jobs the 60% quantile is 0, by groups 1
    values = np.asarray([0.0] * 99 + [1.0])
    groups = np.asarray(["a"] * 99 + ["b"])
    assert family_eval.weighted_quantile(values, groups, 0.6) == 1.0
    assert family_eval.weighted_quantile(values, groups, 0.4) == 0.0


def test_earned_bounds_never_read_a_jobs_own_group() -> None:
    """A group whose truth is 10x its point is not covered by the others' small residuals: its own
    residual never sets its bound (leave one group out)."""
    groups = np.asarray([g for g in "abcdef" for _ in range(5)])
    point = np.ones(30)
    truth = np.where(groups == "f", 10.0, 1.1)
    fam = np.asarray(["vit"] * 30)
    reg = np.asarray(["small"] * 30)
    bound = family_eval.earned_bounds(point, truth, fam, reg, groups, 0.95)
    assert np.all(bound[groups == "f"] < 2.0)
    assert np.all(bound[groups != "f"] >= 1.1 - 1e-9)  # the others see f's residual in theirs


def test_table_point_never_reads_the_excluded_group() -> None:
    full = family_table.point("resnet", 25.6, 50, 224, 32, "fp32", "adam")
    assert full is not None and full.memory_mib > 0
    index = family_table._index()
    own = {n for n, g in zip(index.names, index.groups.tolist(), strict=True) if g == "resnet"}
    held = family_table.point("resnet", 25.6, 50, 224, 32, "fp32", "adam", exclude_group="resnet")
    assert held is not None and not own & set(held.neighbours)
    assert family_table.point("lstm", 5, 2, 256, 32, "fp32", "adam") is None  # no traced recurrent stack
