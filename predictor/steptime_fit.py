"""Fitting the step-time model (predictor/steptime.py) on the campaign's measured step times, and its
held-out figures: `python -m predictor.steptime_fit`. Apart from the runtime because it needs scipy (the
train extra), which `deepres serve` and the serving image do not have."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from predictor.steptime import COEFFICIENTS_PATH, JOBS, MEASURED, REFERENCE_GPU, REPORT, features

# ---------------------------------------------------------------------------------------------
# Fitting (scipy; `python -m predictor.steptime`)


def measured_rows(path: Path = MEASURED) -> list[dict[str, Any]]:
    """The campaign's measured jobs joined with their dataset row (GFLOPs): the step time's data."""
    import csv
    import gzip

    with path.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok"]

    def key(r: dict[str, Any]) -> tuple[str, int, int, str, str]:
        return (r["name"], int(float(r["batch_size"])), int(float(r["input_dim"])), r["precision"], r["optimizer"])

    with gzip.open(JOBS, "rt", newline="") as handle:
        flops = {key(r): float(r["gflops_per_iteration"]) for r in csv.DictReader(handle) if r["status"] == "ok"}
    return [{**r, "gflops_per_iteration": flops[key(r)]} for r in rows if key(r) in flops]


def _matrix(rows: list[dict[str, Any]]) -> Any:
    import numpy as np

    return np.asarray([features(float(r["num_layers"]), r["gflops_per_iteration"], float(r["traced_peak_mib"]),
                                r["precision"]) for r in rows])


def _beside(rows: list[dict[str, Any]]) -> Any:
    import numpy as np

    return np.asarray([float(r.get("ran_beside") or 0) for r in rows])


def fit(rows: list[dict[str, Any]]) -> tuple[list[float], float]:
    """Non-negative weights of the step time of a job running alone, and the co-runners' exponent c
    (a step measured beside k other jobs is the alone step x (1 + k)^c), minimising the mean absolute
    log error of the measured steps: the campaign ran small jobs beside up to 3 others, so a fit that
    ignored them put their slowdown into the per-step constant."""
    import numpy as np
    from scipy.optimize import minimize  # type: ignore[import-untyped]  # (scikit-learn's dependency, train extra)

    x, y, k = _matrix(rows), np.log(np.asarray([float(r["step_s"]) for r in rows])), np.log1p(_beside(rows))

    def loss(theta: Any) -> float:
        return float(np.mean(np.abs(np.log(x @ np.exp(theta[:5])) + theta[5] * k - y)))

    rng = np.random.default_rng(0)  # the loss has local minima: the best of seeded starts
    starts = [np.r_[np.log([5e-3, 1e-4, 2e-5, 5e-6, 1e-5]) + rng.normal(0.0, 2.0, 5), 0.5] for _ in range(12)]
    fits = [minimize(loss, s, method="Nelder-Mead", options={"maxiter": 8000, "xatol": 1e-6, "fatol": 1e-9})
            for s in starts]
    best = min(fits, key=lambda r: float(r.fun))
    return [float(v) for v in np.exp(best.x[:5])], float(best.x[5])


def held_out(rows: list[dict[str, Any]], folds: int = 5, seed: int = 0) -> dict[str, Any]:
    """Predicted vs measured step time on architecture groups held out (`folds` folds by group)."""
    import numpy as np

    from predictor.splits import grouped_folds

    groups = np.asarray([r["group"] for r in rows], dtype=str)
    x = _matrix(rows)
    measured = np.asarray([float(r["step_s"]) for r in rows])
    beside = _beside(rows)
    predicted = np.zeros(len(rows))
    everything = np.arange(len(rows))
    for test in grouped_folds(everything, groups, folds, seed):
        train = np.setdiff1d(everything, test)
        weights, exponent = fit([rows[i] for i in train])
        predicted[test] = x[test] @ np.asarray(weights) * (1.0 + beside[test]) ** exponent
    return _figures(predicted, measured)


def _figures(predicted: Any, measured: Any) -> dict[str, Any]:
    import numpy as np

    rel = np.abs(predicted / measured - 1.0)
    ratio = predicted / measured
    p10, p90 = float(np.percentile(ratio, 10)), float(np.percentile(ratio, 90))
    return {"n": len(measured), "median_abs_rel_err": round(float(np.median(rel)), 4),
            "p90_abs_rel_err": round(float(np.percentile(rel, 90)), 4),
            "ratio_p10": round(p10, 4), "ratio_p90": round(p90, 4),
            "median_ratio": round(float(np.median(ratio)), 4), "p90_over_p10": round(p90 / p10, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predictor.steptime_fit", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=COEFFICIENTS_PATH)
    parser.add_argument("--report", type=Path, default=REPORT,
                        help="merge the `steptime` key into this JSON (the rest is kept)")
    args = parser.parse_args(argv)
    rows = measured_rows()
    alone = [r for r in rows if int(r["ran_beside"]) == 0]
    figures = held_out(rows)
    shared = held_out(alone)
    weights, exponent = fit(rows)
    result = {
        "model": "step_s = w0 + w1*layers + w2*GFLOPs[fp32] + w3*GFLOPs[half] + w4*traced_peak_MiB (H100, the job "
                 "alone); measured beside k other jobs: x (1 + k)^corunner_exponent",
        "weights": weights, "corunner_exponent": round(exponent, 4), "gpu": REFERENCE_GPU,
        "source": f"predictor/data/measured/{MEASURED.name}",
        "held_out_by_group": figures, "held_out_by_group_alone_only": shared,
        "method": f"fitted on every measured job with the co-runners modelled (up to 3 others shared the GPU with "
                  f"the small ones, `ran_beside`: the step beside k others = the alone step x (1 + k)^c, c "
                  f"{exponent:.3f}); the weights are the alone step's; mean absolute log error, best of 12 seeded "
                  "starts; held_out_by_group: 5 folds by architecture group (splits.grouped_folds, seed 0), "
                  "predicted (with the co-runner term) / measured; _alone_only: the same, fitted and scored on the "
                  f"{len(alone)} jobs that ran alone (all of them large)",
        "gpu_scaling": "compute by published dense peak TFLOPs, traffic by memory bandwidth (NVIDIA data sheets): "
                       "the roofline terms of a GPU model without measured steps",
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    report = json.loads(args.report.read_text()) if args.report.exists() else {}
    report["steptime"] = {**figures, "alone_only": shared, "gpu": "NVIDIA H100 80GB HBM3 (measured)",
                          "method": result["method"], "gpu_scaling": result["gpu_scaling"]}
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("weights", "held_out_by_group", "held_out_by_group_alone_only")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
