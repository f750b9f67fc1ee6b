"""Sharing only where it pays: may a pod join a GPU that already runs work?

A GPU "runs work" when its occupied memory is above the empty slack (`GpuView.empty` false). Its
jobs' duties are `GpuView.duties` (the pods deepres placed, `policy.duty`); work deepres did not
place (memory without a duty) counts as one GPU-bound job. The pod may join only when

1. the interference model (`policy.interference`) predicts that neither the pod nor any job already
   there slows beyond the bound: `max_slowdown` (the admin's setting `policy.max_slowdown`, default 1.25),
   or `max_slowdown_high` (default 1.10) when the pod is high or critical (priority >=
   `spread_priority`) or such a pod runs there (`GpuView.strict`); and
2. joining beats waiting for an empty GPU: with R the pod's *predicted* run time alone (the
   predictor's estimate, never the true one) and W the predicted wait until an empty GPU frees
   (`wait_for_empty_s`, from the predicted run times of the jobs holding GPUs; a job past its
   predicted end is expected to run half its attained time again; counted only over the GPUs that
   can hold the pod's admission, `can_hold`, on the nodes the pod may go to), its predicted
   completion shared, R x slowdown, is below W + R. With an empty GPU free now (W = 0) a pod never
   joins a busy one: it takes the empty GPU. A pod with no run time estimate (R = 0) joins on the
   bound alone, and so does a pod of priority below `pack_below_priority` (off by default: see
   PolicyParams), which would pack within the bound even when an empty GPU is free.

3. the GPU is not over its bound and each forecast carries its signature's learned margin
   (`policy.feedback`: what the shared jobs really did corrects the joins).

Otherwise the pod takes an empty GPU or waits. `sharing_view` applies the rule to a node: the GPUs
the pod may not join are shown to it as full, so the filter, the score and bind (and the replay,
which calls the same functions) never place it there; the filter's reason then says "compute".
Pure: no I/O, no clock (`now_s` and the estimates are arguments).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from extender.policy.feedback import judged
from extender.policy.filtering import PASSED
from extender.policy.interference import slowdowns
from extender.policy.types import FilterResult, GpuView, NodeView, PodRequest, PolicyParams

#: The filter's reason kind (a metric label) for nodes the sharing rule failed.
COMPUTE = "compute"

#: Duty of work on a GPU that deepres did not place (or whose duty is unknown): GPU-bound.
UNKNOWN_DUTY = 1.0


def slowdown_bound(pod: PodRequest, gpu: GpuView, params: PolicyParams) -> float:
    """The slowdown allowed on `gpu` if `pod` joins it (rule 1's bound)."""
    strict = pod.priority >= params.spread_priority or gpu.strict
    return params.max_slowdown_high if strict else params.max_slowdown


def resident_duties(gpu: GpuView) -> tuple[float, ...]:
    """The duties of the jobs on `gpu`: its pods', or one GPU-bound job for work of unknown duty."""
    if gpu.duties:
        return gpu.duties
    return () if gpu.empty else (UNKNOWN_DUTY,)


def predicted_join(pod: PodRequest, gpu: GpuView) -> tuple[float, float]:
    """(the pod's predicted slowdown, the worst predicted slowdown of the jobs already there) if
    `pod` joins `gpu`; (1.0, 1.0) on a GPU that runs nothing."""
    residents = resident_duties(gpu)
    if not residents:
        return 1.0, 1.0
    factors = slowdowns((*residents, min(max(pod.duty, 0.0), 1.0)))
    return factors[-1], max(factors[:-1])


def draining(pod: PodRequest, params: PolicyParams, waiting_priority: float) -> bool:
    """The draining rule: while a GPU pod of priority `waiting_priority` waits (fits nowhere; -inf:
    none), a busy GPU takes no new sharer of lower priority, so that GPUs empty for the waiting pod
    instead of filling with sharers that keep them busy (`PolicyParams.drain`)."""
    return params.drain and pod.priority < waiting_priority


def judged_slowdown(predicted: float, params: PolicyParams) -> float:
    """A predicted slowdown with the model's error margin (`PolicyParams.slowdown_error_exponent`)."""
    return float(max(predicted, 1.0) ** params.slowdown_error_exponent)


def may_join(pod: PodRequest, gpu: GpuView, params: PolicyParams, wait_s: float,
             waiting_priority: float = -math.inf) -> bool:
    """Rules 1 and 2 for one GPU (with the draining rule and the memory margin for sharers): True on
    a GPU that runs nothing, or where joining pays."""
    residents = resident_duties(gpu)
    if not residents:
        return True
    if draining(pod, params, waiting_priority):
        return False
    if gpu.over_bound and params.sharing_feedback:  # its jobs already run slower than promised (`feedback`)
        return False
    if gpu.free_mib < pod.admission_mib * (1.0 + params.share_memory_margin):
        return False
    own, others = predicted_join(pod, gpu)
    if params.sharing_feedback:  # each forecast x its signatures' learned error (`feedback.margin`)
        own, others = judged(own, pod.slowdown_margin), judged(others, gpu.resident_margin)
    own, others = judged_slowdown(own, params), judged_slowdown(others, params)
    if max(own, others) > slowdown_bound(pod, gpu, params) + 1e-9:
        return False
    if pod.priority < params.pack_below_priority:
        return True  # best effort packs within the bound: whole GPUs stay free for the others
    run = max(pod.predicted_run_s, 0.0)
    return run <= 0.0 or run * own < max(wait_s, 0.0) + run


def sharing_view(pod: PodRequest, node: NodeView, params: PolicyParams, wait_s: float,
                 waiting_priority: float = -math.inf) -> NodeView:
    """`node` as `pod` may use it: each busy GPU it may not join (`may_join`) shown full."""
    if not pod.gpu_job or not params.sharing or not node.busy_count:  # (no busy GPU: nothing to show full)
        return node
    gpus = []
    changed = False
    for g in node.gpus:  # a GPU the pod does not fit by memory is out anyway: no need to ask
        if g.healthy and not g.empty and g.free_mib >= pod.admission_mib and not may_join(pod, g, params, wait_s,
                                                                                       waiting_priority):
            gpus.append(replace(g, reserved_mib=max(g.capacity_mib, g.reserved_mib), compute_full=True))
            changed = True
        else:
            gpus.append(g)
    return NodeView(name=node.name, gpus=tuple(gpus), received_s=node.received_s) if changed else node


#: A job past its predicted end is expected to run this share of its attained time again (run times
#: are heavy-tailed: one that outlived its estimate likely runs on), not to end at once.
OVERDUE_SHARE = 0.5


def expected_end_s(now_s: float, start_s: float, run_s: float) -> float:
    """When a job started at `start_s` with predicted run time `run_s` is expected to end, seen at
    `now_s`: its predicted end, or for an overdue job now + OVERDUE_SHARE x its attained time."""
    end = start_s + max(run_s, 0.0)
    return end if end >= now_s else now_s + OVERDUE_SHARE * (now_s - start_s)


def can_hold(capacity_mib: float, need_mib: float) -> bool:
    """Whether a GPU of `capacity_mib`, once empty, holds an admission of `need_mib` per GPU. W counts
    only such GPUs (issue 46): an empty GPU too small for the pod is no GPU it waits for (counted, it
    made W 0, so a high-priority pod refused to share for a GPU that would never hold it). The nodes
    are the pod's own (the filter's node list: kube-scheduler's selectors, affinity and taints
    applied; the replay's `base_mask`)."""
    return capacity_mib >= need_mib


def wait_for_empty_s(now_s: float, gpus: Iterable[Iterable[tuple[float, float]]]) -> float:
    """The predicted wait until one of `gpus` is empty: each GPU given as its jobs' (start or bind
    time, predicted run time alone) pairs; a GPU's jobs end when the last is expected to end
    (`expected_end_s`); 0 when a GPU holds nothing; inf when there are no GPUs."""
    best = math.inf
    for jobs in gpus:
        ends = [expected_end_s(now_s, start, run) for start, run in jobs]
        best = min(best, max([now_s, *ends]) - now_s)
        if best <= 0.0:
            return 0.0
    return best


def _fits_shared(pod: PodRequest, node: NodeView, params: PolicyParams, wait_s: float,
                 joins: dict[tuple[tuple[float, ...], bool, bool, float, bool, float], bool],
                 waiting_priority: float = -math.inf) -> bool:
    """`gpus_fit` over `sharing_view(pod, node, ...)`'s free memory without building the view: a GPU
    shown full has what sharing_view leaves it (none), any other its own. A filter asks this of every
    node that fits, and building the views was most of its time once many GPUs were busy (issue 31).
    `joins` memoises `may_join` by the only fields of a GPU it reads (its duties, over_bound, margin, empty,
    strict, and its free memory where `share_memory_margin` makes it count): one answer for the GPUs of
    one filter that run the same jobs."""
    need, want, refused = pod.admission_mib, max(pod.gpus, 1), False
    fitting = 0
    for free in node.empty_free_desc:  # an empty GPU is never refused (largest first: stop at the first short)
        if free < need:
            break
        fitting += 1
    if fitting >= want:  # enough empty GPUs: the node passes whatever its busy GPUs would answer
        return True
    for g in node.busy:
        free = g.free_mib
        if free < need:
            continue
        key = (g.duties, g.empty, g.strict, free if params.share_memory_margin else 0.0, g.over_bound,
               g.resident_margin)
        joined = joins.get(key)
        if joined is None:
            joined = joins[key] = may_join(pod, g, params, wait_s, waiting_priority)
        if joined:
            fitting += 1
            continue
        refused = True
        # shown full, as sharing_view shows it: max(capacity, reserved) reserved, so occupied_mib >= capacity
        # and nothing is free on it (foreign use is a sum of reported process memory: never negative)
        if need <= 0.0:
            fitting += 1
    return not refused or fitting >= want  # (no GPU refused: the node as it passed the filter)


def apply_sharing(pod: PodRequest, result: FilterResult, nodes: Mapping[str, NodeView], params: PolicyParams,
                  wait_s: float, waiting_priority: float = -math.inf) -> FilterResult:
    """The filter's answer with the sharing rule applied to the nodes it passed (the live extender's
    columnar filter knows memory only): a node whose fitting GPUs are all busy GPUs the pod may not
    join (`sharing_view`) moves to the failed nodes, its reason saying so (preemption may help)."""
    if not pod.gpu_job or not params.sharing or not result.passed:
        return result
    request = result.request or pod
    passed: list[str] = []
    failed = dict(result.failed)
    kinds = dict(result.kinds)
    joins: dict[tuple[tuple[float, ...], bool, bool, float, bool, float], bool] = {}  # may_join by what it reads
    for name in result.passed:
        node = nodes.get(name)
        if node is None or not node.busy_count or _fits_shared(request, node, params, wait_s, joins,
                                                               waiting_priority):
            passed.append(name)
            continue
        failed[name] = ("compute: sharing a busy GPU would slow a job beyond the bound (sharing.maxSlowdown) "
                        "or cost more than waiting for an empty one")
        kinds[COMPUTE] = kinds.get(COMPUTE, 0) + 1
        kinds[PASSED] = kinds.get(PASSED, 1) - 1
    if kinds.get(PASSED) == 0:
        kinds.pop(PASSED)
    return replace(result, passed=tuple(passed), failed=failed, kinds=kinds)
