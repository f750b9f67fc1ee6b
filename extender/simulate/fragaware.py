"""Compatibility re-export: the fragmentation-aware score now lives in `extender.policy.fragmentation`
(the live extender and the simulator call the same functions)."""

from extender.policy.fragmentation import (
    DEFAULT_SHARPNESS,
    DemandMix,
    DemandShape,
    choose_gpus_fragaware,
    demand_mix,
    fragmentation,
    fragmentation_delta,
    merit_from_delta,
    score_nodes_fragaware,
    scores_from_merits,
)

__all__ = [
    "DEFAULT_SHARPNESS",
    "DemandMix",
    "DemandShape",
    "choose_gpus_fragaware",
    "demand_mix",
    "fragmentation",
    "fragmentation_delta",
    "merit_from_delta",
    "score_nodes_fragaware",
    "scores_from_merits",
]
