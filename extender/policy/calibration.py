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
  more than NODE_TOLERANCE (and NODE_SPREADS standard errors) away from the median across nodes is
  left out (a node reporting 10x or
  a tenth of its pods' peaks), and nothing is learned from fewer than MIN_NODES nodes agreeing;
- the point: a robust line peak = intercept + slope x point over the kept pods (Theil-Sen: the
  median of pairwise slopes; an outlier pod moves it by one rank), so an additive difference (a
  larger context) and a multiplicative one are both learned; the slope is shrunk toward 1 by
  SLOPE_PRIOR_PODS pseudo-pods (few pods say little about it); the intercept is the median of the
  pods' residuals weighted by 1 / peak (the point is judged by its relative error |point / peak -
  1|, which it makes least; the plain median weighs a 30 GiB pod's MiB as a 2 GiB pod's: on the
  bound-side rows, 200 draws of 20 pods, the mean of the median errors 4.4% -> 4.2% on the exact path,
  11.5% -> 10.6% on the family path); slope and intercept are bounded;
- a bound that stays tight: the calibrated bound is multiplicative, bound = point x exp(q x scale),
  a split-conformal bound over the kept pods' log(peak / point), each point from the line fitted
  without that pod (jackknife: the ratios a new pod will show, not the fit's own narrower ones).
  The scale is per batch regime (`regime`: small batches, <= SMALL_BATCH, medium, <= MEDIUM_BATCH,
  large above; small batches scatter less around the line than large ones: measured on the H100
  campaign's bound-side rows, a 90th percentile of 1.06 vs 1.17 on the exact path), the regime's
  MAD of those log ratios shrunk toward the pooled MAD with SHRINK_PODS pseudo-pods (a regime with
  few pods takes the pooled scale); q is the
  ceil((n + 1)(1 - TARGET_UNDER))-th smallest of the pods' log ratio / scale (their largest while
  n is small): a new pod exchangeable with those lands above the bound with probability at most
  TARGET_UNDER. The factor is bounded to [1, MAX_BOUND_FACTOR]. The offline bound is kept instead
  where the pods above it are not too many for a bound that holds (a binomial test at
  TARGET_UNDER: at 20 pods, one above it is likely, two are not; HOLD_ALPHA) and either the pods
  are too few for the conformal rank to be below their largest ratio (a bound from the largest of
  20 ratios is loose when one outlier was seen, short when none was) or it is the tighter of the
  two over the pods (median bound / peak). An additive shift (the rule before) widened loose bounds;
- a kept offline bound follows the batch (the exact path: RECENTRED_PATHS): the offline bound is
  one margin for every batch, and the pods of large batches come closer to it than those of small
  ones (on the H100 campaign's bound-side rows, median log(peak / offline bound) -0.29 at batch
  <= 16, -0.17 above 64: with it kept, 5.2% of the large-batch pods above it and 0.9% of the
  small-batch ones). It is re-centred per regime (`_recentred`): times exp(a robust trend of
  log(peak / offline bound) over the regimes' order, read at the regime, minus the pooled median),
  within +-RECENTRE_MAX, so that each regime's pods sit as far under it as all of them do (wider for
  large batches, tighter for small ones). The trend (Theil-Sen over the pods of different regimes)
  shares every regime's pods: the regime's own median, the rule before, followed whatever its two or
  three pods showed (the bench's seed 3: three medium pods far under the bound tightened it by 5%,
  and 10.6% of new medium pods went above it; 5.3% with the trend).
  Whether it is kept is decided on the offline bound as it is (deciding on the re-centred one, a
  tightened regime's pods above it dropped it for the largest ratio of 20 on one seed of the
  bench's five: 1.38x the peak at the median instead of 1.26x);
- never from few pods: nothing below MIN_PODS pods; the most recent WINDOW pods per key.
- one workload owner cannot steer it either (the workloads may lie even when the agents do not): a
  pod counts only once it ran long enough to have reached its peak (`settled`, decided by the
  store); each owner (the namespace and the controller of the pod: `tenant`, `owner`) has at most
  OWNER_PODS pods in the fit; the window is filled round robin across tenants (newest first), so
  a flood of one tenant's pods never pushes the others' out; tenants are screened as nodes are
  (three or more: a tenant far from the median across tenants is left out; two that disagree: the
  line stays the one of the tenant seen first, until a third one decides), and a kept tenant has at
  most as many pods as the largest other kept tenant; owners with several pods are screened as
  nodes are, and at least MIN_OWNERS owners must be left.
- small clusters: the nodes that must agree are MIN_NODES, or all the nodes of the GPU model and
  node software when the cluster has fewer (`nodes_of`); several owners must agree either way.

The fit costs one sort of the n^2 / 2 pairwise slopes and O(n^2) array work for n pods (the
jackknife's leave-one-out medians are read from that sorted array for every pod at once, `_kth_kept`,
not recomputed per pod: that was O(n^3), ~0.25 s per full key; then a Python loop per pod: `learn`
~10 ms of CPU for a key of 200 pods; now ~4 ms: `python -m devtools.calibration_offline --fit-cost`).

Pure functions over a snapshot (no I/O, no clock): `learn(observations) -> {Key: Shift}`,
`corrected(point, upper, shifts, key) -> Corrected`. The live ledger's calibration store
(extender/calibration_store.py) and the replay (extender/simulate/calibration_replay.py) both call
these.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

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
#: A node is left out only when its median is also this many standard errors (the pods' MAD of
#: log(peak / point) over the square root of the node's pods) away: with few pods per node on a
#: widely scattered path, honest nodes' medians differ by more than NODE_TOLERANCE (on the
#: family path 3 of 8 honest nodes were left out at 20 pods, and with them the pods the bound
#: must cover, so 20% of new pods went above it).
NODE_SPREADS = 3.0
#: Share of pods the bound may leave above it: the conformal level. 0.03 as the per-GPU lines'
#: (predictor.gpucal.UNDER), below the 5% target so that one sample of new pods stays under 5% (at
#: 20 pods the rank is the largest either way; at 100 pods a 5% level left 5.3% of new pods above
#: in the split of the bench's bound-side rows, 3% left 2.4%).
TARGET_UNDER = 0.03
#: The offline bound is dropped when the pods above it are this unlikely for a bound that holds
#: (binomial, TARGET_UNDER): at 20 pods, two or more above it. The rule before dropped it for one
#: pod above it (a conformal bound at the largest rank): an outlier among 20 pods then replaced a
#: bound that held on the new pods (3.3% above, 1.26x the peak) by the largest of 20 ratios (1.56x).
#: Chosen on the bench's bound-side rows (`python -m devtools.calibration_offline --bound-side 200`:
#: 200 draws of 20 pods on the exact path): bound / peak mean 1.38 -> 1.30, draws with a bound at
#: most 1.3x 72% -> 95%, the worst draw's share of new pods above it 8.3% -> 2.8% (median 2.8% both).
HOLD_ALPHA = 0.2
#: Largest per-GPU batch of the small-batch regime (the bound's scale is per regime)...
SMALL_BATCH = 16
#: ...and of the medium one; above it, the large regime.
MEDIUM_BATCH = 64
#: While the offline bound is kept, it is re-centred per batch regime (`_recentred`) by at most this
#: log factor either way (a regime of one or two pods moves it by no more than 25%).
RECENTRE_MAX = math.log(1.25)
#: The paths whose kept offline bound is re-centred: the exact path only. On the family path (its
#: offline bound 1.6-2.0x the peak) it widened the bound and left no fewer pods above it (the bench's
#: bound-side draws of 20 pods: 1.72x -> 1.74x at the median, 2.0% -> 2.8% of new pods above on average).
RECENTRED_PATHS: tuple[str, ...] = ("exact",)
#: Pseudo-pods of the pooled scale in a regime's scale (its MAD shrunk toward the pooled MAD).
SHRINK_PODS = 5.0
#: Smallest scale (MAD of log ratios) taken: a regime whose pods all agree is not trusted to 0.5%.
MIN_SCALE = 0.01
#: Bounds of what is learned.
SLOPE_RANGE = (0.5, 2.0)
MAX_INTERCEPT_MIB = 4096.0
MAX_BOUND_FACTOR = 2.0
#: Pseudo-pods of slope 1 in the fitted slope (a Bayesian shrinkage toward it): a GPU model differs
#: from another mostly by its context and allocator (an intercept), the tensors being the same, so
#: a slope from few pods is mostly noise (measured on the measured GPU lines: H100 / A100 factor
#: 1.03). 20 chosen on splits of the bench's bound-side rows: the exact path's median error at 20
#: pods 4.3% -> 4.2% (its 80th percentile over splits 4.9% -> 4.5%); at 100 pods unchanged.
SLOPE_PRIOR_PODS = 20.0
#: Readings outside [point / MAX_RATIO, point x MAX_RATIO] are no observation.
MAX_RATIO = 20.0
#: Pods of one owner (namespace + controller) in the fit at most (its most recent): with MIN_PODS 12,
#: one owner is never the majority of the smallest fit, and its median is screened as a node's is.
OWNER_PODS = 5
#: Distinct owners left after the screens needed (as MIN_NODES for nodes).
MIN_OWNERS = 3

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
    upper_mib: float = 0.0  # the offline bound it was placed with (kept for the record)
    regime: str = ""  # the batch regime (`regime`): "" takes the pooled scale
    tenant: str = ""  # its namespace ("": one tenant for every pod without one)
    owner: str = ""  # its controller within the tenant ("": the pod is its own owner)
    settled: bool = True  # it ran long enough to have reached its peak (else: no observation yet)

    @property
    def key(self) -> Key:
        return (self.gpu_model, self.software, self.path)

    @property
    def owner_key(self) -> tuple[str, str]:
        return (self.tenant, self.owner or "pod:" + self.pod_uid)


def regime(batch_size: int) -> str:
    """The batch regime of a per-GPU batch size (0: unknown, the large regime's wider scale)."""
    if 0 < batch_size <= SMALL_BATCH:
        return "small"
    return "medium" if 0 < batch_size <= MEDIUM_BATCH else "large"


@dataclass(frozen=True)
class Shift:
    """What was learned for one key: calibrated point = intercept + slope x offline point, bound =
    calibrated point x exp(level x the regime's scale) (bounded to [1, MAX_BOUND_FACTOR] x point).
    `pods`/`nodes`: what it was learned from (after the node screen); `left_out`: nodes the screen
    left out; `under_rate`: share of those pods above the bound this gives them (their own, fitted
    with them: lower than a new pod's); `shift`: calibrated / offline point at the pods' median point;
    `bound_factor`: bound / point at the pooled scale."""

    intercept_mib: float
    slope: float
    bound_factor: float
    pods: int
    nodes: int
    under_rate: float
    shift: float
    left_out: tuple[str, ...] = ()
    level: float = 0.0  # the conformal quantile of log ratio / scale
    scale: float = MIN_SCALE  # the pooled scale (MAD of the jackknife log ratios)
    scales: tuple[tuple[str, float], ...] = ()  # per regime, shrunk toward `scale`
    offline_holds: bool = False  # the offline bound is kept: it held (conformally) and is the tighter
    recentred: tuple[tuple[str, float], ...] = ()  # per regime, log of the kept offline bound's factor

    def point(self, point_mib: float) -> float:
        return max(0.0, self.intercept_mib + self.slope * point_mib)

    def factor(self, regime: str = "") -> float:
        scale = dict(self.scales).get(regime, self.scale)
        return min(max(math.exp(self.level * scale), 1.0), MAX_BOUND_FACTOR)

    def bound(self, point_mib: float, upper_mib: float, regime: str = "") -> float:
        """The bound of an offline (point, bound) on this key, in a batch regime: never below the
        calibrated point."""
        point = self.point(point_mib)
        if self.offline_holds:
            return max(point, upper_mib * math.exp(dict(self.recentred).get(regime, 0.0)))
        return point * self.factor(regime)


@dataclass(frozen=True)
class Corrected:
    memory_mib: float
    memory_mib_upper: float
    calibrated: bool
    pods: int


def _shrunk(slope: float, pods: int) -> float:
    """The slope shrunk toward 1 by SLOPE_PRIOR_PODS pseudo-pods, then bounded."""
    slope = 1.0 + (slope - 1.0) * pods / (pods + SLOPE_PRIOR_PODS)
    return min(max(slope, SLOPE_RANGE[0]), SLOPE_RANGE[1])


def _pair_slopes(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairwise slopes (i < j) whose points differ, with the pods of each pair."""
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    usable = np.abs(dx) > 1e-6 * np.maximum(np.abs(x[i]), 1.0)
    return i[usable], j[usable], (y[j] - y[i])[usable] / dx[usable]


def _theil_sen(xs: list[float], ys: list[float]) -> tuple[float, float]:
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    slopes = _pair_slopes(x, y)[2]
    slope = float(np.median(slopes)) if slopes.size else float(np.median(y / x))
    slope = _shrunk(slope, x.size)
    return _intercept(x, y, slope), slope


def _intercept(x: np.ndarray, y: np.ndarray, slope: float) -> float:
    """The intercept under `slope` that makes the pods' summed relative error |point / peak - 1| the
    least: the median of y - slope x weighted by 1 / y, bounded."""
    residuals, weights = y - slope * x, 1.0 / y
    order = np.argsort(residuals)
    cumulative = np.cumsum(weights[order])
    intercept = float(residuals[order][np.searchsorted(cumulative, cumulative[-1] / 2.0)])
    return min(max(intercept, -MAX_INTERCEPT_MIB), MAX_INTERCEPT_MIB)


def _kth_kept(removed: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per row, the position in a sorted array of its q-th (0-based) element once that row's sorted
    positions `removed` (padded with a huge value) are taken out. With r_0 < r_1 < ... the removed
    positions, r_i - i never decreases, and the answer is q + m for m the count of i with r_i - i <= q
    (the m removed positions before it): one comparison per removed position, no loop."""
    shifted = removed - np.arange(removed.shape[1])[None, :]
    found: np.ndarray = q + (shifted <= q[:, None]).sum(axis=1)
    return found


def _held_out_fits(xs: list[float], ys: list[float]) -> list[float]:
    """Each pod's point as the line fitted without it predicts it (jackknife): the ratios the bound is
    taken over are then those of pods the line did not see, as a new pod's will be (the fit's own
    residuals are narrower: measured, a bound over them left 8.5% of new pods above it, not 5%).

    The median of the slopes without pod k's pairs is read from the sorted slopes of all pairs (its
    pairs' positions taken out: `_kth_kept`, every pod at once), O(n^2) after the one sort, the same
    value as sorting them again (tests/unit/test_calibration_safety.py compares it with the direct
    computation)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    n = x.size
    i, j, slopes = _pair_slopes(x, y)
    order = np.argsort(slopes)  # (ties are equal values: any order gives the same medians)
    ordered = slopes[order]
    # both pods of each pair, in the order of the sorted slopes; then grouped by pod (a stable sort:
    # each pod's positions stay ascending)
    owners = np.empty(2 * order.size, dtype=np.int64)
    owners[0::2], owners[1::2] = i[order], j[order]
    positions = np.repeat(np.arange(order.size, dtype=np.int64), 2)
    by = np.argsort(owners.astype(np.int16) if n < 2 ** 15 else owners, kind="stable")  # (radix for int16)
    owners, positions = owners[by], positions[by]
    starts = np.searchsorted(owners, np.arange(n + 1))
    counts = np.diff(starts)
    # each pod's removed positions as a row, padded past any position
    removed = np.full((n, max(int(counts.max(initial=0)), 1)), ordered.size + n + 1, dtype=np.int64)
    removed[owners, np.arange(owners.size) - starts[owners]] = positions
    left = ordered.size - counts
    some = left > 0
    slope_of = np.empty(n)
    if some.any():
        low = _kth_kept(removed[some], (left[some] - 1) // 2)
        high = _kth_kept(removed[some], left[some] // 2)
        slope_of[some] = (ordered[low] + ordered[high]) / 2.0
    for k in np.flatnonzero(~some):  # every pair of pod k without a slope: the others' median ratio
        rest = np.arange(n) != k
        slope_of[k] = float(np.median(y[rest] / x[rest]))
    slope_of = np.array([_shrunk(float(v), n - 1) for v in slope_of])
    # every pod's intercept at once (`_intercept` without pod k, row k): residuals sorted per row, the
    # 1 / peak weights summed in that order, pod k's own weight 0
    residuals = y[None, :] - slope_of[:, None] * x[None, :]
    weights = np.broadcast_to(1.0 / y, (n, n)).copy()
    np.fill_diagonal(weights, 0.0)
    order2 = np.argsort(residuals, axis=1)  # (tied residuals: the same value at the half)
    cumulative = np.cumsum(np.take_along_axis(weights, order2, axis=1), axis=1)
    half = cumulative[:, -1:] / 2.0
    at = (cumulative >= half).argmax(axis=1)
    intercepts = np.clip(np.take_along_axis(np.take_along_axis(residuals, order2, axis=1), at[:, None], axis=1)[:, 0],
                         -MAX_INTERCEPT_MIB, MAX_INTERCEPT_MIB)
    return [max(float(b + a * v), 1.0) for a, b, v in zip(slope_of, intercepts, x, strict=True)]


def conformal_quantile(scores: list[float], under: float = TARGET_UNDER) -> float:
    """The ceil((n + 1)(1 - under))-th smallest of `scores` (their largest when n is small): a new
    score exchangeable with these lands above it with probability at most `under`."""
    ordered = sorted(scores)
    rank = min(len(ordered), math.ceil((len(ordered) + 1) * (1.0 - under)))
    return ordered[rank - 1]


def _mad(values: list[float]) -> float:
    centre = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - centre) for v in values)


def _scales(logs: list[float], regimes: list[str]) -> tuple[float, dict[str, float]]:
    """The pooled scale and each regime's, shrunk toward it by SHRINK_PODS pseudo-pods."""
    pooled = max(_mad(logs), MIN_SCALE)
    by: dict[str, list[float]] = {}
    for value, r in zip(logs, regimes, strict=True):
        by.setdefault(r, []).append(value)
    return pooled, {r: (len(v) * max(_mad(v), MIN_SCALE) + SHRINK_PODS * pooled) / (len(v) + SHRINK_PODS)
                    for r, v in by.items()}


def _screen(pods: list[Observation], min_nodes: int, group: Callable[[Observation], Any] = lambda o: o.node,
            screened: Callable[[int], bool] = lambda count: True,
            ) -> tuple[list[Observation], tuple[str, ...]] | None:
    """The pods of the groups (default: nodes) that agree with the median across groups, and the
    groups left out; None when fewer than `min_nodes` groups agree. `screened(pods of a group)`: whether
    a group of that many pods may be left out at all (owners: only those with several pods)."""
    by_node: dict[Any, list[float]] = {}
    for o in pods:
        by_node.setdefault(group(o), []).append(math.log(o.peak_mib / o.point_mib))
    if len(by_node) < min_nodes:
        return None
    medians = {node: statistics.median(logs) for node, logs in by_node.items()}
    centre = statistics.median(medians.values())
    spread = _mad([v for logs in by_node.values() for v in logs])
    kept = {node for node, m in medians.items()
            if not screened(len(by_node[node]))
            or abs(m - centre) <= max(NODE_TOLERANCE, NODE_SPREADS * spread / math.sqrt(len(by_node[node])))}
    if len(kept) < min_nodes:
        return None
    return [o for o in pods if group(o) in kept], tuple(sorted(str(g) for g in set(medians) - kept))


def _window(pods: list[Observation], window: int) -> list[Observation]:
    """The pods the fit runs over: each owner's OWNER_PODS most recent, then WINDOW of those taken
    round robin across tenants, newest first (a tenant with many pods fills what the others leave,
    never pushes them out)."""
    per_owner: dict[tuple[str, str], int] = {}
    by_tenant: dict[str, list[Observation]] = {}
    for o in sorted(pods, key=lambda o: o.order, reverse=True):
        taken = per_owner.get(o.owner_key, 0)
        if taken < OWNER_PODS:
            per_owner[o.owner_key] = taken + 1
            by_tenant.setdefault(o.tenant, []).append(o)
    if len(by_tenant) == 1:
        return next(iter(by_tenant.values()))[:window]
    out: list[Observation] = []
    queues = sorted(by_tenant.values(), key=lambda q: -q[0].order)
    for rank in range(max(len(q) for q in queues)):
        for queue in queues:
            if rank < len(queue):
                out.append(queue[rank])
                if len(out) == window:
                    return out
    return out


def _tenants(pods: list[Observation]) -> list[Observation]:
    """The pods of the tenants that agree (see the module docstring), each kept tenant with at most as
    many pods as the largest other kept tenant (its most recent)."""
    by: dict[str, list[Observation]] = {}
    for o in pods:
        by.setdefault(o.tenant, []).append(o)
    if len(by) == 1:
        return pods
    if len(by) == 2:
        pa, pb = by.values()
        la = [math.log(o.peak_mib / o.point_mib) for o in pa]
        lb = [math.log(o.peak_mib / o.point_mib) for o in pb]
        spread = _mad(la + lb)
        apart = abs(statistics.median(la) - statistics.median(lb))
        if apart > max(NODE_TOLERANCE, NODE_SPREADS * spread * math.sqrt(1.0 / len(la) + 1.0 / len(lb))):
            first = min(by, key=lambda t: min(o.order for o in by[t]))  # the line stays the first tenant's
            return by[first]
    else:
        screened = _screen(pods, 2, lambda o: o.tenant)
        if screened is None:
            return []
        by = {}
        for o in screened[0]:
            by.setdefault(o.tenant, []).append(o)
    if len(by) == 1:
        return next(iter(by.values()))
    sizes = {t: len(q) for t, q in by.items()}
    out: list[Observation] = []
    for tenant, queue in by.items():
        cap = max(n for t, n in sizes.items() if t != tenant)
        out += sorted(queue, key=lambda o: o.order)[-cap:]
    return out


def learn(observations: Iterable[Observation], min_pods: int = MIN_PODS, min_nodes: int = MIN_NODES,
          window: int = WINDOW, nodes_of: Mapping[tuple[str, str], int] | None = None,
          keys: Iterable[Key] | None = None) -> dict[Key, Shift]:
    """The shift of every key (of `keys`, default all) with at least `min_pods` settled pods of at
    least MIN_OWNERS owners on at least `min_nodes` agreeing nodes (fewer where the cluster has fewer
    nodes of that GPU model and software: `nodes_of`, (GPU model, software) -> nodes)."""
    wanted = set(keys) if keys is not None else None
    per_pod: dict[tuple[Key, str], Observation] = {}
    for o in observations:
        if not o.settled or (wanted is not None and o.key not in wanted):
            continue  # not yet at its peak: no observation yet
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
        recent = _window(pods, window)
        if len(recent) < min_pods:
            continue
        need = min_nodes if nodes_of is None else max(1, min(min_nodes, nodes_of.get(key[:2], min_nodes)))
        screened = _screen(recent, need)
        if screened is None or len(screened[0]) < min_pods:
            continue
        kept, left_out = screened
        owners = _screen(_tenants(kept), MIN_OWNERS, lambda o: o.owner_key, lambda count: count > 1)
        if owners is None or len(owners[0]) < min_pods:
            continue
        kept = owners[0]
        xs, ys = [o.point_mib for o in kept], [o.peak_mib for o in kept]
        intercept, slope = _theil_sen(xs, ys)
        logs = [math.log(y / f) for y, f in zip(ys, _held_out_fits(xs, ys), strict=True)]
        regimes = [o.regime for o in kept]
        pooled, scales = _scales(logs, regimes)
        level = conformal_quantile([v / scales[r] for v, r in zip(logs, regimes, strict=True)])
        centre = statistics.median(xs)
        shift = Shift(round(intercept, 1), round(slope, 5), round(min(max(math.exp(level * pooled), 1.0),
                                                                      MAX_BOUND_FACTOR), 4),
                      len(kept), len({o.node for o in kept}), 0.0,
                      round(max(intercept + slope * centre, 0.0) / centre, 4), left_out, round(level, 4),
                      round(pooled, 5), tuple(sorted((r, round(v, 5)) for r, v in scales.items())))
        shift = replace(shift, recentred=_recentred(kept) if key[2] in RECENTRED_PATHS else ())
        shift = replace(shift, offline_holds=_offline_kept(kept, shift))
        under = sum(o.peak_mib > shift.bound(o.point_mib, o.upper_mib, o.regime) for o in kept) / len(kept)
        out[key] = replace(shift, under_rate=round(under, 4))
    return out


#: The batch regimes in order of batch size: the re-centring's trend runs over this index.
REGIME_ORDER = {"small": 0.0, "medium": 1.0, "large": 2.0}


def _recentred(kept: list[Observation]) -> tuple[tuple[str, float], ...]:
    """Per batch regime, the log factor that puts the kept offline bound as far above the regime's pods
    as above all of them, read off a robust trend of log(peak / offline bound) over the regimes'
    order (REGIME_ORDER; a Theil-Sen line over the pods of different regimes), minus the pooled
    median, within +-RECENTRE_MAX (positive: the regime's pods come closer to the bound than the
    others, which widens it there; negative: they stay further below, which tightens it).

    The trend shares the pods of every regime: a regime of three pods among 20 moved its own median
    (the rule before) by whatever those three showed (seed 3 of the bench: three medium pods far under
    the bound tightened it by 5%, and 10.6% of medium pods were above it); on the line it moves one
    rank of many pairwise slopes. Where the pods are of one regime only, that regime's median."""
    logs = [(REGIME_ORDER.get(o.regime, REGIME_ORDER["large"]), o.regime, math.log(o.peak_mib / o.upper_mib))
            for o in kept if o.upper_mib > 0]
    if not logs:
        return ()
    pooled = statistics.median(v for _, _, v in logs)
    x = np.asarray([p for p, _, _ in logs])
    y = np.asarray([v for _, _, v in logs])
    slopes = _pair_slopes(x, y)[2]
    slope = float(np.median(slopes)) if slopes.size else 0.0
    intercept = float(np.median(y - slope * x))
    regimes = sorted({(p, r) for p, r, _ in logs}, key=lambda pr: pr[1])
    return tuple((r, round(min(max(intercept + slope * p - pooled, -RECENTRE_MAX), RECENTRE_MAX), 5))
                 for p, r in regimes)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how likely k or more of n pods above a bound whose true
    share above is p."""
    return sum(math.comb(n, i) * p ** i * (1.0 - p) ** (n - i) for i in range(max(k, 0), n + 1))


def _offline_kept(kept: list[Observation], shift: Shift) -> bool:
    """Whether the offline bound is kept: the pods above it are not too many for a bound that holds
    (k of n pods above it are likely, binomial_tail(k, n, TARGET_UNDER) >= HOLD_ALPHA, for a bound
    leaving TARGET_UNDER of pods above), and either the calibrated bound is still the largest
    of a few pods' ratios (fewer pods than the conformal rank needs: a noisy bound, loose when one
    outlier was seen and short when none was) or the offline bound is the tighter of the two over the
    pods (median bound / peak)."""
    if any(o.upper_mib <= 0 for o in kept):
        return False
    if binomial_tail(sum(o.peak_mib > o.upper_mib for o in kept), len(kept), TARGET_UNDER) < HOLD_ALPHA:
        return False
    held = replace(shift, offline_holds=True, recentred=())  # (decided on the offline bound as it is)
    if math.ceil((len(kept) + 1) * (1.0 - TARGET_UNDER)) > len(kept):
        return True
    offline = statistics.median(held.bound(o.point_mib, o.upper_mib, o.regime) / o.peak_mib for o in kept)
    calibrated = statistics.median(shift.bound(o.point_mib, 0.0, o.regime) / o.peak_mib for o in kept)
    return offline <= calibrated


def corrected(memory_mib: float, upper_mib: float, shifts: Mapping[Key, Shift], key: Key,
              batch_regime: str = "") -> Corrected:
    """(point, bound) of an offline Demand on this key's GPU model, calibrated where a shift is
    learned (else unchanged, `calibrated` False); never below zero, the bound never below the point."""
    shift = shifts.get(key)
    if shift is None:
        return Corrected(memory_mib, upper_mib, False, 0)
    return Corrected(round(shift.point(memory_mib), 1), round(shift.bound(memory_mib, upper_mib, batch_regime), 1),
                     True, shift.pods)
