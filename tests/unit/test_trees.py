"""The flattened tree ensembles (predictor.trees): the LightGBM and AdaBoost members of the blend served without
lightgbm or scikit-learn."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from predictor.trees import TreeEnsemble, from_lightgbm_dump


def _booster(seed: int = 0, **settings: Any) -> tuple[Any, np.ndarray]:
    import lightgbm

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(600, 6))
    y = 2.0 * x[:, 0] + np.sin(3.0 * x[:, 1]) + x[:, 2] * x[:, 3] + 0.1 * rng.normal(size=600)
    model = lightgbm.LGBMRegressor(**({"n_estimators": 120, "num_leaves": 15, "min_child_samples": 5,
                                        "subsample": 0.9, "subsample_freq": 1, "colsample_bytree": 0.9,
                                        "n_jobs": 1, "random_state": seed, "verbose": -1} | settings))
    return model.fit(x, y), rng.normal(size=(400, 6)) * 1.5  # test rows partly outside the training values


def test_flattened_trees_predict_what_lightgbm_predicts() -> None:
    model, x = _booster()
    trees = from_lightgbm_dump(model.booster_.dump_model())
    assert len(trees.roots) == 120
    np.testing.assert_allclose(trees.predict(x), model.predict(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(trees.predict(x[:1]), model.predict(x[:1]), rtol=1e-12, atol=1e-12)


def test_a_booster_of_single_leaf_trees_is_its_constant() -> None:
    model, x = _booster(min_child_samples=1000)  # no split possible: every tree is one leaf
    trees = from_lightgbm_dump(model.booster_.dump_model())
    assert (trees.feature == -1).all()
    np.testing.assert_allclose(trees.predict(x), model.predict(x), rtol=1e-12)


def test_arrays_round_trip_and_damaged_arrays_are_refused() -> None:
    model, x = _booster(seed=1)
    trees = from_lightgbm_dump(model.booster_.dump_model())
    saved = trees.arrays("tree0.")
    np.testing.assert_array_equal(TreeEnsemble.from_arrays(saved, "tree0.").predict(x), trees.predict(x))
    broken = {**saved, "tree0.left": saved["tree0.left"] + len(trees.feature)}
    with pytest.raises(ValueError, match="outside"):
        TreeEnsemble.from_arrays(broken, "tree0.")
    with pytest.raises(KeyError):
        TreeEnsemble.from_arrays({k: v for k, v in saved.items() if not k.endswith("roots")}, "tree0.")
    with pytest.raises(ValueError, match="feature"):
        trees.check(n_features=2)


def test_what_it_cannot_evaluate_is_refused_not_mispredicted() -> None:
    model, _ = _booster()
    dump = model.booster_.dump_model()
    with pytest.raises(ValueError, match="single-output"):
        from_lightgbm_dump({**dump, "num_tree_per_iteration": 3})
    tree = dict(dump["tree_info"][0])
    tree["tree_structure"] = {**tree["tree_structure"], "decision_type": "=="}  # a categorical split
    with pytest.raises(ValueError, match="unsupported"):
        from_lightgbm_dump({**dump, "tree_info": [tree]})


def test_stacked_ensembles_give_each_its_own_column() -> None:
    from predictor.trees import StackedTrees

    first, x = _booster(seed=2)
    second, _ = _booster(seed=3, num_leaves=4, n_estimators=30)
    stacked = StackedTrees([from_lightgbm_dump(first.booster_.dump_model()),
                            from_lightgbm_dump(second.booster_.dump_model())])
    out = stacked.predict(x)
    assert out.shape == (len(x), 2)
    np.testing.assert_allclose(out[:, 0], first.predict(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[:, 1], second.predict(x), rtol=1e-12, atol=1e-12)


def _adaboost(seed: int = 0, **settings: Any) -> tuple[Any, np.ndarray]:
    from sklearn.ensemble import AdaBoostRegressor
    from sklearn.tree import DecisionTreeRegressor

    rng = np.random.default_rng(seed)
    scale = np.array([1.0, 10.0, 1e3, 1e-3, 1.0, 1.0])  # features of very different sizes, as log2 sizes are not
    x = rng.normal(size=(600, 6)) * scale
    y = 2.0 * x[:, 0] + np.sin(0.3 * x[:, 1]) + x[:, 2] * x[:, 3] + 0.1 * rng.normal(size=600)
    model = AdaBoostRegressor(DecisionTreeRegressor(max_depth=settings.pop("max_depth", 8), random_state=seed),
                              **({"n_estimators": 150, "learning_rate": 0.5, "random_state": seed} | settings))
    test = np.vstack([rng.normal(size=(400, 6)) * 1.5 * scale, x[:50]])  # new rows, and rows on the thresholds
    return model.fit(x, y), test


def test_flattened_adaboost_predicts_what_scikit_learn_predicts() -> None:
    from predictor.trees import BoostedMedian, from_sklearn_adaboost

    first, x = _adaboost(seed=0)
    second, _ = _adaboost(seed=1, max_depth=3, n_estimators=40, loss="square")
    flat = [from_sklearn_adaboost(m) for m in (first, second)]
    assert len(flat[0][0].roots) == len(first.estimators_)
    served = BoostedMedian([e for e, _ in flat], [w for _, w in flat])
    out = served.predict(x)
    assert out.shape == (len(x), 2)
    np.testing.assert_array_equal(out[:, 0], first.predict(x))
    np.testing.assert_array_equal(out[:, 1], second.predict(x))
    # rows exactly on a threshold that float32 rounds up: scikit-learn's trees send them right
    e = flat[0][0]
    ties = [i for i in np.flatnonzero(e.feature >= 0) if float(np.float32(e.threshold[i])) > e.threshold[i]]
    assert ties
    on = np.repeat(x[:1], len(ties), axis=0)
    on[np.arange(len(ties)), e.feature[ties]] = e.threshold[ties]
    np.testing.assert_array_equal(served.predict(on)[:, 0], first.predict(on))
    # a weighted median, not a mean: each answer is one tree's own prediction
    leaves = served.trees.leaves(x.astype(np.float32).astype(np.float64))[:, : len(first.estimators_)]
    assert all(v in row for v, row in zip(out[:, 0], leaves, strict=True))


def test_weighted_median_takes_the_first_value_reaching_half_the_weight() -> None:
    from predictor.trees import weighted_median

    values = np.array([[3.0, 1.0, 2.0], [5.0, 4.0, 6.0]])
    # ascending 1 (w 1), 2 (w 1), 3 (w 2): half of 4 is reached at 2
    assert weighted_median(values, np.array([2.0, 1.0, 1.0])).tolist() == [2.0, 5.0]
    # one tree with most of the weight decides
    assert weighted_median(values, np.array([10.0, 1.0, 1.0])).tolist() == [3.0, 5.0]


def test_adaboost_weights_that_do_not_fit_are_refused() -> None:
    from predictor.trees import BoostedMedian, from_sklearn_adaboost

    model, _ = _adaboost(seed=2, n_estimators=10)
    ensemble, weights = from_sklearn_adaboost(model)
    with pytest.raises(ValueError, match="weight"):
        BoostedMedian([ensemble], [weights[:-1]])
    with pytest.raises(ValueError, match="weight"):
        BoostedMedian([ensemble], [np.where(np.arange(len(weights)) == 0, np.nan, weights)])
    with pytest.raises(ValueError, match="weight vectors"):
        BoostedMedian([ensemble, ensemble], [weights])
