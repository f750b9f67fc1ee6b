"""Sharing's promise kept by feedback (issue 46, item 2): what shared jobs really do corrects the joins.

The sharing rule (`policy.sharing`) admits a join when the interference model forecasts no job there
slows beyond the admin's bound. A forecast can be wrong (a light job waits behind a heavy one longer
than the model says, an extra context costs time the model does not charge), and nothing corrected a
bad join. This module is the correction, from the agent's per-process samples alone:

1. **Solo duty.** A pod seen alone on its GPU shows its duty alone as its busy share (NVML's
   per-process SM samples): remembered per pod and per job signature (`SOLO_PODS` last pods, median).
2. **Observed slowdown.** A job's GPU work per step does not change when it shares, so while it shares
   its busy share u is its solo duty d over its slowdown: the slowdown observed is d / u
   (`observed_slowdown`; smoothed per pod over the reports, `SMOOTHING`), for jobs heavy enough that
   NVML's whole-percent samples can show it (`MIN_SOLO`). No model enters it: it is what the job does.
   (Measured: a shared GPU serves a job's kernels no faster than alone, the interference report's
   `shared_service` 0.95 <= 1, so d / u never understates a slowdown.)
3. **Stop adding.** A GPU where a job past its warm-up runs slower than the bound it was admitted under
   (`sharing.slowdown_bound`) is *over its bound*: it takes no new joiner (`GpuView.over_bound`) until
   its jobs run within the bound again.
4. **Move the newest joiner.** If the GPU stays over its bound for `PolicyParams.sharing_move_after_s`,
   the pod that joined it last (the latest bound) is moved: the live extender evicts it (its controller
   makes it again, and it is placed with what was learned), the replay stops it and queues it again; its
   lost work is counted. At most one move per GPU per period; a lone pod is never moved.
5. **Learn the forecast's error.** For each shared pod with a known solo duty, the ratio of its observed
   slowdown's excess (slowdown - 1) to the excess the model forecast for the GPU's jobs
   (`interference.slowdowns`; at least `MIN_EXCESS`) is kept per job
   signature and GPU model (its latest per pod; the last `ERROR_PODS` pods), and per GPU model over every
   signature (the last `MODEL_PODS` pods). A later join multiplies the forecast excess of each job by its margin
   (`margin`: the largest of its signature's kept ratios and the `MODEL_QUANTILE` quantile of its GPU
   model's, at least 1, at most `MAX_MARGIN`): the signatures the model flatters carry their own margin,
   and a systematic error of the forecast on a GPU model is carried by signatures never seen sharing.

Pure: no I/O, no clock (`now_s` is an argument); not thread-safe by itself (the ledger holds it under
its lock, the replay its own). Bounded: every map is an LRU with a cap.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from extender.policy.interference import slowdowns

if TYPE_CHECKING:
    from extender.policy.types import PolicyParams

#: Per-report weight of a new slowdown sample in a pod's smoothed slowdown (NVML's whole-percent samples
#: of a light job are noisy: one report never decides).
SMOOTHING = 0.3
#: Samples a pod needs before its smoothed slowdown counts (the first reports after a join are mixed).
MIN_SAMPLES = 3
#: A busy share below this says nothing of a slowdown (the job is idle, not slowed).
MIN_BUSY = 0.02
#: Only a job whose solo duty is at least this is judged: NVML samples busy shares in whole percent with
#: a noise of about 2 points, so a 25 % slowdown of a lighter job (0.10 -> 0.08) is lost in them; a light
#: job's slowdown shows in the heavier jobs beside it, which are judged.
MIN_SOLO = 0.15
#: Observed slowdowns are clipped to this range (noise on a tiny busy share makes wild ratios).
SLOWDOWN_RANGE = (1.0, 10.0)
#: The last pods per signature whose solo duty (median) and forecast error (largest) are kept.
SOLO_PODS = 8
ERROR_PODS = 8
#: The last pods per GPU model whose forecast error is kept for every signature on it (`MODEL_QUANTILE`).
MODEL_PODS = 64
#: The model-wide margin: this quantile of the GPU model's kept error ratios (a systematic error of the
#: forecast, e.g. light jobs beside heavy ones, carried by signatures never seen sharing).
MODEL_QUANTILE = 0.5
#: The smallest forecast excess (slowdown - 1) an error ratio is taken over (a near-1 forecast divides noise).
MIN_EXCESS = 0.05
#: The widest margin a signature carries (a forecast's excess x this).
MAX_MARGIN = 4.0
#: The criticality index from which a pod is high or critical (`policy.priority` CRITICALITIES).
HIGH_CRITICALITY = 2
#: Entries kept per map (pods, signatures, GPUs): the oldest forgotten first.
CAPACITY = 20_000


@dataclass(frozen=True, slots=True)
class Sharer:
    """One pod on one GPU as the feedback reads it (from a report, or the replay's samples)."""

    uid: str
    signature: str
    busy: float | None  # its busy share over the last window (NVML per-process), None: no sample
    duty: float  # its duty as the extender knows it (the model's input)
    bound_s: float  # when it was bound (the newest joiner has the latest)
    bound: float  # the slowdown bound it was admitted under (`sharing.slowdown_bound`)
    warm: bool  # past `usage_warmup_s` since its bind: its samples count


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the feedback says of one GPU: over its bound (takes no joiner), and the pod to move."""

    over_bound: bool = False
    move: str | None = None
    worst: float = 1.0  # the worst smoothed observed slowdown there (1.0: none known)


OPEN = Verdict()


def observed_slowdown(solo_duty: float | None, busy: float | None) -> float | None:
    """Rule 2: a shared job's slowdown from its solo duty and its busy share while sharing; None when
    either is unknown or the busy share is too small to say anything."""
    if solo_duty is None or busy is None or not (math.isfinite(solo_duty) and math.isfinite(busy)):
        return None
    if busy < MIN_BUSY or solo_duty < MIN_SOLO:
        return None
    return min(max(solo_duty / busy, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])


def judged(forecast: float, margin: float) -> float:
    """A forecast slowdown with its learned margin on the interference (the excess over 1)."""
    return 1.0 + max(forecast - 1.0, 0.0) * max(margin, 1.0)


def gpu_bound(criticalities: Iterable[int], params: PolicyParams) -> float:
    """The bound the jobs of one GPU were admitted under (`sharing.slowdown_bound`): the tighter one when
    a high or critical job runs there. One home for the live extender and the replay."""
    strict = any(c >= HIGH_CRITICALITY for c in criticalities)
    return params.max_slowdown_high if strict else params.max_slowdown


#: The signature key of a GPU model's own errors (every signature's on it).
ANY = "*"


def _key(signature: str, model: str) -> str:
    return f"{model}|{signature}"


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile of sorted values (linear between ranks)."""
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class SharingFeedback:
    """The feedback's memory: solo duties, smoothed slowdowns, forecast errors, GPUs over their bound."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = max(int(capacity), 1)
        self._solo_pod: OrderedDict[str, float] = OrderedDict()  # pod -> its latest solo busy share
        self._solo: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()  # signature -> pod -> solo duty
        self._smoothed: OrderedDict[str, tuple[float, int]] = OrderedDict()  # pod -> (slowdown, samples)
        self._errors: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()  # model|sig -> pod -> ratio
        self._over: OrderedDict[str, float] = OrderedDict()  # GPU -> since when it is over its bound
        self._models: OrderedDict[str, float] = OrderedDict()  # the GPU models errors were kept for
        self.moves = 0  # pods this feedback asked to move (a counter for metrics and reports)

    # ---- the two maps of learned values ----
    def solo_duty(self, uid: str, signature: str) -> float | None:
        """A pod's duty alone: its own solo reading, else its signature's (median of its last pods)."""
        own = self._solo_pod.get(uid)
        if own is not None:
            return own
        pods = self._solo.get(signature) if signature else None
        return statistics.median(pods.values()) if pods else None

    def margin(self, signature: str, model: str | None = None) -> float:
        """Rule 5: the factor on the forecast excess (slowdown - 1) of a job of `signature` on a GPU of
        `model` (None: the largest over the models seen): its largest kept error ratio, between 1 and
        MAX_MARGIN (`judged`)."""
        # O(the GPU models seen), never O(the signatures): the planner asks this of every pod it plans
        keys = [_key(signature, ANY if model is None else model)] if signature else []
        models = [_key(ANY, m) for m in (self._models if model is None else (model,))]
        ratios = [r for k in keys if (pods := self._errors.get(k)) for r in pods.values()]
        for k in models:
            pods = self._errors.get(k)
            if pods and len(pods) >= MIN_SAMPLES:
                ratios.append(_quantile(sorted(pods.values()), MODEL_QUANTILE))
        return min(max([1.0, *ratios]), MAX_MARGIN)

    def is_over(self, gpu: str) -> bool:
        return gpu in self._over

    def over_bound(self) -> frozenset[str]:
        return frozenset(self._over)

    def forget_pod(self, uid: str) -> None:
        """A pod gone (deleted, finished, moved): its per-pod state goes (what it taught stays)."""
        self._solo_pod.pop(uid, None)
        self._smoothed.pop(uid, None)

    def forget_gpu(self, gpu: str) -> None:
        self._over.pop(gpu, None)

    # ---- one GPU's samples ----
    def observe(self, gpu: str, model: str, sharers: Sequence[Sharer], others: bool, now_s: float,
                move_after_s: float) -> Verdict:
        """Rules 1-5 for one GPU's report at `now_s`: `sharers` are the pods deepres placed there with
        their busy shares; `others` says work deepres did not place runs there too (no solo reading then).
        Returns whether the GPU is over its bound and the pod to move (if any)."""
        live = [s for s in sharers if s.busy is not None and math.isfinite(s.busy)]
        if len(sharers) <= 1:
            self._over.pop(gpu, None)
            if len(live) == 1 and not others and live[0].warm and live[0].busy is not None:
                self._record_solo(live[0])
            return OPEN
        forecast = slowdowns(tuple(min(max(s.duty, 0.0), 1.0) for s in sharers))
        worst, breached = 1.0, False
        for s, predicted in zip(sharers, forecast, strict=True):
            if not s.warm:
                continue
            seen = observed_slowdown(self.solo_duty(s.uid, s.signature), s.busy)
            if seen is None:
                continue
            smooth, n = self._smooth(s.uid, seen)
            if n < MIN_SAMPLES:
                continue
            worst = max(worst, smooth)
            breached |= smooth > s.bound + 1e-9
            ratio = (smooth - 1.0) / max(predicted - 1.0, MIN_EXCESS)  # the interference's error, not the base
            if s.signature:
                self._record_error(_key(s.signature, model), s.uid, ratio, ERROR_PODS)
                self._record_error(_key(s.signature, ANY), s.uid, ratio, ERROR_PODS)  # every model's, for None
            self._record_error(_key(ANY, model), s.uid, ratio, MODEL_PODS)
            self._put(self._models, model, now_s)
        if not breached:
            self._over.pop(gpu, None)
            return Verdict(False, None, worst)
        since = self._over.get(gpu)
        if since is None:
            self._put(self._over, gpu, now_s)
            return Verdict(True, None, worst)
        if now_s - since < move_after_s:
            return Verdict(True, None, worst)
        newest = max(sharers, key=lambda s: (s.bound_s, s.uid))
        self._put(self._over, gpu, now_s)  # the move gets a period of its own before the next
        self.moves += 1
        return Verdict(True, newest.uid, worst)

    # ---- bounded state ----
    def _put(self, table: OrderedDict[str, float], key: str, value: float) -> None:
        table.pop(key, None)
        table[key] = value
        while len(table) > self.capacity:
            table.popitem(last=False)

    def _smooth(self, uid: str, seen: float) -> tuple[float, int]:
        last = self._smoothed.pop(uid, None)
        value = (seen, 1) if last is None else (last[0] + SMOOTHING * (seen - last[0]), last[1] + 1)
        self._smoothed[uid] = value
        while len(self._smoothed) > self.capacity:
            self._smoothed.popitem(last=False)
        return value

    def _record_solo(self, s: Sharer) -> None:
        assert s.busy is not None
        if not (0.0 < s.busy <= 1.0):
            return
        self._put(self._solo_pod, s.uid, float(s.busy))
        if s.signature:
            self._record(self._solo, s.signature, s.uid, float(s.busy), SOLO_PODS)

    def _record_error(self, key: str, uid: str, ratio: float, per_key: int) -> None:
        if math.isfinite(ratio) and ratio > 0.0:
            self._record(self._errors, key, uid, ratio, per_key)

    def _record(self, table: OrderedDict[str, OrderedDict[str, float]], key: str, uid: str, value: float,
                per_key: int) -> None:
        pods = table.pop(key, None) or OrderedDict()
        table[key] = pods
        pods.pop(uid, None)
        pods[uid] = value
        while len(pods) > per_key:
            pods.popitem(last=False)
        while len(table) > self.capacity:
            table.popitem(last=False)
