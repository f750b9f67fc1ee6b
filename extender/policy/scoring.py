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

from extender.policy.types import GpuView, NodeView, PodRequest, PolicyParams, is_partly_used

MAX_SCORE = 10
MIN_SCORE = 0


def spreads(pod: PodRequest, params: PolicyParams) -> bool:
    """Whether the pod is placed by the spread rule (high priority) rather than packed."""
    return pod.priority >= params.spread_priority


#: Scalar sort keys (cheaper than tuples in the hot loop). Spread: utilisation first, then more free
#: memory (utilisation x 1e9 dominates any free MiB). Pack: least leftover, a whole GPU 0.5 MiB
#: "worse" than a partly used one with the same leftover. Equal keys keep the lower index.
_UTILISATION_SCALE = 1.0e9
_WHOLE_PENALTY_MIB = 0.5


def _pick_one(node: NodeView, need: float, spread: bool) -> GpuView | None:
    best: GpuView | None = None
    best_key = 0.0
    for g in node.healthy:
        free = g.free_mib
        if free < need:
            continue
        if spread:
            key = g.utilization * _UTILISATION_SCALE - free
        else:
            key = free - need + (_WHOLE_PENALTY_MIB if g.empty else 0.0)
        if best is None or key < best_key:
            best, best_key = g, key
    return best


def choose_gpus(pod: PodRequest, node: NodeView, params: PolicyParams) -> tuple[GpuView, ...] | None:
    """The GPUs the pod would get on `node`, or None when fewer than `pod.gpus` fit.

    Spread: least utilised first (then most free). Pack: smallest leftover first, and at equal
    leftover a partly used GPU before a whole one. Ties end on the GPU index, so it is deterministic.
    """
    need = pod.admission_mib
    count = max(pod.gpus, 1)
    if len(node.free_desc) < count or node.free_desc[count - 1] < need:
        return None
    spread = pod.priority >= params.spread_priority
    if count == 1:  # the common case: one pass, no sorting
        best = _pick_one(node, need, spread)
        return (best,) if best is not None else None
    fitting = [g for g in node.healthy if g.free_mib >= need]
    if spread:
        fitting.sort(key=lambda g: (g.utilization * _UTILISATION_SCALE - g.free_mib, g.index))
    else:
        fitting.sort(key=lambda g: (g.free_mib - need + (_WHOLE_PENALTY_MIB if g.empty else 0.0), g.index))
    return tuple(fitting[:count])


def _value(chosen: tuple[GpuView, ...], node: NodeView, need: float, spread: bool, weight: float) -> int:
    main = 0.0
    partly = node.partly_count
    for g in chosen:
        cap, free = g.capacity_mib, g.free_mib
        if spread:
            main += min(1.0 - g.utilization, free / cap if cap > 0 else 0.0)
        else:
            main += need / free if free > 0 else 1.0
        partly += is_partly_used(cap - free + need, cap) - g.partly
    main /= len(chosen)
    whole = 1.0 - partly / len(node.healthy)
    value = (1.0 - weight) * min(max(main, 0.0), 1.0) + weight * whole
    return min(max(round(MAX_SCORE * value), MIN_SCORE), MAX_SCORE)


def score_node(pod: PodRequest, node: NodeView | None, params: PolicyParams) -> int:
    """The pod's score (0..10) on one node; see the module docstring for the formula."""
    if not pod.gpu_job:
        return min(max(params.neutral_score, MIN_SCORE), MAX_SCORE)
    if node is None:
        return MIN_SCORE
    chosen = choose_gpus(pod, node, params)
    if not chosen:
        return MIN_SCORE
    weight = min(max(params.fragmentation_weight, 0.0), 1.0)
    return _value(chosen, node, pod.admission_mib, pod.priority >= params.spread_priority, weight)


def score_nodes(
    pod: PodRequest, names: Iterable[str], nodes: Mapping[str, NodeView], params: PolicyParams
) -> list[tuple[str, int]]:
    """(name, score) for each name in input order (duplicates answered once); unknown nodes score 0.

    The same numbers as `score_node` per name, with the per-call work hoisted out of the loop.
    """
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    if not pod.gpu_job:
        neutral = min(max(params.neutral_score, MIN_SCORE), MAX_SCORE)
        for name in names:
            if name not in seen:
                seen.add(name)
                out.append((name, neutral))
        return out
    need, count = pod.admission_mib, max(pod.gpus, 1)
    spread = pod.priority >= params.spread_priority
    weight = min(max(params.fragmentation_weight, 0.0), 1.0)
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        node = nodes.get(name)
        if node is None or len(node.free_desc) < count or node.free_desc[count - 1] < need:
            out.append((name, MIN_SCORE))
            continue
        if count == 1:
            best = _pick_one(node, need, spread)
            chosen: tuple[GpuView, ...] | None = (best,) if best is not None else None
        else:
            chosen = choose_gpus(pod, node, params)
        out.append((name, _value(chosen, node, need, spread, weight) if chosen else MIN_SCORE))
    return out
