"""Usage rule: reservations follow what jobs really use, and what was seen corrects predictions.

1. After `usage_warmup_s` since bind, a running pod's reservation per GPU becomes its observed peak
   per GPU x `usage_margin` (never below `min_reservation_mib`), down as well as up. Before the
   warm-up the admitted reservation holds: start-up peaks (cuDNN autotuning, first allocations) are
   not yet representative, and a lower early peak must not free memory the job will soon take.
2. Observed peaks are kept per job signature in a bounded store (least recently used signatures
   are forgotten first); a later pod of the same signature is admitted with the largest observed
   peak x margin instead of the predictor's upper bound, in either direction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from extender.policy.types import PolicyParams, Reservation

#: Below this change (MiB) a reservation is left as is, so a steady job does not churn the ledger.
FOLLOW_DEADBAND_MIB = 1.0


def warmed_up(res: Reservation, now_s: float, params: PolicyParams) -> bool:
    """Whether a bound pod's observed peaks are representative yet (`usage_warmup_s` since bind)."""
    return now_s - res.bound_s >= params.usage_warmup_s


def follow_usage(res: Reservation, peak_mib_per_gpu: float, now_s: float, params: PolicyParams) -> Reservation:
    """The reservation after applying the usage rule to an observed per-GPU peak at `now_s`."""
    if not warmed_up(res, now_s, params) or peak_mib_per_gpu <= 0.0:
        return res
    target = max(peak_mib_per_gpu * params.usage_margin, params.min_reservation_mib)
    if abs(target - res.memory_mib) < FOLLOW_DEADBAND_MIB:
        return res
    return replace(res, memory_mib=target)


def observe_usage(res: Reservation, peak_mib_per_gpu: float, now_s: float, params: PolicyParams,
                  peaks: PeakStore) -> Reservation:
    """One observation of a bound pod's per-GPU peak (a telemetry report): the reservation after the
    usage rule, and once the warm-up has passed the peak recorded for the pod's job signature. The
    extender's state calls this on every report, the simulator's replay on its usage events."""
    updated = follow_usage(res, peak_mib_per_gpu, now_s, params)
    if res.signature and warmed_up(res, now_s, params):
        peaks.record(res.signature, peak_mib_per_gpu)
    return updated


@dataclass(frozen=True, slots=True)
class Correction:
    """What was observed for a job signature: the largest per-GPU peak over `observations` runs."""

    peak_mib: float
    observations: int


class PeakStore:
    """Bounded map job signature -> Correction (LRU). No I/O, no clock; not thread-safe by itself
    (the extender's state holds it under its lock)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = max(capacity, 1)
        self._items: OrderedDict[str, Correction] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def record(self, signature: str, peak_mib: float) -> Correction:
        """Record one observed per-GPU peak; returns the signature's updated correction."""
        old = self._items.pop(signature, None)
        new = Correction(peak_mib, 1) if old is None else Correction(max(old.peak_mib, peak_mib), old.observations + 1)
        self._items[signature] = new
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return new

    def get(self, signature: str) -> Correction | None:
        correction = self._items.get(signature)
        if correction is not None:
            self._items.move_to_end(signature)
        return correction

    def items(self) -> list[tuple[str, Correction]]:
        return list(self._items.items())


def corrected_admission(
    predicted_upper_mib: float, correction: Correction | None, params: PolicyParams
) -> float:
    """The admission memory per GPU: the observed peak x margin when the signature was seen, else the
    predictor's upper bound."""
    if correction is None or correction.observations <= 0:
        return predicted_upper_mib
    return max(correction.peak_mib * params.usage_margin, params.min_reservation_mib)
