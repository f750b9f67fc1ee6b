"""The step-time model against solo steps measured apart from the campaign it was fitted on.

/work/shared/data/colocation (`h100-2026-11-27.json`) holds the steady-state steps per second of 17
real jobs alone on an H100 (3 warm-up steps, 5-second windows, inputs drawn on the GPU): none of its
steps is in the campaign's table. Each job is read as a user would annotate it (`SPECS`: the exact
architecture where the table holds it, the family annotations for the hand-written ones) and the
runtime (`steptime.step_seconds` on the Demand the predictor gives) is scored on the measured step.
Jobs that sleep after each step (`wait_ms`, an input-bound job) are left out: their step is the wait.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from predictor import datapaths

COLOCATION = datapaths.COLOCATION / "h100-2026-11-27.json"

#: The rate file's jobs as annotations (`JobSpec.parse`), from its own descriptions. Hand-written nets:
#: params counted from the layers it lists (conv 3x3 64-128-256-512-512 + Linear(512,10): 3.9 M;
#: Embedding(10000,512) + LSTM(512,1024,2) + Linear(1024,10000): 30.1 M; MLP 1024-4096-4096-4096-10: 37.8 M).
SPECS: dict[str, dict[str, str]] = {
    "timm/resnet50": {"model": "timm/resnet50"},
    "timm/vit_base_patch16_224": {"model": "timm/vit_base_patch16_224"},
    "timm/mobilenetv3_large_100": {"model": "timm/mobilenetv3_large_100"},
    "timm/efficientnet_b0": {"model": "timm/efficientnet_b0"},
    "timm/resnet18": {"model": "timm/resnet18"},
    "hf/bert-base-uncased (sequence classification)": {"model": "hf/bert-base-uncased",
                                                       "task": "sequence-classification"},
    "hf/gpt2 (causal LM)": {"model": "hf/gpt2", "task": "causal-lm"},
    "hand-written CNN": {"model-type": "cnn", "params-millions": "3.9", "num-layers": "6"},
    "LSTM LM": {"model-type": "lstm", "params-millions": "30.1", "num-layers": "2"},
    "MLP": {"model-type": "mlp", "params-millions": "37.8", "num-layers": "4"},
}


def _annotations(job: dict[str, Any], described: dict[str, dict[str, Any]]) -> dict[str, str] | None:
    text = str(job.get("model", ""))
    if text.startswith("the same"):  # "the same hand-written CNN": the job above with that description
        rest = text.removeprefix("the same").strip()
        text = next((str(j["model"]) for j in described.values() if str(j.get("model", "")).startswith(rest)), text)
    for prefix, spec in SPECS.items():
        if text.startswith(prefix):
            return {**spec, "batch-size": str(job["batch_size"]), "input-dim": str(job["input_dim"]),
                    "precision": str(job["precision"]), "optimizer": str(job["optimizer"])}
    return None


def solo_steps(path: Path = COLOCATION) -> list[tuple[str, dict[str, str], float]]:
    """(job, annotations, measured solo step in seconds) for every job of the rate file that has a solo rate,
    no wait, and a known reading (`SPECS`)."""
    data = json.loads(path.read_text())
    jobs: dict[str, dict[str, Any]] = data["jobs"]
    rates: dict[str, float] = {}
    for group in data["groups"]:
        for job, rate in group.get("alone_steps_per_s", {}).items():
            rates.setdefault(job, float(rate))
    out = []
    for job, rate in sorted(rates.items()):
        described = jobs.get(job, {})
        if float(described.get("wait_ms", 0) or 0) > 0 or rate <= 0:
            continue
        spec = _annotations(described, jobs)
        if spec is not None:
            out.append((job, spec, 1.0 / rate))
    return out


def colocation_solo(path: Path = COLOCATION, coef: dict[str, Any] | None = None) -> dict[str, Any]:
    """The runtime's H100 step / the measured solo step on the rate file's jobs (figures as the held-out
    ones, plus each job's ratio); {} when the file is absent."""
    if not path.exists():
        return {}
    from predictor import steptime
    from predictor.runtime import Predictor
    from predictor.spec import JobSpec

    predictor = Predictor.load()
    names, predicted, measured = [], [], []
    for job, annotated, step in solo_steps(path):
        spec = JobSpec.parse(annotated)
        demand = predictor.predict(spec)
        parts = steptime.step_parts(spec, demand) if coef is None else steptime.parts(
            spec.num_layers, demand.gflops_per_iteration, steptime.traced_mib_of(spec, demand), spec.precision,
            coef, family=spec.model_type, input_dim=spec.input_dim)
        names.append(job)
        predicted.append(steptime.on_gpu(parts, spec.precision, steptime.REFERENCE_GPU))
        measured.append(step)
    if not names:
        return {}
    result = figures(predicted, measured)
    result["ratios"] = {job: round(p / m, 3) for job, p, m in zip(names, predicted, measured, strict=True)}
    result["source"] = f"shared/data/colocation/{path.name}"
    return result


def figures(predicted: Any, measured: Any) -> dict[str, Any]:
    """Predicted / measured: median and p90 of |ratio - 1|, p10, p90 and median of the ratio, p90/p10."""
    import numpy as np

    predicted, measured = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    rel = np.abs(predicted / measured - 1.0)
    ratio = predicted / measured
    p10, p90 = float(np.percentile(ratio, 10)), float(np.percentile(ratio, 90))
    return {"n": len(measured), "median_abs_rel_err": round(float(np.median(rel)), 4),
            "p90_abs_rel_err": round(float(np.percentile(rel, 90)), 4),
            "ratio_p10": round(p10, 4), "ratio_p90": round(p90, 4),
            "median_ratio": round(float(np.median(ratio)), 4), "p90_over_p10": round(p90 / p10, 3)}
