"""`deepres evaluate`: every model on every split, the seed's Table 3 on our data, and plots.

Models: the paper's Transformer-BiGRU, our tuned one, and the seven baselines. Splits: the seed's
random 70/30, held-out family (one fold per family, test predictions pooled over folds) and size
extrapolation (test = the largest 20% by parameters). Every model is fitted by the same
`predictor.train.fit_model` (fit rows = training rows less a 15% calibration fold that sets the
memory upper bound), so the random-split row of the tuned model is the shipped artifact's.

Writes `reports/predictor.json` (shape fixed by the issue; other tools read it), `reports/predictor.md`
(tables and discussion) and `reports/predictor-metrics.png`, `reports/predictor-pred-vs-actual.png`.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from predictor.baselines import BASELINES, tune
from predictor.metrics import over_reservation, regression_metrics, under_rate
from predictor.splits import Split, calibration_split, family_splits, random_split, size_split
from predictor.train import (
    CALIBRATION_FRACTION,
    DEFAULT_DATA,
    MODELS,
    REPO_ROOT,
    Dataset,
    DatasetError,
    fit_model,
    load_dataset,
)

log = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]
REPORTS = REPO_ROOT / "reports"
JSON_KEYS_MEMORY: tuple[str, ...] = ("mse", "rmse", "mae", "mape", "r2", "under_rate")
JSON_KEYS_FLOPS: tuple[str, ...] = ("mse", "rmse", "mae", "mape", "r2")
NETWORKS = ("transformer_bigru_paper", "transformer_bigru_tuned")


class Predictions:
    """Test-set predictions of one model on one split (pooled over folds for `family`)."""

    def __init__(self) -> None:
        self.rows: list[npt.NDArray[np.int64]] = []
        self.points: list[FloatArray] = []
        self.upper: list[FloatArray] = []

    def add(self, rows: npt.NDArray[np.int64], points: FloatArray, upper: FloatArray) -> None:
        self.rows.append(rows)
        self.points.append(points)
        self.upper.append(upper)

    def arrays(self) -> tuple[npt.NDArray[np.int64], FloatArray, FloatArray]:
        return np.concatenate(self.rows), np.concatenate(self.points), np.concatenate(self.upper)


def metrics_of(data: Dataset, preds: Predictions) -> dict[str, dict[str, float]]:
    rows, points, upper = preds.arrays()
    memory = regression_metrics(data.y[rows, 0], points[:, 0])
    memory["under_rate"] = under_rate(data.y[rows, 0], upper)
    memory["over_reservation"] = over_reservation(data.y[rows, 0], upper)
    return {"memory": memory, "flops": regression_metrics(data.y[rows, 1], points[:, 1])}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the dataset (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPORTS, help="report directory (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="also print reports/predictor.json to stdout")
    parser.add_argument("--seed", type=int, default=0, help="seed for splits, initialisation and shuffling")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of %(default)s")
    parser.add_argument("--splits", default="random,family,size", help="comma-separated subset of %(default)s")
    parser.add_argument("--fold-epochs-scale", type=float, default=0.5,
                        help="epochs of the networks on family/size folds, relative to their configuration "
                             "(the random split always uses the full recipe; default %(default)s)")
    parser.add_argument("--no-tune", action="store_true", help="skip the baselines' grid (use the first setting)")


def run(args: argparse.Namespace) -> int:
    from extender.cli import UsageError

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown or not models:
        raise UsageError(f"--models: unknown {', '.join(unknown) or '(none)'}; expected names from {', '.join(MODELS)}")
    split_names = [s.strip() for s in args.splits.split(",") if s.strip()]
    if not split_names or set(split_names) - {"random", "family", "size"}:
        raise UsageError(f"--splits must be a subset of random,family,size; got {args.splits!r}")
    if not 0 < args.fold_epochs_scale <= 1:
        raise UsageError(f"--fold-epochs-scale must be in (0, 1], got {args.fold_epochs_scale}")
    try:
        data = load_dataset(args.data)
    except DatasetError as err:
        raise UsageError(str(err)) from None

    started = time.perf_counter()
    rnd = random_split(data.n_rows, 0.3, args.seed)
    settings = _tune_baselines(data, rnd, [m for m in models if m in BASELINES], args, started)
    plan: list[tuple[str, list[Split], float]] = []
    if "random" in split_names:
        plan.append(("random", [rnd], 1.0))
    if "family" in split_names:
        plan.append(("family", family_splits(data.families), args.fold_epochs_scale))
    if "size" in split_names:
        plan.append(("size", [size_split(data.cols["params_millions"])], args.fold_epochs_scale))
    total = sum(len(splits) for _, splits, _ in plan) * len(models)
    done = 0
    results: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    per_family: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    predictions: dict[str, dict[str, Predictions]] = {}
    print(f"evaluating {len(models)} models on {data.n_rows} jobs ({data.path.name} sha256 {data.sha256[:12]}), "
          f"{total} fits", flush=True)
    for split_name, splits, scale in plan:
        predictions[split_name] = {m: Predictions() for m in models}
        for split in splits:
            for model_name in models:
                t0 = time.perf_counter()
                model = fit_model(model_name, data, split, args.seed, epochs_scale=scale,
                                  settings=settings.get(model_name))
                points, upper = model.predict(data, split.test)
                predictions[split_name][model_name].add(split.test, points, upper)
                done += 1
                one = Predictions()
                one.add(split.test, points, upper)
                fold = metrics_of(data, one)
                if split_name == "family":
                    per_family.setdefault(split.name.split(":", 1)[1], {})[model_name] = fold
                print(f"[{done}/{total}] {split.name:<18} {model_name:<24} memory R² {fold['memory']['r2']:8.4f} "
                      f"MAPE {fold['memory']['mape']:7.2f}%  FLOPs R² {fold['flops']['r2']:8.4f}  "
                      f"({time.perf_counter() - t0:.0f}s, total {time.perf_counter() - started:.0f}s)", flush=True)
        results[split_name] = {m: metrics_of(data, predictions[split_name][m]) for m in models}

    report = build_json(results, _calibration(args.out))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predictor.json").write_text(json.dumps(report, indent=2) + "\n")
    elapsed = time.perf_counter() - started
    context = {
        "rows": data.n_rows, "sha256": data.sha256, "data": _display_path(data.path), "seed": args.seed,
        "settings": settings,
        "fold_epochs_scale": args.fold_epochs_scale, "elapsed_s": elapsed, "n_test_random": len(rnd.test),
        "families": sorted(set(data.families.tolist())),
    }
    from predictor.report import write_markdown, write_plots

    if "random" in predictions:
        write_plots(data, predictions["random"], results["random"], args.out)
    write_markdown(results, per_family, report["calibration"], context, args.out)
    if args.json:
        print(json.dumps(report, indent=2))
    print(f"wrote {args.out / 'predictor.json'} and {args.out / 'predictor.md'} in {elapsed / 60:.1f} min")
    return 0


def build_json(results: dict[str, dict[str, dict[str, dict[str, float]]]],
               calibration: dict[str, float | None]) -> dict[str, Any]:
    """The contract's shape: splits -> target -> model -> metrics (memory adds under_rate)."""
    splits: dict[str, Any] = {}
    for split_name, by_model in results.items():
        splits[split_name] = {
            "memory": {m: {k: _finite(v["memory"][k]) for k in JSON_KEYS_MEMORY} for m, v in by_model.items()},
            "flops": {m: {k: _finite(v["flops"][k]) for k in JSON_KEYS_FLOPS} for m, v in by_model.items()},
        }
    return {"splits": splits, "calibration": calibration}


def _finite(value: float) -> float | None:
    return round(float(value), 6) if np.isfinite(value) else None


def _calibration(reports: Path) -> dict[str, float | None]:
    """The dataset's held-out calibration error, copied from reports/calibration.json."""
    path = reports / "calibration.json"
    try:
        data = json.loads(path.read_text())
        return {k: float(data[k]) for k in ("median_abs_rel_err", "p90_abs_rel_err")}
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("no calibration figures (%s: %s); run `deepres dataset` first", path, err)
        return {"median_abs_rel_err": None, "p90_abs_rel_err": None}


def _tune_baselines(data: Dataset, rnd: Split, names: list[str], args: argparse.Namespace,
                    started: float) -> dict[str, dict[str, Any]]:
    """Grid-pick each baseline's setting on the random split's calibration fold."""
    if args.no_tune or not names:
        return {}
    fit_rows, cal_rows = calibration_split(rnd.train, CALIBRATION_FRACTION, args.seed)
    x = data.physics_x.values
    chosen = {}
    for name in names:
        chosen[name] = tune(name, x[fit_rows], data.y[fit_rows], x[cal_rows], data.y[cal_rows], args.seed)
        print(f"tuned {name}: {chosen[name]} ({time.perf_counter() - started:.0f}s)", flush=True)
    return chosen


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
