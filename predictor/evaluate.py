"""`deepres evaluate`: every model on every split, per family, and what serving costs; the report.

Models: the paper's Transformer-BiGRU, our tuned one, and the seven baselines. Splits
(`predictor.splits`): **grouped** (30% of the architecture groups held out: the headline, what a
user with a model the predictor never saw meets), **leave_family_out** (one fold per family, test
predictions pooled over folds) and the seed's **random** 70/30 (for the paper's comparison). Every
model is fitted by the same `predictor.train.fit_model` (grouped cross-validation over the
training rows calibrates the memory upper bound, then one fit on all of them), so the grouped row
of the tuned model is the recipe of the shipped artifact.

Writes `reports/predictor.json` (keys fixed by the issue; other tools read them), `reports/predictor.md`
and its plots. Each fit's test predictions are kept in `<out>/.evaluate-cache/` (keyed by data hash,
model, fold, seed, epochs, coverage and settings), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from predictor.baselines import BASELINES, tune
from predictor.metrics import bound_figures, over_reservation, regression_metrics, under_rate
from predictor.predictions import CURVE_COVERAGES, Predictions
from predictor.progress import Bar
from predictor.splits import Split, family_splits, grouped_calibration_split, grouped_split, random_split
from predictor.train import (
    CALIBRATION_FRACTION,
    CV_FOLDS,
    DEFAULT_MAX_ROWS,
    MODELS,
    add_coverage_argument,
    at_coverage,
    check_coverage,
    fit_model,
)
from predictor.trainset import DEFAULT_DATA, REPO_ROOT, Dataset, DatasetError, load_dataset

log = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]
REPORTS = REPO_ROOT / "reports"
SPLITS: tuple[str, ...] = ("grouped", "leave_family_out", "random")
#: Memory metrics written per model and split (the issue names the first five).
JSON_KEYS_MEMORY: tuple[str, ...] = (
    "median_abs_rel_err", "p90_abs_rel_err", "under_rate", "over_reservation", "rmse", "mse", "mae", "mape", "r2",
)
JSON_KEYS_FLOPS: tuple[str, ...] = ("median_abs_rel_err", "p90_abs_rel_err", "rmse", "mse", "mae", "mape", "r2")
FAMILY_KEYS: tuple[str, ...] = ("median_abs_rel_err", "p90_abs_rel_err", "under_rate", "over_reservation",
                                "signed_median_rel_err")
NETWORKS = ("transformer_bigru_paper", "transformer_bigru_tuned")
#: Models fitted on the leave-family-out folds by default (every fold repeats the whole CV+ recipe).
FAMILY_MODELS = ("transformer_bigru_tuned", "decision_tree", "xgboost", "lightgbm", "catboost")
CACHE_DIR = ".evaluate-cache"
#: Bumped whenever what a cached fit holds changes meaning (e.g. how the bound is computed).
CACHE_VERSION = 7
#: Bumped when what the tuned model is changed (its bound's base; 2: the network blended with LightGBM;
#: 3: the median of the network, LightGBM and AdaBoost).
BOUND_CHOICE_VERSION = 3


def metrics_of(data: Dataset, preds: Predictions) -> dict[str, dict[str, float]]:
    rows, points, upper = preds.arrays()
    memory = regression_metrics(data.y[rows, 0], points[:, 0])
    memory["under_rate"] = under_rate(data.y[rows, 0], upper)
    memory["over_reservation"] = over_reservation(data.y[rows, 0], upper)
    return {"memory": memory, "flops": regression_metrics(data.y[rows, 1], points[:, 1])}


def family_metrics(data: Dataset, preds: Predictions) -> dict[str, dict[str, float]]:
    """Memory metrics per report family (the dataset's `family` column) of the pooled test rows."""
    rows, points, upper = preds.arrays()
    truth = data.y[rows, 0]
    families = data.report_families[rows]
    out: dict[str, dict[str, float]] = {}
    for family in sorted(set(families.tolist())):
        m = families == family
        rel = points[m, 0] / truth[m] - 1.0
        out[str(family)] = {
            "n": float(m.sum()),
            "median_abs_rel_err": float(np.median(np.abs(rel))),
            "p90_abs_rel_err": float(np.percentile(np.abs(rel), 90)),
            "signed_median_rel_err": float(np.median(rel)),
            "under_rate": under_rate(truth[m], upper[m]),
            "over_reservation": over_reservation(truth[m], upper[m]),
        }
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the dataset (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPORTS, help="report directory (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="also print reports/predictor.json to stdout")
    parser.add_argument("--seed", type=int, default=0, help="seed for splits, initialisation and shuffling")
    parser.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS,
                        help="evaluate on a seeded random subset of this many rows (CPU budget; 0: all; "
                             "default %(default)s)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of %(default)s")
    parser.add_argument("--splits", default=",".join(SPLITS), help="comma-separated subset of %(default)s")
    parser.add_argument("--family-models", default=",".join(FAMILY_MODELS),
                        help="models fitted on the leave-family-out folds ('all': every one of --models; "
                             "default %(default)s: the paper's network and the slower trees skipped for CPU)")
    parser.add_argument("--epochs-scale", type=float, default=1.0,
                        help="epochs of the networks on the grouped and random splits, relative to their "
                             "configuration (default %(default)s)")
    parser.add_argument("--fold-epochs-scale", type=float, default=0.25,
                        help="epochs of the networks on the leave-family-out folds (default %(default)s)")
    parser.add_argument("--cv-folds", type=int, default=CV_FOLDS,
                        help="grouped cross-validation folds that calibrate the bound on the grouped and random "
                             "splits (< 2: one held-out calibration fold; default %(default)s)")
    parser.add_argument("--fold-cv-folds", type=int, default=2,
                        help="the same on the leave-family-out folds (default %(default)s)")
    parser.add_argument("--random-cv-folds", type=int, default=1,
                        help="the same on the random split (default %(default)s: one held-out calibration fold)")
    add_coverage_argument(parser)
    parser.add_argument("--no-tune", action="store_true", help="skip the baselines' grid (use the first setting)")
    parser.add_argument("--artifact", type=Path, default=None,
                        help="artifact whose runtime is measured (default: the shipped one)")
    parser.add_argument("--no-runtime", action="store_true", help="skip the fresh-process runtime measurement")
    parser.add_argument("--exact-runs", type=int, default=300,
                        help="held-out measured MLP runs the exact path is checked on (0 skips; default %(default)s)")


def _names(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    from predictor.errors import UsageError

    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = sorted(set(names) - set(allowed))
    if unknown or not names:
        raise UsageError(f"{flag}: unknown {', '.join(unknown) or '(none)'}; expected names from {', '.join(allowed)}")
    return names


def run(args: argparse.Namespace) -> int:
    from predictor.errors import UsageError

    models = _names(args.models, MODELS, "--models")
    family_models = models if args.family_models == "all" else _names(args.family_models, MODELS, "--family-models")
    split_names = _names(args.splits, SPLITS, "--splits")
    check_coverage(args.coverage)
    for flag, value in (("--epochs-scale", args.epochs_scale), ("--fold-epochs-scale", args.fold_epochs_scale)):
        if not 0 < value <= 1:
            raise UsageError(f"{flag} must be in (0, 1], got {value}")
    try:
        data = load_dataset(args.data, args.max_rows or None, args.seed)
    except DatasetError as err:
        raise UsageError(str(err)) from None

    started = time.perf_counter()
    grouped = grouped_split(data.groups, 0.3, args.seed)
    settings = _tune_baselines(data, grouped, sorted({m for m in models + family_models if m in BASELINES}),
                               args, started)
    plan: list[tuple[str, list[Split], float, list[str], int]] = []
    if "grouped" in split_names:
        plan.append(("grouped", [grouped], args.epochs_scale, models, args.cv_folds))
    if "leave_family_out" in split_names:
        plan.append(("leave_family_out", family_splits(data.report_families), args.fold_epochs_scale, family_models,
                     args.fold_cv_folds))
    if "random" in split_names:
        random_cv = args.random_cv_folds
        plan.append(("random", [random_split(data.n_rows, 0.3, args.seed)], args.epochs_scale, models, random_cv))
    total = sum(len(splits) * len(names) for _, splits, _, names, _ in plan)
    done = 0
    cache = args.out / CACHE_DIR
    results: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    by_family: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    predictions: dict[str, dict[str, Predictions]] = {}
    results_bare: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    by_family_bare: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    print(f"evaluating {len(models)} models on {data.n_rows} jobs of {len(set(data.groups.tolist()))} architecture "
          f"groups ({data.path.name} sha256 {data.sha256[:12]}), {total} fits", flush=True)
    bare = data.without_shapes()
    predictions_bare: dict[str, dict[str, Predictions]] = {}
    bar = Bar(total, "fitting", unit="fit").open()
    for split_name, splits, scale, names, cv_folds in plan:
        predictions[split_name] = {m: Predictions() for m in names}
        predictions_bare[split_name] = {m: Predictions() for m in names}
        for split in splits:
            for model_name in names:
                t0 = time.perf_counter()
                key = _cache_key(data, model_name, split, args.seed, scale, [settings.get(model_name), cv_folds],
                                 args.coverage)
                hit = _cache_load(cache, key, split.test)
                bare_hit = _cache_load(cache, key + "-bare", split.test)
                if hit is None or bare_hit is None:
                    model = fit_model(model_name, data, split, args.seed, epochs_scale=scale,
                                      settings=settings.get(model_name), cv_folds=cv_folds, coverage=args.coverage)
                    points, upper = model.predict(data, split.test)
                    bounds = np.stack([at_coverage(model, data, c).predict(data, split.test)[1]
                                       for c in CURVE_COVERAGES])
                    _cache_save(cache, key, points, upper, bounds)
                    curve: FloatArray | None = bounds
                    bare_points, bare_upper = model.predict(bare, split.test)  # the same jobs without shapes
                    _cache_save(cache, key + "-bare", bare_points, bare_upper, np.zeros(0))
                else:
                    points, upper, curve = hit
                    bare_points, bare_upper, _ = bare_hit
                predictions[split_name][model_name].add(split.test, points, upper, curve)
                predictions_bare[split_name][model_name].add(split.test, bare_points, bare_upper)
                done += 1
                bar.advance(note=f"{split_name} {model_name}")
                one = Predictions()
                one.add(split.test, points, upper)
                fold = metrics_of(data, one)["memory"]
                print(f"[{done}/{total}] {split.name:<28} {model_name:<24} memory median |rel| "
                      f"{fold['median_abs_rel_err']:6.3f} p90 {fold['p90_abs_rel_err']:6.3f} under "
                      f"{fold['under_rate']:5.3f} over {fold['over_reservation']:6.3f}"
                      f"{' (cached)' if hit is not None else ''} ({time.perf_counter() - t0:.0f}s, "
                      f"total {time.perf_counter() - started:.0f}s)", flush=True)
        results[split_name] = {m: metrics_of(data, predictions[split_name][m]) for m in names}
        by_family[split_name] = {m: family_metrics(data, predictions[split_name][m]) for m in names}
        results_bare[split_name] = {m: metrics_of(data, predictions_bare[split_name][m]) for m in names}
        by_family_bare[split_name] = {m: family_metrics(data, predictions_bare[split_name][m]) for m in names}
    bar.close()

    runtime: dict[str, Any] | None = None
    if not args.no_runtime:
        from predictor.bench import runtime_figures

        runtime = runtime_figures(args.artifact)
    else:  # keep what `deepres bench predictor` last wrote
        try:
            runtime = json.loads((args.out / "predictor.json").read_text()).get("runtime")
        except (OSError, ValueError, AttributeError):
            runtime = None
    curves = {split: {m: p.coverage_curve(data) for m, p in by_model.items()}
              for split, by_model in predictions.items()}
    report = build_json(results, by_family, {"grouped": len(grouped.test), "grouped_train": len(grouped.train)},
                        _calibration(args.out), _exact(cache, args.exact_runs) if args.exact_runs else
                        {"median_abs_rel_err": None, "under_rate": None, "note": "skipped (--exact-runs 0)"}, runtime,
                        args.coverage, curves)
    for split_name, by_model in predictions.items():
        if "transformer_bigru_tuned" in by_model:
            report["splits"][split_name]["hindsight_bound"] = {
                "transformer_bigru_tuned": hindsight_bound(data, by_model["transformer_bigru_tuned"], args.coverage)}
    add_without_shapes(report, build_json(results_bare, by_family_bare, {}, {}, {}, None, args.coverage))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predictor.json").write_text(json.dumps(report, indent=2) + "\n")
    elapsed = time.perf_counter() - started
    context = {
        "rows": data.n_rows, "sha256": data.sha256, "data": _display_path(data.path), "seed": args.seed,
        "settings": settings, "epochs_scale": args.epochs_scale, "fold_epochs_scale": args.fold_epochs_scale,
        "elapsed_s": elapsed, "n_groups": len(set(data.groups.tolist())),
        "n_test": {name: len(splits[0].test) for name, splits, _, _, _ in plan if len(splits) == 1},
        "cv_folds": args.cv_folds, "fold_cv_folds": args.fold_cv_folds,
        "random_cv_folds": args.random_cv_folds,
        "family_models": family_models, "max_rows": args.max_rows,
        "families": sorted(set(data.report_families.tolist())), "coverage": args.coverage,
    }
    from predictor.report import write_markdown, write_plots

    write_plots(data, predictions, results, args.out)
    write_markdown(report, results, by_family, context, args.out)
    if args.json:
        print(json.dumps(report, indent=2))
    print(f"wrote {args.out / 'predictor.json'} and {args.out / 'predictor.md'} in {elapsed / 60:.1f} min")
    return 0


def build_json(results: dict[str, dict[str, dict[str, dict[str, float]]]],
               by_family: dict[str, dict[str, dict[str, dict[str, float]]]], n_test: dict[str, int],
               calibration: dict[str, float | None], exact: dict[str, Any],
               runtime: dict[str, Any] | None, coverage: float,
               curves: dict[str, dict[str, list[dict[str, float]]]] | None = None) -> dict[str, Any]:
    """The issue's shape: splits.<split>.memory.<model>.<metric>, plus per-family, exact and runtime sections."""
    splits: dict[str, Any] = {}
    for split_name, by_model in results.items():
        families = by_family.get(split_name, {})
        splits[split_name] = {
            "memory": {m: {k: _finite(v["memory"][k]) for k in JSON_KEYS_MEMORY} for m, v in by_model.items()},
            "flops": {m: {k: _finite(v["flops"][k]) for k in JSON_KEYS_FLOPS} for m, v in by_model.items()},
            "memory_by_family": {
                family: {m: {k: _finite(families[m][family][k]) for k in (*FAMILY_KEYS, "n")}
                         for m in families if family in families[m]}
                for family in sorted({f for per in families.values() for f in per})
            },
        }
        if split_name in n_test:
            splits[split_name]["n_test"] = n_test[split_name]
        if curves and curves.get(split_name):
            splits[split_name]["coverage_curve"] = {m: c for m, c in curves[split_name].items() if c}
    return {"splits": splits, "exact": exact, "runtime": runtime or {"imports_torch": None, "p99_ms": None},
            "calibration": calibration, "upper_coverage": coverage}


def hindsight_bound(data: Dataset, preds: Predictions, coverage: float) -> dict[str, float]:
    """What the tightest bound of its kind would give with hindsight: one margin on the point memory set
    to the `coverage` quantile of log(real / point) over the test jobs themselves (not a method: it looks
    at the answers; the floor any bound calibrated without them pays for these point errors)."""
    rows, points, _ = preds.arrays()
    truth = data.y[rows, 0]
    scores = np.sort(np.log(truth / points[:, 0]))
    margin = float(scores[max(1, int(np.ceil(len(scores) * coverage - 1e-9))) - 1])  # the tightest with <= 1 - c under
    bound = points[:, 0] * np.exp(margin)
    return {"coverage": coverage, "margin": round(margin, 6), "under_rate": round(under_rate(truth, bound), 6),
            "over_reservation": round(over_reservation(truth, bound), 6)}


def add_without_shapes(report: dict[str, Any], bare: dict[str, Any]) -> None:
    """Put the figures of the same test jobs without the optional activation count (`activations-millions`:
    what a user who leaves it out meets) next to each split's own, under
    `memory_without_shapes` and `memory_by_family_without_shapes`."""
    for split_name, figures in bare["splits"].items():
        report["splits"][split_name]["memory_without_shapes"] = figures["memory"]
        report["splits"][split_name]["memory_by_family_without_shapes"] = figures["memory_by_family"]


def _finite(value: float) -> float | None:
    return round(float(value), 6) if np.isfinite(value) else None


def _cache_key(data: Dataset, model: str, split: Split, seed: int, scale: float, settings: Any,
               coverage: float) -> str:
    test = hashlib.sha256(np.asarray(split.test, dtype=np.int64).tobytes()).hexdigest()[:16]
    version = [CACHE_VERSION, BOUND_CHOICE_VERSION] if model == "transformer_bigru_tuned" else CACHE_VERSION
    text = json.dumps([version, data.sha256, model, split.name, test, seed, scale, coverage,
                       CALIBRATION_FRACTION, settings], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_load(cache: Path, key: str,
                rows: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray, FloatArray | None] | None:
    path = cache / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as archive:
            points, upper = np.asarray(archive["points"]), np.asarray(archive["upper"])
            curve = np.asarray(archive["curve"]) if "curve" in archive.files else None
    except (OSError, KeyError, ValueError):
        return None
    if curve is not None and curve.shape != (len(CURVE_COVERAGES), len(rows)):
        curve = None
    return (points, upper, curve) if len(points) == len(rows) == len(upper) else None


def _cache_save(cache: Path, key: str, points: FloatArray, upper: FloatArray, curve: FloatArray) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{key}.tmp.npz"
    np.savez(tmp, points=points, upper=upper, curve=curve)
    tmp.replace(cache / f"{key}.npz")


def _calibration(reports: Path) -> dict[str, float | None]:
    """The dataset's held-out calibration error, copied from reports/calibration.json."""
    path = reports / "calibration.json"
    try:
        data = json.loads(path.read_text())
        return {k: float(data[k]) for k in ("median_abs_rel_err", "p90_abs_rel_err")}
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("no calibration figures (%s: %s); run `deepres dataset` first", path, err)
        return {"median_abs_rel_err": None, "p90_abs_rel_err": None}


def _exact(cache: Path, n: int) -> dict[str, Any]:
    """The exact-architecture path's held-out figures: `predictor.exact.heldout_metrics()` when the
    exact path provides it, else `exact_heldout` here."""
    import importlib

    try:
        figures = getattr(importlib.import_module("predictor.exact"), "heldout_metrics", None)
    except ImportError:
        figures = None
    if figures is not None:
        result: dict[str, Any] = figures()
        return result
    try:
        return exact_heldout(cache, n)
    except (OSError, ValueError, KeyError, ImportError) as err:
        log.warning("exact path not measured: %s", err)
        return {"median_abs_rel_err": None, "under_rate": None, "note": f"not measured: {err}"}


def exact_heldout(cache: Path, n: int, seed: int = 0) -> dict[str, Any]:
    """The exact path on measured runs it was not fitted on: the public GPUMemNet MLP runs
    (../shared/data/gpumem) that the nvidia-smi calibration held out (the same seeded 30%), and the
    project's own real-GPU campaign (predictor/data/measured/*.csv, `predictor.dataset.campaign`),
    pooled for the headline figures and per source beside them.

    Each run's exact architecture is traced on the meta device (one training step, as the dataset
    does), and `predictor.exact.traced_memory` turns the traced peak into the Demand's memory and
    bound, as for a pod that names its architecture or gives its traced peak. A seeded sample of
    `n` held-out runs keeps it within minutes on 2 cores; traced peaks are cached.
    """
    from predictor import exact
    from predictor.dataset import calibration, campaign

    runs = calibration.load_runs()
    _, hold = calibration.split_holdout([r.key for r in runs], calibration.HOLDOUT_FRACTION, seed)
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(hold, min(n, len(hold)), replace=False).tolist())
    path = cache / f"exact-heldout-{n}-{seed}.json"
    traced: dict[str, float]
    try:
        traced = json.loads(path.read_text())
    except (OSError, ValueError):
        traced = {}
    for i in picked:
        if runs[i].key not in traced:
            traced[runs[i].key] = calibration.trace_run(runs[i])[0]
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(traced))
    measured = np.asarray([runs[i].measured_mib for i in picked])
    memory, upper = (np.asarray(v) for v in zip(*(exact.traced_memory(traced[runs[i].key]) for i in picked),
                                                  strict=True))
    mlp = _exact_figures(memory, upper, measured)
    mlp["note"] = (f"{len(picked)} of the {len(hold)} GPUMemNet MLP runs (A100-40GB) the calibration held out, "
                   "each traced as its exact architecture; memory and bound from predictor.exact.traced_memory")
    sources: dict[str, Any] = {"mlp": mlp}
    parts = [(memory, upper, measured)]
    tables = sorted(campaign.MEASURED_DIR.glob("*.csv"))
    for table in tables:
        rows = campaign.read_table(table)
        if rows:
            _, held = campaign.calibration_split(rows)
            parts.append(campaign.exact_on_measured([rows[i] for i in held]))
            sources[f"campaign_{table.stem}"] = {
                **_exact_figures(*parts[-1]),
                "all_rows": _exact_figures(*campaign.exact_on_measured(rows)),
                "note": f"the real-GPU campaign's held-out 30% ({table.name}: whole architecture groups the "
                        "measured lines of the bound were not fitted on) whose architecture the exact table "
                        "holds, looked up by deepres.io/model as a pod would; measured: NVML per-process peak; "
                        "all_rows: every measured row, the lines' own fit rows included"}
    pooled = _exact_figures(*(np.concatenate(v) for v in zip(*parts, strict=True)))
    return {**pooled, **sources,
            "note": "pooled over the held-out public MLP runs and the real-GPU campaign's measurements "
                    f"({', '.join(t.name for t in tables) or 'none present'}); each source on its own below"}


def _exact_figures(memory: FloatArray, upper: FloatArray, measured: FloatArray) -> dict[str, Any]:
    return dict(bound_figures(measured, memory, upper))


def _tune_baselines(data: Dataset, split: Split, names: list[str], args: argparse.Namespace,
                    started: float) -> dict[str, dict[str, Any]]:
    """Grid-pick each baseline's setting on the grouped split's calibration fold (whole groups the
    fit did not see, never a test row)."""
    if args.no_tune or not names:
        return {}
    fit_rows, cal_rows = grouped_calibration_split(split.train, data.groups, CALIBRATION_FRACTION, args.seed)
    x = data.physics_x.values
    chosen = {}
    for name in names:
        targets = data.physics_t  # what the baselines learn (densities of the decomposition)
        chosen[name] = tune(name, data.fit_x(fit_rows), data.fit_t(fit_rows), x[cal_rows], targets[cal_rows],
                            args.seed)
        print(f"tuned {name}: {chosen[name]} ({time.perf_counter() - started:.0f}s)", flush=True)
    return chosen


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
