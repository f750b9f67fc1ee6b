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


def fit(rows: list[dict[str, Any]]) -> list[float]:
    """Non-negative weights minimising the mean absolute log error of the step time."""
    import numpy as np
    from scipy.optimize import minimize  # type: ignore[import-untyped]  # (scikit-learn's dependency, train extra)

    x, y = _matrix(rows), np.log(np.asarray([float(r["step_s"]) for r in rows]))

    def loss(theta: Any) -> float:
        return float(np.mean(np.abs(np.log(x @ np.exp(theta)) - y)))

    rng = np.random.default_rng(0)  # the loss has local minima: the best of seeded starts
    starts = [np.log([5e-3, 1e-4, 2e-5, 5e-6, 1e-5]) + rng.normal(0.0, 2.0, 5) for _ in range(12)]
    fits = [minimize(loss, s, method="Nelder-Mead", options={"maxiter": 6000, "xatol": 1e-6, "fatol": 1e-9})
            for s in starts]
    best = min(fits, key=lambda r: float(r.fun))
    return [float(v) for v in np.exp(best.x)]


def held_out(rows: list[dict[str, Any]], folds: int = 5, seed: int = 0) -> dict[str, Any]:
    """Predicted vs measured step time on architecture groups held out (`folds` folds by group)."""
    import numpy as np

    from predictor.splits import grouped_folds

    groups = np.asarray([r["group"] for r in rows], dtype=str)
    x = _matrix(rows)
    measured = np.asarray([float(r["step_s"]) for r in rows])
    predicted = np.zeros(len(rows))
    everything = np.arange(len(rows))
    for test in grouped_folds(everything, groups, folds, seed):
        train = np.setdiff1d(everything, test)
        weights = fit([rows[i] for i in train])
        predicted[test] = x[test] @ np.asarray(weights)
    rel = np.abs(predicted / measured - 1.0)
    ratio = predicted / measured
    return {"n": len(rows), "median_abs_rel_err": round(float(np.median(rel)), 4),
            "p90_abs_rel_err": round(float(np.percentile(rel, 90)), 4),
            "ratio_p10": round(float(np.percentile(ratio, 10)), 4),
            "ratio_p90": round(float(np.percentile(ratio, 90)), 4)}


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
    result = {
        "model": "step_s = w0 + w1*layers + w2*GFLOPs[fp32] + w3*GFLOPs[half] + w4*traced_peak_MiB (H100)",
        "weights": fit(rows), "gpu": REFERENCE_GPU, "source": f"predictor/data/measured/{MEASURED.name}",
        "held_out_by_group": figures, "held_out_by_group_alone_only": shared,
        "method": "fitted on every measured job (up to 3 others shared the GPU with the small ones: "
                  "`ran_beside`), mean absolute log error, best of 12 seeded starts; held_out_by_group: "
                  "5 folds by architecture group (splits.grouped_folds, seed 0); _alone_only: the same, "
                  "fitted and scored on the 142 jobs that ran alone (all of them large)",
        "gpu_scaling": "compute by published dense peak TFLOPs, traffic by memory bandwidth (NVIDIA data sheets)",
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
