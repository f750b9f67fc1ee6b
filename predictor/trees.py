"""Regression tree ensembles as flat numpy arrays: the LightGBM and AdaBoost members of the shipped
predictor, evaluated at serving time with no lightgbm, scikit-learn (or torch) import.

`from_lightgbm_dump` flattens a LightGBM booster's `dump_model()` and `from_sklearn_adaboost` a
scikit-learn AdaBoostRegressor of decision trees (training side); `StackedTrees` walks every tree of
every target for every row at once, one level per step (a few microseconds per level for a few
hundred trees). A booster's prediction is the sum of its leaves (LightGBM's rule for a regression
booster); AdaBoost's is the weighted median of its trees (`BoostedMedian`, scikit-learn's AdaBoost.R2
rule, on features rounded to float32 as scikit-learn's trees read them).
Only what our ensembles use is supported: numerical `<=` splits on finite features; anything else
(categorical splits, a multi-class or averaged model) is refused when flattening, not mispredicted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
#: Array names of one ensemble inside the artifact's .npz (`arrays`, `from_arrays`).
ARRAY_NAMES: tuple[str, ...] = ("feature", "threshold", "left", "right", "value", "roots")


@dataclass(frozen=True)
class TreeEnsemble:
    """All trees of one booster in flat node arrays. Node i splits on `feature[i]` at `threshold[i]`
    (a row goes to `left[i]` when its value is <= the threshold, else to `right[i]`); a leaf has
    feature -1, left = right = itself, and its output in `value`. `roots[t]` is tree t's first node."""

    feature: IntArray
    threshold: FloatArray
    left: IntArray
    right: IntArray
    value: FloatArray
    roots: IntArray

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        """Sum over the trees of each row's leaf value, (n,)."""
        out: FloatArray = StackedTrees([self]).predict(X)[:, 0]
        return out

    def arrays(self, prefix: str) -> dict[str, npt.NDArray[Any]]:
        """The arrays under `prefix` + name, for the artifact's .npz (node indices as int32: a few hundred
        thousand nodes; thresholds and values stay float64, exact)."""
        return {prefix + name: getattr(self, name).astype(np.int32) if getattr(self, name).dtype == np.int64
                else getattr(self, name) for name in ARRAY_NAMES}

    @classmethod
    def from_arrays(cls, weights: Mapping[str, npt.ArrayLike], prefix: str) -> TreeEnsemble:
        """The ensemble saved by `arrays` (KeyError if one is missing, ValueError if inconsistent)."""
        a = {name: np.asarray(weights[prefix + name]) for name in ARRAY_NAMES}
        ensemble = cls(feature=a["feature"].astype(np.int64), threshold=a["threshold"].astype(np.float64),
                       left=a["left"].astype(np.int64), right=a["right"].astype(np.int64),
                       value=a["value"].astype(np.float64), roots=a["roots"].astype(np.int64))
        ensemble.check()
        return ensemble

    def check(self, n_features: int | None = None) -> None:
        """Raise ValueError unless every index points inside the arrays (a damaged artifact fails at load)."""
        n = len(self.feature)
        if not (len(self.threshold) == len(self.left) == len(self.right) == len(self.value) == n) or n == 0:
            raise ValueError("tree arrays of different lengths")
        for name in ("left", "right", "roots"):
            idx = getattr(self, name)
            if len(idx) == 0 or idx.min() < 0 or idx.max() >= n:
                raise ValueError(f"tree array {name} points outside the nodes")
        if n_features is not None and self.feature.max() >= n_features:
            raise ValueError(f"a tree splits on feature {int(self.feature.max())} of {n_features}")


class StackedTrees:
    """Several ensembles (one per output) walked together: (n, outputs) in one pass over the levels.

    Leaves become nodes that split on feature 0 at +inf and lead to themselves, so every row takes the
    same number of steps (the deepest tree's depth) with no test for having arrived: three array
    lookups and a comparison per level for all trees of all outputs at once."""

    def __init__(self, ensembles: Sequence[TreeEnsemble]) -> None:
        if not ensembles:
            raise ValueError("no tree ensembles to stack")
        offsets = np.cumsum([0, *(len(e.feature) for e in ensembles[:-1])])
        leaf = np.concatenate([e.feature < 0 for e in ensembles])
        self.feature = np.where(leaf, 0, np.concatenate([e.feature for e in ensembles]))
        self.threshold = np.where(leaf, np.inf, np.concatenate([e.threshold for e in ensembles]))
        self.left = np.concatenate([e.left + o for e, o in zip(ensembles, offsets, strict=True)])
        self.right = np.concatenate([e.right + o for e, o in zip(ensembles, offsets, strict=True)])
        self.value = np.concatenate([e.value for e in ensembles])
        self.roots = np.concatenate([e.roots + o for e, o in zip(ensembles, offsets, strict=True)])
        self.outputs = np.zeros((len(self.roots), len(ensembles)))  # tree -> its output, as a 0/1 matrix
        owner = np.repeat(np.arange(len(ensembles)), [len(e.roots) for e in ensembles])
        self.outputs[np.arange(len(self.roots)), owner] = 1.0
        self.depth = 0
        frontier = self.roots[~leaf[self.roots]]
        while len(frontier):  # levels below the roots, down to the deepest leaf
            self.depth += 1
            frontier = np.concatenate([self.left[frontier], self.right[frontier]])
            frontier = frontier[~leaf[frontier]]

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        """Per row and ensemble, the sum of its trees' leaves, (n, ensembles)."""
        out: FloatArray = self.leaves(X) @ self.outputs
        return out

    def leaves(self, X: npt.ArrayLike) -> FloatArray:
        """Per row, the leaf value each tree reaches, (n, trees), the trees in the ensembles' order."""
        x = np.asarray(X, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"X must be (n, features), got shape {x.shape}")
        node = np.broadcast_to(self.roots, (len(x), len(self.roots)))
        rows = np.arange(len(x))[:, None]
        for _ in range(self.depth):
            node = np.where(x[rows, self.feature[node]] <= self.threshold[node], self.left[node], self.right[node])
        out: FloatArray = self.value[node]
        return out


class BoostedMedian:
    """AdaBoost.R2 regressors, one per output, served from flat arrays: each output is the weighted
    median of its trees' predictions (scikit-learn's `AdaBoostRegressor.predict`: the smallest
    prediction whose cumulative weight, in ascending order, reaches half the total). Features are
    rounded to float32 first: scikit-learn's trees compare float32 features with their thresholds."""

    def __init__(self, ensembles: Sequence[TreeEnsemble], weights: Sequence[npt.ArrayLike]) -> None:
        if len(ensembles) != len(weights):
            raise ValueError(f"{len(ensembles)} AdaBoost ensembles but {len(weights)} weight vectors")
        self.weights = [np.asarray(w, dtype=np.float64) for w in weights]
        for e, w in zip(ensembles, self.weights, strict=True):
            if w.shape != (len(e.roots),) or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
                raise ValueError("AdaBoost weights must be one finite, non-negative weight per tree, not all 0")
        self.trees = StackedTrees(ensembles)
        self.bounds = np.cumsum([0, *(len(e.roots) for e in ensembles)])

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        """(n, outputs)."""
        leaves = self.trees.leaves(np.asarray(X, dtype=np.float64).astype(np.float32).astype(np.float64))
        return np.column_stack([weighted_median(leaves[:, lo:hi], w) for lo, hi, w in
                                zip(self.bounds[:-1], self.bounds[1:], self.weights, strict=True)])


def weighted_median(values: FloatArray, weights: FloatArray) -> FloatArray:
    """Per row of `values` (n, k), the smallest value whose cumulative weight (`weights`, k), taken in
    ascending order of the values, reaches half the total weight."""
    order = np.argsort(values, axis=1, kind="stable")
    cdf = np.cumsum(weights[order], axis=1)
    pick = np.argmax(cdf >= 0.5 * cdf[:, -1:], axis=1)
    out: FloatArray = np.take_along_axis(values, order[np.arange(len(values)), pick][:, None], axis=1)[:, 0]
    return out


def from_sklearn_adaboost(model: Any) -> tuple[TreeEnsemble, FloatArray]:
    """(the trees, their weights) of a fitted scikit-learn `AdaBoostRegressor` of decision trees, one
    output: every fitted tree, whose prediction is its leaf value."""
    trees = [estimator.tree_ for estimator in model.estimators_]
    if not trees:
        raise ValueError("the AdaBoost model has no fitted trees")
    if any(tree.n_outputs != 1 or tree.value.shape[1:] != (1, 1) for tree in trees):
        raise ValueError("only single-output regression trees can be flattened")
    roots = np.cumsum([0, *(tree.node_count for tree in trees[:-1])]).astype(np.int64)
    parts: dict[str, list[npt.NDArray[Any]]] = {name: [] for name in ("feature", "threshold", "left", "right")}
    for tree, base in zip(trees, roots, strict=True):  # scikit-learn's arrays are flat already; a leaf has child -1
        leaf = tree.children_left < 0
        nodes = np.arange(tree.node_count)
        parts["feature"].append(np.where(leaf, -1, tree.feature))
        parts["threshold"].append(np.where(leaf, 0.0, tree.threshold))
        parts["left"].append(base + np.where(leaf, nodes, tree.children_left))
        parts["right"].append(base + np.where(leaf, nodes, tree.children_right))
    ensemble = TreeEnsemble(feature=np.concatenate(parts["feature"]).astype(np.int64),
                            threshold=np.concatenate(parts["threshold"]).astype(np.float64),
                            left=np.concatenate(parts["left"]).astype(np.int64),
                            right=np.concatenate(parts["right"]).astype(np.int64),
                            value=np.concatenate([tree.value[:, 0, 0] for tree in trees]).astype(np.float64),
                            roots=roots)
    ensemble.check()
    return ensemble, np.asarray(model.estimator_weights_[: len(trees)], dtype=np.float64)


def from_lightgbm_dump(dump: Mapping[str, Any]) -> TreeEnsemble:
    """Flatten `lightgbm.Booster.dump_model()` of a single-output regression booster."""
    if int(dump.get("num_tree_per_iteration", 1)) != 1 or dump.get("average_output"):
        raise ValueError("only single-output boosted (not averaged) LightGBM models can be flattened")
    feature: list[int] = []
    threshold: list[float] = []
    left: list[int] = []
    right: list[int] = []
    value: list[float] = []
    roots: list[int] = []

    def add(node: Mapping[str, Any]) -> int:
        i = len(feature)
        feature.append(-1)
        threshold.append(0.0)
        left.append(i)
        right.append(i)
        value.append(0.0)
        if "leaf_value" in node:
            value[i] = float(node["leaf_value"])
            return i
        if node.get("decision_type") != "<=" or node.get("missing_type") == "Zero":
            raise ValueError(f"unsupported LightGBM split {node.get('decision_type')!r}, missing "
                             f"{node.get('missing_type')!r} (numerical <= on finite values only)")
        feature[i] = int(node["split_feature"])
        threshold[i] = float(node["threshold"])
        left[i] = add(node["left_child"])
        right[i] = add(node["right_child"])
        return i

    for tree in dump["tree_info"]:  # leaf values already include the learning rate and the initial score
        roots.append(add(tree["tree_structure"]))
    ensemble = TreeEnsemble(np.asarray(feature, dtype=np.int64), np.asarray(threshold, dtype=np.float64),
                            np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64),
                            np.asarray(value, dtype=np.float64), np.asarray(roots, dtype=np.int64))
    ensemble.check()
    return ensemble
