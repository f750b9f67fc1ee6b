"""Per-GPU-model calibration: the Demand's memory as a given GPU model shows it.

A Demand's `memory_mib` is the traced peak through the public A100 line (predictor/dataset/
calibration.json: 1,462 MiB + 1.098 x traced). Each GPU model, driver and framework keeps its own
context and allocator slack, so where a GPU model was measured (the campaign's rows,
predictor/data/measured/) the Demand is re-read on that GPU's line: per path (`exact`: a named
architecture or a traced peak; `family`: the network on the family annotations) and precision,

    traced-equivalent = (memory_mib - A100 context) / A100 factor
    on the GPU        = context + factor x traced-equivalent,    bound = that x (1 + rel)

with `rel` the margin that leaves at most UNDER of the fitted jobs above it. The lines are fitted on
every measured job (`python -m predictor.realjobs --write-lines`; held-out figures: `realjobs`).
An uncalibrated GPU model keeps the Demand's own (wider) bound and says so (`calibrated` False).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from predictor.spec import Demand

LINES_PATH = Path(__file__).resolve().parent / "data" / "gpu_lines.json"
_A100 = Path(__file__).resolve().parent / "dataset" / "calibration.json"
#: Share of the fitted jobs a GPU line's bound may leave above it.
UNDER = 0.03


@dataclass(frozen=True)
class OnGpu:
    memory_mib: float
    memory_mib_upper: float
    calibrated: bool  # a measured line of this GPU model, path and precision was used
    note: str = ""


@cache
def _a100() -> tuple[float, float]:
    data = json.loads(_A100.read_text())
    return float(data["context_mib"]), float(data["factor"])


def traced_equivalent(memory_mib: float) -> float:
    context, factor = _a100()
    return max(0.0, (float(memory_mib) - context) / factor)


@cache
def lines(path: str = str(LINES_PATH)) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        return {"gpus": {}}
    data: dict[str, Any] = json.loads(file.read_text())
    return data


def gpu_key(gpu: str) -> str:
    """The calibration's name of an nvidia-smi GPU name (`NVIDIA H100 80GB HBM3` -> `h100-sxm`)."""
    from predictor.steptime import gpu_model

    model, known = gpu_model(gpu)
    return model.name if known else ""


def path_of(demand: Demand) -> str:
    return "exact" if demand.model_version.endswith(("+exact", "+traced")) else "family"


def _precision_key(precision: str) -> str:
    return {"bf16-mixed": "amp", "fp16": "bf16"}.get(precision, precision)


def on_gpu(demand: Demand, precision: str, gpu: str, path: str | None = None) -> OnGpu:
    """The Demand's memory and bound on the GPU model `gpu` (nvidia-smi's name)."""
    key = gpu_key(gpu)
    by_path = lines()["gpus"].get(key, {}).get(path or path_of(demand), {})
    line = by_path.get(_precision_key(precision)) or by_path.get("any")
    if line is None:
        return OnGpu(demand.memory_mib, demand.memory_mib_upper, False,
                     f"no measured line for GPU {gpu!r}: the Demand's own bound (wider, not calibrated to it)")
    traced = traced_equivalent(demand.memory_mib)
    memory = float(line["context_mib"]) + float(line["factor"]) * traced
    return OnGpu(round(memory, 1), round(memory * (1.0 + float(line["rel"])), 1), True)
