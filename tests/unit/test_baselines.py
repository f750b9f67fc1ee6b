"""Baselines: every learner fits, predicts positive values in the targets' units, and is tuned on
a calibration fold by the grid it documents."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.baselines import BASELINES, GRIDS, BaselineRegressor, tune

# fewer trees than the evaluation uses: the test checks the wiring, not the tuning
SMALL = {"random_forest": {"n_estimators": 30, "n_jobs": 1}, "extra_trees": {"n_estimators": 30, "n_jobs": 1},
         "adaboost": {"n_estimators": 30}, "xgboost": {"n_estimators": 100, "n_jobs": 1},
         "lightgbm": {"n_estimators": 100, "n_jobs": 1}, "catboost": {"iterations": 100, "thread_count": 1}}


def _data(n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, (n, 3))
    return x, np.column_stack([np.exp(x[:, 0] * 0.5), 1.0 + x[:, 1]])


@pytest.mark.parametrize("name", BASELINES)
def test_each_baseline_learns_the_trend(name: str) -> None:
    x, y = _data()
    est = BaselineRegressor(name, GRIDS[name][0] | SMALL.get(name, {}), random_state=0).fit(x, y)
    pred = est.predict(x)
    assert pred.shape == y.shape and (pred > 0).all()
    # far better than predicting the mean (in log space)
    assert np.mean(np.log(pred / y) ** 2) < 0.25 * np.mean(np.log(y.mean(axis=0) / y) ** 2)


def test_unknown_and_unfitted_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown baseline"):
        BaselineRegressor("svm").fit(np.zeros((3, 1)), np.ones(3))
    with pytest.raises(RuntimeError, match="not fitted"):
        BaselineRegressor("decision_tree").predict(np.zeros((1, 1)))


def test_tune_picks_a_grid_setting() -> None:
    x, y = _data()
    assert tune("decision_tree", x[:150], y[:150], x[150:], y[150:]) in GRIDS["decision_tree"]
