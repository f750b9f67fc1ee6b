"""Preemption: which bound pods to evict so that a higher-priority pod fits on a node.

Only pods of strictly lower DeepRes priority (evaluated at `now_s`), and lower by at least
`preempt_min_gap` (`outranks`), are ever victims. Victims are
added lowest priority first (largest memory first within a priority) until the pod fits; then any
victim whose eviction turns out unnecessary is dropped again, so the set is minimal by inclusion.
Evicting a pod frees its reservation and, as an estimate, the same amount of observed use.

Preemption never throws away long jobs' progress (`evictable`): a pod without a declared
`deepres.io/checkpoint-interval` is a victim only while its attained service (time since bind) is
below `preempt_max_loss_s` (default 30 min); one with a declared interval I loses only the work since
its last checkpoint, taken as (time since bind) mod I, and is a victim only while that is below the
same limit. A pod that may not be evicted is not a victim at any priority.

Preemption that does not churn (issue 33):

- a pod is not evicted twice in a row by the same kind of arrival (`arrival_kind`: the preemptor's
  criticality and GPU count): a reservation whose `evicted_by` is the preemptor's kind is no victim;
- with the preemptor's predicted wait without preemption given (`wait_s`: the sharing rule's
  `wait_for_empty_s`), a victim set is taken only when it pays by the rule's own estimate
  (`preemption_pays`): the GPU-seconds of waiting it saves (wait x the pod's GPUs) exceed the
  GPU-seconds it throws away (each victim's `progress_lost_s` plus a restart, `RESTART_S`, x its
  GPUs). Without `wait_s` (unknown), or for a pod without a run time estimate, the check is not made.

When no node fits, the node to preempt on (`choose_preemption`, used by the extender's
self-preemption and the simulator's replay alike) is the one whose victims have the lowest highest
priority, then the fewest victims, then the least memory evicted, then the first name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from extender.policy.filtering import gpus_fit
from extender.policy.memory import effective_free_mib, occupied_mib
from extender.policy.priority import priority_of
from extender.policy.types import NodeView, PodRequest, PolicyParams, Reservation

#: What an eviction costs a victim besides its lost progress: the restart (container start, reading
#: the checkpoint, warming up), in seconds of its GPUs' time.
RESTART_S = 120.0


def arrival_kind(criticality: int, gpus: int) -> str:
    """The kind of an arriving pod for the churn rule: its criticality and its GPU count."""
    return f"c{criticality}/g{gpus}"


#: What `arrival_kind` makes (criticality level, GPU count).
ARRIVAL_KIND = re.compile(r"c[0-9]/g[0-9]{1,5}")


def is_arrival_kind(text: str) -> bool:
    """Whether `text` is a kind `arrival_kind` makes (a restored `deepres.io/evicted-by` is checked so)."""
    return ARRIVAL_KIND.fullmatch(text) is not None


def eviction_cost_gpu_s(victims: Iterable[Reservation], now_s: float) -> float:
    """GPU-seconds evicting `victims` throws away: each one's lost progress plus a restart, x its GPUs."""
    return sum((progress_lost_s(r, now_s) + RESTART_S) * max(len(r.gpu_uuids), 1) for r in victims)


def preemption_pays(pod: PodRequest, victims: Sequence[Reservation], now_s: float, wait_s: float | None) -> bool:
    """Whether evicting `victims` for `pod` gains more than it throws away: the GPU-seconds of waiting
    saved (`wait_s` x the pod's GPUs; an unknown wait, None, or a pod without a run time estimate is
    not judged: True) against
    `eviction_cost_gpu_s`. An infinite wait (no GPU will ever free) always pays."""
    if wait_s is None or pod.predicted_run_s <= 0.0:
        return True  # no estimate to weigh (as the sharing rule, a pod without a run time is not judged)
    if math.isinf(wait_s):
        return True
    return max(wait_s, 0.0) * max(pod.gpus, 1) > eviction_cost_gpu_s(victims, now_s)


def plan_victims(
    pod: PodRequest,
    node: NodeView,
    on_node: Sequence[Reservation],
    now_s: float,
    params: PolicyParams,
    evicted: Sequence[Reservation] = (),
    service_now_s: float | None = None,
) -> tuple[str, ...] | None:
    """UIDs of the reservations to evict for `pod` to fit on `node` (empty: fits already), or None
    when even evicting every strictly-lower-priority pod would not make it fit.

    `evicted` are reservations leaving anyway (victims kube-scheduler already chose); their memory
    counts as freed and they are not returned again. `service_now_s` is the time on the clock of the
    reservations' `bound_s` (the extender's monotonic clock) for the attained-service limit
    (`evictable`); default `now_s` (one clock, as in the replay).
    """
    service_now = now_s if service_now_s is None else service_now_s
    gone = list(evicted)
    gone_ids = {r.pod_uid for r in gone}
    if _fits(pod, node, gone, on_node):
        return ()
    ranked = sorted(
        ((priority_of(r.priority_inputs, now_s, params), r) for r in on_node
         if r.node == node.name and r.pod_uid not in gone_ids),
        key=lambda pr: (pr[0], -pr[1].memory_mib, pr[1].pod_uid),
    )
    candidates = [r for p, r in ranked if outranks(pod.priority, p, params) and evictable(r, service_now, params)
                  and not (pod.kind and r.evicted_by == pod.kind)]
    chosen: list[Reservation] = []
    for res in candidates:
        chosen.append(res)
        if _fits(pod, node, chosen + gone, on_node):
            break
    else:
        return None
    for res in list(reversed(chosen)):  # drop victims that turn out unnecessary
        rest = [c for c in chosen if c is not res]
        if _fits(pod, node, rest + gone, on_node):
            chosen = rest
    return tuple(r.pod_uid for r in chosen)


def outranks(priority: float, victim_priority: float, params: PolicyParams) -> bool:
    """Whether a pod of `priority` may evict one of `victim_priority`: strictly lower, and by at least
    `preempt_min_gap` (the live setting's default is 0: any strictly lower priority; `PolicyParams`'
    own default and the compute replay keep one criticality level, 10 points)."""
    return victim_priority < priority and victim_priority <= priority - params.preempt_min_gap


def progress_lost_s(res: Reservation, now_s: float) -> float:
    """The work evicting `res` at `now_s` throws away: its attained service, or with a declared
    checkpoint interval the time since its last checkpoint (attained mod interval)."""
    attained = max(now_s - res.bound_s, 0.0)
    interval = res.checkpoint_interval_s
    if interval is not None and interval > 0.0:
        return attained % interval
    return attained


def evictable(res: Reservation, now_s: float, params: PolicyParams) -> bool:
    """Whether `res` may be a victim at `now_s`: a bound pod (not one only assumed on its node) whose
    progress it would lose is below the limit."""
    return not res.assumed and progress_lost_s(res, now_s) < params.preempt_max_loss_s


def choose_preemption(
    pod: PodRequest,
    candidates: Iterable[tuple[NodeView, Sequence[Reservation]]],
    now_s: float,
    params: PolicyParams,
    service_now_s: float | None = None,
    wait_s: float | None = None,
) -> tuple[str, tuple[Reservation, ...]] | None:
    """(node, victims) to evict on the best candidate for `pod`, or None when no candidate has a
    victim set (`plan_victims`) that makes the pod fit and pays (`preemption_pays` with `wait_s`, the
    pod's predicted wait without preemption; None: not judged). Candidates: the nodes the filter
    failed for memory, each with the reservations on it. Best: the lowest highest victim priority,
    then the fewest victims, then the least memory evicted, then the first node name."""
    service_now = now_s if service_now_s is None else service_now_s
    best: tuple[tuple[float, int, float, str], tuple[Reservation, ...]] | None = None
    for node, on_node in candidates:
        victims = plan_victims(pod, node, on_node, now_s, params, service_now_s=service_now_s)
        if not victims:
            continue
        by_uid = {r.pod_uid: r for r in on_node}
        chosen = tuple(by_uid[uid] for uid in victims)
        if not preemption_pays(pod, chosen, service_now, wait_s):
            continue
        top = max(priority_of(r.priority_inputs, now_s, params) for r in chosen)
        key = (top, len(chosen), sum(r.memory_mib * len(r.gpu_uuids) for r in chosen), node.name)
        if best is None or key < best[0]:
            best = (key, chosen)
    return None if best is None else (best[0][3], best[1])


def _fits(pod: PodRequest, node: NodeView, victims: Sequence[Reservation], on_node: Sequence[Reservation] = ()) -> bool:
    """The fit test (`gpus_fit`) on the node as it would be without `victims`. A GPU the sharing rule
    closed to the pod (`compute_full`) opens only when every pod on it (`on_node`) is a victim: then it
    holds only what deepres did not place."""
    freed: dict[str, float] = {}
    gone = {res.pod_uid for res in victims}
    for res in victims:
        for uuid in res.gpu_uuids:
            freed[uuid] = freed.get(uuid, 0.0) + res.memory_mib
    free = []
    for g in node.healthy:
        if g.compute_full:
            if any(g.uuid in r.gpu_uuids and r.pod_uid not in gone for r in on_node):
                free.append(-1.0)
                continue
            occupied = occupied_mib(g.used_mib - freed.get(g.uuid, 0.0), 0.0, g.foreign_mib, 0.0)
        else:
            occupied = occupied_mib(g.used_mib - freed.get(g.uuid, 0.0), g.reserved_mib - freed.get(g.uuid, 0.0),
                                    g.foreign_mib, g.pending_mib)
        free.append(effective_free_mib(g.capacity_mib, occupied))
    return gpus_fit(sorted(free, reverse=True), pod.gpus, pod.admission_mib)
