"""Step time per GPU model: how long one training iteration of a job takes on a given GPU.

    step = fixed + per-layer cost of the family's kind of layer x layers   (kernel launches, Python: per step)
         + per serial step x layers x sequence length (recurrent families: one cell after the other)
         + GFLOPs x seconds per GFLOP of the precision                     (compute)
         + traced peak MiB x seconds per MiB                               (memory traffic)

fitted on the campaign's measured `step_s` (predictor/data/measured/h100-*.csv; the third
iteration's wall time) by minimising the mean absolute log error, scored on architecture groups held
out (5 folds by group). The campaign's step also holds two things that are not the job's: the
co-runners (`ran_beside`: a step beside k others is the alone step x (1 + k)^c) and the benchmark's
own input, drawn with `torch.randn` on the host inside the step (seconds per input element, fp32 and
bf16: the largest single cost of a big-image step there). The fit models both; the runtime leaves
both out (`CAMPAIGN_TERMS` in predictor/steptime_fit.py): a job's step here is on the GPU, alone, its
data loader overlapping.

The coefficients are the H100's; another GPU model scales the compute term by the ratio of
published dense peak throughputs and the traffic term by the ratio of memory bandwidths
(GPU_MODELS: NVIDIA's data sheets), the per-step costs stay (they are the host's and the launch
latency's). An unknown GPU model is read as an A100 40GB (the reference GPU of
`estimate_gpu_seconds`) and says so (`known_gpu`).

Runtime: numpy-free arithmetic over predictor/data/steptime.json; `python -m predictor.steptime_fit`
refits it (scipy) and prints the held-out figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from predictor.spec import Demand, JobSpec

COEFFICIENTS_PATH = Path(__file__).resolve().parent / "data" / "steptime.json"
MEASURED = Path(__file__).resolve().parent / "data" / "measured" / "h100-2026-11-24.csv"
JOBS = Path(__file__).resolve().parent / "data" / "real_jobs.csv.gz"  # the dataset's rows (GFLOPs of each job)
REFERENCE_GPU = "h100-sxm"
REPORT = Path(__file__).resolve().parents[1] / "reports" / "predictor.json"


@dataclass(frozen=True)
class GpuModel:
    """Published dense peaks (TFLOPs: fp32 without tensor cores, fp16/bf16 tensor cores with fp32
    accumulate, no sparsity) and memory bandwidth (TB/s), from NVIDIA's data sheets."""

    name: str
    fp32_tflops: float
    half_tflops: float
    bandwidth_tbs: float


#: nvidia-smi name fragments (lower case, first match wins) -> the model's published figures.
GPU_MODELS: tuple[tuple[str, GpuModel], ...] = (
    ("h200", GpuModel("h200", 67.0, 989.0, 4.8)),
    ("h100 pcie", GpuModel("h100-pcie", 51.0, 756.0, 2.0)),
    ("h100", GpuModel("h100-sxm", 67.0, 989.0, 3.35)),
    ("a100-sxm4-80gb", GpuModel("a100-80gb", 19.5, 312.0, 2.039)),
    ("a100 80gb", GpuModel("a100-80gb-pcie", 19.5, 312.0, 1.935)),
    ("a100", GpuModel("a100-40gb", 19.5, 312.0, 1.555)),
    ("l40s", GpuModel("l40s", 91.6, 362.0, 0.864)),
    ("l40", GpuModel("l40", 90.5, 181.0, 0.864)),
    ("l4", GpuModel("l4", 30.3, 121.0, 0.3)),
    ("a10", GpuModel("a10", 31.2, 125.0, 0.6)),
    ("v100", GpuModel("v100", 15.7, 125.0, 0.9)),
    ("t4", GpuModel("t4", 8.1, 65.0, 0.32)),
    ("4090", GpuModel("rtx-4090", 82.6, 165.0, 1.008)),
)
FALLBACK_GPU = GpuModel("a100-40gb", 19.5, 312.0, 1.555)
_BY_NAME = {m.name: m for _, m in GPU_MODELS}


def gpu_model(name: str) -> tuple[GpuModel, bool]:
    """(the GPU model's figures, known) for an nvidia-smi name (`NVIDIA H100 80GB HBM3`) or a short name."""
    text = str(name).strip().lower()
    if text in _BY_NAME:
        return _BY_NAME[text], True
    for fragment, model in GPU_MODELS:
        if fragment in text:
            return model, True
    return FALLBACK_GPU, False


def _half(precision: str) -> bool:
    return precision != "fp32"


#: The family's kind of layer: what one of its `num-layers` costs in kernel launches differs (a
#: transformer block runs tens of kernels, a conv layer a few, a linear layer one or two).
LAYER_KINDS: dict[str, str] = {
    "vit": "transformer", "gpt": "transformer", "transformer": "transformer",
    "cnn": "conv", "resnet": "conv", "vgg": "conv",
    "mlp": "mlp",
    "rnn": "recurrent", "lstm": "recurrent", "gru": "recurrent",
}
#: The columns the coefficients multiply, in the order of `weights` in steptime.json.
FEATURES: tuple[str, ...] = ("fixed", "layers_transformer", "layers_conv", "layers_mlp", "layers_recurrent",
                             "recurrent_serial_steps", "gflops_fp32", "gflops_half", "traced_mib")
#: Which part of the step each column is (`parts`): per-step (host and launch latency), compute, traffic.
PER_STEP, COMPUTE, TRAFFIC = range(3)
PART_OF: tuple[int, ...] = (PER_STEP,) * 6 + (COMPUTE, COMPUTE, TRAFFIC)


def layer_kind(family: str) -> str:
    """The kind of layer of a family (`JobSpec.model_type`); an unknown family counts as conv layers."""
    return LAYER_KINDS.get(str(family).strip().lower(), "conv")


def features(layers: float, gflops: float, traced_mib: float, precision: str, family: str = "cnn",
             input_dim: float = 0.0) -> tuple[float, ...]:
    """The columns (FEATURES) the coefficients multiply: 1, the layers in the column of the family's kind
    of layer, layers x sequence length (`input_dim`) for recurrent families, GFLOPs in the column of
    its precision, traced MiB."""
    half = _half(precision)
    kind = layer_kind(family)
    layers = float(layers)
    per_kind = tuple(layers if kind == k else 0.0 for k in ("transformer", "conv", "mlp", "recurrent"))
    serial = layers * float(input_dim) if kind == "recurrent" else 0.0
    return (1.0, *per_kind, serial, 0.0 if half else float(gflops), float(gflops) if half else 0.0,
            float(traced_mib))


@cache
def coefficients(path: str = str(COEFFICIENTS_PATH)) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    if data.get("features") != list(FEATURES) or len(data.get("weights", ())) != len(FEATURES):
        raise ValueError(f"{path}: its `features`/`weights` are not this runtime's columns {FEATURES}: "
                         "refit it with `python -m predictor.steptime_fit`")
    return data


def parts(layers: float, gflops: float, traced_mib: float, precision: str, coef: dict[str, Any] | None = None,
          family: str = "cnn", input_dim: float = 0.0) -> tuple[float, float, float]:
    """(per-step, compute, traffic) seconds of one step on the reference GPU (the H100 measured), the job alone."""
    w = (coef or coefficients())["weights"]
    x = features(layers, gflops, traced_mib, precision, family, input_dim)
    out = [0.0, 0.0, 0.0]
    for weight, value, part in zip(w, x, PART_OF, strict=True):
        out[part] += float(weight) * value
    return out[0], out[1], out[2]


def on_gpu(step_parts: tuple[float, ...], precision: str, gpu: str) -> float:
    """Seconds per step on `gpu` from the reference GPU's parts (compute by peak, traffic by bandwidth)."""
    if not step_parts:
        return 0.0
    fixed, compute, traffic = step_parts
    ref, _ = gpu_model(REFERENCE_GPU)
    model, _ = gpu_model(gpu)
    half = _half(precision)
    peak_ratio = (ref.half_tflops / model.half_tflops) if half else (ref.fp32_tflops / model.fp32_tflops)
    return fixed + compute * peak_ratio + traffic * ref.bandwidth_tbs / model.bandwidth_tbs


def traced_mib_of(spec: JobSpec, demand: Demand) -> float:
    """The traced peak behind a Demand: the table's when the job names its model, the user's traced
    peak when given, else the Demand's memory through the shipped calibration (MiB)."""
    from predictor import exact

    if spec.traced_peak_mib > 0:
        return spec.traced_peak_mib
    if spec.model:
        try:
            return exact.estimate(spec.model, spec.batch_size, spec.input_dim, spec.precision, spec.optimizer,
                                  task=spec.task, target_dim=spec.target_dim).traced_peak_mib
        except ValueError:
            pass
    cal = exact.load_table()["calibration"]
    return max(0.0, (demand.memory_mib - float(cal["context_mib"])) / float(cal["factor"]))


def step_parts(spec: JobSpec, demand: Demand) -> tuple[float, float, float]:
    return parts(spec.num_layers, demand.gflops_per_iteration, traced_mib_of(spec, demand), spec.precision,
                 family=spec.model_type, input_dim=spec.input_dim)


def step_seconds(spec: JobSpec, demand: Demand, gpu: str = REFERENCE_GPU) -> float:
    """Seconds per training step of `spec` (whose Demand the predictor gave) on the GPU model `gpu`
    (nvidia-smi's name, e.g. `NVIDIA A100-SXM4-40GB`, or a short name): the Demand's own parts
    when it carries them (`Demand.step_parts`), else computed here."""
    return on_gpu(demand.step_parts or step_parts(spec, demand), spec.precision, gpu)
