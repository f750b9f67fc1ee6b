"""Usage rule for compute: each pod's GPU duty (busy share alone, 0..1), learned as memory is.

1. Prior (`prior_duty`): before any observation a pod is GPU-bound (duty 1.0) unless it declares
   `deepres.io/gpu-share` (0..1), which stands until observation replaces it, but counts only down
   to its namespace's share floor (`admission_duty`; default 1.0: declarations count where the admin
   says). A job signature seen before starts from what its pods showed (`admission_duty`): the next
   pod of the same job starts known.
2. Observation (`alone_duties`): the agent reports each pod's busy share over its window (NVML's
   per-process samples, or the device's utilisation charged whole to each pod where the driver gives
   none). Busy shares seen *while sharing* are lower than the pod's duty alone (it ran slower), so
   the shares of the pods observed together on one GPU are turned into alone duties by the
   interference model's inverse (`interference.standalone_duties`). Over several GPUs, the largest.
3. Following (`follow_duty`): after `usage_warmup_s` since bind the pod's duty becomes its alone
   duty (down as well as up). A missing, non-finite or out-of-range observation changes nothing: bad
   or missing samples never lower a duty.
4. Per signature (`DutyStore`): the largest alone duty of its last `PODS_PER_SIGNATURE` pods
   (a conservative summary: under-stating a duty packs jobs that then slow each other down).

Pure: no I/O, no clock; the ledger holds a DutyStore under its lock, the replay its own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from extender.policy.interference import PRECEDENCE, SHARED_SERVICE, standalone_duties

if TYPE_CHECKING:
    from extender.policy.types import PolicyParams, Reservation

#: A GPU-bound job: the prior of a pod that declares nothing and whose signature was never seen.
GPU_BOUND = 1.0
#: Below this change a pod's duty is left as is (NVML reports whole percent).
DUTY_DEADBAND = 0.01
PODS_PER_SIGNATURE = 16


def prior_duty(declared: float | None) -> float:
    """The duty before observation: the declared `deepres.io/gpu-share`, else GPU-bound (1.0)."""
    return GPU_BOUND if declared is None else min(max(float(declared), 0.0), 1.0)


def admission_duty(declared: float | None, learned: float | None, floor: float = 0.0) -> float:
    """The duty a new pod is placed with: its signature's learned duty when there is one (observation
    replaces the declaration), else `prior_duty(declared)` but never below `floor`: the namespace's
    share floor (`PolicySettings.share_floor`), the lowest duty a declaration there may claim before
    observation. A declaration is a prior, not a pass: with the default floor (1.0) a pod that says
    0.01 is placed as GPU-bound until its signature's duty is seen, so six such pods can no longer
    join a GPU-bound job and slow it 6.45x (issue 34 row 6). The replay (truthful declarations)
    keeps 0."""
    if learned is not None and valid_duty(learned):
        return float(learned)
    return max(prior_duty(declared), min(max(floor, 0.0), GPU_BOUND))


def valid_duty(value: float | None) -> bool:
    """Whether `value` is an observation at all: a finite number in [0, 1]."""
    return value is not None and isinstance(value, int | float) and math.isfinite(value) and 0.0 <= value <= 1.0


def alone_duties(busy: Mapping[str, float | None], shared_service: float = SHARED_SERVICE,
                 precedence: float = PRECEDENCE) -> dict[str, float]:
    """pod -> alone duty from the busy shares of the pods observed together on ONE GPU (None or bad
    shares are no observation and left out; they still do not count as idle). A pod alone keeps its
    share."""
    seen = {pod: float(u) for pod, u in busy.items() if u is not None and valid_duty(u)}
    if not seen:
        return {}
    pods = sorted(seen)
    return dict(zip(pods, standalone_duties([seen[p] for p in pods], shared_service, precedence), strict=True))


def pod_alone_duty(per_gpu: Sequence[float]) -> float | None:
    """A pod's alone duty over its GPUs: the busiest; None without any observation."""
    values = [d for d in per_gpu if valid_duty(d)]
    return max(values) if values else None


def follow_duty(res: Reservation, alone: float | None, now_s: float, params: PolicyParams) -> Reservation:
    """The reservation with its duty following an alone-duty observation at `now_s` (rule 3)."""
    if not valid_duty(alone) or now_s - res.bound_s < params.usage_warmup_s:
        return res
    assert alone is not None
    if abs(alone - res.duty) < DUTY_DEADBAND:
        return res
    return replace(res, duty=float(alone))


class DutyStore:
    """Bounded map job signature -> the alone duties of its last pods (LRU over signatures). No I/O,
    no clock; not thread-safe by itself (the ledger holds it under its lock)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = max(capacity, 1)
        self._items: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def record(self, signature: str, duty: float, pod_uid: str) -> float | None:
        """Record pod `pod_uid`'s alone duty (its latest replaces its earlier one); returns the
        signature's duty. A bad value is no observation."""
        if not signature or not valid_duty(duty):
            return self.get(signature)
        pods = self._items.pop(signature, None) or OrderedDict()
        self._items[signature] = pods
        pods.pop(pod_uid, None)
        pods[pod_uid] = float(duty)
        while len(pods) > PODS_PER_SIGNATURE:
            pods.popitem(last=False)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return max(pods.values())

    def get(self, signature: str) -> float | None:
        """The signature's duty (the largest of its last pods'), None when never observed."""
        pods = self._items.get(signature)
        if not pods:
            return None
        self._items.move_to_end(signature)
        return max(pods.values())
