"""Filter: which candidate nodes can take the pod now, and why the others cannot.

A node passes when it has `pod.gpus` healthy GPUs each with effective free memory >= the pod's
admission memory, and its telemetry is fresh. Failures a person can act on are reported per node;
those no preemption could fix (no or stale telemetry, too few GPUs, the job larger than the node's
GPUs) are "unresolvable", which also keeps kube-scheduler from preempting there in vain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from extender.policy.types import FilterResult, NodeView, PodRequest, PolicyParams

MIB_PER_GIB = 1024.0

# Reason kinds (bounded set: metric labels).
PASSED = "passed"
NO_REPORT = "no_report"
STALE = "stale"
TOO_FEW_GPUS = "too_few_gpus"
TOO_LARGE = "too_large"
MEMORY = "memory"


def gib(mib: float) -> str:
    """Memory for a person: `23.1 GiB`."""
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def gpus_fit(free_desc: Sequence[float], gpus: int, need_mib: float) -> bool:
    """THE fit test: at least `gpus` (>= 1) healthy GPUs each with effective free memory >= `need_mib`,
    `free_desc` being the healthy GPUs' free memory, largest first. Filter, score, bind, preemption
    and the simulator all ask this (columnar.fits_rows is its vectorised twin, property-tested)."""
    count = max(gpus, 1)
    return len(free_desc) >= count and free_desc[count - 1] >= need_mib


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
    if gpus_fit(free, need_gpus, need):
        return None
    if node.capacity_desc[need_gpus - 1] < need:
        largest = gib(node.capacity_desc[need_gpus - 1])
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
    Duplicated names are answered once. The result only ever holds names from the input.
    """
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
    """`gpu-1: needs 23.1 GiB, 11.4 GiB free` naming the roomiest GPUs (at most four)."""
    best = sorted(node.healthy, key=lambda g: -g.free_mib)[: max(pod.gpus, 1)][:4]
    frees = ", ".join(f"{g.label}: {gib(g.free_mib)} free" for g in best)
    if pod.gpus == 1:
        return f"{best[0].label}: needs {gib(pod.admission_mib)}, {gib(best[0].free_mib)} free"
    return f"needs {pod.gpus} GPUs with {gib(pod.admission_mib)} free each; {frees}"
