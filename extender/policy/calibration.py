"""Online calibration per GPU model: the offset between observed and predicted peaks, learned from pods.

The memory a process shows beyond its tensors (CUDA context, cuDNN/cuBLAS workspaces, allocator
slack) depends on the GPU model, the driver and the framework: a cluster whose GPUs keep 700 MiB
more per process than the GPUs the predictor was calibrated on has every bound 700 MiB short. This
rule learns that offset from the peaks the agent observed for pods placed there, per (GPU model,
node image), and shifts the Demand by it: the point by the median of (observed - predicted point),
the bound by how far the observed peaks went above the bounds they were admitted with (a robust
high quantile of observed - bound: median + 2 scaled MADs), so the bound's under-rate returns to a
few percent whatever the GPU keeps per process:

- one value per pod (its highest observed peak minus its prediction): a pod seen in many reports
  counts once, so a long-running job cannot outvote the others;
- robust: the median over the most recent WINDOW pods (an OOM-ing outlier or a job that allocates
  far beyond its annotations moves it by at most one rank);
- never from one pod: no offset below MIN_PODS distinct pods (the key then has none: 0);
- bounded: clipped to [-MAX_DOWN_MIB, +MAX_UP_MIB] (a bad batch of reports cannot unreserve a GPU);
  corrections downwards are halved (a bound errs on the safe side).

Pure functions over a snapshot (no I/O, no clock): `learn(observations) -> Offsets`,
`corrected(memory, upper, offsets, gpu_model, node_image) -> (memory, upper)`. The usage rule and
the replay both call these; the ledger keeps the observations.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Distinct pods needed before any offset is learned for a (GPU model, node image).
MIN_PODS = 5
#: Pods the median runs over (the most recent ones: a driver upgrade is followed within WINDOW pods).
WINDOW = 50
#: Bounds of the learned offset (MiB).
MAX_UP_MIB = 4096.0
MAX_DOWN_MIB = 1024.0
#: Share of a downward offset applied (a bound shrinks more slowly than it grows).
DOWN_SHARE = 0.5
#: The bound's shift: median + Z_BOUND x MAD_TO_SD x MAD of (observed - admitted bound): a normal
#: spread's 97.7% quantile (z = 2, not 1.645: from 5 to 50 pods the median and MAD are themselves
#: uncertain), robust to outliers (one pod moves a median by one rank, not by its size).
Z_BOUND = 2.0
MAD_TO_SD = 1.4826

Key = tuple[str, str]  # (GPU model as NVML names it, node image: e.g. the node's OS/driver/runtime label)


@dataclass(frozen=True)
class Observation:
    """One report of one pod: its GPU model and node image, the predicted point (MiB, the Demand's
    `memory_mib` it was placed with), the peak observed so far (MiB), and an order (a sequence
    number or report time, for the window; larger is more recent)."""

    pod_uid: str
    gpu_model: str
    node_image: str
    predicted_mib: float
    observed_peak_mib: float
    order: float = 0.0
    admitted_mib: float = 0.0  # the bound it was admitted with (the Demand's memory_mib_upper); 0: unknown


@dataclass(frozen=True)
class Offset:
    mib: float  # add to the point
    pods: int  # distinct pods it was learned from
    raw_median_mib: float  # before bounding
    bound_mib: float = 0.0  # add to the bound (0 where no pod said what it was admitted with)


Offsets = Mapping[Key, Offset]


def learn(observations: Iterable[Observation], min_pods: int = MIN_PODS, window: int = WINDOW) -> dict[Key, Offset]:
    """The offset of every (GPU model, node image) with at least `min_pods` distinct pods."""
    per_pod: dict[tuple[Key, str], tuple[float, float, float, float]] = {}  # -> (order, point, bound, peak)
    for o in observations:
        if not (o.predicted_mib > 0 and o.observed_peak_mib >= 0):
            continue  # no prediction to compare with, or a bad reading
        k = ((o.gpu_model, o.node_image), o.pod_uid)
        seen = per_pod.get(k)
        if seen is None:
            per_pod[k] = (o.order, o.predicted_mib, o.admitted_mib, o.observed_peak_mib)
        else:
            per_pod[k] = (max(seen[0], o.order), seen[1], seen[2], max(seen[3], o.observed_peak_mib))
    by_key: dict[Key, list[tuple[float, float, float | None]]] = {}
    for (key, _uid), (order, predicted, admitted, peak) in per_pod.items():
        by_key.setdefault(key, []).append((order, peak - predicted, peak - admitted if admitted > 0 else None))
    out: dict[Key, Offset] = {}
    for key, values in by_key.items():
        if len(values) < min_pods:
            continue
        recent = sorted(values, key=lambda v: v[0])[-window:]
        median = statistics.median(d for _, d, _ in recent)
        above = [a for _, _, a in recent if a is not None]
        bound = 0.0
        if len(above) >= min_pods:  # a robust (1 - TARGET_UNDER) quantile: median + Z x the scaled MAD
            centre = statistics.median(above)
            spread = MAD_TO_SD * statistics.median(abs(a - centre) for a in above)
            bound = _bounded(centre + Z_BOUND * spread)
        out[key] = Offset(round(_bounded(median), 1), len(values), round(median, 1), round(bound, 1))
    return out


def _bounded(offset: float) -> float:
    return min(MAX_UP_MIB, offset) if offset >= 0 else max(-MAX_DOWN_MIB, offset * DOWN_SHARE)


def corrected(memory_mib: float, upper_mib: float, offsets: Offsets, gpu_model: str,
              node_image: str) -> tuple[float, float]:
    """(point, bound) of a Demand on a GPU of this model and node image, shifted by the learned offset
    (unchanged where none is learned); never below zero, the bound never below the point."""
    offset = offsets.get((gpu_model, node_image))
    if offset is None:
        return memory_mib, upper_mib
    point = max(0.0, memory_mib + offset.mib)
    return point, max(point, upper_mib + (offset.bound_mib if offset.bound_mib else offset.mib))
