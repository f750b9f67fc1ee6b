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
pick; files go to --dir, default /tmp/bound-study.)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from predictor import train as T
from predictor.baselines import tune
from predictor.metrics import over_reservation, under_rate
from predictor.model import TransformerBiGRURegressor, tuned_config
from predictor.runtime import margin_for
from predictor.splits import grouped_calibration_split, grouped_folds, grouped_split


def fit(data: T.Dataset, name: str, rows: Any, seed: int, settings: dict[str, Any] | None) -> T.FittedModel:
    """`tbgru`: the tuned network alone; `blend`: the shipped recipe (network + LightGBM); else a baseline."""
    if name != "tbgru":
        return T._fit_estimators("transformer_bigru_tuned" if name == "blend" else name, data, rows, seed, 1.0,
                                 settings, None)
    network = TransformerBiGRURegressor(tuned_config(), data.physics_x.categorical, seed)
    model = T.FittedModel(name, [network.fit(data.fit_x(rows), data.fit_t(rows))], "physics")
    model.target_ranges = T.target_ranges(data, "physics", rows)
    return model


def collect(data: T.Dataset, member: str, out: Path) -> None:
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


def score(data: T.Dataset, blend: str, out: Path) -> str:
    members = [dict(np.load(out / f"{m}.npz")) for m in blend.split("+")]
    train, test, in_range = members[0]["train"], members[0]["test"], members[0]["in_range"]

    def geo(key: str) -> Any:
        return np.exp(np.mean([np.log(np.maximum(m[key], T.TINY)) for m in members], axis=0))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("collect", "score"))
    parser.add_argument("names", nargs="+", help="collect: tbgru:SEED or baseline names; score: a or a+b+...")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bound-study"))
    args = parser.parse_args()
    data = T.load_dataset(T.DEFAULT_DATA, T.DEFAULT_MAX_ROWS, 0)
    for name in args.names:
        if args.action == "collect":
            collect(data, name, args.dir)
        else:
            print(score(data, name, args.dir), flush=True)


if __name__ == "__main__":
    main()
