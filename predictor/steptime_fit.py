"""Fitting the step-time model (predictor/steptime.py) on the campaign's measured step times, and its
held-out figures: `python -m predictor.steptime_fit`. Apart from the runtime because it needs scipy (the
train extra), which `deepres serve` and the serving image do not have."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from predictor import steptime_check
from predictor.steptime import COEFFICIENTS_PATH, FEATURES, JOBS, MEASURED, REFERENCE_GPU, REPORT, features
from predictor.steptime_check import figures

#: Terms of the campaign's measured step that are not the job's: the benchmark drew each step's input
#: with `torch.randn` on the host inside the timed step (predictor.dataset.campaign.measure), seconds
#: per element drawn in fp32 (fp32 and amp jobs) and in bf16 (bf16 jobs: far slower on that host's
#: torch). The fit models them so that they do not leak into the job's terms; the runtime leaves them out.
CAMPAIGN_TERMS: tuple[str, ...] = ("input_elements_fp32", "input_elements_bf16")
RNN_FEATURES = 256  # the campaign's recurrent inputs: (batch, sequence, 256) (predictor.dataset.archs)
STARTS = 6  # the loss has local minima: the best of seeded starts

# ---------------------------------------------------------------------------------------------
# Data


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


def input_elements(row: dict[str, Any]) -> float:
    """Elements the campaign drew with `torch.randn` on the host for one step of `row` (token inputs are
    `randint`: next to nothing): images (batch, 3, side, side), features (batch, side), the hand-written
    recurrent stacks (batch, sequence, 256)."""
    b, side = float(row["batch_size"]), float(row["input_dim"])
    if row["source"] == "nn" and row["family"] in ("rnn", "lstm", "gru"):
        return b * side * RNN_FEATURES
    if row["kind"] in ("text", "seq2seq"):
        return 0.0
    if row["kind"] == "features":
        return b * side
    return b * 3.0 * side * side


def campaign_terms(row: dict[str, Any]) -> tuple[float, float]:
    n = input_elements(row)
    return (0.0, n) if row["precision"] == "bf16" else (n, 0.0)


def _matrix(rows: list[dict[str, Any]]) -> Any:
    """The job's columns (steptime.FEATURES), then the campaign's (CAMPAIGN_TERMS)."""
    import numpy as np

    return np.asarray([(*features(float(r["num_layers"]), r["gflops_per_iteration"], float(r["traced_peak_mib"]),
                                  r["precision"], r["family"], float(r["input_dim"])), *campaign_terms(r))
                       for r in rows])


def _beside(rows: list[dict[str, Any]]) -> Any:
    import numpy as np

    return np.asarray([float(r.get("ran_beside") or 0) for r in rows])


# ---------------------------------------------------------------------------------------------
# Fitting (scipy)


def predict(x: Any, beside: Any, weights: Any, exponent: float) -> Any:
    """The campaign's step: the job's step (its columns) x (1 + k)^c, plus the benchmark's input term."""
    import numpy as np

    n = len(FEATURES)
    w = np.asarray(weights, dtype=float)
    return (x[:, :n] @ w[:n]) * (1.0 + beside) ** exponent + x[:, n:] @ w[n:]


def fit(rows: list[dict[str, Any]], starts: int = STARTS) -> tuple[list[float], float]:
    """Non-negative weights (steptime.FEATURES, then CAMPAIGN_TERMS) and the co-runners' exponent c,
    minimising the mean absolute log error of the measured steps (smoothed: sqrt(r^2 + 1e-4)), from
    seeded starts (L-BFGS-B, then Nelder-Mead from its end); c is kept in [0, 2]."""
    import numpy as np
    from scipy.optimize import minimize  # type: ignore[import-untyped]  # (scikit-learn's dependency, train extra)

    x, beside = _matrix(rows), _beside(rows)
    y = np.log(np.asarray([float(r["step_s"]) for r in rows]))
    n = x.shape[1]

    def loss(theta: Any) -> float:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            r = np.log(predict(x, beside, np.exp(np.clip(theta[:n], -60.0, 5.0)), theta[n])) - y
            value = float(np.mean(np.sqrt(r * r + 1e-4)))
        return value if np.isfinite(value) else 1e9

    rng = np.random.default_rng(0)
    bounds = [(-60.0, 5.0)] * n + [(0.0, 2.0)]  # a co-runner never speeds a job up
    best: Any = None
    for _ in range(starts):
        theta = np.r_[rng.normal(-10.0, 3.0, n), 0.3]
        first = minimize(loss, theta, method="L-BFGS-B", bounds=bounds)
        res = minimize(loss, first.x, method="Nelder-Mead", bounds=bounds,
                       options={"maxiter": 4000, "xatol": 1e-5, "fatol": 1e-8})
        if best is None or res.fun < best.fun:
            best = res
    return [float(v) for v in np.exp(np.clip(best.x[:n], -60.0, 5.0))], float(best.x[n])


def held_out(rows: list[dict[str, Any]], folds: int = 5, seed: int = 0, starts: int = STARTS) -> dict[str, Any]:
    """Predicted vs measured step time on architecture groups held out (`folds` folds by group)."""
    import numpy as np

    from predictor.splits import grouped_folds

    groups = np.asarray([r["group"] for r in rows], dtype=str)
    x, beside = _matrix(rows), _beside(rows)
    measured = np.asarray([float(r["step_s"]) for r in rows])
    predicted = np.zeros(len(rows))
    everything = np.arange(len(rows))
    for test in grouped_folds(everything, groups, folds, seed):
        train = np.setdiff1d(everything, test)
        weights, exponent = fit([rows[i] for i in train], starts)
        predicted[test] = predict(x[test], beside[test], weights, exponent)
    return figures(predicted, measured)


METHOD = ("fitted on every measured job (mean absolute log error, best of {starts} seeded starts), two things of "
          "the campaign's step modelled apart from the job's: the co-runners (`ran_beside`: the step beside k others "
          "= the alone step x (1 + k)^c, c {c:.3f}) and the benchmark's own input, drawn with torch.randn on the "
          "host inside the timed step ({fp32:.0f} M elements/s in fp32, {bf16:.0f} M/s in bf16); the runtime's step "
          "is the job's terms alone. held_out_by_group: 5 folds by architecture group (splits.grouped_folds, seed "
          "0), predicted (with both campaign terms) / measured; alone_only: the same, fitted and scored on the "
          "{alone} jobs that ran alone (all of them large); colocation_solo: the runtime (fitted on every row) on "
          "the solo steady-state steps of {solo} real jobs measured apart (/work/shared/data/colocation, inputs "
          "already on the GPU)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predictor.steptime_fit", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=COEFFICIENTS_PATH)
    parser.add_argument("--report", type=Path, default=REPORT,
                        help="merge the `steptime` key into this JSON (the rest is kept)")
    parser.add_argument("--colocation", type=Path, default=steptime_check.COLOCATION,
                        help="solo step times of real jobs measured apart (skipped when absent)")
    args = parser.parse_args(argv)
    rows = measured_rows()
    alone = [r for r in rows if int(r["ran_beside"]) == 0]
    scored = held_out(rows)
    shared = held_out(alone)
    weights, exponent = fit(rows)
    n = len(FEATURES)
    result: dict[str, Any] = {
        "model": "step_s = sum of weights x features (H100, the job alone): " + ", ".join(FEATURES)
                 + "; the campaign's step beside k other jobs: x (1 + k)^corunner_exponent, plus "
                 + " and ".join(CAMPAIGN_TERMS) + " x campaign_weights (the benchmark's host input: not the job's)",
        "features": list(FEATURES), "weights": weights[:n], "campaign_terms": list(CAMPAIGN_TERMS),
        "campaign_weights": weights[n:], "corunner_exponent": round(exponent, 4), "gpu": REFERENCE_GPU,
        "source": f"predictor/data/measured/{MEASURED.name}",
        "held_out_by_group": scored, "held_out_by_group_alone_only": shared,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")  # the runtime's coefficients, before the check reads them
    solo = steptime_check.colocation_solo(args.colocation, json.loads(args.out.read_text()))
    result["colocation_solo"] = solo
    result["method"] = METHOD.format(starts=STARTS, c=exponent, fp32=1e-6 / max(weights[n], 1e-30),
                                     bf16=1e-6 / max(weights[n + 1], 1e-30), alone=len(alone),
                                     solo=solo.get("n", 0) if solo else 0)
    result["gpu_scaling"] = ("compute by published dense peak TFLOPs, traffic by memory bandwidth (NVIDIA data "
                             "sheets): the roofline terms of a GPU model without measured steps")
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    report = json.loads(args.report.read_text()) if args.report.exists() else {}
    report["steptime"] = {**scored, "alone_only": shared, "colocation_solo": solo,
                          "gpu": "NVIDIA H100 80GB HBM3 (measured)",
                          "method": result["method"], "gpu_scaling": result["gpu_scaling"]}
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("weights", "campaign_weights", "corunner_exponent", "held_out_by_group",
                                             "held_out_by_group_alone_only", "colocation_solo")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
