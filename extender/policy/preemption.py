"""Preemption: which bound pods to evict so that a higher-priority pod fits on a node.

Only pods of strictly lower DeepRes priority (evaluated at `now_s`) are ever victims. Victims are
added lowest priority first (largest memory first within a priority) until the pod fits; then any
victim whose eviction turns out unnecessary is dropped again, so the set is minimal by inclusion.
Evicting a pod frees its reservation and, as an estimate, the same amount of observed use.
"""

from __future__ import annotations

from collections.abc import Sequence

from extender.policy.priority import priority_of
from extender.policy.types import NodeView, PodRequest, PolicyParams, Reservation
from extender.policy.usage import occupied_mib


def plan_victims(
    pod: PodRequest,
    node: NodeView,
    on_node: Sequence[Reservation],
    now_s: float,
    params: PolicyParams,
    evicted: Sequence[Reservation] = (),
) -> tuple[str, ...] | None:
    """UIDs of the reservations to evict for `pod` to fit on `node` (empty: fits already), or None
    when even evicting every strictly-lower-priority pod would not make it fit.

    `evicted` are reservations leaving anyway (victims kube-scheduler already chose); their memory
    counts as freed and they are not returned again.
    """
    gone = list(evicted)
    gone_ids = {r.pod_uid for r in gone}
    if _fits(pod, node, gone):
        return ()
    ranked = sorted(
        ((priority_of(r.priority_inputs, now_s, params), r) for r in on_node
         if r.node == node.name and r.pod_uid not in gone_ids),
        key=lambda pr: (pr[0], -pr[1].memory_mib, pr[1].pod_uid),
    )
    candidates = [r for p, r in ranked if p < pod.priority]
    chosen: list[Reservation] = []
    for res in candidates:
        chosen.append(res)
        if _fits(pod, node, chosen + gone):
            break
    else:
        return None
    for res in list(reversed(chosen)):  # drop victims that turn out unnecessary
        rest = [c for c in chosen if c is not res]
        if _fits(pod, node, rest + gone):
            chosen = rest
    return tuple(r.pod_uid for r in chosen)


def _fits(pod: PodRequest, node: NodeView, victims: Sequence[Reservation]) -> bool:
    freed: dict[str, float] = {}
    for res in victims:
        for uuid in res.gpu_uuids:
            freed[uuid] = freed.get(uuid, 0.0) + res.memory_mib
    fitting = 0
    for g in node.healthy:
        gain = freed.get(g.uuid, 0.0)
        occupied = occupied_mib(g.used_mib - gain, g.reserved_mib - gain, g.foreign_mib)
        if g.capacity_mib - occupied >= pod.admission_mib:
            fitting += 1
    return fitting >= max(pod.gpus, 1)
