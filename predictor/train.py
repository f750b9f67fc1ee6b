"""`deepres train`: fit the tuned Transformer-BiGRU, blended with a LightGBM booster and an AdaBoost
regressor of the same features (`BLEND_MEMBERS`: their median in log space), and write the shipped artifact.

The artifact is fitted by the recipe the report measures (`fit_model`: grouped cross-validation
sets the admission margin of `memory_mib_upper` by split conformal at a level tuned on nested
folds of whole groups, then the model is fitted on all its rows), on every row of the dataset's
default subset (`--split all`, the default); `deepres evaluate` measures the same recipe on
architectures held out by group.
`--split grouped` fits on the grouped split's training rows and reports its test rows instead.

Weights are written as .npz (numpy arrays under the module's state-dict names, and the booster's trees
flattened by `predictor.trees`): serving reads them with `predictor.inference` and `predictor.trees`
and never imports torch or lightgbm. Everything is seeded (`--seed`): the same
dataset and seed give the same weights on this CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from predictor import features as feats
from predictor.baselines import BASELINES, BaselineRegressor
from predictor.metrics import conformal_quantile, over_reservation, regression_metrics, under_rate
from predictor.model import TransformerBiGRURegressor, paper_config, tuned_config
from predictor.progress import Bar
from predictor.runtime import (
    ADABOOST_PREFIX,
    INPUT_RANGE_COLUMNS,
    METADATA_FILE,
    TINY_DENSITY,
    TREE_PREFIX,
    WEIGHTS_FILE,
    blend_points,
    clip_bounds,
    margin_for,
    range_factor,
)
from predictor.splits import Split, grouped_calibration_split, grouped_folds, grouped_split
from predictor.trainset import DEFAULT_DATA, REPO_ROOT, TARGETS, Dataset, DatasetError, load_dataset
from predictor.trees import from_lightgbm_dump, from_sklearn_adaboost

log = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]

DEFAULT_ARTIFACT = REPO_ROOT / "predictor" / "artifacts"
MODELS: tuple[str, ...] = ("transformer_bigru_paper", "transformer_bigru_tuned", *BASELINES)
#: Share of the jobs of architectures the margins never saw that the memory bound covers: the
#: admission bound should under-estimate at most 5% of them. Met on nested folds of whole groups of
#: the out-of-fold scores (`conformal_plan`), not on the jobs pooled (jobs of one architecture err
#: together). `deepres train/evaluate --coverage` picks another share (the trade-off with over-reservation).
UPPER_COVERAGE = 0.95
#: Share of a training set's architecture groups held out to calibrate the bound.
CALIBRATION_FRACTION = 0.2
#: A family can get its own margin (when the nested folds say it reserves less, `set_margins`) when
#: the calibration rows hold at least this many of its jobs of this many groups.
MIN_FAMILY_CALIBRATION = 30
MIN_FAMILY_GROUPS = 3
#: Rows used by default (a seeded subset): the CPU budget of `deepres train` / `evaluate` on 2 cores.
DEFAULT_MAX_ROWS = 4000
#: Grouped cross-validation folds that calibrate the bound (`fit_model`); below 2: one held-out fold.
#: Ten: each out-of-fold prediction comes from a fit on 90% of the groups, closer to the final fit on
#: all of them than 80% (on the grouped split's training rows, 5 folds gave in-range out-of-fold log
#: scores with a 95th percentile of 0.52 and a nested-tuned level of 0.9675; 10 folds 0.49 and 0.95).
CV_FOLDS = 10
#: Threads for training: fixed so results are reproducible. One: these networks are so small that a
#: second intra-op thread only adds synchronisation (10x slower on a busy 2-core machine).
TRAIN_THREADS = 1
#: The shipped predictor (`transformer_bigru_tuned`) blends the tuned network with a LightGBM booster and
#: an AdaBoost regressor of the same features and rows: the median of the three in log space
#: (`runtime.blend_points`). Chosen on the grouped split's training rows alone (10 grouped CV folds, the
#: bound's nested folds; `scripts/bound_study.py score`), nested over-reservation at a 5% nested
#: under-rate, three network seeds: the network alone 0.43-0.51, LightGBM alone 0.43, AdaBoost alone 0.32,
#: the network with LightGBM (geometric mean, the previous release) 0.37-0.41, the median of the three
#: 0.32-0.34. They err on unseen architectures, but not together; the median drops the one that errs
#: most, and keeps the network, which errs least on the largest jobs (docs/predictor.md).
#: The blend's tree members, in order, and their settings (the grid values `deepres evaluate` picks on
#: the grouped split's calibration fold; AdaBoost picks the same on all rows' calibration fold).
BLEND_TREES: dict[str, dict[str, Any]] = {"lightgbm": {"num_leaves": 15}, "adaboost": {"max_depth": 8}}
BLEND_MEMBERS: tuple[str, ...] = ("network", *BLEND_TREES)
TINY = TINY_DENSITY  # the runtime's floor for densities, so train and serving clip alike


@dataclass
class FittedModel:
    """One model fitted on a split's fit rows, with its calibrated memory margins (log scale).

    Physics models learn the targets as densities (`predictor.features.Decomposition`): the memory
    is the exact fixed bytes plus a learned activation term, and the bound's margin widens only that
    learned term (what the annotations do not determine), so a job whose peak is mostly weights and
    optimizer state gets a tight bound and one whose peak is mostly activations a wide one.
    `memory_shift` is the margin of all families together; `family_shifts` those of the families
    with enough calibration jobs (keyed by model_type, what a JobSpec names at request time).
    """

    name: str
    estimators: list[Any]  # one multi-target estimator, or one per target (paper)
    feature_set: str
    memory_shift: float = 0.0
    family_shifts: dict[str, float] = field(default_factory=dict)
    ranges: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Per family, the [min, max] of each sized input over the training rows (`input_ranges`)."""
    bound_source: str = "quantile"
    """What the margin multiplies: the quantile head (`quantile`, where the model has one) or the
    point prediction (`point`); chosen on the calibration scores (`set_margins`)."""
    target_ranges: dict[str, list[list[float]]] = field(default_factory=dict)
    """Per family (model_type), [[lowest], [highest]] learned target of its fit rows: predictions
    are held inside their family's range (`clip_to_family`)."""
    coverage: float = UPPER_COVERAGE
    """The coverage the margins were calibrated to (`set_margins`): of jobs of architectures they never saw."""
    level: float = UPPER_COVERAGE
    """The nominal split-conformal level that meets `coverage` on unseen groups (`conformal_plan`)."""
    unseen_shift: float | None = None
    """The margin of a family absent from training (`set_margins`); None: `memory_shift`."""
    held_out: tuple[npt.NDArray[np.int64], FloatArray, FloatArray | None, npt.NDArray[np.bool_] | None] | None = None
    """What the margins were calibrated on (`set_margins`' rows, point, quantile, in_range): `at_coverage`
    recalibrates from it without refitting. Not saved in the artifact."""
    blend: bool = False
    """Where set, the estimators are the BLEND_MEMBERS (network first) and the point is their median in
    log space (`runtime.blend_points`); no quantile head."""
    without_shapes: FittedModel | None = None
    """The same estimators with margins calibrated on held-out predictions made without the optional
    shape annotations (`shaped_margins`): the bound of a job that does not state `activations-millions`.
    Its errors are those of the network without them, larger than with them: one set of margins
    calibrated on jobs that state the count would under-cover the jobs that do not."""

    def predict(self, data: Dataset, rows: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
        """(points (n, 2), memory upper bound (n,)) for the given rows, the bound as the runtime
        serves it: calibrated margin on the learned term, widened outside the training ranges (`range_factor`)."""
        x = (data.physics_x if self.feature_set == "physics" else data.seed_x).values[rows]
        factors = range_factors(data, rows, self.ranges)
        return self.decode(x, data.families[rows], data.terms_for(self.feature_set, rows), factors)

    def decode(self, x: FloatArray, families: npt.NDArray[Any], terms: feats.Decomposition,
               factors: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(points in MiB and GFLOPs, memory bound) from the feature rows and their decomposition; rows
        that do not state the activation count take the bound of `without_shapes`."""
        points, upper = self._decode(x, families, terms, factors)
        if self.without_shapes is not None and self.feature_set == "physics":
            stated = x[:, feats.PHYSICS_NAMES.index("activations_given")] > 0
            if not stated.all():
                upper = np.where(stated, upper, self.without_shapes._decode(x, families, terms, factors)[1])
        return points, upper

    def _decode(self, x: FloatArray, families: npt.NDArray[Any], terms: feats.Decomposition,
                factors: FloatArray) -> tuple[FloatArray, FloatArray]:
        points_t, base = self.raw(x, families)
        shift = np.asarray([margin_for(str(f), self.family_shifts, self.memory_shift, self.unseen_shift, self.ranges)
                            for f in families], dtype=np.float64)
        memory = terms.memory(points_t[:, 0])
        upper = np.maximum(terms.memory(base * np.exp(shift) * factors), memory)
        return np.column_stack([memory, terms.flops(points_t[:, 1])]), upper

    def raw(self, x: FloatArray, families: npt.NDArray[Any]) -> tuple[FloatArray, FloatArray]:
        """(points, uncalibrated memory bound) in target units: the quantile head (if chosen), else the point."""
        points, quantile = self.raw_both(x, families)
        base = quantile if quantile is not None and self.bound_source == "quantile" else points[:, 0]
        return points, np.maximum(base, TINY)

    def raw_both(self, x: FloatArray, families: npt.NDArray[Any]) -> tuple[FloatArray, FloatArray | None]:
        """(points, the quantile head's memory bound or None), in target units, held inside each family's range."""
        upper_raw: FloatArray | None = None
        if self.blend:
            points = blend_points(*(est.predict(x) for est in self.estimators))
        elif len(self.estimators) == 1:
            est = self.estimators[0]
            if isinstance(est, TransformerBiGRURegressor):
                points, upper_raw = est.predict_with_upper(x)
            else:
                points = est.predict(x)
        else:
            points = np.column_stack([est.predict(x)[:, 0] for est in self.estimators])
        if not self.target_ranges:
            return points, upper_raw
        low, high = clip_bounds(self.target_ranges, families, points.shape[1])
        points = np.clip(points, low, high)
        return points, None if upper_raw is None else np.clip(upper_raw, low[:, 0], high[:, 0])


def range_factors(data: Dataset, rows: npt.NDArray[np.int64],
                  ranges: Mapping[str, Mapping[str, Sequence[float]]]) -> FloatArray:
    """`range_factor` of each row against per-family training ranges (`input_ranges`): 1.0 inside."""
    checked = {f: {c: (float(lo), float(hi)) for c, (lo, hi) in cols.items()} for f, cols in ranges.items()}
    return np.asarray([
        range_factor(str(data.families[r]), {c: float(data.cols[c][r]) for c in INPUT_RANGE_COLUMNS}, checked)[0]
        for r in rows
    ], dtype=np.float64)


def target_ranges(data: Dataset, feature_set: str, rows: npt.NDArray[np.int64]) -> dict[str, list[list[float]]]:
    """Per family, the lowest and highest learned target over `rows` (what `clip_bounds` holds predictions
    to): of the targets as fitted (`Dataset.fit_t`: with or without the shape annotations)."""
    targets = data.fit_t(rows) if feature_set == "physics" else data.targets_for(feature_set)[rows]
    families = data.families[rows]
    return {str(f): [targets[families == f].min(axis=0).tolist(), targets[families == f].max(axis=0).tolist()]
            for f in sorted(set(families.tolist()))}


def calibrate(model: FittedModel, data: Dataset, cal_rows: npt.NDArray[np.int64], coverage: float,
              fit_ranges: Mapping[str, Mapping[str, Sequence[float]]] | None = None) -> None:
    """Set the model's margins on a calibration fold (rows of groups it did not fit); `fit_ranges`:
    the input ranges of the rows it did fit (`input_ranges`), which mark the in-range rows."""
    x = (data.physics_x if model.feature_set == "physics" else data.seed_x).values[cal_rows]
    points, quantile = model.raw_both(x, data.families[cal_rows])
    in_range = None if fit_ranges is None else range_factors(data, cal_rows, fit_ranges) == 1.0
    bare = _without_shapes_predictions(model, data, cal_rows)
    shaped_margins(model, data, cal_rows, (points[:, 0], quantile), bare, coverage, in_range)


def _without_shapes_predictions(model: FittedModel, data: Dataset,
                                rows: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray | None] | None:
    """(point, quantile) of `rows` read without the shape annotations; None where there are none to drop."""
    if model.feature_set != "physics" or data.physics_x_bare is None:
        return None
    points, quantile = model.raw_both(data.physics_x_bare.values[rows], data.families[rows])
    return points[:, 0], quantile


def shaped_margins(model: FittedModel, data: Dataset, rows: npt.NDArray[np.int64],
                   stated: tuple[FloatArray, FloatArray | None], bare: tuple[FloatArray, FloatArray | None] | None,
                   coverage: float, in_range: npt.NDArray[np.bool_] | None) -> None:
    """`set_margins` twice, Mondrian on whether a job states its activation count: on the held-out
    predictions as the rows are annotated (the model's own margins) and on the same rows read without
    the shape annotations (`model.without_shapes`'s)."""
    if bare is not None:
        twin = replace(model, family_shifts={}, without_shapes=None)
        set_margins(twin, data.without_shapes(), rows, bare[0], bare[1], coverage, in_range)
        model.without_shapes = twin
    set_margins(model, data, rows, stated[0], stated[1], coverage, in_range)


def set_margins(model: FittedModel, data: Dataset, rows: npt.NDArray[np.int64], point: FloatArray,
                quantile: FloatArray | None, coverage: float, in_range: npt.NDArray[np.bool_] | None = None) -> None:
    """Split conformal margins from held-out predictions of `rows` (point, and the quantile head's
    bound where the model has one; target units: the learned term). The score is log(true / predicted
    learned term); the bound on memory is monotone in it.

    The unit a bound must cover is a job of an architecture nobody calibrated on, and jobs of one
    architecture err together: a quantile over jobs, where one group of 80 jobs outweighs ten groups
    of 3, under-covers the next architecture (nested grouped CV on the real data: 10% of held-out
    jobs under the bound at a nominal 95%). So `coverage` is met over architectures the margins
    never saw (`conformal_plan`): each candidate (base: point or quantile head; taxonomy: one margin
    for all families, or Mondrian per family where MIN_FAMILY_CALIBRATION jobs of MIN_FAMILY_GROUPS
    groups back it) gets the lowest nominal level whose margins, computed without each of
    NESTED_FOLDS folds of whole groups, leave at most 1 - coverage of that fold's jobs under the
    bound; the candidate reserving the least memory on those same nested folds is kept.

    `in_range` (per row: inside the input ranges of the fit that predicted it): the margins are
    calibrated on the in-range rows alone, the jobs they are served to unwidened; out-of-range rows
    (a family the fit never saw, sizes beyond its own) err far more, and the runtime serves them the
    margin times `range_factor`. Fewer than MIN_FAMILY_CALIBRATION in-range rows: all rows calibrate.
    A family the model never saw at all gets `unseen_shift`, the pooled margin over every held-out
    row, out-of-range ones included, times `range_factor`'s UNSEEN_FAMILY_FACTOR."""
    model.held_out = (rows, point, quantile, in_range)
    truth_all = data.targets_for(model.feature_set)[rows, 0]
    groups_all, point_all, quantile_all = data.groups[rows], point, quantile
    if in_range is not None and int(np.sum(in_range)) >= MIN_FAMILY_CALIBRATION:
        rows, point = rows[in_range], point[in_range]
        quantile = None if quantile is None else quantile[in_range]
    truth = data.targets_for(model.feature_set)[rows, 0]
    memory = data.y[rows, 0]
    terms = data.terms_for(model.feature_set, rows)
    families = data.families[rows].astype(str)
    groups = data.groups[rows]
    candidates = {"point": np.maximum(point, TINY)}
    if quantile is not None:
        candidates["quantile"] = np.maximum(quantile, TINY)
    floor = terms.memory(np.maximum(point, TINY))
    best: tuple[float, str, ConformalPlan] | None = None
    for source, base in candidates.items():
        scores = np.log(np.maximum(truth, TINY) / base)
        for classes in (np.full(len(rows), ALL_FAMILIES), mondrian_classes(families, groups)):
            plan = conformal_plan(scores, groups, classes, coverage)
            reserved = float(np.mean(np.maximum(terms.memory(base * np.exp(plan.nested_margins)), floor) / memory))
            if best is None or reserved < best[0] - 1e-12:
                best = (reserved, source, plan)
    assert best is not None
    _, model.bound_source, plan = best
    model.memory_shift = plan.margins.get(ALL_FAMILIES, plan.pooled)
    model.family_shifts = {c: m for c, m in plan.margins.items() if c != ALL_FAMILIES}
    model.level = plan.level
    base_all = np.maximum(point_all if model.bound_source == "point" or quantile_all is None else quantile_all, TINY)
    scores_all = np.log(np.maximum(truth_all, TINY) / base_all)
    model.unseen_shift = conformal_plan(scores_all, groups_all, np.full(len(scores_all), ALL_FAMILIES),
                                        coverage).pooled
    model.coverage = coverage


#: Folds of whole groups the nominal conformal level is tuned on (`conformal_plan`), and their seed.
NESTED_FOLDS = 5
NESTED_SEED = 1
#: The class of every job in a margin for all families together (`mondrian_classes`' fallback).
ALL_FAMILIES = "*"


@dataclass(frozen=True)
class ConformalPlan:
    """Margins at a nominal level tuned so that they cover `coverage` of jobs of unseen groups."""

    level: float
    """The nominal split-conformal level the margins are computed at (the tuned one)."""
    margins: dict[str, float]
    """Log margin per class (ALL_FAMILIES: the jobs of families without their own)."""
    pooled: float
    """The margin of all rows together at `level` (what a class with too few rows falls back to)."""
    nested_margins: FloatArray
    """Per row, the margin computed without the row's nested fold (what it would have been served)."""
    nested_under: float
    """Share of rows above their nested margin at `level`."""


def mondrian_classes(families: npt.NDArray[Any], groups: npt.NDArray[Any]) -> npt.NDArray[np.str_]:
    """Per row, its family where the rows hold MIN_FAMILY_CALIBRATION jobs of at least MIN_FAMILY_GROUPS
    groups of it (one architecture's residuals say little about the next one's), else ALL_FAMILIES."""
    out = np.full(len(families), ALL_FAMILIES, dtype=object)
    for family in sorted(set(families.tolist())):
        mask = families == family
        if mask.sum() >= MIN_FAMILY_CALIBRATION and len(set(groups[mask].tolist())) >= MIN_FAMILY_GROUPS:
            out[mask] = str(family)
    return out.astype(str)


def _class_margins(scores: FloatArray, classes: npt.NDArray[np.str_], level: float) -> tuple[dict[str, float], float]:
    pooled = conformal_quantile(scores, level)
    margins = {}
    for c in sorted(set(classes.tolist())):
        mask = classes == c
        margins[c] = pooled if c == ALL_FAMILIES or mask.sum() < MIN_FAMILY_CALIBRATION \
            else conformal_quantile(scores[mask], level)
    return margins, pooled


def conformal_plan(scores: FloatArray, groups: npt.NDArray[Any], classes: npt.NDArray[np.str_],
                   coverage: float) -> ConformalPlan:
    """Margins per class at the lowest nominal level (of LEVEL_GRID) whose margins, computed on the
    other NESTED_FOLDS - 1 folds of whole groups, leave at most 1 - coverage of each held-out fold's
    jobs above them, pooled over the folds (nested grouped cross-validation: groups the margins never
    saw, as at serving time). Fewer than NESTED_FOLDS groups: the nominal level is `coverage` itself.
    The under-rate only falls as the level rises, so a bisection over the grid finds it."""
    n_groups = len(set(groups.tolist()))
    if n_groups < NESTED_FOLDS:
        margins, pooled = _class_margins(scores, classes, coverage)
        nested = np.asarray([margins[c] for c in classes], dtype=np.float64)
        return ConformalPlan(coverage, margins, pooled, nested, float(np.mean(scores > nested)))
    positions = np.arange(len(scores), dtype=np.int64)
    folds = grouped_folds(positions, np.asarray(groups).astype(str), NESTED_FOLDS, NESTED_SEED)

    def nested_at(level: float) -> FloatArray:
        out = np.empty(len(scores))
        for fold in folds:
            rest = np.setdiff1d(positions, fold)
            margins, pooled = _class_margins(scores[rest], classes[rest], level)
            out[fold] = [margins.get(c, pooled) for c in classes[fold]]
        return out

    lo, hi = 0, len(LEVEL_GRID) - 1
    if np.mean(scores > nested_at(LEVEL_GRID[hi])) > 1.0 - coverage:
        lo = hi  # not even the highest level: take it (the largest scores)
    while lo < hi:
        mid = (lo + hi) // 2
        if np.mean(scores > nested_at(LEVEL_GRID[mid])) <= 1.0 - coverage:
            hi = mid
        else:
            lo = mid + 1
    level = float(LEVEL_GRID[lo])
    nested = nested_at(level)
    margins, pooled = _class_margins(scores, classes, level)
    return ConformalPlan(level, margins, pooled, nested, float(np.mean(scores > nested)))


#: Nominal levels `conformal_plan` chooses from.
LEVEL_GRID: tuple[float, ...] = tuple(round(0.5 + 0.0025 * i, 4) for i in range(200))  # 0.5 .. 0.9975


def at_coverage(model: FittedModel, data: Dataset, coverage: float) -> FittedModel:
    """The same fitted model with its margins recalibrated, on the same held-out jobs, to another
    coverage (the coverage / over-reservation trade-off `deepres evaluate` reports)."""
    if model.held_out is None:
        raise ValueError(f"{model.name} has no calibration scores to recalibrate from")
    other = replace(model, family_shifts={})
    set_margins(other, data, *model.held_out[:3], coverage, model.held_out[3])
    if model.without_shapes is not None:
        other.without_shapes = at_coverage(model.without_shapes, data.without_shapes(), coverage)
    return other


def _fit_estimators(name: str, data: Dataset, rows: npt.NDArray[np.int64], seed: int, epochs_scale: float,
                    settings: dict[str, Any] | None, progress: Callable[[int, float], None] | None) -> FittedModel:
    """Model `name` fitted on `rows`, without margins; physics models hold predictions to the family ranges."""
    model = _fit_learner(name, data, rows, seed, epochs_scale, settings, progress)
    if model.feature_set == "physics":
        model.target_ranges = target_ranges(data, model.feature_set, rows)
    return model


def _fit_learner(name: str, data: Dataset, rows: npt.NDArray[np.int64], seed: int, epochs_scale: float,
                 settings: dict[str, Any] | None, progress: Callable[[int, float], None] | None) -> FittedModel:
    torch.set_num_threads(TRAIN_THREADS)
    if name == "transformer_bigru_paper":
        config = paper_config()
        epochs = max(1, round(config.epochs * epochs_scale))
        x = data.seed_x.values
        # the paper predicts one target per network: one network per target
        estimators: list[Any] = [
            TransformerBiGRURegressor(config, (), seed, epochs=epochs, progress=progress).fit(
                x[rows], data.y[rows, k : k + 1]
            )
            for k in range(len(TARGETS))
        ]
        return FittedModel(name, estimators, "seed")
    if name == "transformer_bigru_tuned":
        config = tuned_config()
        epochs = max(1, round(config.epochs * epochs_scale))
        est = TransformerBiGRURegressor(config, data.physics_x.categorical, seed, epochs=epochs, progress=progress)
        trees = [BaselineRegressor(member, settings, seed).fit(data.fit_x(rows), data.fit_t(rows))
                 for member, settings in BLEND_TREES.items()]
        return FittedModel(name, [est.fit(data.fit_x(rows), data.fit_t(rows)), *trees], "physics", blend=True)
    if name in BASELINES:
        est_b = BaselineRegressor(name, settings, seed).fit(data.fit_x(rows), data.fit_t(rows))
        return FittedModel(name, [est_b], "physics")
    raise ValueError(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")


def fit_model(
    name: str,
    data: Dataset,
    split: Split,
    seed: int,
    *,
    epochs_scale: float = 1.0,
    settings: dict[str, Any] | None = None,
    progress: Callable[[int, float], None] | None = None,
    coverage: float = UPPER_COVERAGE,
    cv_folds: int = CV_FOLDS,
) -> FittedModel:
    """Fit model `name` on the split's training rows and calibrate its memory bound on architecture
    groups it did not fit (the same procedure for every model).

    `cv_folds` >= 2 (and at least that many groups): grouped cross-validation, i.e. `cv_folds` fits
    each without one fold of whole groups give an out-of-fold raw bound for every training row, the
    margins come from all of them, and the model itself is then fitted on every training row (the
    CV+ recipe: more calibration architectures than a single held-out fold, none lost to fitting).
    Otherwise a single calibration fold of CALIBRATION_FRACTION of the groups is held out.
    """
    train = split.train
    n_groups = len(set(data.groups[train].tolist()))
    if cv_folds >= 2 and n_groups >= cv_folds:
        point = np.empty(len(train))
        in_range = np.empty(len(train), dtype=bool)
        quantile: FloatArray | None = None
        bare_point = np.empty(len(train))
        bare_quantile: FloatArray | None = None
        has_bare = False
        for fold in grouped_folds(train, data.groups, cv_folds, seed):
            inner_rows = np.setdiff1d(train, fold)
            inner = _fit_estimators(name, data, inner_rows, seed, epochs_scale, settings, None)
            x = (data.physics_x if inner.feature_set == "physics" else data.seed_x).values[fold]
            at = np.searchsorted(train, fold)
            points, upper = inner.raw_both(x, data.families[fold])
            point[at] = points[:, 0]
            in_range[at] = range_factors(data, fold, input_ranges(data, inner_rows)) == 1.0
            if upper is not None:
                quantile = np.empty(len(train)) if quantile is None else quantile
                quantile[at] = upper
            bare_fold = _without_shapes_predictions(inner, data, fold)
            if bare_fold is not None:
                has_bare = True
                bare_point[at] = bare_fold[0]
                if bare_fold[1] is not None:
                    bare_quantile = np.empty(len(train)) if bare_quantile is None else bare_quantile
                    bare_quantile[at] = bare_fold[1]
        model = _fit_estimators(name, data, train, seed, epochs_scale, settings, progress)
        shaped_margins(model, data, train, (point, quantile), (bare_point, bare_quantile) if has_bare else None,
                       coverage, in_range)
    else:
        fit_rows, cal_rows = grouped_calibration_split(train, data.groups, CALIBRATION_FRACTION, seed)
        model = _fit_estimators(name, data, fit_rows, seed, epochs_scale, settings, progress)
        calibrate(model, data, cal_rows, coverage, input_ranges(data, fit_rows))
    model.ranges = input_ranges(data, train)
    if model.without_shapes is not None:
        model.without_shapes.ranges = model.ranges
    return model


def score(model: FittedModel, data: Dataset, rows: npt.NDArray[np.int64]) -> dict[str, dict[str, float]]:
    """Metrics on the given rows: memory (with under_rate, over_reservation) and FLOPs."""
    points, upper = model.predict(data, rows)
    memory = regression_metrics(data.y[rows, 0], points[:, 0])
    memory["under_rate"] = under_rate(data.y[rows, 0], upper)
    memory["over_reservation"] = over_reservation(data.y[rows, 0], upper)
    return {"memory": memory, "flops": regression_metrics(data.y[rows, 1], points[:, 1])}


def input_ranges(data: Dataset, rows: npt.NDArray[np.int64]) -> dict[str, dict[str, list[float]]]:
    """Per family (model_type), the [min, max] of each sized input over the training rows: the
    runtime widens the bound and warns outside them."""
    out: dict[str, dict[str, list[float]]] = {}
    families = data.families[rows]
    for family in sorted(set(families.tolist())):
        sub = rows[families == family]
        out[str(family)] = {col: [float(data.cols[col][sub].min()), float(data.cols[col][sub].max())]
                            for col in INPUT_RANGE_COLUMNS}
    return out


def save_artifact(model: FittedModel, data: Dataset, out_dir: Path, seed: int,
                  metrics: dict[str, dict[str, float]], train_seconds: float, *,
                  train_rows: npt.NDArray[np.int64] | None = None, split: str = "grouped") -> Path:
    """Write weights (.npz) + metadata (version, data hash, normalisation, margins, ranges, metrics)."""
    est = model.estimators[0]
    if not isinstance(est, TransformerBiGRURegressor):
        raise TypeError("only the Transformer-BiGRU is shipped")
    weights, meta = est.get_state()
    arrays: dict[str, Any] = dict(weights)
    blend = None
    if model.blend:
        booster, adaboost = model.estimators[1:]
        for k, target in enumerate(booster.estimators_):
            arrays.update(from_lightgbm_dump(target.booster_.dump_model()).arrays(f"{TREE_PREFIX}{k}."))
        for k, target in enumerate(adaboost.estimators_):
            ensemble, tree_weights = from_sklearn_adaboost(target)
            arrays.update(ensemble.arrays(f"{ADABOOST_PREFIX}{k}."))
            arrays[f"{ADABOOST_PREFIX}{k}.weights"] = tree_weights
        blend = {"rule": "median", "members": list(BLEND_MEMBERS),
                 "settings": {"lightgbm": booster.settings, "adaboost": adaboost.settings},
                 "targets": len(booster.estimators_)}
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out_dir / WEIGHTS_FILE, **arrays)
    (out_dir / "transformer_bigru_tuned.pt").unlink(missing_ok=True)  # the torch-format weights of old releases
    rows = train_rows if train_rows is not None else np.arange(data.n_rows, dtype=np.int64)
    metadata = {
        "version": f"tbgru{'-lgbm-ada' if blend is not None else ''}-{data.sha256[:10]}-s{seed}",
        "model": model.name,
        "data_sha256": data.sha256,
        "data_rows": data.n_rows,
        "seed": seed,
        "split": split,
        "feature_set": model.feature_set,
        "feature_names": list(data.physics_x.names),
        "targets": list(TARGETS),
        "memory_upper_shift": model.memory_shift,
        "memory_upper_shift_by_family": model.family_shifts,
        "memory_upper_shift_unseen_family": model.unseen_shift,
        "memory_upper_without_shapes": None if model.without_shapes is None else {
            "base": model.without_shapes.bound_source, "shift": model.without_shapes.memory_shift,
            "by_family": model.without_shapes.family_shifts, "unseen_family": model.without_shapes.unseen_shift},
        "memory_upper_base": model.bound_source,
        "memory_upper_level": model.level,
        "memory_upper_level_without_shapes": None if model.without_shapes is None else model.without_shapes.level,
        "target_ranges": model.target_ranges,
        "memory_calibration": dict(zip(("context_mib", "factor"), data.terms.calibration, strict=True)),
        "upper_coverage": model.coverage,
        "input_ranges": model.ranges or input_ranges(data, rows),
        "estimator": meta,
        "blend": blend,
        "metrics_test": metrics,
        "train_seconds": round(train_seconds, 1),
        "torch_version": torch.__version__,
    }
    path = out_dir / METADATA_FILE
    path.write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the dataset (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT, help="artifact directory (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the split, the initialisation and shuffling")
    parser.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS,
                        help="train on a seeded random subset of this many rows (CPU budget; 0: all; "
                             "default %(default)s)")
    parser.add_argument("--cv-folds", type=int, default=CV_FOLDS,
                        help="grouped cross-validation folds that calibrate the bound (< 2: one held-out "
                             "calibration fold; default %(default)s)")
    parser.add_argument("--epochs-scale", type=float, default=1.0, help="scale the configured epochs (quick runs)")
    add_coverage_argument(parser)
    parser.add_argument("--split", choices=("grouped", "all"), default="all",
                        help="fit on every row (default: the shipped artifact) or on the grouped split's "
                             "training rows, reporting its test rows")


def add_coverage_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coverage", type=float, default=UPPER_COVERAGE,
                        help="share of held-out architectures' jobs the memory bound is calibrated to cover "
                             "(higher: fewer under-estimates, more memory reserved; default %(default)s)")


def check_coverage(coverage: float) -> None:
    from predictor.errors import UsageError

    if not 0.5 <= coverage < 1.0:
        raise UsageError(f"--coverage must be in [0.5, 1), got {coverage}")


def run(args: argparse.Namespace) -> int:
    from predictor.errors import UsageError

    check_coverage(args.coverage)
    try:
        data = load_dataset(args.data, args.max_rows or None, args.seed)
    except DatasetError as err:
        raise UsageError(str(err)) from None
    if args.epochs_scale <= 0:
        raise UsageError(f"--epochs-scale must be > 0, got {args.epochs_scale}")
    if args.split == "grouped":
        split = grouped_split(data.groups, 0.3, args.seed)
    else:
        split = Split("all", np.arange(data.n_rows, dtype=np.int64), np.zeros(0, dtype=np.int64))
    epochs = max(1, round(tuned_config().epochs * args.epochs_scale))
    print(f"training transformer_bigru_tuned on {len(split.train)} of {data.n_rows} jobs ({args.split} split) "
          f"({data.path.name} sha256 {data.sha256[:12]}), {epochs} epochs", flush=True)
    started = time.perf_counter()

    def progress(epoch: int, loss: float) -> None:
        bar.advance(note=f"loss {loss:.4f}")
        if not bar.drawn and (epoch % 10 == 0 or epoch == epochs):
            print(f"  epoch {epoch}/{epochs}  loss {loss:.4f}  {time.perf_counter() - started:.0f}s", flush=True)

    with Bar(epochs, "training", unit="epoch") as bar:
        model = fit_model("transformer_bigru_tuned", data, split, args.seed, epochs_scale=args.epochs_scale,
                          progress=progress, cv_folds=args.cv_folds, coverage=args.coverage)
    seconds = time.perf_counter() - started
    metrics = score(model, data, split.test) if len(split.test) else {}
    path = save_artifact(model, data, args.out, args.seed, metrics, seconds, train_rows=split.train, split=args.split)
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    if metrics:
        mem, flops = metrics["memory"], metrics["flops"]
        print(f"{args.split} test ({len(split.test)} jobs of unseen architectures): memory median "
              f"|rel err| {mem['median_abs_rel_err']:.3f}, p90 {mem['p90_abs_rel_err']:.3f}, "
              f"under-rate {mem['under_rate']:.3f}, over-reservation {mem['over_reservation']:.3f}; "
              f"FLOPs median |rel err| {flops['median_abs_rel_err']:.3f}")
    print(f"wrote {path.parent} ({size / 1024:.0f} KiB) in {seconds:.0f}s")
    return 0
