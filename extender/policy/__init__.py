"""The DeepRes policies as pure functions: no I/O, no clock (time is always the `now_s` argument),
no globals. The extender's HTTP layer and the trace simulator call exactly these.

Records (frozen dataclasses, `extender.policy.types`)
    GpuView(uuid, index, capacity_mib, used_mib=0, reserved_mib=0, utilization=0, healthy=True, foreign_mib=0,
            pending_mib=0)
        derived: free_mib = capacity - usage.occupied_mib(used, reserved, foreign, pending) (-1 when unhealthy)
    NodeView(name, gpus: tuple[GpuView, ...], received_s)
        derived once: healthy, free_desc, capacity_desc (build one per node and telemetry/ledger
        change, then reuse it for every call: the filter is O(1) per node)
    PodRequest(uid, namespace, name, gpus=1, admission_mib=0, predicted_mib=0, priority=0, gpu_job=True,
               fallback=False, whole_gpu=False)
    PriorityInputs(criticality=1, deadline_s=None, gpu_seconds=0, gpus=1)
    Reservation(pod_uid, namespace, name, node, gpu_uuids, memory_mib, admission_mib, predicted_mib,
                priority_inputs, bound_s, signature="", predictor_version="")
    PolicyParams(telemetry_ttl_s=30, spread_priority=20, fragmentation_weight=0.2, neutral_score=5,
                 usage_warmup_s=120, usage_margin=1.10, min_reservation_mib=256,
                 size_scale_gpu_s=1e6, deadline_floor_s=60)
    FilterResult(passed: tuple[str, ...], failed: dict[str, str], unresolvable: dict[str, str],
                 kinds: dict[str, int], request: PodRequest | None = None)

Functions
    filter_nodes(pod, names, nodes: Mapping[str, NodeView], now_s, params) -> FilterResult
    node_failure(pod, node | None, now_s, params) -> (kind, reason, unresolvable) | None
    score_nodes(pod, names, nodes, params) -> list[(name, score 0..10)]
    score_node(pod, node | None, params) -> int
    choose_gpus(pod, node, params) -> tuple[GpuView, ...] | None     (bind uses the same rule)
    gpus_fit(free_desc, gpus, need_mib) -> bool    (THE fit test; columnar.fits_rows its vectorised twin)
    whole_gpu_request(pod, nodes) -> PodRequest | None   (THE whole-GPU fallback: a bound above every
        candidate GPU, the point estimate fitting the largest: empty GPUs of that size, reserved whole;
        filter_nodes / filter_matrix apply it when no node passes and return it as FilterResult.request)
    largest_gpu_mib(nodes, gpus) -> float; reserved_per_gpu(pod, capacities) -> float
        (columnar.largest_gpu_rows: the vectorised twin of largest_gpu_mib)
    is_fresh(received_s, now_s, params) -> bool    (telemetry trusted; columnar.fresh_rows its twin)
    spreads(pod, params) -> bool                   (THE spread rule)
    gpu_key(free, utilization, empty, need, spread) -> float   (THE GPU choice order; columnar.gpu_keys)
    packs_by_mix(pod, params) -> bool; choose_gpus_for(pod, node, params, mix=None, ...) -> GPUs | None
        (which placement rule a pod gets, and the GPUs bind takes under it: `placement`)
    shortlist(scores, keep) -> positions of the `keep` best scores, in input order
        (the filter's answer when many nodes fit: `placement`)
    effective_free_mib(capacity, occupied, healthy) / occupied_mib(used, reserved, foreign)
        (GPU free memory: the one home of the formula, in `usage`)
    priority_of(inputs: PriorityInputs, now_s, params) -> float      (0..45, formula in .priority)
    criticality_level(name) -> int; cap_criticality(level, ceiling) -> int;
    criticality_from_priority_class(value) -> int
    follow_usage(reservation, peak_mib_per_gpu, now_s, params) -> Reservation
    observe_usage(reservation, peak_mib_per_gpu, now_s, params, peaks) -> Reservation
        (one report's peak: the usage rule, and the signature's peak recorded once the pod has shown it)
    peak_shown(reservation) -> bool
        (the pod's observed peak flat for usage_plateau_s: only then may its reservation go below admission)
    PeakStore(capacity).record(signature, peak_mib) / .get(signature) -> Correction | None
    corrected_admission(predicted_upper_mib, correction | None, params) -> float
    plan_victims(pod, node, reservations_on_node, now_s, params, evicted=()) -> tuple[uid, ...] | None
    choose_preemption(pod, [(node, reservations_on_node), ...], now_s, params)
        -> (node name, victims) | None   (THE preemption node choice: self-preemption and the replay)

Fragmentation-aware packing score (`extender.policy.fragmentation`), for low-priority pods:
    DemandShape(memory_mib, gpus, probability, cpu_milli=0); DemandMix(shapes);
    demand_mix([(memory_mib, gpus, weight, cpu_milli), ...]) -> DemandMix (weights renormalised)
    DemandWindow().admit(memory_mib, gpus, cpu_milli) / .mix() -> DemandMix   (the recent admissions)
    score_nodes_fragaware(pod, names, nodes, params, mix, cpu_left_milli=None, pod_cpu_milli=0)
        -> list[(name, score 0..10)]   (10: first top-merit node in name order, 9: other top ones)
    choose_gpus_fragaware(pod, node, mix, cpu_left_milli=None, pod_cpu_milli=0) -> GPUs | None
    fragmentation(free, capacity, mix, cpu_left) / fragmentation_delta(...) / merit_from_delta(delta)
        / scores_from_merits([(name, merit 0..100)]) / merits_from_deltas(array) (vectorised)

Vectorised equivalents (`extender.policy.columnar`, numpy; same answers, property-tested), for
callers that keep a columnar copy of their NodeViews (the extender's state does):
    NodeMatrix(rows=1024, cols=8).put(view) / .remove(name)
    filter_matrix(pod, names, matrix, nodes, now_s, params) -> FilterResult
    score_matrix(pod, names, matrix, nodes, params) -> Scores (names, values array; .pairs())
    score_matrix_fragaware(pod, names, matrix, params, mix) -> Scores
        (score_nodes_fragaware without the CPU term: the live extender's packing score)

Compute (issue 24): `interference.step_rate_fractions(duties)` / `slowdowns(duties)` (THE interference
model, fitted on real co-location data), `duty` (the usage rule for GPU duty: prior, observation
corrected for sharing, `DutyStore` per signature), `sharing.may_join(pod, gpu, params, wait_s)` /
`sharing_view(pod, node, params, wait_s)` (THE sharing rule: join a busy GPU only within
`max_slowdown` and when that beats waiting for an empty GPU), `preemption.evictable(res, now_s,
params)` (attained service / declared checkpoint interval).

Units: MiB, seconds, ratios 0..1. The caller computes `PodRequest.priority = priority_of(...)` at
the decision time and `NodeView.gpus[*].reserved_mib` as the sum of reservations on each GPU.
"""

from extender.policy.filtering import (
    filter_nodes,
    gpus_fit,
    is_fresh,
    largest_gpu_mib,
    node_failure,
    reserved_per_gpu,
    whole_gpu_request,
)
from extender.policy.fragmentation import (
    DemandMix,
    DemandShape,
    DemandWindow,
    choose_gpus_fragaware,
    demand_mix,
    fragmentation,
    fragmentation_delta,
    merit_from_delta,
    score_nodes_fragaware,
    scores_from_merits,
)
from extender.policy.placement import choose_gpus_for, packs_by_mix, shortlist
from extender.policy.preemption import choose_preemption, plan_victims
from extender.policy.priority import cap_criticality, criticality_from_priority_class, criticality_level, priority_of
from extender.policy.scoring import choose_gpus, gpu_key, score_node, score_nodes, spreads
from extender.policy.types import (
    CRITICALITIES,
    FilterResult,
    GpuView,
    NodeView,
    PodRequest,
    PolicyParams,
    PriorityInputs,
    Reservation,
)
from extender.policy.usage import (
    Correction,
    PeakStore,
    corrected_admission,
    effective_free_mib,
    follow_usage,
    observe_usage,
    occupied_mib,
    peak_shown,
    warmed_up,
)

__all__ = [
    "CRITICALITIES",
    "Correction",
    "DemandMix",
    "DemandShape",
    "DemandWindow",
    "FilterResult",
    "GpuView",
    "NodeView",
    "PeakStore",
    "PodRequest",
    "PolicyParams",
    "PriorityInputs",
    "Reservation",
    "cap_criticality",
    "choose_gpus",
    "choose_gpus_for",
    "choose_gpus_fragaware",
    "choose_preemption",
    "corrected_admission",
    "criticality_from_priority_class",
    "criticality_level",
    "demand_mix",
    "effective_free_mib",
    "filter_nodes",
    "follow_usage",
    "fragmentation",
    "fragmentation_delta",
    "gpu_key",
    "gpus_fit",
    "is_fresh",
    "largest_gpu_mib",
    "merit_from_delta",
    "node_failure",
    "observe_usage",
    "occupied_mib",
    "packs_by_mix",
    "peak_shown",
    "plan_victims",
    "priority_of",
    "reserved_per_gpu",
    "score_node",
    "score_nodes",
    "score_nodes_fragaware",
    "scores_from_merits",
    "shortlist",
    "spreads",
    "warmed_up",
    "whole_gpu_request",
]
