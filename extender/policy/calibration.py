"""Online calibration per (GPU model, node software, path): the predictor's point and bound as the
pods placed on that GPU model showed them.

The memory a process shows depends on the GPU model, the driver and the framework (CUDA context,
cuDNN/cuBLAS workspaces, allocator slack), and the predictor's error depends on its path (`exact`:
a named architecture; `family`: the family annotations). A GPU model the offline lines do not know
has its bounds off in both directions (on an A100, 36% of exact-path peaks above the bound). This
rule learns, from the peaks the agent reported for pods deepres placed, how the offline point maps
to what that GPU shows, and how wide the bound must be there:

- one value per pod: its highest observed peak against the offline point it was placed with (the
  point on its GPU model before any calibration, so the rule never learns from its own output);
- one node cannot steer it: each node's median log(peak / point) first; a node whose median is
  more than NODE_TOLERANCE away from the median across nodes is left out (a node reporting 10x or
  a tenth of its pods' peaks), and nothing is learned from fewer than MIN_NODES nodes agreeing;
- the point: a robust line peak = intercept + slope x point over the kept pods (Theil-Sen: the
  median of pairwise slopes; an outlier pod moves it by one rank), so an additive difference (a
  larger context) and a multiplicative one are both learned; slope and intercept are bounded;
- a bound that stays tight: the calibrated bound is multiplicative, the split-conformal
  (1 - TARGET_UNDER) quantile of the kept pods' peak / calibrated point (the ceil((n + 1)(1 -
  alpha))-th smallest), bounded to [1, MAX_BOUND_FACTOR]: it widens the point only as far as the
  observations went above it (an additive shift loosened loose bounds further). It replaces the
  offline bound only where the observations say so: when more of the pods than TARGET_UNDER (and
  at least 2) went above their offline bound; while the offline bound holds it is kept, and from
  TIGHTEN_MIN_PODS pods on the tighter of the two, itself widened by the conformal quantile of
  peak / (that tighter bound) (a loose offline bound is tightened only once enough pods show by
  how much, and the under-rate of the combination stays at TARGET_UNDER);
- never from few pods: nothing below MIN_PODS pods; the most recent WINDOW pods per key.

Pure functions over a snapshot (no I/O, no clock): `learn(observations) -> {Key: Shift}`,
`corrected(point, upper, shifts, key) -> Corrected`. The live ledger's calibration store
(extender/calibration_store.py) and the replay (extender/simulate/calibration_replay.py) both call
these.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

#: Distinct pods needed before a (GPU model, software, path) is calibrated.
MIN_PODS = 12
#: Distinct nodes agreeing needed (the median across nodes then ignores any one of them).
MIN_NODES = 3
#: Pods the fit runs over (the most recent ones: a driver upgrade is followed within WINDOW pods).
WINDOW = 200
#: A node whose median log(peak / point) is further than this from the median across nodes is
#: left out (log 1.35: a 35% disagreement, beyond what job mixes differ by between nodes).
NODE_TOLERANCE = math.log(1.35)
#: Share of pods the bound may leave above it.
TARGET_UNDER = 0.05
#: Bounds of what is learned.
SLOPE_RANGE = (0.5, 2.0)
MAX_INTERCEPT_MIB = 4096.0
MAX_BOUND_FACTOR = 2.0
#: Pods from which a holding offline bound is tightened to the calibrated one where that is tighter.
TIGHTEN_MIN_PODS = 100
#: The tightened combination's conformal level: below TARGET_UNDER, as the combination is chosen on
#: the same pods it is widened on (measured on the H100 campaign's rows: at 0.05 it
#: left 5.6% of held-out pods above it).
TIGHTEN_UNDER = 0.04
#: Readings outside [point / MAX_RATIO, point x MAX_RATIO] are no observation.
MAX_RATIO = 20.0

Key = tuple[str, str, str]  # (GPU model as NVML names it, node software: "driver/CUDA", path: exact|family)
PATHS = ("exact", "family")


@dataclass(frozen=True)
class Observation:
    """One pod as the agent reported it: where it ran (node, GPU model, node software), its path,
    the offline point it was placed with (MiB, per GPU) and the highest peak seen (MiB, per GPU);
    `order` is its placement order (larger is more recent)."""

    pod_uid: str
    node: str
    gpu_model: str
    software: str
    path: str
    point_mib: float
    peak_mib: float
    order: float = 0.0
    upper_mib: float = 0.0  # the offline bound it was placed with (0: unknown, taken as failing)

    @property
    def key(self) -> Key:
        return (self.gpu_model, self.software, self.path)


@dataclass(frozen=True)
class Shift:
    """What was learned for one key: calibrated point = intercept + slope x offline point, bound =
    calibrated point x bound_factor, or the offline bound while it holds (`offline_holds`; the tighter
    of the two with `tighten`). `pods`/`nodes`: what it was learned from (after the node screen);
    `left_out`: nodes the screen left out; `under_rate`: share of those pods above the bound this
    gives them; `shift`: calibrated / offline point at the pods' median point."""

    intercept_mib: float
    slope: float
    bound_factor: float
    pods: int
    nodes: int
    under_rate: float
    shift: float
    left_out: tuple[str, ...] = ()
    offline_holds: bool = False
    tighten: bool = False
    tighten_factor: float = 1.0  # the combination's widening (conformal over the pods)

    def point(self, point_mib: float) -> float:
        return max(0.0, self.intercept_mib + self.slope * point_mib)

    def bound(self, point_mib: float, upper_mib: float) -> float:
        """The bound of an offline (point, bound) on this key: never below the calibrated point."""
        point = self.point(point_mib)
        calibrated = point * self.bound_factor
        if not self.offline_holds:
            return calibrated
        if not self.tighten:
            return max(point, upper_mib)
        return max(point, min(upper_mib, min(upper_mib, calibrated) * self.tighten_factor))  # never loosened


@dataclass(frozen=True)
class Corrected:
    memory_mib: float
    memory_mib_upper: float
    calibrated: bool
    pods: int


def _theil_sen(xs: list[float], ys: list[float]) -> tuple[float, float]:
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    usable = np.abs(dx) > 1e-6 * np.maximum(np.abs(x[i]), 1.0)
    slope = float(np.median((y[j] - y[i])[usable] / dx[usable])) if usable.any() else float(np.median(y / x))
    slope = min(max(slope, SLOPE_RANGE[0]), SLOPE_RANGE[1])
    intercept = float(np.median(y - slope * x))
    return min(max(intercept, -MAX_INTERCEPT_MIB), MAX_INTERCEPT_MIB), slope


def _held_out_fits(xs: list[float], ys: list[float]) -> list[float]:
    """Each pod's point as the line fitted without it predicts it (jackknife): the ratios the bound is
    taken over are then those of pods the line did not see, as a new pod's will be (the fit's own
    residuals are narrower: measured, a bound over them left 8.5% of new pods above it, not 5%)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    usable = np.abs(dx) > 1e-6 * np.maximum(np.abs(x[i]), 1.0)
    slopes = np.where(usable, (y[j] - y[i]) / np.where(usable, dx, 1.0), np.nan)
    out = []
    for k in range(x.size):
        keep = (i != k) & (j != k) & usable
        slope = float(np.median(slopes[keep])) if keep.any() else float(np.median(y / x))
        slope = min(max(slope, SLOPE_RANGE[0]), SLOPE_RANGE[1])
        rest = np.arange(x.size) != k
        intercept = min(max(float(np.median(y[rest] - slope * x[rest])), -MAX_INTERCEPT_MIB), MAX_INTERCEPT_MIB)
        out.append(max(intercept + slope * float(x[k]), 1.0))
    return out


def conformal_factor(ratios: list[float], under: float = TARGET_UNDER) -> float:
    """The ceil((n + 1)(1 - under))-th smallest of `ratios` (their largest when n is small), in
    [1, MAX_BOUND_FACTOR]: a new pod like these lands above it with probability at most `under`."""
    ordered = sorted(ratios)
    rank = min(len(ordered), math.ceil((len(ordered) + 1) * (1.0 - under)))
    return min(max(ordered[rank - 1], 1.0), MAX_BOUND_FACTOR)


def _screen(pods: list[Observation], min_nodes: int) -> tuple[list[Observation], tuple[str, ...]] | None:
    """The pods of the nodes that agree with the median across nodes, and the nodes left out; None
    when fewer than `min_nodes` nodes agree."""
    by_node: dict[str, list[float]] = {}
    for o in pods:
        by_node.setdefault(o.node, []).append(math.log(o.peak_mib / o.point_mib))
    if len(by_node) < min_nodes:
        return None
    medians = {node: statistics.median(logs) for node, logs in by_node.items()}
    centre = statistics.median(medians.values())
    kept = {node for node, m in medians.items() if abs(m - centre) <= NODE_TOLERANCE}
    if len(kept) < min_nodes:
        return None
    return [o for o in pods if o.node in kept], tuple(sorted(set(medians) - kept))


def learn(observations: Iterable[Observation], min_pods: int = MIN_PODS, min_nodes: int = MIN_NODES,
          window: int = WINDOW) -> dict[Key, Shift]:
    """The shift of every key with at least `min_pods` pods on at least `min_nodes` agreeing nodes."""
    per_pod: dict[tuple[Key, str], Observation] = {}
    for o in observations:
        if not (o.point_mib > 0 and o.peak_mib > 0 and o.path in PATHS):
            continue  # no prediction to compare with, or no reading
        if not 1.0 / MAX_RATIO <= o.peak_mib / o.point_mib <= MAX_RATIO:
            continue  # absurd: no observation
        k = (o.key, o.pod_uid)
        seen = per_pod.get(k)
        if seen is None or o.peak_mib > seen.peak_mib:
            per_pod[k] = o
    by_key: dict[Key, list[Observation]] = {}
    for (key, _uid), o in per_pod.items():
        by_key.setdefault(key, []).append(o)
    out: dict[Key, Shift] = {}
    for key, pods in by_key.items():
        recent = sorted(pods, key=lambda o: o.order)[-window:]
        if len(recent) < min_pods:
            continue
        screened = _screen(recent, min_nodes)
        if screened is None or len(screened[0]) < min_pods:
            continue
        kept, left_out = screened
        xs, ys = [o.point_mib for o in kept], [o.peak_mib for o in kept]
        intercept, slope = _theil_sen(xs, ys)
        held_out = _held_out_fits(xs, ys)
        factor = conformal_factor([y / f for y, f in zip(ys, held_out, strict=True)])
        above = sum(o.peak_mib > o.upper_mib for o in kept)  # the offline bound's misses (0 upper: a miss)
        holds = above <= max(1, math.floor(len(kept) * TARGET_UNDER))
        centre = statistics.median(xs)
        shift = Shift(round(intercept, 1), round(slope, 5), round(factor, 4), len(kept), len({o.node for o in kept}),
                      0.0, round(max(intercept + slope * centre, 0.0) / centre, 4), left_out, holds,
                      holds and len(kept) >= TIGHTEN_MIN_PODS)
        if shift.tighten:
            tighter = [min(o.upper_mib, f * factor) for o, f in zip(kept, held_out, strict=True)]
            shift = replace(shift, tighten_factor=round(conformal_factor([o.peak_mib / t for o, t in zip(
                kept, tighter, strict=True)], TIGHTEN_UNDER), 4))
        under = sum(o.peak_mib > shift.bound(o.point_mib, o.upper_mib) for o in kept) / len(kept)
        out[key] = replace(shift, under_rate=round(under, 4))
    return out


def corrected(memory_mib: float, upper_mib: float, shifts: Mapping[Key, Shift], key: Key) -> Corrected:
    """(point, bound) of an offline Demand on this key's GPU model, calibrated where a shift is
    learned (else unchanged, `calibrated` False); never below zero, the bound never below the point."""
    shift = shifts.get(key)
    if shift is None:
        return Corrected(memory_mib, upper_mib, False, 0)
    return Corrected(round(shift.point(memory_mib), 1), round(shift.bound(memory_mib, upper_mib), 1), True,
                     shift.pods)
