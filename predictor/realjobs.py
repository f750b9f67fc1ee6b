"""The predictor on the real GPU's jobs: `realjobs.*` of reports/predictor.json, in about a minute.

On the campaign's measured rows (predictor/data/measured/h100-*.csv: real training jobs, NVML
per-process peaks), each path reads the job as a user would annotate it:

- `exact`: `deepres.io/model` (the traced table; the rows whose architecture it holds);
- `family`: the family annotations by docs/data-scientist.md's rules (`features.annotated_specs`; vision
  mixers as `vit`, `MIXER_RULE`), through the shipped network;

and its Demand is read on the measured GPU's line (`predictor.gpucal`), fitted on the other
architecture groups (5 folds by group, `splits.grouped_folds`, seed 0): every figure is on
architecture groups the lines never saw. `python -m predictor.realjobs` merges the keys into
reports/predictor.json (the rest of the file is kept); `--write-lines` also refits the shipped
lines (predictor/data/gpu_lines.json) on every row.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path
from typing import Any

from predictor import gpucal
from predictor.features import MIXER_RULE

REPORT = Path(__file__).resolve().parents[1] / "reports" / "predictor.json"
FOLDS = 5
def measured(path: Path | None = None) -> list[dict[str, Any]]:
    from predictor.dataset import campaign

    tables = [path] if path else sorted(campaign.MEASURED_DIR.glob("*.csv"))
    return [r for t in tables for r in campaign.read_table(t)]


def demands(rows: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """(exact Demand or None, family Demand or None) per measured row."""
    from predictor import exact, features
    from predictor.dataset import paths
    from predictor.runtime import Predictor
    from predictor.spec import Demand, SpecError

    def key(r: dict[str, Any]) -> tuple[str, int, int, str, str]:
        return (r["name"], int(float(r["batch_size"])), int(float(r["input_dim"])), r["precision"], r["optimizer"])

    wanted = {key(r): i for i, r in enumerate(rows)}
    with gzip.open(paths.JOBS_OUT, "rt", newline="") as handle:
        source = [r for r in csv.DictReader(handle) if r.get("status") == "ok" and key(r) in wanted]
    predictor = Predictor.load()
    family: list[Any] = [None] * len(rows)
    for r, spec in zip(source, features.annotated_specs(source, paths.DATA_DIR), strict=True):
        if spec is not None:
            family[wanted[key(r)]] = predictor.predict(spec)
    exact_out: list[Any] = []
    for r in rows:
        try:
            e = exact.estimate(r["name"], int(r["batch_size"]), int(r["input_dim"]), r["precision"], r["optimizer"])
            exact_out.append(Demand(e.memory_mib, e.memory_mib_upper, e.gflops_per_iteration, 0.0, "table+exact"))
        except (SpecError, KeyError):
            exact_out.append(None)
    return exact_out, family


def held_out(rows: list[dict[str, Any]], found: list[Any]) -> dict[str, Any]:
    """The path's Demands read on lines fitted on the other architecture groups."""
    import numpy as np

    from predictor.splits import grouped_folds

    idx = np.asarray([i for i, d in enumerate(found) if d is not None])
    groups = np.asarray([r["group"] for r in rows], dtype=str)
    truth = np.asarray([float(r["nvml_process_peak_mib"]) for r in rows])
    traced = np.asarray([gpucal.traced_equivalent(d.memory_mib) if d is not None else 0.0 for d in found])
    precision = np.asarray([gpucal._precision_key(r["precision"]) for r in rows], dtype=str)
    point, bound = np.zeros(len(rows)), np.zeros(len(rows))
    for test in grouped_folds(idx, groups, FOLDS, 0):
        train = np.setdiff1d(idx, test)
        for p in set(precision[test].tolist()):
            fit_rows = train[precision[train] == p]
            line = fit_lines(traced[fit_rows].tolist(), truth[fit_rows].tolist())
            rows_p = test[precision[test] == p]
            point[rows_p] = line["context_mib"] + line["factor"] * traced[rows_p]
            bound[rows_p] = point[rows_p] * (1.0 + line["rel"])
    t, p_, b = truth[idx], point[idx], bound[idx]
    rel = p_ / t - 1.0
    shipped = np.asarray([found[i].memory_mib_upper for i in idx])
    return {"n": int(idx.size), "median_abs_rel_err": round(float(np.median(np.abs(rel))), 4),
            "p90_abs_rel_err": round(float(np.percentile(np.abs(rel), 90)), 4),
            "under_rate": round(float(np.mean(b < t)), 4), "median_bound_ratio": round(float(np.median(b / t)), 4),
            "uncalibrated": {"under_rate": round(float(np.mean(shipped < t)), 4),
                             "median_bound_ratio": round(float(np.median(shipped / t)), 4)}}


def write_lines(rows: list[dict[str, Any]], exact_d: list[Any], family_d: list[Any],
                out: Path = gpucal.LINES_PATH) -> dict[str, Any]:
    """The shipped per-GPU lines, fitted on every measured row (per path and precision)."""
    from predictor.steptime import gpu_model

    result: dict[str, Any] = {"about": "per-GPU-model lines of predictor.gpucal: written by "
                                       "`python -m predictor.realjobs --write-lines`", "under": gpucal.UNDER,
                              "gpus": {}}
    for path_name, found in (("exact", exact_d), ("family", family_d)):
        for p in ("fp32", "amp", "bf16", "any"):
            use = [i for i, d in enumerate(found) if d is not None and (
                p == "any" or gpucal._precision_key(rows[i]["precision"]) == p)]
            by_gpu: dict[str, list[int]] = {}
            for i in use:
                by_gpu.setdefault(gpu_model(rows[i]["gpu"])[0].name, []).append(i)
            for gpu, members in by_gpu.items():
                line = fit_lines([gpucal.traced_equivalent(found[i].memory_mib) for i in members],
                                        [float(rows[i]["nvml_process_peak_mib"]) for i in members])
                result["gpus"].setdefault(gpu, {}).setdefault(path_name, {})[p] = line
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def figures() -> dict[str, Any]:
    rows = measured()
    exact_d, family_d = demands(rows)
    return {"exact": held_out(rows, exact_d), "family": held_out(rows, family_d),
            "rows": len(rows), "source": "predictor/data/measured/*.csv (NVML per-process peaks)",
            "method": "each path's Demand read on the measured GPU's line per precision (predictor.gpucal), the "
                      f"lines fitted on the other architecture groups ({FOLDS} folds by group, seed 0); bound = line x "
                      f"(1 + the margin leaving {gpucal.UNDER:.0%} of the fitted jobs above it); family annotations "
                      f"by docs/data-scientist.md's rules (features.row_spec: {MIXER_RULE}); `uncalibrated`: the "
                      "Demand bound"}


def merge(report: Path, key: str, value: Any) -> None:
    data = json.loads(report.read_text()) if report.exists() else {}
    data[key] = value
    report.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predictor.realjobs", description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--write-lines", action="store_true", help="refit predictor/data/gpu_lines.json")
    args = parser.parse_args(argv)
    result = figures()
    if args.write_lines:
        rows = measured()
        write_lines(rows, *demands(rows))
    merge(args.report, "realjobs", result)
    print(json.dumps(result, indent=1))
    return 0


def fit_lines(traced: list[float], measured: list[float], under: float = gpucal.UNDER) -> dict[str, float]:
    """A GPU line and the margin above it that leaves `under` of these jobs uncovered."""
    import numpy as np

    from predictor.dataset.calibration import fit_line

    line = fit_line(traced, measured)
    above = np.asarray(measured) / (line.context_mib + line.factor * np.asarray(traced)) - 1.0
    rel = float(np.quantile(above, 1.0 - under, method="higher"))
    return {"context_mib": round(line.context_mib, 1), "factor": round(line.factor, 5), "rel": round(max(rel, 0.0), 4),
            "n": len(traced)}


if __name__ == "__main__":
    raise SystemExit(main())

