"""The trainer's dataset reading, grouped calibration and the bound's conformal margins."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from predictor.metrics import conformal_quantile
from predictor.splits import grouped_split
from predictor.train import (
    ALL_FAMILIES,
    LEVEL_GRID,
    FittedModel,
    calibrate,
    conformal_plan,
    fit_model,
    set_margins,
)
from predictor.trainset import load_dataset
from tests.unit._predictor_frames import synthetic_jobs


def _frame_with_groups(tmp_path: Path, n: int = 240) -> Path:
    frame = synthetic_jobs(n, seed=2)
    frame["group"] = [f"arch{i // 3}" for i in range(len(frame))]
    frame["family"] = frame["model_type"]
    path = tmp_path / "jobs.csv.gz"
    frame.to_csv(path, index=False)
    return path


def test_group_and_family_columns_and_a_seeded_subset(tmp_path: Path) -> None:
    path = _frame_with_groups(tmp_path)
    data = load_dataset(path)
    assert data.n_rows == 239  # one row has status error
    assert data.groups[0] == "arch0" and len(set(data.groups.tolist())) == 80
    sub = load_dataset(path, max_rows=100, seed=0)
    assert sub.n_rows == 100 and sub.sha256 != data.sha256
    assert load_dataset(path, max_rows=100, seed=0).sha256 == sub.sha256
    assert not np.array_equal(load_dataset(path, max_rows=100, seed=1).y, sub.y)


def test_calibration_fold_is_whole_groups_and_margins_are_conformal_at_the_tuned_level(tmp_path: Path) -> None:
    data = load_dataset(_frame_with_groups(tmp_path, 600))
    split = grouped_split(data.groups, 0.3, 0)
    model = fit_model("decision_tree", data, split, seed=0)
    assert set(model.ranges) == set(data.families[split.train].tolist())
    # by hand: a model that predicts a learned density of 1 everywhere needs a margin of the log of the
    # true density there (the margin widens the learned term, in the decomposition's units), at the
    # nominal level the nested folds chose, over its family's jobs if it has its own margin, else all
    fam = str(data.families[0])

    class One:
        def predict(self, x: np.ndarray) -> np.ndarray:
            return np.full((len(x), 2), 1.0)

    rows = np.arange(data.n_rows, dtype=np.int64)
    one = FittedModel("one", [One()], "physics")
    calibrate(one, data, rows, 0.9)
    assert one.level in LEVEL_GRID
    scores = np.log(data.physics_t[:, 0])
    mask = data.families == fam if fam in one.family_shifts else np.ones(data.n_rows, dtype=bool)
    expected = np.sort(scores[mask])[math.ceil((mask.sum() + 1) * one.level) - 1]
    assert one.family_shifts.get(fam, one.memory_shift) == pytest.approx(expected)
    # and the served bound covers that share of the family's real peaks
    _, upper = one.predict(data, rows[mask])
    assert np.mean(upper >= data.y[mask, 0] * (1 - 1e-9)) >= 0.9


def test_the_tuned_level_covers_jobs_of_unseen_groups_where_a_job_quantile_does_not() -> None:
    """Jobs of one architecture err together (a group effect): the split-conformal quantile over jobs
    treats 30 groups of 20 jobs as 600 draws and under-covers the jobs of a new group. The level
    tuned on nested folds of whole groups covers them at the stated rate, on average over 60 draws."""
    coverage, plain, tuned, nested = 0.9, [], [], []
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n_groups, size = 30, 20
        groups = np.repeat([f"g{i}" for i in range(n_groups)], size)
        scores = np.repeat(rng.normal(0.0, 0.5, n_groups), size) + rng.normal(0.0, 0.05, n_groups * size)
        fresh = rng.normal(0.0, 0.5, 2000) + rng.normal(0.0, 0.05, 2000)  # jobs of 2000 new groups
        plan = conformal_plan(scores, groups, np.full(len(scores), ALL_FAMILIES), coverage)
        plain.append(np.mean(fresh <= conformal_quantile(scores, coverage)))
        tuned.append(np.mean(fresh <= plan.pooled))
        nested.append(plan.nested_under)
        assert plan.level > coverage - 0.05 and plan.nested_under <= 1 - coverage
    assert np.mean(plain) < 0.89  # the job quantile falls short of the stated 90%
    assert np.mean(tuned) >= 0.89
    assert max(nested) <= 1 - coverage


def test_fewer_groups_than_nested_folds_keep_the_stated_level() -> None:
    scores = np.linspace(-1.0, 1.0, 40)
    plan = conformal_plan(scores, np.repeat(["a", "b", "c"], [10, 10, 20]), np.full(40, ALL_FAMILIES), 0.9)
    assert plan.level == 0.9 and plan.pooled == pytest.approx(np.sort(scores)[math.ceil(41 * 0.9) - 1])


def test_the_decomposition_gives_back_the_labels(tmp_path: Path) -> None:
    data = load_dataset(_frame_with_groups(tmp_path, 120))
    memory = data.terms.memory(data.physics_t[:, 0])
    # exact wherever the label is above the fixed bytes (the floor keeps a positive activation term)
    context_mib, factor = data.terms.calibration
    above = (data.y[:, 0] - context_mib) / factor > data.terms.fixed_mib * 1.02
    assert above.sum() > 20
    np.testing.assert_allclose(memory[above], data.y[above, 0], rtol=1e-9)
    np.testing.assert_allclose(data.terms.flops(data.physics_t[:, 1]), data.y[:, 1], rtol=1e-9)


def test_the_bound_keeps_the_base_that_reserves_less(tmp_path: Path) -> None:
    data = load_dataset(_frame_with_groups(tmp_path, 300))
    rows = np.arange(data.n_rows, dtype=np.int64)
    truth = data.physics_t[:, 0]
    rng = np.random.default_rng(0)
    point = truth * np.exp(rng.normal(0.0, 0.05, len(truth)))  # a good point prediction
    wild = truth * np.exp(rng.normal(0.5, 1.0, len(truth)))  # a quantile head all over the place
    model = FittedModel("m", [], "physics")
    set_margins(model, data, rows, point, wild, 0.9)
    assert model.bound_source == "point"
    margins = np.asarray([model.family_shifts.get(str(f), model.memory_shift) for f in data.families])
    assert np.mean(point * np.exp(margins) >= truth) >= 0.88
    tight = truth * 1.02
    set_margins(model, data, rows, point, tight, 0.9)
    assert model.bound_source == "quantile"


def test_margins_cover_held_out_rows_at_the_stated_rate_with_heteroscedastic_errors(tmp_path: Path) -> None:
    """Split conformal on a synthetic set whose families err by very different amounts: margins per
    family reserve less than one for all (the nested folds pick them), every family's bound covers
    the stated share of fresh jobs drawn the same way (not only of the calibration rows), a quiet
    family gets a smaller margin than a noisy one, and out-of-range rows (huge errors) do not set
    the margins of the in-range jobs."""
    data = load_dataset(_frame_with_groups(tmp_path, 3000))
    rows = np.arange(data.n_rows, dtype=np.int64)
    truth = data.physics_t[:, 0]
    families = data.families.astype(str)
    names = sorted(set(families.tolist()))
    sigma = np.asarray([0.05 + 0.6 * names.index(f) / (len(names) - 1) for f in families])  # 0.05 .. 0.65

    def draw(seed: int) -> np.ndarray:
        return truth * np.exp(-np.random.default_rng(seed).normal(0.0, sigma))  # log(truth/point) ~ N(0, sigma)

    point = draw(1)
    out = np.random.default_rng(2).random(len(rows)) < 0.15
    point[out] = truth[out] * np.exp(-8.0)  # the fit never saw these: 3000x under
    coverage = 0.9
    model = FittedModel("m", [], "physics")
    set_margins(model, data, rows, point, None, coverage, in_range=~out)
    assert model.coverage == coverage and model.bound_source == "point"
    quiet, noisy = names[0], names[-1]
    assert model.family_shifts[quiet] < 0.2 < 0.5 < model.family_shifts[noisy]
    assert model.memory_shift < 2.0  # pooled with the out-of-range rows it would be 8
    # a family never trained on is like the out-of-range rows: its margin is over all of them
    assert model.unseen_shift is not None and model.unseen_shift > 7.0
    fresh = draw(3)
    for family in names:
        m = families == family
        shift = model.family_shifts.get(family, model.memory_shift)
        assert np.mean(fresh[m] * np.exp(shift) >= truth[m]) >= coverage - 0.07, family
    margins = np.asarray([model.family_shifts.get(f, model.memory_shift) for f in families])
    assert np.mean(fresh * np.exp(margins) >= truth) >= coverage - 0.02
    # the same rows without the in-range mark: the out-of-range rows' errors dominate the margins
    pooled = FittedModel("m", [], "physics")
    set_margins(pooled, data, rows, point, None, coverage)
    served = np.asarray([pooled.family_shifts.get(f, pooled.memory_shift) for f in families])
    assert np.mean(served) > 3.0 * np.mean(margins) and max(served) > 7.0


def test_the_tuned_model_is_the_median_of_the_network_lightgbm_and_adaboost(tmp_path: Path) -> None:
    """The shipped recipe's point is, per job and target, the middle one of the tuned network, a LightGBM
    booster and an AdaBoost regressor, each fitted on its own on the same rows (rebuilt here from the
    learners themselves)."""
    from predictor.baselines import BaselineRegressor
    from predictor.model import TransformerBiGRURegressor, tuned_config

    data = load_dataset(_frame_with_groups(tmp_path, 120))
    split = grouped_split(data.groups, 0.3, 0)
    model = fit_model("transformer_bigru_tuned", data, split, seed=0, epochs_scale=2 / 120, cv_folds=1)
    fit_rows = np.setdiff1d(split.train, model.held_out[0]) if model.held_out is not None else split.train
    network = TransformerBiGRURegressor(tuned_config(), data.physics_x.categorical, 0,
                                        epochs=max(1, round(tuned_config().epochs * 2 / 120)))
    network.fit(data.fit_x(fit_rows), data.fit_t(fit_rows))
    members = [network] + [BaselineRegressor(name, settings, 0).fit(data.fit_x(fit_rows), data.fit_t(fit_rows))
                           for name, settings in (("lightgbm", {"num_leaves": 15}), ("adaboost", {"max_depth": 8}))]
    x = data.physics_x.values[split.test]
    expected = np.sort(np.stack([m.predict(x) for m in members]), axis=0)[1]
    points, quantile = model.raw_both(x, data.families[split.test])
    assert quantile is None and model.bound_source == "point"
    low = np.asarray([model.target_ranges[f][0] for f in data.families[split.test]])
    high = np.asarray([model.target_ranges[f][1] for f in data.families[split.test]])
    np.testing.assert_allclose(points, np.clip(expected, low, high), rtol=1e-5)
    assert not np.allclose(points, np.clip(network.predict(x), low, high), rtol=1e-3)  # not the network alone
