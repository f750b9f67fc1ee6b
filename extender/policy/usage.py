"""Usage rule: reservations follow what jobs really use, what was seen corrects predictions, and
memory deepres did not place is never counted as free.

1. Occupied memory of a GPU (`occupied_mib`, the one home of the formula): the sum of reservations
   plus the memory of processes deepres did not place ("foreign": a process of no pod, or of a pod
   that holds no reservation on that GPU), and never less than the memory the GPU reports used.
   A GPU whose report lists no processes cannot attribute its used memory: there the reservations
   made less than `usage_warmup_s` before the report (pending: their use may not show yet) come on
   top of the used memory, and only the older ones may hide inside it. Effective free = capacity -
   occupied.
2. A reservation goes below its admission only to what the job is known to reach, and only once
   the job has shown its peak (`peak_shown`): `usage_warmup_s` since bind, and its observed peak
   (the largest per-GPU peak since bind, kept by the ledger across agent restarts) has not grown by
   more than `PLATEAU_GROWTH` for `usage_plateau_s` over at least `usage_plateau_samples`
   observations. Then the reservation is that peak x `usage_margin` (never below
   `min_reservation_mib`). Before, it is never below the admission (which is never below the
   predictor's point except where the user's override or the signature's observed peaks set it):
   a job that started at 30% of its admission and grows to it within a minute keeps its memory. A
   reservation goes *up* at once whenever peak x margin exceeds it. A job that outgrows its lowered
   reservation (`regrown`) gets its reservation back at once (to its observed need, peak x margin)
   and its GPUs admit nothing (the ledger shows them full) until its peak is flat again, so nothing
   else takes the memory it grows into. A peak of 0 is
   no observation (NVML without per-process memory reports 0), and a peak is bounded by the GPU's
   capacity.
3. Observed peaks are kept per job signature in a bounded store (least recently used signatures
   are forgotten first), per node. A later pod of the same signature is admitted from them only
   once `correction_min_pods` pods on `correction_min_nodes` nodes were seen, and then so that no
   single node moves it alone: admission goes down only to the largest peak any node saw, and up
   only to the second largest node's peak (`corrected_admission`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from extender.policy.memory import effective_free_mib as effective_free_mib  # re-exported: its home is memory.py
from extender.policy.memory import occupied_mib as occupied_mib
from extender.policy.memory import occupied_mib_array as occupied_mib_array
from extender.policy.types import UsageTrack

if TYPE_CHECKING:
    from extender.policy.types import PolicyParams, Reservation

F64 = npt.NDArray[np.float64]

#: Below this change (MiB) a reservation is left as is, so a steady job does not churn the ledger.
FOLLOW_DEADBAND_MIB = 1.0
#: Growth of the observed peak (share of the peak when it last grew) that restarts the plateau: the
#: margin (10%) covers creep below it, and allocator noise does not keep a job from ever settling.
PLATEAU_GROWTH = 0.02
#: Nodes and pods remembered per signature (enough to count to the thresholds and keep the maxima).
NODES_PER_SIGNATURE = 16
PODS_PER_SIGNATURE = 16


def observed_peak(peak_mib_per_gpu: float | None, capacity_mib: float) -> float | None:
    """A pod's reported per-GPU peak as an observation: None when there is none (0, missing, not
    finite), else bounded by the GPU's capacity (an agent cannot claim more than the GPU has)."""
    if peak_mib_per_gpu is None or not peak_mib_per_gpu > 0.0 or peak_mib_per_gpu != peak_mib_per_gpu:
        return None
    return min(float(peak_mib_per_gpu), capacity_mib)


def warmed_up(res: Reservation, now_s: float, params: PolicyParams) -> bool:
    """Whether `usage_warmup_s` has passed since the pod's bind."""
    return now_s - res.bound_s >= params.usage_warmup_s


def track_peak(track: UsageTrack | None, peak_mib_per_gpu: float, now_s: float) -> UsageTrack:
    """`track` after one observation of the pod's per-GPU peak at `now_s`: the largest peak since
    bind, and the plateau restarted when it grew beyond `PLATEAU_GROWTH` of the peak it last grew to."""
    if track is None:
        return UsageTrack(peak_mib_per_gpu, peak_mib_per_gpu, now_s)
    peak = max(track.peak_mib, peak_mib_per_gpu)
    if peak > track.base_mib * (1.0 + PLATEAU_GROWTH):
        return replace(track, peak_mib=peak, base_mib=peak, grew_s=now_s, samples=1)
    return replace(track, peak_mib=peak, samples=track.samples + 1)


def plateau_reached(res: Reservation, track: UsageTrack, now_s: float, params: PolicyParams) -> bool:
    """Past the warm-up, and the observed peak flat for `usage_plateau_s` over
    `usage_plateau_samples` observations."""
    return (warmed_up(res, now_s, params) and now_s - track.grew_s >= params.usage_plateau_s
            and track.samples >= params.usage_plateau_samples)


def peak_shown(res: Reservation) -> bool:
    """Whether the pod has shown its peak (rule 2): its observed peak was flat for the plateau once."""
    return res.track is not None and res.track.shown


def need_mib(track: UsageTrack, params: PolicyParams) -> float:
    """What the job is known to reach per GPU: its observed peak since bind x margin."""
    return max(track.peak_mib * params.usage_margin, params.min_reservation_mib)


def floor_before_peak_mib(res: Reservation) -> float:
    """The least a reservation holds until the pod has shown its peak: its admission. Not the
    predictor's point: a job above its point estimate is the predictor's ordinary error (the upper
    bound exists for it), and memory between the two handed out early is memory such a job grows
    into (tests/adversarial/test_ledger_growth.py's property test finds that at once)."""
    return res.admission_mib


def follow_usage(res: Reservation, peak_mib_per_gpu: float, now_s: float, params: PolicyParams) -> Reservation:
    """The reservation after the usage rule (rule 2) sees a per-GPU peak at `now_s`: its `track`
    updated; its memory max(admission, need) until the pod has shown its peak, then its need
    (`need_mib`, up at once as the peak grows). A job that outgrows a lowered reservation is marked
    `regrown` until its peak is flat again (the ledger then shows its GPUs full)."""
    if not peak_mib_per_gpu > 0.0:
        return res
    track = track_peak(res.track, peak_mib_per_gpu, now_s)
    need = need_mib(track, params)
    if plateau_reached(res, track, now_s, params):
        track = replace(track, shown=True, regrown=False)
    elif track.shown and need > res.memory_mib + FOLLOW_DEADBAND_MIB:
        track = replace(track, regrown=True)  # it grew back above what it was lowered to
    target = need if track.shown else max(need, floor_before_peak_mib(res))
    if abs(target - res.memory_mib) < FOLLOW_DEADBAND_MIB:
        return replace(res, track=track)
    return replace(res, memory_mib=target, track=track)


def usage_reports_s(params: PolicyParams) -> list[float]:
    """Times after bind at which a job whose use is flat from its start is observed so that the last
    one shows its peak (`peak_shown`): its first report, then `usage_plateau_samples` reports spread up
    to max(warm-up, plateau). The replay, whose jobs use their peak from the start, observes them then."""
    last = max(params.usage_warmup_s, params.usage_plateau_s)
    n = max(params.usage_plateau_samples, 2)
    return [last * k / (n - 1) for k in range(n)]


def observe_usage(res: Reservation, peak_mib_per_gpu: float, now_s: float, params: PolicyParams,
                  peaks: PeakStore) -> Reservation:
    """One observation (`observed_peak`) of a bound pod's per-GPU peak, from a telemetry report: the
    reservation after the usage rule, and once the pod has shown its peak that peak recorded for the
    pod's job signature on its node (an early peak must not lower the admission of the job's next
    pods either). The extender's ledger calls this on every report, the simulator's replay on its
    usage events."""
    updated = follow_usage(res, peak_mib_per_gpu, now_s, params)
    if res.signature and updated.track is not None and updated.track.shown:
        peaks.record(res.signature, updated.track.peak_mib, res.pod_uid, res.node)
    return updated


@dataclass(frozen=True, slots=True)
class Correction:
    """What was observed for a job signature: the largest per-GPU peak a node saw (`peak_mib`), the
    second largest node's (`second_mib`, = peak_mib with one node), over `observations` pods on
    `nodes` nodes."""

    peak_mib: float
    observations: int
    nodes: int = 1
    second_mib: float = -1.0  # < 0: the same as peak_mib

    @property
    def runner_up_mib(self) -> float:
        return self.peak_mib if self.second_mib < 0 else self.second_mib


class _Seen:
    __slots__ = ("by_node", "count", "pods")

    def __init__(self) -> None:
        self.by_node: OrderedDict[str, float] = OrderedDict()
        self.pods: OrderedDict[str, None] = OrderedDict()
        self.count = 0

    def correction(self) -> Correction:
        top = sorted(self.by_node.values(), reverse=True)[:2]
        return Correction(top[0], self.count, len(self.by_node), top[1] if len(top) > 1 else top[0])


class PeakStore:
    """Bounded map job signature -> per-node peaks (LRU). No I/O, no clock; not thread-safe by itself
    (the extender's ledger holds it under its lock)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = max(capacity, 1)
        self._items: OrderedDict[str, _Seen] = OrderedDict()
        self._anonymous = 0

    def __len__(self) -> int:
        return len(self._items)

    def record(self, signature: str, peak_mib: float, pod_uid: str | None = None,
               node: str | None = None) -> Correction:
        """Record one observed per-GPU peak of pod `pod_uid` on `node`; returns the signature's
        updated correction. The live ledger names both; a caller that is its own ground truth (the
        simulator) may leave them out, and each record then counts as a pod on a node of its own."""
        if pod_uid is None or node is None:
            self._anonymous += 1
            pod_uid = pod_uid if pod_uid is not None else f"#{self._anonymous}"
            node = node if node is not None else f"#{self._anonymous}"
        seen = self._items.pop(signature, None) or _Seen()
        self._items[signature] = seen
        if pod_uid not in seen.pods:
            seen.count += 1
        seen.pods[pod_uid] = None
        seen.pods.move_to_end(pod_uid)
        while len(seen.pods) > PODS_PER_SIGNATURE:
            seen.pods.popitem(last=False)
        seen.by_node[node] = max(seen.by_node.get(node, 0.0), peak_mib)
        seen.by_node.move_to_end(node)
        while len(seen.by_node) > NODES_PER_SIGNATURE:
            seen.by_node.popitem(last=False)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return seen.correction()

    def get(self, signature: str) -> Correction | None:
        seen = self._items.get(signature)
        if seen is None:
            return None
        self._items.move_to_end(signature)
        return seen.correction()

    def items(self) -> list[tuple[str, Correction]]:
        return [(sig, seen.correction()) for sig, seen in self._items.items()]


def corrected_admission(
    predicted_upper_mib: float, correction: Correction | None, params: PolicyParams
) -> float:
    """The admission memory per GPU: the predictor's upper bound U, corrected by observed peaks once
    `correction_min_pods` pods on `correction_min_nodes` nodes were seen, as
    min(largest node peak x margin, max(U, second node peak x margin)): lower only when every node
    saw less, higher only when two nodes saw more."""
    if correction is None or correction.observations < params.correction_min_pods \
            or correction.nodes < params.correction_min_nodes:
        return predicted_upper_mib
    down = correction.peak_mib * params.usage_margin
    up = correction.runner_up_mib * params.usage_margin
    return max(min(down, max(predicted_upper_mib, up)), params.min_reservation_mib)


def is_corrected(predicted_upper_mib: float, correction: Correction | None, params: PolicyParams) -> bool:
    """Whether observed peaks decided the admission (for the metrics and the pod's event)."""
    return correction is not None and corrected_admission(predicted_upper_mib, correction, params) \
        != predicted_upper_mib
