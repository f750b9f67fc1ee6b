"""The exact-architecture path: `deepres.io/model: timm/resnet50` -> a Demand from traced curves.

`deepres dataset real` traces every named architecture (timm, torchvision, Hugging Face configs) at
three inputs x fp32/amp/bf16 x three batch sizes and writes predictor/data/exact.json: per traced
point the forward/backward peak and the bytes left after backward, the GFLOPs, and each
optimizer's state and step bytes. A request is a lookup, no tracing and no torch:

- batch: piecewise linear through the traced batches, the end segments extended (peak memory is
  affine in the batch to within the residual the data card reports; at small batches the
  after-backward term can dominate, which the max below keeps);
- optimizer: peak = max(fb + state, end + state + step), exact (tracing.StepComponents);
- precision: fp16 has bf16's bytes;
- input size: exact at a traced input, else from the two nearest traced inputs: the after-backward
  bytes linearly, the activations on top of them and the GFLOPs as a power of the input (and the
  bound widens by the error this makes on traced inputs left out, the data card's check);
- memory = the nvidia-smi calibration (predictor/dataset/calibration.json) of the traced peak;
  memory_mib_upper = memory x (1 + the calibration's margin [+ batch extrapolation margin]
  [+ input interpolation margin]), or, where the real-GPU campaign measured a GPU
  (`bound.measured_lines`, predictor/dataset/campaign.py), the highest of that and each measured
  line of the job's precision x (1 + its own margin + the same extra margins): the public
  calibration was fitted on small MLPs on an A100, and a bound must hold on the GPUs measured
  (an H100 with today's CUDA: a smaller context, a larger factor for large jobs).

An unknown name raises `SpecError` naming the closest known names (difflib).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from predictor import tasks
from predictor.spec import Demand, JobSpec, SpecError, estimate_gpu_seconds
from predictor.table import HF_TABLE_PATH, SOURCES, TABLE_PATH, entry, load_table, load_tasks, names, resolve

__all__ = ["HF_TABLE_PATH", "SOURCES", "TABLE_PATH", "ExactEstimate", "NotTraced", "entry", "estimate", "load_table",
           "measured_upper", "names", "override", "resolve", "traced_memory"]


class NotTraced(SpecError):
    """A known architecture asked at an input size the table cannot reach (one traced input only)."""


@dataclass(frozen=True)
class ExactEstimate:
    """What the table says for one request (MiB, GFLOPs) and how it was obtained."""

    name: str
    traced_peak_mib: float
    memory_mib: float
    memory_mib_upper: float
    gflops_per_iteration: float
    interpolated_input: bool
    extrapolated_batch: bool


def _piecewise(xs: list[int], ys: list[float], x: float) -> float:
    """Linear interpolation through (xs, ys), the end segments extended beyond the ends."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _components(curve: dict[str, Any], batches: list[int], batch: int) -> tuple[float, float, float]:
    """(fb peak, after-backward, GFLOPs) at one traced input and any batch."""
    return (_piecewise(batches, curve["fb"], batch), _piecewise(batches, curve["end"], batch),
            _piecewise(batches, curve["gflops"], batch))


def _at_input(curve: dict[str, Any], batches: list[int], batch: int, optimizer: str) -> tuple[float, float]:
    """(traced peak MiB, GFLOPs) at one traced input."""
    fb, end, gflops = _components(curve, batches, batch)
    state, step = curve["optimizers"][optimizer]
    return max(fb + state, end + state + step), gflops


#: How activations grow with the input when the table cannot tell (image side: area; tokens: length).
_DEFAULT_EXPONENT = {"image": 2.0}


def _activation_line(c: dict[str, Any], batches: list[int]) -> tuple[float, float] | None:
    """(intercept, MiB per sample) of the forward/backward peak over the two largest traced batches,
    or None when activations do not decide that peak there (it sits on the after-backward plateau)."""
    (b2, b3), (f2, f3), (e2, e3) = batches[-2:], c["fb"][-2:], c["end"][-2:]
    if f2 <= e2 * 1.01 or f3 <= e3 * 1.01:
        return None
    slope = (f3 - f2) / (b3 - b2)
    return f3 - slope * b3, slope


def _between_inputs(curves: list[dict[str, Any]], inputs: list[int], want: int, batches: list[int], batch: int,
                    optimizer: str, kind: str = "text") -> tuple[float, float]:
    """(traced peak, GFLOPs) at an untraced input, from the traced ones. The forward/backward peak
    is a line in the batch whose slope (the activations of one sample) grows as a power of the
    input (log-log between the nearest inputs where activations decide the peak; area for images,
    length for tokens when only one does), or the after-backward plateau, whichever is higher;
    the after-backward bytes (weights, gradients), the optimizer and the intercept are linear in
    the input, the GFLOPs a power of it."""
    j = min(max(bisect.bisect_left(inputs, want), 1), len(inputs) - 1)
    (lo, hi), (c_lo, c_hi) = (inputs[j - 1], inputs[j]), (curves[j - 1], curves[j])
    t_lin = (want - lo) / (hi - lo)

    def lin(a: float, b: float) -> float:
        return a + t_lin * (b - a)

    def power(x0: int, a: float, x1: int, b: float) -> float:
        a, b = max(a, 1e-9), max(b, 1e-9)
        t = (math.log(want) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(a) + t * (math.log(b) - math.log(a)))

    end_lo, end_hi = _piecewise(batches, c_lo["end"], batch), _piecewise(batches, c_hi["end"], batch)
    end = max(0.0, lin(end_lo, end_hi))
    plateau = end + min(_piecewise(batches, c["fb"], batch) - _piecewise(batches, c["end"], batch) for c in curves)
    lines = [(i, ln) for i, c in zip(inputs, curves, strict=True) if (ln := _activation_line(c, batches))]
    if len(lines) >= 2:
        k = min(max(bisect.bisect_left([i for i, _ in lines], want), 1), len(lines) - 1)
        (i0, (a0, s0)), (i1, (a1, s1)) = lines[k - 1], lines[k]
        slope = power(i0, s0, i1, s1)
        intercept = a0 + (want - i0) / (i1 - i0) * (a1 - a0)
        fb = max(plateau, intercept + slope * batch)
    elif lines:
        i0, (a0, s0) = lines[0]
        fb = max(plateau, a0 + s0 * (want / i0) ** _DEFAULT_EXPONENT.get(kind, 1.0) * batch)
    else:
        fb = max(plateau, lin(_piecewise(batches, c_lo["fb"], batch), _piecewise(batches, c_hi["fb"], batch)))
    state, step = (lin(c_lo["optimizers"][optimizer][n], c_hi["optimizers"][optimizer][n]) for n in (0, 1))
    gflops = power(lo, _piecewise(batches, c_lo["gflops"], batch), hi, _piecewise(batches, c_hi["gflops"], batch))
    return max(fb + state, end + state + step), gflops


def estimate(name: str, batch_size: int, input_dim: int | None, precision: str, optimizer: str,
             path: str = str(TABLE_PATH), task: str = "", target_dim: int = 0) -> ExactEstimate:
    """The traced, calibrated demand of one training process of a named architecture, with the head
    of `task` (its default when empty: `predictor.tasks`) and, for seq2seq, `target_dim` target tokens.
    `bf16-mixed` is the larger of amp (the same byte widths: fp32 weights, gradients and states,
    half activations) and whole-model bf16."""
    if precision == "bf16-mixed":
        mixed = estimate(name, batch_size, input_dim, "amp", optimizer, path, task, target_dim)
        try:
            true = estimate(name, batch_size, input_dim, "bf16", optimizer, path, task, target_dim)
        except SpecError:
            return mixed
        return ExactEstimate(mixed.name, max(mixed.traced_peak_mib, true.traced_peak_mib),
                             max(mixed.memory_mib, true.memory_mib), max(mixed.memory_mib_upper, true.memory_mib_upper),
                             mixed.gflops_per_iteration, mixed.interpolated_input or true.interpolated_input,
                             mixed.extrapolated_batch)
    table = load_table(path)
    resolved = resolve(name, path)
    e = table["models"][resolved]
    default_task, _ = tasks.tasks_of(resolved)
    chosen = task or default_task
    if chosen == "seq2seq" and target_dim:
        return _at_target(resolved, e, batch_size, input_dim, precision, optimizer, target_dim, table)
    if chosen != default_task:
        e = _task_entry(resolved, e, chosen)
    return _estimate_entry(resolved, e, batch_size, input_dim, precision, optimizer, table)


def _task_entry(resolved: str, e: dict[str, Any], key: str) -> dict[str, Any]:
    """The traced entry of another head (`predictor/data/exact_tasks.json`), in exact.json's layout."""
    traced = load_tasks().get(resolved, {}).get("tasks", {}).get(key)
    if traced is None:
        known = {tasks.tasks_of(resolved)[0], *(k.split("@", 1)[0] for k in load_tasks().get(resolved, {}).get(
            "tasks", {}))}
        raise NotTraced("task", key.split("@", 1)[0], f"a task traced for {resolved} ({', '.join(sorted(known))})")
    return {**e, "batches": traced["batches"], "inputs": traced["inputs"]}


def _at_target(resolved: str, e: dict[str, Any], batch_size: int, input_dim: int | None, precision: str,
               optimizer: str, target_dim: int, table: dict[str, Any]) -> ExactEstimate:
    """A seq2seq job with `target_dim` target tokens: linear in the target length between the traced
    ones (`tasks.TARGET_LENGTHS`), the end segments extended (the bound widens as for a batch outside
    the traced ones)."""
    traced = sorted(int(k.split("@", 1)[1]) for k in load_tasks().get(resolved, {}).get("tasks", {})
                    if k.startswith("seq2seq@"))
    if not traced:
        raise NotTraced("target-dim", target_dim, f"a seq2seq target length traced for {resolved} (none is)")
    if target_dim in traced:
        return _estimate_entry(resolved, _task_entry(resolved, e, f"seq2seq@{target_dim}"), batch_size, input_dim,
                               precision, optimizer, table)
    j = min(max(bisect.bisect_left(traced, target_dim), 1), len(traced) - 1) if len(traced) > 1 else 0
    lo_t, hi_t = traced[max(j - 1, 0)], traced[j]
    lo = _estimate_entry(resolved, _task_entry(resolved, e, f"seq2seq@{lo_t}"), batch_size, input_dim, precision,
                         optimizer, table)
    if lo_t == hi_t:
        return lo
    hi = _estimate_entry(resolved, _task_entry(resolved, e, f"seq2seq@{hi_t}"), batch_size, input_dim, precision,
                         optimizer, table)
    t = (target_dim - lo_t) / (hi_t - lo_t)
    outside = not traced[0] <= target_dim <= traced[-1]
    widen = 1.0 + (float(table["bound"]["batch_extrapolation_rel"]) if outside else 0.0)

    def lin(a: float, b: float) -> float:
        return max(0.0, a + t * (b - a))

    memory = lin(lo.memory_mib, hi.memory_mib)
    return ExactEstimate(resolved, round(lin(lo.traced_peak_mib, hi.traced_peak_mib), 1), round(memory, 1),
                         round(max(lin(lo.memory_mib_upper, hi.memory_mib_upper) * widen, memory), 1),
                         round(lin(lo.gflops_per_iteration, hi.gflops_per_iteration), 4),
                         lo.interpolated_input or hi.interpolated_input, lo.extrapolated_batch or outside)


def _estimate_entry(resolved: str, e: dict[str, Any], batch_size: int, input_dim: int | None, precision: str,
                    optimizer: str, table: dict[str, Any]) -> ExactEstimate:
    key = "bf16" if precision == "fp16" else precision
    inputs = sorted(int(i) for i in e["inputs"] if key in e["inputs"][i]["curves"])
    if not inputs:
        raise SpecError("precision", precision, f"a precision traced for {resolved} "
                        f"({', '.join(sorted({p for i in e['inputs'].values() for p in i['curves']}))})")
    want = int(input_dim) if input_dim else int(e["default_input"])
    batches = [int(b) for b in e["batches"]]
    points = {i: _at_input(e["inputs"][str(i)]["curves"][key], batches, batch_size, optimizer) for i in inputs}
    if want in points:
        peak, gflops = points[want]
        interpolated = False
    else:
        if len(inputs) < 2:
            raise NotTraced("input-dim", want, f"{inputs[0]}, the only input traced for {resolved}")
        curves = [e["inputs"][str(i)]["curves"][key] for i in inputs]
        peak, gflops = _between_inputs(curves, inputs, want, batches, batch_size, optimizer, e["kind"])
        interpolated = True
    extrapolated = not batches[0] <= batch_size <= batches[-1]
    cal, bound = table["calibration"], table["bound"]
    memory = float(cal["context_mib"]) + float(cal["factor"]) * peak
    extra = float(bound["batch_extrapolation_rel"]) if extrapolated else 0.0
    if interpolated:  # per kind of input (image side, tokens...) when the table says
        by_kind: Any = bound["input_interpolation_rel"]
        extra += float(by_kind[e["kind"]] if e["kind"] in by_kind else by_kind["default"]) if isinstance(
            by_kind, dict) else float(by_kind)
    upper = max(memory * (1.0 + float(bound["calibration_rel"]) + extra),
                measured_upper(bound, key, peak, extra))
    return ExactEstimate(resolved, round(peak, 1), round(memory, 1), round(upper, 1),
                         round(gflops, 4), interpolated, extrapolated)


def measured_upper(bound: dict[str, Any], precision: str, traced_peak_mib: float, extra: float = 0.0) -> float:
    """The highest bound of the measured GPUs' lines for this precision (`any`: a traced peak whose
    precision is not known); 0 where the table holds no measured line."""
    uppers = [(float(line["context_mib"]) + float(line["factor"]) * traced_peak_mib)
              * (1.0 + float(line["rel"]) + extra)
              for line in bound.get("measured_lines", ()) if line["precision"] == precision]
    return max(uppers, default=0.0)


def traced_memory(traced_peak_mib: float, path: str = str(TABLE_PATH)) -> tuple[float, float]:
    """(memory, upper) MiB for a peak the user traced with `deepres profile`: calibrated, with the
    calibration's margin."""
    table = load_table(path)
    cal, rel = table["calibration"], float(table["bound"]["calibration_rel"])
    if not table["models"]:  # no table shipped: the calibration constants alone
        constants = json.loads((Path(__file__).resolve().parent / "dataset" / "calibration.json").read_text())
        cal = {"context_mib": constants["context_mib"], "factor": constants["factor"]}
    memory = float(cal["context_mib"]) + float(cal["factor"]) * float(traced_peak_mib)
    upper = max(memory * (1.0 + rel), measured_upper(table["bound"], "any", float(traced_peak_mib)))
    return round(memory, 1), round(upper, 1)


def override(spec: JobSpec, network: Demand) -> Demand:
    """The Demand to use for `spec`: from the traced table when it names an architecture, from the
    user's traced peak when it gives one (`deepres profile`), else the network's `network` as is.
    GFLOPs (and so GPU time) come from the table when it has them, else from the network."""
    if spec.model:
        try:
            est = estimate(spec.model, spec.batch_size, spec.input_dim, spec.precision, spec.optimizer,
                           task=spec.task, target_dim=spec.target_dim)
        except SpecError:  # an input or precision the table lacks: the family fields (from the table) still describe it
            return replace(network, model_version=f"{network.model_version}+untraced-input")
        return Demand(est.memory_mib, est.memory_mib_upper, est.gflops_per_iteration,
                      float(f"{estimate_gpu_seconds(est.gflops_per_iteration, spec.iterations, spec.precision):.6g}"),
                      f"{network.model_version}+exact")
    if spec.traced_peak_mib > 0:
        memory, upper = traced_memory(spec.traced_peak_mib)
        return Demand(memory, upper, network.gflops_per_iteration, network.gpu_seconds,
                      f"{network.model_version}+traced")
    return network
