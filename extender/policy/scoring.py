"""Score (0..10) and GPU choice: the same rule ranks nodes at prioritize and picks GPUs at bind.

For a pod of priority >= `spread_priority` (urgent or critical work) the rule prefers the least
utilised GPUs that fit, where it will run fastest. Below it the rule packs: best fit on memory into
partly used GPUs, keeping whole GPUs free for large jobs. Either way a share of the score
(`fragmentation_weight`) rewards placements that leave fewer GPUs partly used:

    main  = mean over chosen GPUs of  admission / free            (pack: 1 = exact fit)
                                  or  min(1 - utilisation, free / capacity)   (spread)
    whole = 1 - (GPUs of the node partly used after placement) / (healthy GPUs of the node)
    score = round(10 x ((1 - w) x main + w x whole)),  w = fragmentation_weight

A node that cannot take the pod scores 0; a pod that is not a GPU job scores `neutral_score`
everywhere. Prioritize errors are dropped by kube-scheduler, so safety never lives here: the
filter and bind's check-and-reserve hold it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from extender.policy.types import EMPTY_SLACK_MIB, GpuView, NodeView, PodRequest, PolicyParams

MAX_SCORE = 10
MIN_SCORE = 0


def spreads(pod: PodRequest, params: PolicyParams) -> bool:
    """Whether the pod is placed by the spread rule (high priority) rather than packed."""
    return pod.priority >= params.spread_priority


def choose_gpus(pod: PodRequest, node: NodeView, params: PolicyParams) -> tuple[GpuView, ...] | None:
    """The GPUs the pod would get on `node`, or None when fewer than `pod.gpus` fit.

    Spread: least utilised first (then most free). Pack: smallest leftover first, and at equal
    leftover a partly used GPU before a whole one. Ties end on the GPU index, so it is deterministic.
    """
    need = pod.admission_mib
    count = max(pod.gpus, 1)
    if len(node.free_desc) < count or node.free_desc[count - 1] < need:
        return None
    fitting = [g for g in node.healthy if g.free_mib >= need]
    if spreads(pod, params):
        fitting.sort(key=lambda g: (g.utilization, -g.free_mib, g.index))
    else:
        fitting.sort(key=lambda g: (g.free_mib - need, g.empty, g.index))
    return tuple(fitting[:count])


def score_node(pod: PodRequest, node: NodeView | None, params: PolicyParams) -> int:
    """The pod's score (0..10) on one node; see the module docstring for the formula."""
    if not pod.gpu_job:
        return min(max(params.neutral_score, MIN_SCORE), MAX_SCORE)
    if node is None:
        return MIN_SCORE
    chosen = choose_gpus(pod, node, params)
    if not chosen:
        return MIN_SCORE
    need = pod.admission_mib
    if spreads(pod, params):
        main = sum(min(1.0 - g.utilization, g.free_mib / g.capacity_mib if g.capacity_mib > 0 else 0.0)
                   for g in chosen) / len(chosen)
    else:
        main = sum(need / g.free_mib if g.free_mib > 0 else 1.0 for g in chosen) / len(chosen)
    whole = 1.0 - _partly_used_after(node, chosen, need) / len(node.healthy)
    weight = min(max(params.fragmentation_weight, 0.0), 1.0)
    value = (1.0 - weight) * min(max(main, 0.0), 1.0) + weight * whole
    return min(max(round(MAX_SCORE * value), MIN_SCORE), MAX_SCORE)


def score_nodes(
    pod: PodRequest, names: Iterable[str], nodes: Mapping[str, NodeView], params: PolicyParams
) -> list[tuple[str, int]]:
    """(name, score) for each name in input order (duplicates answered once); unknown nodes score 0."""
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for name in names:
        if name not in seen:
            seen.add(name)
            out.append((name, score_node(pod, nodes.get(name), params)))
    return out


def _partly_used_after(node: NodeView, chosen: tuple[GpuView, ...], need: float) -> int:
    """How many healthy GPUs of the node hold something but are not full after the placement."""
    chosen_ids = {g.uuid for g in chosen}
    partly = 0
    for g in node.healthy:
        occupied = g.capacity_mib - g.free_mib + (need if g.uuid in chosen_ids else 0.0)
        if EMPTY_SLACK_MIB < occupied < g.capacity_mib - EMPTY_SLACK_MIB:
            partly += 1
    return partly
