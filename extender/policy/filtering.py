"""Filter: which candidate nodes can take the pod now, and why the others cannot.

A node passes when it has `pod.gpus` healthy GPUs each with effective free memory >= the pod's
admission memory, and its telemetry is fresh. Failures a person can act on are reported per node;
those no preemption could fix (no or stale telemetry, too few GPUs, the job larger than the node's
GPUs) are "unresolvable", which also keeps kube-scheduler from preempting there in vain.

When no candidate passes because the predictor's bound exceeds every candidate GPU while its point
estimate fits one, the pod asks for a whole GPU instead (`whole_gpu_request`, the whole-GPU
fallback): refusing it everywhere would leave it Pending forever although it would run. What such a
pod gets is the admin's (`PolicyParams.bound_beyond_gpus`): `whole-gpu` (the default: an empty GPU,
reserved whole, shared with nothing), `point` (admitted at its point estimate x `usage_margin`, sharing
like any pod; the usage rule follows its observed peak) or `wait` (refused, with the reason saying so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from extender.policy.types import EMPTY_SLACK_MIB, FilterResult, NodeView, PodRequest, PolicyParams

MIB_PER_GIB = 1024.0

# Reason kinds (bounded set: metric labels).
PASSED = "passed"
NO_REPORT = "no_report"
STALE = "stale"
TOO_FEW_GPUS = "too_few_gpus"
TOO_LARGE = "too_large"
MEMORY = "memory"

# What a predictor-admitted pod whose bound fits no candidate GPU while its point does gets
# (`PolicyParams.bound_beyond_gpus`, the setting `policy.bound_beyond_gpus`).
BEYOND_WHOLE_GPU = "whole-gpu"
BEYOND_POINT = "point"
BEYOND_WAIT = "wait"
BOUND_BEYOND_GPUS = (BEYOND_WHOLE_GPU, BEYOND_POINT, BEYOND_WAIT)


def gib(mib: float) -> str:
    """Memory for a person: `23.1 GiB`."""
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def gpus_fit(free_desc: Sequence[float], gpus: int, need_mib: float) -> bool:
    """THE fit test: at least `gpus` (>= 1) healthy GPUs each with effective free memory >= `need_mib`,
    `free_desc` being the healthy GPUs' free memory, largest first. Filter, score, bind, preemption
    and the simulator all ask this (columnar.fits_rows is its vectorised twin, property-tested)."""
    count = max(gpus, 1)
    return len(free_desc) >= count and free_desc[count - 1] >= need_mib


def fit_free_desc(pod: PodRequest, node: NodeView) -> Sequence[float]:
    """The free memory the fit test reads for `pod` on `node`, largest first: every healthy GPU's, or for
    a whole-GPU request (reserved whole at bind) only the empty GPUs': a partly used GPU larger than the
    request's size would otherwise pass and be reserved whole over what it already holds."""
    if not pod.whole_gpu:
        return node.free_desc
    return sorted((g.free_mib for g in node.healthy if g.empty), reverse=True)


def largest_gpu_mib(nodes: Iterable[NodeView | None], gpus: int) -> float:
    """The largest GPU memory a `gpus`-GPU pod could be given on `nodes`: the most, over the nodes
    with that many healthy GPUs, of the node's `gpus`-th largest GPU (its per-GPU size for such a
    pod). 0 when no node has that many. None (a name with no report) is skipped."""
    count = max(gpus, 1)
    return max((n.capacity_desc[count - 1] for n in nodes if n is not None and len(n.capacity_desc) >= count),
               default=0.0)


def whole_gpu_request(pod: PodRequest, nodes: Iterable[NodeView | None],
                      params: PolicyParams | None = None) -> PodRequest | None:
    """THE whole-GPU fallback: the request to place instead of `pod` when its admission (per GPU)
    exceeds every GPU it could be given on `nodes` while its point estimate (`predicted_mib`) fits the
    largest of them, L (`largest_gpu_mib`): the same pod asking for empty GPUs of that size
    (`admission_mib` = L - EMPTY_SLACK_MIB: what an idle GPU of size L has free, so only an empty one
    passes) and reserving them whole at bind (`reserved_per_gpu`); the usage rule then corrects the
    reservation after the warm-up, as for any pod. None when the fallback does not apply: the pod is
    not the predictor's (`fallback` off: the user's gpu-memory is never second-guessed), its
    admission fits some GPU of `nodes` (it waits for room there: a job whose bound fits an 80 GB GPU
    does not take a 16 GB one), or its point estimate exceeds them all (refused: larger than the GPUs).

    `nodes` are the candidates of the decision: the nodes kube-scheduler sent to this filter (those
    its own plugins found feasible: node selectors, affinity, taints, CPU and memory), with or
    without fresh telemetry (a GPU's size does not go stale). Not the whole known cluster: a pod
    pinned to a pool of 16 GB nodes would then wait forever for an 80 GB GPU it may not use, and
    the filter would read every node per request. The price: an 80 GB node that kube-scheduler left
    out for a moment (its CPU full) lets the pod take a whole smaller GPU now rather than wait; its
    point estimate fits that GPU, and the usage rule follows what it really uses. Bind, which sees
    one node, decides with that node alone, which agrees with the filter for every node the filter
    passed (a node passed under the fallback is one whose GPUs are all below the bound).

    `params.bound_beyond_gpus` (None: the default, `whole-gpu`) chooses the request: `point` gives the
    same pod admitted at its point estimate x `usage_margin` (at most L - EMPTY_SLACK_MIB), not whole:
    it shares GPUs like any pod and the usage rule follows its observed peak; `wait` gives None (the
    pod is refused with the reason `node_failure` words, until a GPU holds its bound)."""
    if not (pod.fallback and pod.gpu_job) or pod.whole_gpu:
        return None
    return whole_gpu_for(pod, largest_gpu_mib(nodes, pod.gpus), params)


def whole_gpu_for(pod: PodRequest, largest_mib: float, params: PolicyParams | None = None) -> PodRequest | None:
    """`whole_gpu_request` with the candidates' `largest_gpu_mib` already known (the columnar path
    reads it from its matrix: `columnar.largest_gpu_rows`)."""
    mode = params.bound_beyond_gpus if params is not None else BEYOND_WHOLE_GPU
    if not (pod.fallback and pod.gpu_job) or pod.whole_gpu or mode == BEYOND_WAIT:
        return None
    if largest_mib <= EMPTY_SLACK_MIB or pod.admission_mib <= largest_mib or pod.predicted_mib > largest_mib:
        return None
    if mode == BEYOND_POINT and params is not None:
        return replace(pod, admission_mib=min(pod.predicted_mib * params.usage_margin, largest_mib - EMPTY_SLACK_MIB))
    return replace(pod, admission_mib=largest_mib - EMPTY_SLACK_MIB, whole_gpu=True)


def reserved_per_gpu(pod: PodRequest, capacities_mib: Iterable[float]) -> float:
    """What bind reserves per GPU for `pod` on GPUs of these capacities: its admission, or for a
    whole-GPU request (`whole_gpu_request`) the GPUs' whole memory, so that nothing shares them."""
    if not pod.whole_gpu:
        return pod.admission_mib
    return max([pod.admission_mib, *capacities_mib])


def is_fresh(received_s: float, now_s: float, params: PolicyParams) -> bool:
    """Whether a node's telemetry received at `received_s` may still be trusted at `now_s`."""
    return now_s - received_s <= params.telemetry_ttl_s


def node_failure(
    pod: PodRequest, node: NodeView | None, now_s: float, params: PolicyParams
) -> tuple[str, str, bool] | None:
    """None when the node fits the pod, else (kind, reason, unresolvable).

    A pod that is not a GPU job fits every node: GPU telemetry has nothing to say about it.
    """
    if not pod.gpu_job:
        return None
    if node is None:
        return NO_REPORT, "no agent report", True
    if not is_fresh(node.received_s, now_s, params):
        return STALE, f"telemetry stale ({now_s - node.received_s:.0f}s old)", True
    need_gpus = max(pod.gpus, 1)
    free = node.free_desc
    if len(free) < need_gpus:
        have = len(free)
        unhealthy = len(node.gpus) - have
        extra = f" ({unhealthy} unhealthy)" if unhealthy else ""
        return TOO_FEW_GPUS, f"needs {need_gpus} GPU(s), node has {have} healthy{extra}", True
    need = pod.admission_mib
    if gpus_fit(fit_free_desc(pod, node), need_gpus, need):
        return None
    size = node.capacity_desc[need_gpus - 1]
    if size < need:
        largest = gib(size)
        if pod.whole_gpu:
            return TOO_LARGE, f"needs a whole GPU of {gib(need + EMPTY_SLACK_MIB)} (its upper bound exceeds " \
                              f"every GPU it could be given), larger than this node's GPUs ({largest})", True
        if pod.fallback and pod.predicted_mib > size:
            return TOO_LARGE, f"predicted {gib(pod.predicted_mib)} per GPU (upper bound {gib(need)}), larger " \
                              f"than this node's GPUs ({largest})", True
        if pod.fallback and params.bound_beyond_gpus == BEYOND_WAIT:
            return TOO_LARGE, f"upper bound {gib(need)} per GPU exceeds this node's GPUs ({largest}) while the " \
                              f"prediction {gib(pod.predicted_mib)} fits: it waits for a GPU that holds the bound " \
                              f"(policy.bound_beyond_gpus: wait; whole-gpu or point would admit it)", True
        return TOO_LARGE, f"needs {gib(need)} per GPU, larger than this node's GPUs ({largest})", True
    return MEMORY, _memory_reason(pod, node), False


def filter_nodes(
    pod: PodRequest,
    names: Iterable[str],
    nodes: Mapping[str, NodeView],
    now_s: float,
    params: PolicyParams,
) -> FilterResult:
    """Split `names` into passed / failed / unresolvable; the passed names keep the input order.

    Names are looked up in `nodes` (the extender's snapshot); an unknown name has no agent report.
    Duplicated names are answered once. The result only ever holds names from the input. When none
    passes and the whole-GPU fallback applies (`whole_gpu_request` over these nodes), the answer is
    the fallback request's, which it carries (`FilterResult.request`).
    """
    names = tuple(names)
    result = _filter_once(pod, names, nodes, now_s, params)
    if result.passed or not pod.fallback:
        return result
    whole = whole_gpu_request(pod, map(nodes.get, names), params)
    if whole is None:
        return result
    return replace(_filter_once(whole, names, nodes, now_s, params), request=whole)


def _filter_once(
    pod: PodRequest, names: Iterable[str], nodes: Mapping[str, NodeView], now_s: float, params: PolicyParams,
) -> FilterResult:
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    kinds: dict[str, int] = {}
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        failure = node_failure(pod, nodes.get(name), now_s, params)
        if failure is None:
            passed.append(name)
            continue
        kind, reason, final = failure
        (unresolvable if final else failed)[name] = reason
        kinds[kind] = kinds.get(kind, 0) + 1
    if passed:
        kinds[PASSED] = len(passed)
    return FilterResult(tuple(passed), failed, unresolvable, kinds)


def _memory_reason(pod: PodRequest, node: NodeView) -> str:
    """`gpu-1: needs 23.1 GiB, 11.4 GiB free` naming the roomiest GPUs (at most four); a whole-GPU
    request says so: `gpu-1: needs a whole GPU (31.9 GiB free), 11.4 GiB free`."""
    best = sorted(node.healthy, key=lambda g: -g.free_mib)[: max(pod.gpus, 1)][:4]
    frees = ", ".join(f"{g.label}: {gib(g.free_mib)} free" for g in best)
    need = f"a whole GPU ({gib(pod.admission_mib)} free)" if pod.whole_gpu else gib(pod.admission_mib)
    if any(g.compute_full for g in node.healthy) and all(g.compute_full or g.free_mib < pod.admission_mib
                                                         for g in node.healthy):
        return "compute: sharing a busy GPU would slow a job beyond the bound (sharing.maxSlowdown), and no " \
               f"empty GPU fits; best: {best[0].label}"
    if pod.gpus == 1:
        return f"{best[0].label}: needs {need}, {gib(best[0].free_mib)} free"
    if pod.whole_gpu:
        return f"needs {pod.gpus} whole GPUs ({gib(pod.admission_mib)} free each); {frees}"
    return f"needs {pod.gpus} GPUs with {need} free each; {frees}"
