"""The baselines of both seed papers: decision tree, random forest, AdaBoost, ExtraTrees,
XGBoost, LightGBM and CatBoost, behind one scikit-learn-style estimator.

They read the same feature matrix as the tuned Transformer-BiGRU (`predictor.features`, physics
set) and are fitted on the same rows, so the comparison is about the learner, not the inputs.
Like the tuned network they learn log(target) (relative errors; a 1 GB and an 80 GB job count
alike), one regressor per target.

Tuning: each learner has a small grid (`GRIDS`, 2-3 settings of its most sensitive knob, the rest
fixed at common defaults) scored on the random split's calibration fold, never on a test set;
`deepres evaluate` picks the best setting once and uses it on every split. One thread per learner
and moderate tree counts keep the whole comparison within minutes on 2 cores.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

BASELINES: tuple[str, ...] = (
    "decision_tree", "random_forest", "adaboost", "extra_trees", "xgboost", "lightgbm", "catboost",
)
#: One thread per learner: on a busy 2-core machine OpenMP workers spin against each other (and
#: against the other processes) and a second thread makes fits slower, not faster.
N_JOBS = 1

#: name -> candidate settings (the first is the default when no tuning is run).
GRIDS: dict[str, list[dict[str, Any]]] = {
    "decision_tree": [{"min_samples_leaf": 2}, {"min_samples_leaf": 1}, {"min_samples_leaf": 5}],
    "random_forest": [{"max_features": 0.5}, {"max_features": 1.0}],
    "adaboost": [{"max_depth": 8}, {"max_depth": 5}],
    "extra_trees": [{"max_features": 1.0}, {"max_features": 0.5}],
    "xgboost": [{"max_depth": 6}, {"max_depth": 4}],
    "lightgbm": [{"num_leaves": 31}, {"num_leaves": 15}],
    "catboost": [{"depth": 6}, {"depth": 8}],
}


def make_regressor(name: str, settings: dict[str, Any], random_state: int) -> Any:
    """A fresh single-target regressor of the named family; `settings` override the fixed defaults."""
    if name == "decision_tree":
        from sklearn.tree import DecisionTreeRegressor

        return DecisionTreeRegressor(random_state=random_state, **settings)
    if name == "random_forest":
        from sklearn.ensemble import RandomForestRegressor

        defaults = {"n_estimators": 200, "n_jobs": N_JOBS, "random_state": random_state}
        return RandomForestRegressor(**(defaults | settings))
    if name == "extra_trees":
        from sklearn.ensemble import ExtraTreesRegressor

        defaults = {"n_estimators": 200, "n_jobs": N_JOBS, "random_state": random_state}
        return ExtraTreesRegressor(**(defaults | settings))
    if name == "adaboost":
        from sklearn.ensemble import AdaBoostRegressor
        from sklearn.tree import DecisionTreeRegressor

        tree = DecisionTreeRegressor(max_depth=settings["max_depth"], random_state=random_state)
        rest = {k: v for k, v in settings.items() if k != "max_depth"}
        return AdaBoostRegressor(tree, **({"n_estimators": 200, "learning_rate": 0.5, "loss": "linear",
                                           "random_state": random_state} | rest))
    if name == "xgboost":
        from xgboost import XGBRegressor

        return XGBRegressor(**({"n_estimators": 300, "learning_rate": 0.1, "subsample": 0.9, "colsample_bytree": 0.9,
                                "tree_method": "hist", "n_jobs": N_JOBS, "random_state": random_state} | settings))
    if name == "lightgbm":
        from lightgbm import LGBMRegressor

        return LGBMRegressor(**({"n_estimators": 300, "learning_rate": 0.1, "min_child_samples": 5, "subsample": 0.9,
                                 "subsample_freq": 1, "colsample_bytree": 0.9, "n_jobs": N_JOBS,
                                 "random_state": random_state, "verbose": -1} | settings))
    if name == "catboost":
        from catboost import CatBoostRegressor

        return CatBoostRegressor(**({"iterations": 500, "learning_rate": 0.1, "thread_count": N_JOBS,
                                     "random_seed": random_state, "verbose": False, "allow_writing_files": False}
                                    | settings))
    raise ValueError(f"unknown baseline {name!r}: expected one of {', '.join(BASELINES)}")


class BaselineRegressor:
    """One baseline learner, one fitted regressor per target column, on log(target)."""

    def __init__(self, name: str, settings: dict[str, Any] | None = None, random_state: int = 0,
                 log_target: bool = True) -> None:
        self.name = name
        self.settings = settings
        self.random_state = random_state
        self.log_target = log_target

    def fit(self, X: FloatArray, Y: FloatArray) -> BaselineRegressor:
        if self.name not in GRIDS:
            raise ValueError(f"unknown baseline {self.name!r}: expected one of {', '.join(BASELINES)}")
        X = np.asarray(X, dtype=np.float64)
        Y = np.asarray(Y, dtype=np.float64)
        if Y.ndim == 1:
            Y = Y[:, None]
        if X.ndim != 2 or len(X) != len(Y) or len(X) == 0:
            raise ValueError(f"X must be (n, features) and Y (n, targets) with n > 0; got {X.shape} and {Y.shape}")
        if self.log_target and (Y <= 0).any():
            raise ValueError("log targets need positive Y")
        settings = self.settings if self.settings is not None else GRIDS[self.name][0]
        targets = np.log(Y) if self.log_target else Y
        self.n_features_in_ = X.shape[1]
        self.estimators_ = [
            make_regressor(self.name, settings, self.random_state).fit(X, targets[:, k]) for k in range(Y.shape[1])
        ]
        return self

    def predict(self, X: FloatArray) -> FloatArray:
        if not hasattr(self, "estimators_"):
            raise RuntimeError(f"this {self.name} baseline is not fitted yet: call fit(X, Y) first")
        X = np.asarray(X, dtype=np.float64)
        out = np.column_stack([np.asarray(est.predict(X), dtype=np.float64) for est in self.estimators_])
        return np.exp(out) if self.log_target else out


def tune(name: str, X_fit: FloatArray, Y_fit: FloatArray, X_cal: FloatArray, Y_cal: FloatArray,
         random_state: int = 0) -> dict[str, Any]:
    """The grid setting with the lowest log-space MSE on the calibration fold (all targets summed)."""
    best: tuple[float, dict[str, Any]] | None = None
    for settings in GRIDS[name]:
        pred = BaselineRegressor(name, settings, random_state).fit(X_fit, Y_fit).predict(X_cal)
        score = float(np.mean((np.log(pred) - np.log(np.asarray(Y_cal).reshape(pred.shape))) ** 2))
        if best is None or score < best[0]:
            best = (score, settings)
    assert best is not None
    return best[1]
