"""The family path's point correction (predictor.family_point), how the held-out evaluation fits it
(predictor.family_eval.stacked) and what the served Demand does with it and the earned bound."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np

from predictor import family_bounds, family_eval, family_point
from predictor import features as feats
from predictor.runtime import Predictor
from predictor.spec import JobSpec


def _rows(n_groups: int, per: int, family: str, lean: float, rng: np.random.Generator) -> tuple[list[list[float]],
                                                                                               list[float], list[str]]:
    X, y, g = [], [], []
    for k in range(n_groups):
        params = float(rng.uniform(5, 300))
        for _ in range(per):
            batch = float(rng.choice([8, 32, 64]))
            X.append(family_point.design(family, params, 50, 224, batch, "fp32", "adam", 10_000.0, None))
            y.append(lean + float(rng.normal(0, 0.05)))
            g.append(f"{family}{k}")
    return X, y, g


def test_a_familys_lean_is_learned_and_the_correction_is_capped() -> None:
    rng = np.random.default_rng(0)
    a = _rows(12, 10, "cnn", 0.3, rng)
    b = _rows(12, 10, "vit", -0.2, rng)
    X = np.asarray(a[0] + b[0])
    y = np.asarray(a[1] + b[1])
    g = np.asarray(a[2] + b[2])
    model = family_point.fit(X, y, g, 0.3)
    cnn = family_point.design("cnn", 50, 50, 224, 32, "fp32", "adam", 10_000.0, None)
    vit = family_point.design("vit", 50, 50, 224, 32, "fp32", "adam", 10_000.0, None)
    got = family_point.predict(model, np.asarray([cnn, vit]))
    assert abs(got[0] - 0.3) < 0.08 and abs(got[1] + 0.2) < 0.08, got
    wild = family_point.fit(X, y * 10, g, 0.3)  # a lean of e^3: the correction stops at x2
    assert family_point.predict(wild, np.asarray([cnn]))[0] == math.log(2.0)


def test_the_held_out_correction_never_reads_its_own_group() -> None:
    """A group 2x above its point is not corrected by its own residual (the others lean 0)."""
    rng = np.random.default_rng(1)
    X, y, g = _rows(10, 8, "cnn", 0.0, rng)
    ya = np.asarray(y)
    ga = np.asarray(g)
    ya[ga == "cnn3"] = math.log(2.0)
    out = family_eval.stacked(np.asarray(X), ya, ga, np.asarray(X), ga)
    assert np.all(np.abs(out[ga == "cnn3"]) < 0.2), out[ga == "cnn3"]


def _widening(predictor: Predictor, spec: JobSpec) -> float:
    """How much the served bound widens the learned term (what is not weights and optimizer state)."""
    cal = predictor.metadata["memory_calibration"]
    terms = feats.decomposition(feats.columns_from_specs([spec]), float(cal["context_mib"]), float(cal["factor"]))
    fixed = float(cal["context_mib"]) + float(cal["factor"]) * float(terms.fixed_mib[0])
    demand = predictor.predict(spec)
    return (demand.memory_mib_upper - fixed) / (demand.memory_mib - fixed)


def test_the_served_bound_is_earned_per_family_and_regime() -> None:
    predictor = Predictor.load()
    resnet = JobSpec("resnet", params_millions=25, batch_size=32, input_dim=224, num_layers=50, optimizer="sgd")
    cnn = JobSpec("cnn", params_millions=25, batch_size=32, input_dim=224, num_layers=50, optimizer="sgd")
    gpt = JobSpec("gpt", params_millions=124, batch_size=8, input_dim=512, num_layers=12, optimizer="adamw")
    earned = family_bounds.load()["margins"]
    assert earned["resnet"]["large"] < earned["cnn"]["large"]
    # a precise family gets a tighter bound than an uncertain one, on the same sizes
    assert _widening(predictor, resnet) < _widening(predictor, cnn)
    # a family without an earned margin (too few held-out groups) keeps the artifact's one margin
    assert "gpt" not in earned
    artifact = math.exp(float(predictor.metadata["memory_upper_without_shapes"]["shift"]))
    assert math.isclose(_widening(predictor, gpt), artifact, rel_tol=1e-3)
    # a named architecture never takes the family path's correction or margin
    named = JobSpec("resnet", params_millions=25, batch_size=32, input_dim=224, num_layers=50, optimizer="sgd",
                    model="timm/resnet50")
    assert predictor.predict(named).model_version.endswith("+exact")


def test_earned_margins_belong_to_the_shipped_artifact_or_travel_with_another(tmp_path: Path) -> None:
    """Another artifact directory (a retrained or a test's model) keeps its own margins unless a
    family_bounds.json lies beside its weights."""
    from predictor.runtime import DEFAULT_ARTIFACT

    copy = tmp_path / "art"
    shutil.copytree(DEFAULT_ARTIFACT, copy)
    spec = JobSpec("cnn", params_millions=15, batch_size=64, input_dim=224, num_layers=5, precision="amp",
                   optimizer="sgd")
    shipped = Predictor.load(cache_size=0).predict(spec)
    other = Predictor.load(copy, cache_size=0)
    assert other.family_bounds_path is None
    own = other.predict(spec)
    assert own.memory_mib == shipped.memory_mib and own.memory_mib_upper < shipped.memory_mib_upper
    shutil.copy(family_bounds.BOUNDS_PATH, copy / "family_bounds.json")
    assert Predictor.load(copy, cache_size=0).predict(spec).memory_mib_upper == shipped.memory_mib_upper
