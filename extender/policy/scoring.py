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

from extender.policy.filtering import fit_free_desc, gpus_fit
from extender.policy.types import GpuView, NodeView, PodRequest, PolicyParams, is_partly_used

MAX_SCORE = 10
MIN_SCORE = 0


def spreads(pod: PodRequest, params: PolicyParams) -> bool:
    """THE spread rule: whether the pod is placed by spreading (high priority) rather than packed.
    Score, GPU choice, the choice of the packing score (`placement`) and the simulator ask this."""
    return pod.priority >= params.spread_priority


#: Scalar sort keys (cheaper than tuples in the hot loop). Spread: utilisation first, then more free
#: memory (utilisation x 1e9 dominates any free MiB). Pack: least leftover, a whole GPU 0.5 MiB
#: "worse" than a partly used one with the same leftover. Equal keys keep the lower index.
_UTILISATION_SCALE = 1.0e9
_WHOLE_PENALTY_MIB = 0.5


def gpu_key(free_mib: float, utilization: float, empty: bool, need_mib: float, spread: bool) -> float:
    """THE GPU choice order (smaller first) of a GPU with `free_mib` >= `need_mib`: spread, least
    utilised then most free; pack, smallest leftover, a whole GPU after a partly used one with the
    same leftover. Ties keep the lower position. (columnar.score_matrix computes it vectorised from
    the same constants; a property test holds the two equal.)"""
    if spread:
        return utilization * _UTILISATION_SCALE - free_mib
    return free_mib - need_mib + (_WHOLE_PENALTY_MIB if empty else 0.0)


def _pick_one(node: NodeView, need: float, spread: bool) -> GpuView | None:
    best: GpuView | None = None
    best_key = 0.0
    for g in node.healthy:
        free = g.free_mib
        if free < need:
            continue
        key = gpu_key(free, g.utilization, g.empty, need, spread)
        if best is None or key < best_key:
            best, best_key = g, key
    return best


def choose_gpus(pod: PodRequest, node: NodeView, params: PolicyParams) -> tuple[GpuView, ...] | None:
    """The GPUs the pod would get on `node`, or None when fewer than `pod.gpus` fit: the `gpu_key`
    order, ties ending on the GPU index (deterministic). Bind takes these; the score rates them."""
    need = pod.admission_mib
    count = max(pod.gpus, 1)
    if not gpus_fit(fit_free_desc(pod, node), count, need):
        return None
    spread = spreads(pod, params)
    if count == 1 and not pod.whole_gpu:  # the common case: one pass, no sorting
        best = _pick_one(node, need, spread)
        return (best,) if best is not None else None
    fitting = [g for g in node.healthy if g.free_mib >= need and (g.empty or not pod.whole_gpu)]
    fitting.sort(key=lambda g: (gpu_key(g.free_mib, g.utilization, g.empty, need, spread), g.index))
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
    return _value(chosen, node, pod.admission_mib, spreads(pod, params), weight)


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
    spread = spreads(pod, params)
    weight = min(max(params.fragmentation_weight, 0.0), 1.0)
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        node = nodes.get(name)
        if node is None or not gpus_fit(node.free_desc, count, need):
            out.append((name, MIN_SCORE))
            continue
        if count == 1:
            best = _pick_one(node, need, spread)
            chosen: tuple[GpuView, ...] | None = (best,) if best is not None else None
        else:
            chosen = choose_gpus(pod, node, params)
        out.append((name, _value(chosen, node, need, spread, weight) if chosen else MIN_SCORE))
    return out
