"""DeepRes priority: who goes first and who may be preempted.

    priority = criticality_points + urgency_points + size_points            (0 .. 45)

    criticality_points = 10 x level          low 0, normal 10, high 20, critical 30
    urgency_points     = 10 x min(1, run_s / max(time_left_s, deadline_floor_s))   with a deadline
                         0                                                        without one
                         (run_s = predicted GPU-seconds of one process = wall time on the reference
                          GPU; time_left_s = deadline - now; a passed deadline gives the full 10)
    size_points        = 5 x max(0, 1 - log10(1 + gpu_seconds x gpus) / log10(1 + size_scale_gpu_s))
                         (smaller jobs first: a 1-GPU-hour job earns ~2.2, a 1e6 GPU-s job 0)

Criticality dominates (a level is worth as much as the whole urgency range), so an admin's
criticality ordering is never inverted by size alone; within a level, a job that must start now to
meet its deadline goes before one with slack, and small jobs before large ones. The criticality is
the pod's PriorityClass value when it has one (mapped by `criticality_from_priority_class`), else
its annotation capped by the namespace's ceiling (`cap_criticality`).
"""

from __future__ import annotations

import math

from extender.policy.types import CRITICALITIES, PolicyParams, PriorityInputs

CRITICALITY_POINTS = 10.0
URGENCY_POINTS = 10.0
SIZE_POINTS = 5.0

#: PriorityClass values from which a pod counts as critical / high; >= 0 normal; negative low.
#: (Kubernetes' own system classes are 2e9; user classes up to 1e9.)
PRIORITY_CLASS_CRITICAL_FROM = 1_000_000
PRIORITY_CLASS_HIGH_FROM = 1_000


def priority_of(inputs: PriorityInputs, now_s: float, params: PolicyParams) -> float:
    """The DeepRes priority (0..45) of a pod at time `now_s` (the formula in the module docstring)."""
    level = min(max(inputs.criticality, 0), len(CRITICALITIES) - 1)
    points = CRITICALITY_POINTS * level
    if inputs.deadline_s is not None:
        time_left = max(inputs.deadline_s - now_s, params.deadline_floor_s)
        points += URGENCY_POINTS * min(1.0, max(inputs.gpu_seconds, 0.0) / time_left)
    size = max(inputs.gpu_seconds, 0.0) * max(inputs.gpus, 1)
    scale = math.log10(1.0 + max(params.size_scale_gpu_s, 1.0))
    points += SIZE_POINTS * max(0.0, 1.0 - math.log10(1.0 + size) / scale)
    return points


def criticality_level(name: str) -> int:
    """The level of a criticality name (`low`..`critical`); raises ValueError for anything else."""
    return CRITICALITIES.index(name.strip().lower())


def cap_criticality(requested: int, ceiling: int) -> int:
    """A criticality annotation capped by the admin's per-namespace ceiling."""
    return max(0, min(requested, ceiling))


def criticality_from_priority_class(value: int) -> int:
    """The criticality level a PriorityClass value stands for (it wins over the annotation)."""
    if value >= PRIORITY_CLASS_CRITICAL_FROM:
        return 3
    if value >= PRIORITY_CLASS_HIGH_FROM:
        return 2
    return 1 if value >= 0 else 0
