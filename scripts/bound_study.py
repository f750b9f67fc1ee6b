"""How much memory the bound would reserve with other learners or blends, measured on nested folds.

Why: `deepres evaluate` takes half an hour and scores one recipe on the test rows; choosing a recipe
must not look at them. This collects, once per learner, the out-of-fold predictions of the grouped
split's training rows (the same CV_FOLDS grouped folds `fit_model` uses) and the final fit's test
predictions, then scores any blend of collected learners (geometric mean of their densities) the way
`set_margins` calibrates the bound: nested grouped folds, lowest level at a 5% nested under-rate,
memory reserved on those folds. Test figures are printed after them, for the record only.

    PYTHONPATH=$PWD nice -n 19 python scripts/bound_study.py collect tbgru:0 lightgbm adaboost
    PYTHONPATH=$PWD python scripts/bound_study.py score tbgru_0 lightgbm tbgru_0+lightgbm

(`tbgru:SEED` is the tuned network alone with that seed, `blend:SEED` the shipped recipe, the network
blended with LightGBM; any baseline name is that baseline with the setting `deepres evaluate` would
pick; files go to --dir, default /tmp/bound-study. `score a~b~c` combines members by their median
instead of their geometric mean.)

Three studies of what else could narrow the bound, on the same collected predictions:

    PYTHONPATH=$PWD python scripts/bound_study.py local tbgru_0+lightgbm   # per-job width from neighbours
    PYTHONPATH=$PWD python scripts/bound_study.py slope tbgru_0+lightgbm   # the out-of-range widening
    PYTHONPATH=$PWD python scripts/bound_study.py rows lightgbm            # more rows of the same architectures

`local` asks whether the errors of the training jobs of *other* architectures nearest a job (in the
standardised physics features, family one-hot) say how far off its own prediction is: their mean
as a correction of the point, their spread or the distance to the nearest one as the scale of a
normalised conformal score. `slope` asks which widening per doubling out of the training ranges
the out-of-fold out-of-range jobs need (`runtime.OUT_OF_RANGE_SLOPE`). `rows` fits a learner on the
grouped split's training architectures with up to N rows of each from the full dataset (the default
subset has about 2.4) and scores the same test rows.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from predictor import train as T
from predictor import trainset as TS
from predictor.baselines import tune
from predictor.metrics import over_reservation, under_rate
from predictor.model import TransformerBiGRURegressor, tuned_config
from predictor.runtime import OUT_OF_RANGE_MAX_FACTOR, OUT_OF_RANGE_SLOPE, margin_for
from predictor.splits import grouped_calibration_split, grouped_folds, grouped_split


def fit(data: TS.Dataset, name: str, rows: Any, seed: int, settings: dict[str, Any] | None) -> T.FittedModel:
    """`tbgru`: the tuned network alone; `blend`: the shipped recipe (network + LightGBM); else a baseline."""
    if name != "tbgru":
        return T._fit_estimators("transformer_bigru_tuned" if name == "blend" else name, data, rows, seed, 1.0,
                                 settings, None)
    network = TransformerBiGRURegressor(tuned_config(), data.physics_x.categorical, seed)
    model = T.FittedModel(name, [network.fit(data.fit_x(rows), data.fit_t(rows))], "physics")
    model.target_ranges = T.target_ranges(data, "physics", rows)
    return model


def collect(data: TS.Dataset, member: str, out: Path) -> None:
    name, _, seed_text = member.partition(":")
    seed = int(seed_text or 0)
    train, test = (s := grouped_split(data.groups, 0.3, 0)).train, s.test
    settings: dict[str, Any] | None = None
    if name not in ("tbgru", "blend"):
        fit_rows, cal_rows = grouped_calibration_split(train, data.groups, T.CALIBRATION_FRACTION, 0)
        settings = tune(name, data.fit_x(fit_rows), data.fit_t(fit_rows), data.physics_x.values[cal_rows],
                        data.physics_t[cal_rows], 0)
    started = time.perf_counter()
    arrays = {k: np.full(len(train), np.nan) for k in ("oof_point", "oof_bpoint")}
    in_range = np.zeros(len(train), dtype=bool)
    bare_x = data.physics_x_bare if data.physics_x_bare is not None else data.physics_x
    for k, fold in enumerate(grouped_folds(train, data.groups, T.CV_FOLDS, 0)):
        inner_rows = np.setdiff1d(train, fold)
        inner = fit(data, name, inner_rows, seed, settings)
        at = np.searchsorted(train, fold)
        arrays["oof_point"][at] = inner.raw_both(data.physics_x.values[fold], data.families[fold])[0][:, 0]
        arrays["oof_bpoint"][at] = inner.raw_both(bare_x.values[fold], data.families[fold])[0][:, 0]
        in_range[at] = T.range_factors(data, fold, T.input_ranges(data, inner_rows)) == 1.0
        print(f"{member}: fold {k + 1}/{T.CV_FOLDS} ({time.perf_counter() - started:.0f}s)", flush=True)
    model = fit(data, name, train, seed, settings)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / f"{member.replace(':', '_')}.npz", train=train, test=test, in_range=in_range,
             test_point=model.raw_both(data.physics_x.values[test], data.families[test])[0][:, 0], **arrays)


def _members(blend: str, out: Path) -> tuple[Any, Any, Any, Any]:
    """(train rows, test rows, in_range of the train rows, combine(key)): `a+b` combines the members'
    `key` arrays by their geometric mean (the shipped blend's rule), `a~b~c` by their median."""
    sep = "~" if "~" in blend else "+"
    members = [dict(np.load(out / f"{m}.npz")) for m in blend.split(sep)]

    def combine(key: str) -> Any:
        logs = np.log(np.maximum(np.stack([m[key] for m in members]), T.TINY))
        return np.exp(np.median(logs, axis=0) if sep == "~" else np.mean(logs, axis=0))

    return members[0]["train"], members[0]["test"], members[0]["in_range"], combine


def score(data: TS.Dataset, blend: str, out: Path) -> str:
    train, test, in_range, geo = _members(blend, out)

    stated, bare = T.FittedModel(blend, [], "physics"), T.FittedModel(blend, [], "physics")
    T.set_margins(stated, data, train, geo("oof_point"), None, T.UPPER_COVERAGE, in_range)
    T.set_margins(bare, data.without_shapes(), train, geo("oof_bpoint"), None, T.UPPER_COVERAGE, in_range)
    rows = train[in_range]
    base = geo("oof_point")[in_range]
    terms = data.terms.take(rows)
    scores = np.log(data.physics_t[rows, 0] / base)
    plan = T.conformal_plan(scores, data.groups[rows], np.full(len(rows), T.ALL_FAMILIES), T.UPPER_COVERAGE)
    nested = np.maximum(terms.memory(base * np.exp(plan.nested_margins)), terms.memory(base))
    ranges = T.input_ranges(data, train)
    factors = T.range_factors(data, test, ranges)
    point = geo("test_point")
    stated_rows = data.physics_x.values[test, T.feats.PHYSICS_NAMES.index("activations_given")] > 0
    upper = np.empty(len(test))
    for model, mask in ((stated, stated_rows), (bare, ~stated_rows)):
        shift = np.asarray([margin_for(str(f), model.family_shifts, model.memory_shift, model.unseen_shift, ranges)
                            for f in data.families[test[mask]]])
        t = data.terms.take(test[mask])
        upper[mask] = np.maximum(t.memory(point[mask] * np.exp(shift) * factors[mask]), t.memory(point[mask]))
    truth = data.y[test, 0]
    rel = np.abs(data.terms.take(test).memory(point) / truth - 1.0)
    return (f"{blend:<36} nested: level {plan.level:.4f} under {plan.nested_under:.3f} over "
            f"{np.mean(nested / data.y[rows, 0]) - 1:.3f} | test (not for choosing): median {np.median(rel):.3f} "
            f"p90 {np.percentile(rel, 90):.3f} under {under_rate(truth, upper):.3f} "
            f"over {over_reservation(truth, upper):.3f}")


def _nested(scores: Any, groups: Any, shift: Any, scale: Any) -> tuple[float, Any]:
    """(level, per-job nested margin) of the normalised score (scores - shift) / scale: the lowest
    LEVEL_GRID level whose margins, each fold's computed without it, leave at most 1 - UPPER_COVERAGE
    of the jobs above them (the folds and rank rule of `conformal_plan`)."""
    positions = np.arange(len(scores))
    folds = grouped_folds(positions, np.asarray(groups).astype(str), T.NESTED_FOLDS, T.NESTED_SEED)
    z = (scores - shift) / scale

    def nested_at(level: float) -> Any:
        out = np.empty(len(scores))
        for fold in folds:
            out[fold] = shift[fold] + T.conformal_quantile(z[np.setdiff1d(positions, fold)], level) * scale[fold]
        return out

    grid = T.LEVEL_GRID
    lo, hi = 0, len(grid) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if np.mean(scores > nested_at(grid[mid])) <= 1.0 - T.UPPER_COVERAGE else (mid + 1, hi)
    return float(grid[lo]), nested_at(grid[lo])


def _neighbour_features(data: TS.Dataset, rows: Any, train: Any) -> Any:
    """Physics features standardised over the training rows, plus a family one-hot that outweighs them
    (a neighbour is of the same family wherever one exists)."""
    x = data.physics_x.values[:, : len(T.feats.PHYSICS_NAMES) - 1]  # all but activations_given
    mu, sd = x[train].mean(axis=0), x[train].std(axis=0) + 1e-9
    families = np.asarray(sorted(set(data.families.tolist())))
    return np.hstack([(x[rows] - mu) / sd, 10.0 * (data.families[rows][:, None] == families[None, :])])


def local(data: TS.Dataset, blend: str, out: Path) -> list[str]:
    """Normalised conformal scores from each job's nearest out-of-fold jobs of other architectures."""
    train, test, in_range, geo = _members(blend, out)
    rows, base = train[in_range], geo("oof_point")[in_range]
    scores = np.log(data.physics_t[rows, 0] / base)
    groups = data.groups[rows]
    pool_x = _neighbour_features(data, rows, train)

    def near(qx: Any, qgroups: Any, k: int) -> tuple[Any, Any]:
        d = ((qx[:, None, :] - pool_x[None, :, :]) ** 2).sum(axis=-1)
        d[qgroups[:, None] == groups[None, :]] = np.inf  # never the job's own architecture
        idx = np.argsort(d, axis=1)[:, :k]
        return scores[idx], np.sqrt(np.take_along_axis(d, idx, axis=1)[:, 0])

    def recipe(kind: str, k: int, qx: Any, qgroups: Any) -> tuple[Any, Any]:
        """(shift, scale) of the score per job."""
        s, dist = near(qx, qgroups, k)
        zero, one = np.zeros(len(qx)), np.ones(len(qx))
        return {"pooled": (zero, one), "shift": (s.mean(axis=1), one), "half shift": (0.5 * s.mean(axis=1), one),
                "spread": (zero, s.std(axis=1) + 0.05), "distance": (zero, 1.0 + 0.3 * dist)}[kind]

    terms, memory = data.terms.take(rows), data.y[rows, 0]
    t_terms, t_memory = data.terms.take(test), data.y[test, 0]
    ranges = T.input_ranges(data, train)
    factors = T.range_factors(data, test, ranges)
    point = geo("test_point")
    test_x = _neighbour_features(data, test, train)
    lines = []
    for kind, k in (("pooled", 1), ("shift", 10), ("shift", 40), ("half shift", 40), ("spread", 10),
                    ("spread", 40), ("distance", 1)):
        shift, scale = recipe(kind, k, pool_x, groups)
        level, nested_margin = _nested(scores, groups, shift, scale)
        nested = np.maximum(terms.memory(base * np.exp(nested_margin)), terms.memory(base))
        t_shift, t_scale = recipe(kind, k, test_x, data.groups[test])
        margin = t_shift + T.conformal_quantile((scores - shift) / scale, level) * t_scale
        upper = np.maximum(t_terms.memory(point * np.exp(margin) * factors), t_terms.memory(point * np.exp(t_shift)))
        lines.append(f"{kind:<10} k={k:<3} nested: level {level:.4f} under {np.mean(scores > nested_margin):.3f} "
                     f"over {np.mean(nested / memory) - 1:.3f} | test (not for choosing): "
                     f"under {under_rate(t_memory, upper):.3f} over {over_reservation(t_memory, upper):.3f}")
    return lines


def slope(data: TS.Dataset, blend: str, out: Path) -> list[str]:
    """Share of the out-of-fold jobs outside their fit's training ranges above the in-range margin,
    for widening slopes per doubling out (the runtime's rule: 2^(slope x doublings), at most x4)."""
    train, _, in_range, geo = _members(blend, out)
    doublings = np.zeros(len(train))
    for fold in grouped_folds(train, data.groups, T.CV_FOLDS, 0):
        factors = T.range_factors(data, fold, T.input_ranges(data, np.setdiff1d(train, fold)))
        doublings[np.searchsorted(train, fold)] = np.log2(factors) / OUT_OF_RANGE_SLOPE
    scores = np.log(data.physics_t[train, 0] / geo("oof_point"))
    margin = T.conformal_plan(scores[in_range], data.groups[train][in_range],
                              np.full(int(in_range.sum()), T.ALL_FAMILIES), T.UPPER_COVERAGE).pooled
    out_rows = ~in_range
    lines = [f"in-range margin {margin:.3f}; {int(out_rows.sum())} out-of-fold jobs out of range "
             f"({len(set(data.groups[train][out_rows].tolist()))} groups)"]
    for s in (0.0, 0.2, 0.3, 0.5, 0.75, 1.0):
        widening = np.minimum(s * np.log(2.0) * doublings[out_rows], np.log(OUT_OF_RANGE_MAX_FACTOR))
        lines.append(f"slope {s:<4}: above the bound {np.mean(scores[out_rows] - margin > widening):.3f}"
                     + ("  (served)" if s == OUT_OF_RANGE_SLOPE else ""))
    return lines


def rows_study(learner: str) -> list[str]:
    """A learner fitted on the grouped split's training architectures with up to N rows of each."""
    full = TS.load_dataset(TS.DEFAULT_DATA, None, 0)
    keep = np.sort(np.random.default_rng(0).choice(len(full.y), T.DEFAULT_MAX_ROWS, replace=False))
    subset = TS.load_dataset(TS.DEFAULT_DATA, T.DEFAULT_MAX_ROWS, 0)
    split = grouped_split(subset.groups, 0.3, 0)
    test = keep[split.test]  # the subset's test rows, as rows of the full dataset
    settings = {"num_leaves": 15} if learner == "lightgbm" else None
    train_groups = np.isin(full.groups, sorted(set(subset.groups[split.train].tolist())))
    candidates = np.flatnonzero(train_groups)
    arch = np.char.add(full.groups[candidates].astype(str), full.cols["params_millions"][candidates].astype(str))
    lines = []
    for per_arch in (0, 8, 20, 50):
        if per_arch == 0:
            rows = keep[split.train]
        else:
            order = np.random.default_rng(1).permutation(len(candidates))
            rank = np.zeros(len(order), dtype=np.int64)
            taken: dict[str, int] = {}
            for i in order:
                taken[arch[i]] = taken.get(arch[i], 0) + 1
                rank[i] = taken[arch[i]]
            rows = np.sort(candidates[rank <= per_arch])
        model = T._fit_estimators(learner, full, rows, 0, 1.0, settings, None)
        point = model.raw_both(full.physics_x.values[test], full.families[test])[0][:, 0]
        score = np.log(full.physics_t[test, 0] / np.maximum(point, T.TINY))
        rel = np.abs(full.terms.take(test).memory(point) / full.y[test, 0] - 1.0)
        label = "the subset" if per_arch == 0 else f"<= {per_arch} per architecture"
        lines.append(f"{learner} {label:<26} {len(rows):>6} rows | test: log error of the learned term 95th pct "
                     f"{np.percentile(score, 95):.3f}, memory median {np.median(rel):.3f} "
                     f"p90 {np.percentile(rel, 90):.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("collect", "score", "local", "slope", "rows"))
    parser.add_argument("names", nargs="+", help="collect: tbgru:SEED or baseline names; score: a or a+b+...")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bound-study"))
    args = parser.parse_args()
    if args.action == "rows":
        for name in args.names:
            print("\n".join(rows_study(name)), flush=True)
        return
    data = TS.load_dataset(TS.DEFAULT_DATA, T.DEFAULT_MAX_ROWS, 0)
    for name in args.names:
        if args.action == "collect":
            collect(data, name, args.dir)
        elif args.action == "score":
            print(score(data, name, args.dir), flush=True)
        else:
            print("\n".join((local if args.action == "local" else slope)(data, name, args.dir)), flush=True)


if __name__ == "__main__":
    main()
