"""The frozen records the DeepRes policies read: GPUs and nodes as the extender sees them, the pod
being placed, reservations, and the tunable parameters.

They carry no behaviour beyond derived fields computed once at construction, so the policy
functions can be called thousands of times per second (and by the simulator with its own
snapshots) without re-deriving per-GPU figures on every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from extender.policy.memory import effective_free_mib, occupied_mib

#: A GPU whose occupied memory is at most this is "whole" (nothing placed on it): an idle GPU shows
#: a few MiB used, a CUDA context alone is ~300 MiB.
EMPTY_SLACK_MIB = 128.0

#: Criticality levels, lowest first; their index is the level stored in `PriorityInputs`.
CRITICALITIES: tuple[str, ...] = ("low", "normal", "high", "critical")


def is_partly_used(occupied_mib: float, capacity_mib: float) -> bool:
    """Holding something but not full: such a GPU is "fragmented" for the tie-break of the score."""
    return EMPTY_SLACK_MIB < occupied_mib < capacity_mib - EMPTY_SLACK_MIB


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as the policies see it: capacity, observed use, and the sum of reservations on it.

    `free_mib` (derived) is the effective free memory, capacity - `usage.occupied_mib` (reservations
    + foreign use, at least the observed use), and -1 for an unhealthy GPU so nothing ever fits on it.
    `foreign_mib` is memory used by processes deepres did not place; `pending_mib` the reservations
    whose use cannot show in `used_mib` yet on a GPU that lists no processes (`usage.occupied_mib`).
    """

    uuid: str
    index: int
    capacity_mib: float
    used_mib: float = 0.0
    reserved_mib: float = 0.0
    utilization: float = 0.0  # ratio 0..1, from the last telemetry
    healthy: bool = True
    foreign_mib: float = 0.0
    pending_mib: float = 0.0
    duties: tuple[float, ...] = ()  # the GPU duties (alone, 0..1) of the pods placed on it (`policy.duty`)
    strict: bool = False  # a high or critical pod runs on it: the tighter slowdown bound (`policy.sharing`)
    compute_full: bool = False  # shown full to a pod that may not join it (`sharing.sharing_view`)
    over_bound: bool = False  # its shared jobs run slower than their bound: no joiner (`policy.feedback`)
    resident_margin: float = 1.0  # the largest forecast margin of its jobs' signatures (`policy.feedback`)
    free_mib: float = field(init=False, default=0.0)
    empty: bool = field(init=False, default=False)
    partly: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        occupied = occupied_mib(self.used_mib, self.reserved_mib, self.foreign_mib, self.pending_mib)
        object.__setattr__(self, "free_mib", effective_free_mib(self.capacity_mib, occupied, self.healthy))
        object.__setattr__(self, "empty", self.healthy and occupied <= EMPTY_SLACK_MIB)
        object.__setattr__(self, "partly", self.healthy and is_partly_used(occupied, self.capacity_mib))

    @property
    def label(self) -> str:
        return f"gpu-{self.index}"


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node's GPUs at `received_s` (the extender's clock when the telemetry arrived).

    Derived once: `healthy` (the healthy GPUs), `free_desc` (their free memory, largest first),
    `capacity_desc` (their capacities, largest first) and `partly_count` (healthy GPUs partly used)
    make the filter O(1) per node and the score O(GPUs of the node) with no sorting for 1-GPU pods;
    `busy_count` (healthy GPUs not empty) lets the sharing rule pass a node with none in O(1);
    `busy` (those GPUs) and `empty_free_desc` (the empty healthy GPUs' free memory, largest first) let
    it count the empty GPUs a pod fits without a loop and look at the busy ones alone.
    """

    name: str
    gpus: tuple[GpuView, ...]
    received_s: float
    healthy: tuple[GpuView, ...] = field(init=False, default=())
    free_desc: tuple[float, ...] = field(init=False, default=())
    capacity_desc: tuple[float, ...] = field(init=False, default=())
    partly_count: int = field(init=False, default=0)
    busy_count: int = field(init=False, default=0)
    busy: tuple[GpuView, ...] = field(init=False, default=())
    empty_free_desc: tuple[float, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        healthy = tuple(g for g in self.gpus if g.healthy)
        object.__setattr__(self, "healthy", healthy)
        object.__setattr__(self, "partly_count", sum(1 for g in healthy if g.partly))
        busy = tuple(g for g in healthy if not g.empty)
        object.__setattr__(self, "busy", busy)
        object.__setattr__(self, "busy_count", len(busy))
        object.__setattr__(self, "empty_free_desc", tuple(sorted((g.free_mib for g in healthy if g.empty),
                                                                 reverse=True)))
        object.__setattr__(self, "free_desc", tuple(sorted((g.free_mib for g in healthy), reverse=True)))
        object.__setattr__(self, "capacity_desc", tuple(sorted((g.capacity_mib for g in healthy), reverse=True)))

    def gpu(self, uuid: str) -> GpuView | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


@dataclass(frozen=True, slots=True)
class PriorityInputs:
    """What a pod's DeepRes priority is computed from (see `policy.priority.priority_of`).

    `criticality` is an index into CRITICALITIES, already capped by the namespace policy or taken
    from the PriorityClass. `gpu_seconds` is the predicted run time of one process on the reference
    GPU (so also the wall time); `gpus` multiplies it into the job's size.
    """

    criticality: int = 1
    deadline_s: float | None = None  # Unix seconds; None: no deadline
    gpu_seconds: float = 0.0
    gpus: int = 1


@dataclass(frozen=True, slots=True)
class PodRequest:
    """The pod being placed, reduced to what filter, score and preempt need.

    `admission_mib` is the memory each of its `gpus` GPUs must have free (the prediction's upper
    bound, a signature's observed peak, or the user's override). `priority` is `priority_of(...)`
    evaluated at the decision time. A pod that is not a GPU job passes every node, neutrally scored.

    `fallback`: the admission is the predictor's (bound or observed peaks, not the user's
    gpu-memory), so the whole-GPU fallback may replace it (`filtering.whole_gpu_request`);
    `whole_gpu`: this request is that replacement (an empty GPU, reserved whole at bind).
    """

    uid: str
    namespace: str
    name: str
    gpus: int = 1
    admission_mib: float = 0.0
    predicted_mib: float = 0.0
    priority: float = 0.0
    gpu_job: bool = True
    fallback: bool = False
    whole_gpu: bool = False
    duty: float = 1.0  # its GPU duty (`duty.admission_duty`): 1.0 GPU-bound
    predicted_run_s: float = 0.0  # the predictor's run time estimate (0: unknown), for the sharing rule
    kind: str = ""  # the kind of arrival it is, for preemption's churn rule (`preemption.arrival_kind`)
    slowdown_margin: float = 1.0  # its signature's forecast margin learned from outcomes (`policy.feedback`)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class UsageTrack:
    """What the usage rule saw of a bound pod's memory (`usage.track_peak`): its largest per-GPU peak
    since bind (`peak_mib`), the peak when it last grew (`base_mib`) and when (`grew_s`, extender
    clock), the observations since (`samples`), whether it has shown its peak (`shown`: its peak was
    flat for the plateau once; from then on its reservation follows its peak) and whether it outgrew
    its lowered reservation since (`regrown`: its GPUs admit nothing until its peak is flat again)."""

    peak_mib: float
    base_mib: float
    grew_s: float
    samples: int = 1
    shown: bool = False
    regrown: bool = False


@dataclass(frozen=True, slots=True)
class Reservation:
    """Memory held for a bound pod on each of its GPUs (`memory_mib` per GPU).

    `admission_mib` is what was admitted at bind; `memory_mib` starts there and, once the pod has
    shown its peak, follows the observed peak (usage rule; `track` is what it saw). `bound_s` is the
    extender's clock at bind.
    """

    pod_uid: str
    namespace: str
    name: str
    node: str
    gpu_uuids: tuple[str, ...]
    memory_mib: float
    admission_mib: float
    predicted_mib: float
    priority_inputs: PriorityInputs
    bound_s: float
    signature: str = ""
    predictor_version: str = ""
    duty: float = 1.0  # GPU duty alone (0..1): the prior, then the observed one (`policy.duty`)
    checkpoint_interval_s: float | None = None  # declared `deepres.io/checkpoint-interval`
    track: UsageTrack | None = None  # the usage rule's observations (`usage.follow_usage`); None: none yet
    evicted_by: str = ""  # the kind of arrival (`PodRequest.kind`) that last evicted this job ("": none)
    #: held for a pod kube-scheduler is about to bind (its prioritize's best node), not bound yet: it
    #: counts as reserved for the other pods' filters, and is never a victim (the pod runs nowhere)
    assumed: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PolicyParams:
    """Tunables of the DeepRes policies (the `policy` section of the extender's Settings)."""

    telemetry_ttl_s: float = 30.0
    """A node whose last report is older than this fails the filter ("telemetry stale")."""
    spread_priority: float = 20.0
    """Pods with priority >= this spread to the least utilised GPUs; below it they pack (best fit)."""
    fragmentation_weight: float = 0.2
    """Share (0..1) of the score given to keeping GPUs whole; the rest rates fit or idleness."""
    neutral_score: int = 5
    """Score of every node for a pod that is not a GPU job (all nodes equal: no preference)."""
    usage_warmup_s: float = 120.0
    """A running pod's reservation follows its observed peak only after this long since bind."""
    usage_plateau_s: float = 300.0
    """A pod has shown its peak once its observed peak has not grown for this long..."""
    usage_plateau_samples: int = 3
    """...over at least this many observations: only then may its reservation go below its admission."""
    usage_margin: float = 1.10
    """Safety margin on observed peaks (reservation = peak x margin), and on signature corrections."""
    min_reservation_mib: float = 256.0
    """Floor of a usage-following reservation: a CUDA context alone takes ~300 MiB."""
    size_scale_gpu_s: float = 1.0e6
    """Job size (GPU-seconds) that earns no size points in the priority; smaller jobs earn up to 5."""
    deadline_floor_s: float = 60.0
    """Time left below this counts as this, so urgency stays finite near and past the deadline."""
    correction_min_pods: int = 3
    """Observed peaks of a job signature move its admission only once this many pods were seen..."""
    correction_min_nodes: int = 2
    """...on at least this many nodes (one node's agent must not steer the whole cluster)."""
    sharing: bool = True
    """Apply the sharing rule (`policy.sharing`); off: memory alone decides (the ablation)."""
    max_slowdown: float = 1.25
    """`sharing.maxSlowdown`: a pod joins a GPU that runs work only when the interference model
    predicts no job there (nor the pod) slows beyond this (alone step time x this)."""
    max_slowdown_high: float = 1.10
    """The bound for high and critical pods joining, and for high and critical pods already there."""
    slowdown_error_exponent: float = 1.0
    """The interference model's error margin in the join check: a predicted slowdown s is judged as
    s ** this against the bound (1.0: the forecast as is). A held-out error of the model raises the
    true slowdown to s ** k (`simulate.capworld`); the live default is chosen from those residuals."""
    sharing_feedback: bool = False
    """The promise kept by feedback (`policy.feedback`): a GPU whose shared jobs run slower than their
    bound (observed from the agent's per-process samples) takes no joiner, its newest joiner is moved
    after `sharing_move_after_s`, and each signature's forecast error widens its later joins' margin.
    Off by default (the policy the cited reports were made with); the replay measures it side by side."""
    sharing_move_after_s: float = 600.0
    """How long a GPU may stay over its bound (no joiner taken) before its newest joiner is moved; 0
    moves at the second report over the bound. Moves are evictions: `inf` never moves."""
    share_memory_margin: float = 0.0
    """A pod joins a GPU that runs work only when its free memory is at least (1 + this) x the pod's
    admission: headroom for co-located jobs whose memory is only predicted."""
    bound_beyond_gpus: str = "whole-gpu"
    """A predictor-admitted pod whose bound fits no candidate GPU while its point estimate fits the
    largest (`filtering.whole_gpu_request`): `whole-gpu` an empty GPU reserved whole, `point` admitted
    at its point x `usage_margin` (shares; the usage rule follows), `wait` refused until a GPU holds it."""
    drain: bool = False
    """The draining rule (`sharing.draining`): while a GPU pod of higher priority waits (fits nowhere),
    a busy GPU takes no new sharer of lower priority, so GPUs empty for the waiting pod."""
    pack_below_priority: float = 0.0
    """Pods of priority below this join busy GPUs within `max_slowdown` even when an empty GPU is free
    (`policy.sharing`): they would keep whole GPUs free rather than wait less. Off (0) by default:
    on the replay's default slice (2,000 pods, seed 42) 10 (best effort packs) gave a mean JCT of
    150,676 s with 31,174 preemptions (high-priority pods evicting the packed best-effort ones again
    and again), 0 gave 175,319 s with 665 (static: 96,018 s): neither pays there."""
    preempt_min_gap: float = 10.0
    """A victim's priority is at least this far below the preemptor's (10: one criticality level), so
    the size and urgency points of jobs of one class never make them evict each other (measured on
    the replay's default slice: with any strictly lower priority, 1,897 preemptions of 1,724 jobs
    starved best-effort jobs once the sharing rule stopped packing them)."""
    preempt_max_loss_s: float = 1800.0
    """Preemption evicts a pod without a declared checkpoint interval only while its attained service
    (time since bind) is below this; with one, only what it would lose (time since its last checkpoint,
    taken as attained mod interval) below this."""


@dataclass(frozen=True, slots=True)
class FilterResult:
    """The filter's answer: nodes that pass, nodes that fail (preemption may help), nodes that fail
    whatever happens (unresolvable), and how many nodes failed per reason kind (for metrics).
    `request` is the whole-GPU request the answer was computed for when the fallback applied
    (`filtering.whole_gpu_request`; prioritize and bind then place that), else None."""

    passed: tuple[str, ...]
    failed: Mapping[str, str]  # a Mapping: the columnar filter words its failures when read (`columnar.Reasons`)
    unresolvable: Mapping[str, str]
    kinds: dict[str, int]
    request: PodRequest | None = None
