"""The family path's point from the traced table: the real architectures of the same family and size.

A pod that names no architecture gives its family (`model-type`), parameters, layers, input, batch,
precision and optimizer. The traced table (predictor/data/exact.json: 1,539 timm, torchvision and
Hugging Face architectures, each traced at three inputs x three batches x precisions, every optimizer
exact) already holds real architectures of that family near that size. This reads the job off them:

- the neighbours: the table's architectures of the job's family (`vgg` read as `cnn`, vision mixers
  as `vit`, as docs/data-scientist.md tells a user to annotate them), nearest in log parameters and
  log layers (`K` of them, at most one per architecture);
- each neighbour's traced peak at the job's batch, input, precision and optimizer
  (`exact._estimate_entry`: the batch piecewise linear, the input interpolated between its traced
  inputs), minus its exact fixed bytes (weights, gradients, optimizer states: `features.decomposition`),
  is what its step saves for backward; scaled to the job's size by the physics' activation scale
  (sqrt(params x layers), `features.decomposition`), plus the job's own fixed bytes;
- the point: the distance-weighted median of the neighbours' readings in log space; memory the
  dataset's nvidia-smi calibration of that traced peak, as every other label.

Families the table does not hold (the torch.nn recurrent stacks, MLPs) get None: the network stays
their point. The text families (TABLE_POINT_FAMILIES: `transformer`, `gpt`) are *served* this point
(`served_point`, called by `predictor.runtime` on the bare family path): on architecture groups held out
by the grouped split it erred less than the network's over each seed's held-out text jobs, though not
on every group (docs/predictor.md, "The family path on held-out groups"); the image families keep the
network's, which erred less there. Pure Python + numpy over the already-loaded table (no torch).
`exclude_group` leaves an architecture group out, so the held-out evaluation
(`predictor.family_eval`) never reads a job off its own architecture or its close variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from predictor import exact
from predictor import features as feats
from predictor.errors import SpecError
from predictor.table import TABLE_PATH, load_table

#: Neighbours read per job.
K = 6
#: Weight of log layers against log parameters in the neighbour distance.
LAYER_WEIGHT = 0.5
#: The table's families -> the `model-type` a user writes for them.
TABLE_FAMILY = {"vgg": "cnn", "mlp": "vit"}


@dataclass(frozen=True)
class _Index:
    names: tuple[str, ...]
    groups: np.ndarray
    families: np.ndarray
    log_params: np.ndarray
    log_layers: np.ndarray


@cache
def _index(path: str = str(TABLE_PATH)) -> _Index:
    models = load_table(path)["models"]
    names, groups, families, params, layers = [], [], [], [], []
    for name, e in sorted(models.items()):
        inputs = e["inputs"]
        default = inputs.get(str(e["default_input"])) or next(iter(inputs.values()))
        names.append(name)
        groups.append(str(e["group"]))
        families.append(TABLE_FAMILY.get(str(e["family"]), str(e["family"])))
        params.append(math.log(max(float(default["params_millions"]), 1e-6)))
        layers.append(math.log(max(float(default["num_layers"]), 1.0)))
    return _Index(tuple(names), np.asarray(groups, dtype=str), np.asarray(families, dtype=str),
                  np.asarray(params), np.asarray(layers))


def families(path: str = str(TABLE_PATH)) -> set[str]:
    return set(_index(path).families.tolist())


def _fixed_mib(params_millions: float, precision: str, optimizer: str) -> float:
    cols = {"params_millions": np.asarray([params_millions]), "batch_size": np.asarray([1.0]),
            "num_layers": np.asarray([1.0]), "input_dim": np.asarray([1.0]), "model_type": np.asarray(["cnn"]),
            "precision": np.asarray([precision]), "optimizer": np.asarray([optimizer])}
    return float(feats.decomposition(cols, shapes=False).fixed_mib[0])


@dataclass(frozen=True)
class TablePoint:
    memory_mib: float  # the dataset's nvidia-smi calibration of the traced-equivalent peak
    traced_mib: float
    neighbours: tuple[str, ...]
    spread: float  # the neighbours' readings: max / min (how much they disagree)


def point(model_type: str, params_millions: float, num_layers: int, input_dim: int, batch_size: int,
          precision: str, optimizer: str, exclude_group: str | None = None, k: int = K,
          path: str = str(TABLE_PATH)) -> TablePoint | None:
    """The job's memory read off its family's nearest traced architectures (None: the table has none)."""
    index = _index(path)
    mask = index.families == model_type
    if exclude_group is not None:
        mask &= index.groups != exclude_group
    candidates = np.flatnonzero(mask)
    if candidates.size == 0 or params_millions <= 0:
        return None
    lp, ll = math.log(params_millions), math.log(max(float(num_layers), 1.0))
    distance = np.abs(index.log_params[candidates] - lp) + LAYER_WEIGHT * np.abs(index.log_layers[candidates] - ll)
    order = candidates[np.argsort(distance, kind="stable")]
    table = load_table(path)
    # the dataset's precisions: whole-model bf16 is `bf16`; bf16-mixed is read as exact.estimate reads it
    state_precision = {"bf16-mixed": "amp", "fp16": "bf16"}.get(precision, precision)
    fixed_q = _fixed_mib(params_millions, state_precision, optimizer)
    scale_q = math.sqrt(params_millions * max(float(num_layers), 1.0))
    readings: list[float] = []
    weights: list[float] = []
    used: list[str] = []
    for i in order:
        if len(used) >= k:
            break
        name = index.names[int(i)]
        e = table["models"][name]
        try:
            readings_of = ("amp", "bf16") if precision == "bf16-mixed" else (precision,)
            peak = max(exact._estimate_entry(name, e, batch_size, input_dim, p, optimizer, table).traced_peak_mib
                       for p in readings_of)
        except (SpecError, KeyError):
            continue
        p_c, l_c = math.exp(float(index.log_params[i])), math.exp(float(index.log_layers[i]))
        fixed_c = _fixed_mib(p_c, state_precision, optimizer)
        activation = max(peak - fixed_c, feats.ACTIVATION_FLOOR * max(peak, 1e-9))
        reading = activation * scale_q / math.sqrt(p_c * l_c)
        d = abs(float(index.log_params[i]) - lp) + LAYER_WEIGHT * abs(float(index.log_layers[i]) - ll)
        readings.append(math.log(max(reading, 1e-9)))
        weights.append(1.0 / (0.05 + d))
        used.append(name)
    if not used:
        return None
    activation_q = math.exp(_weighted_median(readings, weights))
    traced = fixed_q + activation_q
    cal = table["calibration"]
    memory = float(cal["context_mib"]) + float(cal["factor"]) * traced
    return TablePoint(round(memory, 1), round(traced, 1), tuple(used),
                      round(math.exp(max(readings) - min(readings)), 4))


def _weighted_median(values: list[float], weights: list[float]) -> float:
    order = sorted(range(len(values)), key=values.__getitem__)
    total, acc = sum(weights), 0.0
    for j in order:
        acc += weights[j]
        if acc >= total / 2:
            return values[j]
    return values[order[-1]]


#: The families whose bare family-path point is the table's (issue 47): one home for the server and
#: the held-out evaluation (`predictor.family_eval`, candidate `text_table`).
TABLE_POINT_FAMILIES = ("transformer", "gpt")


def served_point(spec: Any, exclude_group: str | None = None) -> TablePoint | None:
    """The table's point where the family path serves it (a bare job of a TABLE_POINT_FAMILIES family the
    table holds), else None: the network's point stays."""
    if spec.model_type not in TABLE_POINT_FAMILIES or spec.activations_millions > 0:
        return None
    return point_of(spec, exclude_group)


def point_of(spec: Any, exclude_group: str | None = None, k: int = K) -> TablePoint | None:
    """`point` for a JobSpec (family path only: a named model or a traced peak gets None)."""
    if spec.model or spec.traced_peak_mib > 0:
        return None
    return point(spec.model_type, spec.params_millions, spec.num_layers, spec.input_dim, spec.batch_size,
                 spec.precision, spec.optimizer, exclude_group, k)
