"""Calibration of traced tensor memory to what nvidia-smi shows.

Tracing counts the bytes of live tensors; a GPU process shows more: the CUDA context and the
libraries' workspaces (a constant), and the caching allocator's rounding and cached free blocks
(roughly proportional to what is allocated). We fit `measured = context_mib + factor * traced_mib`
on real measurements and apply it to every traced label.

Source of the measurements: GPUMemNet (itu-rad/GPUMemNet, Datasets/MLP, files
`mlp_data_step1.csv` and `mlp_data_step2.csv`): 6,000 MLP training runs on an NVIDIA A100-40GB,
with their exact layer lists and the peak `nvidia-smi` memory. That repository has no licence file,
so the data is read only from ../shared/data/gpumem at calibration time and only the fitted
constants are shipped (`predictor/dataset/calibration.json`).

The files do not say which optimizer or precision the runs used, nor the loss; we assume Adam,
fp32 and cross-entropy on the last layer's units (PyTorch's most common MLP set-up) and say so in
the data card. `fit_line` is pure; `calibrate` only reads the shipped constants.
"""

from __future__ import annotations

import ast
import csv
import json
import logging
import math
import os
import random
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from predictor import datapaths
from predictor.dataset.tracing import MIB, trace_training_step

log = logging.getLogger(__name__)

CONSTANTS_PATH = Path(__file__).with_name("calibration.json")
SOURCE_DIR = datapaths.GPUMEM  # not in data/: no licence to copy it (data/README.md)
SOURCE_FILES = ("gpumemnet_mlp_data_step1.csv", "gpumemnet_mlp_data_step2.csv")
WORK_DIR = Path(__file__).with_name("_work")
CACHE_PATH = WORK_DIR / "calibration_traces.csv"
HOLDOUT_FRACTION = 0.3
ASSUMED_OPTIMIZER = "adam"
ASSUMED_PRECISION = "fp32"
#: The admission bound covers this share of the fit runs' under-prediction (checked on held-out runs).
BOUND_QUANTILE = 0.975

_ACTIVATIONS: dict[str, Callable[[int, int], nn.Module]] = {
    "ReLU": lambda units, n: nn.ReLU(),
    "Softplus": lambda units, n: nn.Softplus(),
    "PReLU": lambda units, n: nn.PReLU(num_parameters=max(1, n)),
    "SiLU": lambda units, n: nn.SiLU(),
    "Identity": lambda units, n: nn.Identity(),
    "Mish": lambda units, n: nn.Mish(),
    "SELU": lambda units, n: nn.SELU(),
    "Tanh": lambda units, n: nn.Tanh(),
    "LeakyReLU": lambda units, n: nn.LeakyReLU(),
    "ELU": lambda units, n: nn.ELU(),
    "GELU": lambda units, n: nn.GELU(),
    "Sigmoid": lambda units, n: nn.Sigmoid(),
    "Softmax": lambda units, n: nn.Softmax(dim=1),
}


@dataclass(frozen=True)
class MeasuredRun:
    """One measured MLP training run: its layers, batch and the peak memory nvidia-smi showed."""

    key: str
    input_dim: int
    layers: tuple[tuple[str, int, int], ...]  # (kind, units, parameters) as GPUMemNet lists them
    dropout: float
    batch_size: int
    measured_mib: float


@dataclass(frozen=True)
class LineFit:
    """measured = context_mib + factor * traced (MiB)."""

    context_mib: float
    factor: float

    def predict(self, traced_mib: float) -> float:
        return self.context_mib + self.factor * traced_mib


def parse_run(key: str, row: dict[str, str]) -> MeasuredRun:
    """A GPUMemNet CSV row as a MeasuredRun; raises ValueError when the row cannot be rebuilt."""
    name = row["Filename"]
    match = re.search(r"input:(\d+)", name)
    if match is None:
        raise ValueError(f"{key}: no input size in {name!r}")
    drop = re.search(r"dropout:([0-9.]+)", name)
    layers = tuple((str(k), int(u), int(p)) for k, u, p in ast.literal_eval(row["Activations-Params"]))
    return MeasuredRun(key, int(match.group(1)), layers, float(drop.group(1)) if drop else 0.5,
                       int(row["Batch Size"]), float(row["Max GPU Memory (MiB)"]))


def load_runs(source_dir: Path = SOURCE_DIR) -> list[MeasuredRun]:
    """Every measured run of the GPUMemNet MLP files, in file order."""
    runs: list[MeasuredRun] = []
    for file_name in SOURCE_FILES:
        with open(source_dir / file_name, newline="") as handle:
            for i, row in enumerate(csv.DictReader(handle)):
                runs.append(parse_run(f"{file_name.split('_')[-1].removesuffix('.csv')}:{i}", row))
    return runs


def build_mlp(run: MeasuredRun) -> nn.Module:
    """The run's network, layer by layer (linear input sizes follow from their parameter counts)."""
    modules: list[nn.Module] = []
    n_in = run.input_dim
    for kind, units, n_params in run.layers:
        if kind == "linear":
            bias = n_params == n_in * units + units
            modules.append(nn.Linear(n_in, units, bias=bias))
            n_in = units
        elif kind == "batch_normalization":
            modules.append(nn.BatchNorm1d(units))
        elif kind == "dropout":
            modules.append(nn.Dropout(run.dropout))
        elif kind in _ACTIVATIONS:
            modules.append(_ACTIVATIONS[kind](units, n_params))
        else:
            raise ValueError(f"{run.key}: unknown layer kind {kind!r}")
    return nn.Sequential(*modules)


def trace_run(run: MeasuredRun) -> tuple[float, dict[str, float]]:
    """Traced peak MiB and its breakdown for one measured run (Adam, fp32, cross-entropy)."""
    classes = next(units for kind, units, _ in reversed(run.layers) if kind == "linear")

    def batch(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(run.batch_size, run.input_dim, dtype=dtype), torch.randint(0, classes, (run.batch_size,))

    trace = trace_training_step(lambda: build_mlp(run), batch, nn.functional.cross_entropy,
                                optimizer=ASSUMED_OPTIMIZER, precision=ASSUMED_PRECISION)
    return trace.peak_mib, trace.breakdown_mib()


def _trace_row(run: MeasuredRun) -> dict[str, Any]:
    try:
        peak, parts = trace_run(run)
    except Exception as err:  # one bad row must not stop the calibration
        return {"key": run.key, "measured_mib": run.measured_mib, "traced_mib": "", "error": str(err)[:200]}
    return {"key": run.key, "measured_mib": run.measured_mib, "traced_mib": round(peak, 4), "error": "",
            **{f"{k}_mib": round(v, 4) for k, v in parts.items()}}


def trace_all(runs: Sequence[MeasuredRun], jobs: int = 1, cache_path: Path = CACHE_PATH) -> list[dict[str, Any]]:
    """Trace every run, reusing (and appending to) the cache so re-runs are fast."""
    done: dict[str, dict[str, Any]] = {}
    if cache_path.exists():
        with open(cache_path, newline="") as handle:
            done = {row["key"]: row for row in csv.DictReader(handle)}
    todo = [r for r in runs if r.key not in done]
    fields = ["key", "measured_mib", "traced_mib", "error", "params_mib", "grads_mib", "optimizer_mib",
              "activations_mib", "temporaries_mib"]
    if todo:
        log.info("calibration: tracing %d measured runs (%d cached) on %d processes", len(todo), len(done), jobs)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        new_file = not cache_path.exists()
        with open(cache_path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
            if new_file:
                writer.writeheader()
            rows = map(_trace_row, todo) if jobs <= 1 else ProcessPoolExecutor(jobs).map(_trace_row, todo, chunksize=16)
            for i, row in enumerate(rows, 1):
                writer.writerow(row)
                done[row["key"]] = {k: str(v) for k, v in row.items()}
                if i % 250 == 0 or i == len(todo):
                    handle.flush()
                    log.info("calibration: traced %d/%d", i, len(todo))
    return [done[r.key] for r in runs if r.key in done]


def fit_line(traced: Sequence[float], measured: Sequence[float]) -> LineFit:
    """Least squares on relative error: minimises sum(((c + f*t - m) / m)^2), the error we report."""
    if len(traced) != len(measured) or len(traced) < 2:
        raise ValueError("fit_line needs at least two (traced, measured) pairs of equal length")
    if max(traced) == min(traced):
        raise ValueError("fit_line needs traced values that are not all equal")
    # weighted least squares with weights 1/m^2 -> normal equations of a 2x2 system
    s_w = s_t = s_tt = s_m = s_tm = 0.0
    for t, m in zip(traced, measured, strict=True):
        w = 1.0 / (m * m)
        s_w += w
        s_t += w * t
        s_tt += w * t * t
        s_m += w * m
        s_tm += w * t * m
    det = s_w * s_tt - s_t * s_t
    factor = (s_w * s_tm - s_t * s_m) / det
    context = (s_m - factor * s_t) / s_w
    return LineFit(context, factor)


def abs_rel_errors(fit: LineFit, traced: Sequence[float], measured: Sequence[float]) -> list[float]:
    return [abs(fit.predict(t) - m) / m for t, m in zip(traced, measured, strict=True)]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def split_holdout(keys: Sequence[str], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices (fit, holdout): a seeded shuffle, `fraction` of them held out."""
    order = list(range(len(keys)))
    random.Random(seed).shuffle(order)
    n_hold = round(len(order) * fraction)
    return sorted(order[n_hold:]), sorted(order[:n_hold])


def run_calibration(jobs: int = 1, seed: int = 0, source_dir: Path = SOURCE_DIR,
                    constants_path: Path = CONSTANTS_PATH, report_path: Path | None = None) -> dict[str, Any]:
    """Trace the measured runs, fit on 70%, report the error on the held-out 30%, write both files."""
    runs = load_runs(source_dir)
    rows = [r for r in trace_all(runs, jobs) if r.get("traced_mib") not in ("", None)]
    traced = [float(r["traced_mib"]) for r in rows]
    measured = [float(r["measured_mib"]) for r in rows]
    fit_idx, hold_idx = split_holdout([r["key"] for r in rows], HOLDOUT_FRACTION, seed)
    fit = fit_line([traced[i] for i in fit_idx], [measured[i] for i in fit_idx])
    errors = abs_rel_errors(fit, [traced[i] for i in hold_idx], [measured[i] for i in hold_idx])
    # the fit is used far beyond these small MLPs: show how the error grows with the traced size
    top_cut = percentile([traced[i] for i in hold_idx], 90)
    top = [e for e, i in zip(errors, hold_idx, strict=True) if traced[i] >= top_cut]
    # the admission bound's margin: the 97.5th percentile of under-prediction on the fit split
    # (one-sided: reserving too little is what hurts), checked on the held-out runs
    under_fit = [measured[i] / fit.predict(traced[i]) - 1.0 for i in fit_idx]
    margin = max(0.0, percentile(under_fit, BOUND_QUANTILE * 100))
    upper_hold = [fit.predict(traced[i]) * (1.0 + margin) for i in hold_idx]
    report = {
        "bound_rel": round(margin, 5),
        "bound_under_rate": round(sum(u < measured[i] for u, i in zip(upper_hold, hold_idx, strict=True))
                                  / len(hold_idx), 5),
        "bound_over_reservation": round(sum(u / measured[i] - 1.0 for u, i in zip(upper_hold, hold_idx, strict=True))
                                        / len(hold_idx), 5),
        "median_abs_rel_err": round(percentile(errors, 50), 5),
        "p90_abs_rel_err": round(percentile(errors, 90), 5),
        "top_decile_traced_min_mib": round(top_cut, 1),
        "top_decile_median_abs_rel_err": round(percentile(top, 50), 5),
        "top_decile_p90_abs_rel_err": round(percentile(top, 90), 5),
        "measured_mib_max": max(measured),
        "n_fit": len(fit_idx),
        "n_holdout": len(hold_idx),
        "context_mib": round(fit.context_mib, 2),
        "factor": round(fit.factor, 5),
        "n_traced": len(rows),
        "n_failed": len(runs) - len(rows),
        "seed": seed,
        "assumed": {"optimizer": ASSUMED_OPTIMIZER, "precision": ASSUMED_PRECISION, "loss": "cross_entropy"},
    }
    constants = {
        "model": "memory_mib = context_mib + factor * traced_peak_mib",
        "context_mib": report["context_mib"],
        "factor": report["factor"],
        "holdout_median_abs_rel_err": report["median_abs_rel_err"],
        "holdout_p90_abs_rel_err": report["p90_abs_rel_err"],
        "bound_rel": report["bound_rel"],
        "holdout_bound_under_rate": report["bound_under_rate"],
        "n_fit": report["n_fit"],
        "n_holdout": report["n_holdout"],
        "source": "GPUMemNet (itu-rad/GPUMemNet, Datasets/MLP mlp_data_step1.csv + mlp_data_step2.csv): "
                  "6,000 MLP training runs, peak nvidia-smi memory on an NVIDIA A100-40GB. No licence file in "
                  "that repository: only these derived constants are shipped, not the data.",
        "assumptions": "runs traced as Adam, fp32, cross-entropy (the source does not state them)",
    }
    constants_path.write_text(json.dumps(constants, indent=2) + "\n")
    if report_path is not None:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        try:  # the real-GPU campaign's figures (`campaign report`) are its own: keep them
            kept = {"campaign": json.loads(report_path.read_text())["campaign"]}
        except (OSError, ValueError, KeyError, TypeError):
            kept = {}
        report_path.write_text(json.dumps({**report, **kept}, indent=2) + "\n")
    calibration_constants.cache_clear()
    return report


@cache
def calibration_constants(path: str = str(CONSTANTS_PATH)) -> LineFit:
    """The shipped constants (read once)."""
    data = json.loads(Path(path).read_text())
    return LineFit(float(data["context_mib"]), float(data["factor"]))


def calibrate(traced_peak_mib: float) -> float:
    """Memory as nvidia-smi would show it (MiB) for a traced tensor peak (MiB)."""
    return calibration_constants().predict(traced_peak_mib)


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)))


__all__ = ["MIB", "LineFit", "calibrate", "fit_line", "run_calibration"]
