"""Which placement rule a pod gets, and the GPUs bind takes on a node under it; pure.

Pods that spread (`scoring.spreads`, high priority) and, without a demand mix, every pod are scored
by `scoring.score_nodes` and get `scoring.choose_gpus`; the others (packing pods) are scored by the
fragmentation-aware rule against the mix and get `fragmentation.choose_gpus_fragaware`. The
extender's prioritize and bind and the simulator's replay all decide through these two functions,
so the GPUs bound are the ones the node was scored for.

`shortlist` is the filter's answer when many nodes fit: the best few by that very score.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from extender.policy.fragmentation import DemandMix, choose_gpus_fragaware
from extender.policy.scoring import choose_gpus, spreads
from extender.policy.types import GpuView, NodeView, PodRequest, PolicyParams


def packs_by_mix(pod: PodRequest, params: PolicyParams) -> bool:
    """Whether `pod` is placed by the fragmentation-aware packing rule (when a demand mix is known)."""
    return pod.gpu_job and not spreads(pod, params)


def choose_gpus_for(
    pod: PodRequest, node: NodeView, params: PolicyParams, mix: DemandMix | None = None,
    cpu_left_milli: float | None = None, pod_cpu_milli: float = 0.0,
) -> tuple[GpuView, ...] | None:
    """The GPUs bind takes on `node`: the fragmentation-aware choice for a packing pod when `mix` has
    shapes, else `choose_gpus` (spread or best fit). None when the pod does not fit."""
    if mix is not None and len(mix) and packs_by_mix(pod, params) and not pod.whole_gpu:
        return choose_gpus_fragaware(pod, node, mix, cpu_left_milli, pod_cpu_milli)
    return choose_gpus(pod, node, params)


def shortlist(scores: npt.ArrayLike, keep: int) -> npt.NDArray[np.int64]:
    """Positions of the `keep` best of `scores` (the prioritize scores of the nodes that fit), in
    their input order: highest score first, ties to the earlier position. All positions when `keep`
    is 0 or not below their number.

    The filter answers with these when more nodes fit, and kube-scheduler then scores (its plugins
    and the extender's prioritize) only them, as its own percentageOfNodesToScore does for its
    plugins. Taking ties by position keeps the node the full prioritize would rank alone at the top
    (the fragmentation-aware score's single 10) and every node scored above any left out, so the
    prioritize over the shortlist gives each of them the score it had among all."""
    values = np.asarray(scores, dtype=np.int64)
    if keep <= 0 or keep >= len(values):
        return np.arange(len(values), dtype=np.int64)
    if keep == 1:  # (the chart's default) the first of the highest
        return np.array([int(np.argmax(values))], dtype=np.int64)
    # the keep-th highest score, then every position above it and the first positions at it: O(n), where
    # a sort of thousands of nodes' scores per pod was not (5,000 nodes: ~60 us against ~10)
    kth = np.partition(values, len(values) - keep)[len(values) - keep]
    above = np.flatnonzero(values > kth)
    at = np.flatnonzero(values == kth)[: keep - len(above)]
    chosen: npt.NDArray[np.int64] = np.sort(np.concatenate([above, at])).astype(np.int64)
    return chosen
