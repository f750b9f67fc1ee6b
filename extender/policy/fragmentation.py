"""DeepRes's fragmentation-aware score for packing (low-priority) pods; pure: no I/O, no clock.

Why: best fit plus a "keep GPUs whole" share (`scoring.score_nodes`) allocates less than FGD on
FGD's packing experiment (reports/simulation.md); this score reaches FGD's level. FGD's insight is
to place where the expected unusable GPU capacity grows least, judged against the mix of requests
that keep arriving. Restated in DeepRes's terms (memory per GPU instead of milli; CPU from the extender's pod informer):

    demand mix   m = (memory_mib d_m per GPU, GPUs k_m, CPU c_m, probability p_m), learnt from
                     recent admissions (the simulator uses the trace's frequent pod shapes)
    frag(node)   = sum_m p_m x stranded_m  in GPUs (free memory / that GPU's capacity), where
                   stranded_m = free on the GPUs with free < d_m   if >= k_m GPUs have free >= d_m
                                                                   and the node has CPU >= c_m
                              = all the node's free memory          otherwise (m cannot start there)
    delta(node)  = frag(after placing the pod on its best GPU(s)) - frag(before)
    merit(node)  = int(100 x sigmoid(-delta))           (0..100, 50 when nothing changes; FGD's scale)
    score        = 10 for the first top-merit node in a stable node order, 9 for the other top-merit
                   nodes, <= 8 for the rest (`scores_from_merits`), so kube-scheduler's random tie
                   break cannot scatter pods over equally good nodes.

The truncated merit makes near-equal placements tie, and ties go to a fixed node order: that
consolidation is as much of FGD's gain as the fragmentation measure (measured: without it, exact
minimum-delta placement allocates ~2 points less). A pod that is not a GPU job is scored by the CPU
it takes alone when `cpu_left_milli` is known, else neutrally.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extender.policy.filtering import gpus_fit, node_failure
from extender.policy.types import GpuView, NodeView, PodRequest, PolicyParams

MAX_SCORE = 10
MAX_MERIT = 100

#: Scale of the fragmentation growth (in GPUs) inside the sigmoid; 1.0 is FGD's (milli / 1000).
DEFAULT_SHARPNESS = 1.0


@dataclass(frozen=True, slots=True)
class DemandShape:
    """One frequent request: `memory_mib` on each of `gpus` GPUs and `cpu_milli`, seen with `probability`.
    `gpus == 0` is a CPU-only request: it can never use GPU memory, so all free memory counts for it."""

    memory_mib: float
    gpus: int
    probability: float
    cpu_milli: float = 0.0


class DemandMix:
    """The demand mix with its arrays prepared once, so a node's states are evaluated in one pass."""

    def __init__(self, shapes: Sequence[DemandShape]) -> None:
        self.shapes = tuple(shapes)
        self._memory = np.array([s.memory_mib for s in self.shapes], dtype=float)
        self._gpus = np.array([s.gpus for s in self.shapes], dtype=np.int64)
        self._cpu = np.array([s.cpu_milli for s in self.shapes], dtype=float)
        self._p = np.array([s.probability for s in self.shapes], dtype=float)

    def __len__(self) -> int:
        return len(self.shapes)

    def arrays(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """(memory per GPU, GPUs, probability) per shape, for the columnar twin of the score."""
        return self._memory, self._gpus, self._p

    def fragmentation_many(self, free_mib: npt.NDArray[np.float64], capacity_mib: npt.NDArray[np.float64],
                           cpu_left_milli: Sequence[float | None]) -> npt.NDArray[np.float64]:
        """Fragmentation (GPUs) of S states of one node at once: free (S, G), capacities (G,), CPU left (S)."""
        states = np.atleast_2d(np.asarray(free_mib, dtype=float))
        if not self.shapes:
            return np.zeros(len(states))
        caps = np.asarray(capacity_mib, dtype=float)
        safe = np.where(caps > 0, caps, 1.0)
        fractions = np.where(caps > 0, states / safe, 0.0)  # (S, G)
        idle = fractions.sum(axis=1)  # (S,)
        fits = states[:, None, :] >= self._memory[None, :, None]  # (S, M, G)
        stranded = np.where(fits, 0.0, fractions[:, None, :]).sum(axis=2)  # (S, M)
        can_start = (self._gpus[None, :] > 0) & (fits.sum(axis=2) >= self._gpus[None, :])
        cpu = np.array([np.inf if c is None else c for c in cpu_left_milli], dtype=float)
        can_start &= cpu[:, None] >= self._cpu[None, :]
        result: npt.NDArray[np.float64] = np.where(can_start, stranded, idle[:, None]) @ self._p
        return result


def fragmentation(free_mib: Sequence[float], capacity_mib: Sequence[float], mix: DemandMix,
                  cpu_left_milli: float | None = None) -> float:
    """Expected stranded capacity of a node, in GPUs, under the demand mix (module docstring)."""
    values = mix.fragmentation_many(np.asarray([free_mib], dtype=float), np.asarray(capacity_mib, dtype=float),
                                    [cpu_left_milli])
    return float(values[0])


def fragmentation_delta(
    pod: PodRequest, node: NodeView, mix: DemandMix,
    cpu_left_milli: float | None = None, pod_cpu_milli: float = 0.0, sharpness: float = DEFAULT_SHARPNESS,
) -> tuple[float, tuple[GpuView, ...]] | None:
    """(growth of the node's fragmentation, the GPUs giving it) for placing `pod`; None if it cannot fit.

    One-GPU pods try every fitting GPU and keep the best merit (ties to the smallest leftover, then
    the index); multi-GPU pods take the fitting GPUs with the smallest leftover, then the lowest index.
    """
    gpus = node.healthy
    free = np.array([g.free_mib for g in gpus], dtype=float)
    caps = np.array([g.capacity_mib for g in gpus], dtype=float)
    cpu_after = None if cpu_left_milli is None else cpu_left_milli - pod_cpu_milli
    if not pod.gpu_job:
        both = mix.fragmentation_many(np.vstack([free, free]), caps, [cpu_left_milli, cpu_after])
        return float(both[1] - both[0]), ()
    need = pod.admission_mib
    count = max(pod.gpus, 1)
    if not gpus_fit(node.free_desc, count, need):
        return None
    fitting = [g for g in gpus if g.free_mib >= need]
    position = {g.uuid: k for k, g in enumerate(gpus)}
    options: list[tuple[GpuView, ...]]
    if count == 1:
        options = [(g,) for g in fitting]
    else:
        options = [tuple(sorted(fitting, key=lambda g: (g.free_mib - need, g.index))[:count])]
    states = np.repeat(free[None, :], len(options) + 1, axis=0)
    for row, option in enumerate(options, start=1):
        for g in option:
            states[row, position[g.uuid]] -= need
    values = mix.fragmentation_many(states, caps, [cpu_left_milli] + [cpu_after] * len(options))
    deltas = values[1:] - values[0]
    best = min(range(len(options)), key=lambda r: (-merit_from_delta(float(deltas[r]), sharpness),
                                                   options[r][0].free_mib - need, options[r][0].index))
    return float(deltas[best]), options[best]


def merit_from_delta(delta: float, sharpness: float = DEFAULT_SHARPNESS) -> int:
    """int(100 x sigmoid(-sharpness x delta)) (0..100; 50 when nothing changes), without overflow.
    The truncation is deliberate: placements within a few hundredths of a GPU of each other tie."""
    x = -sharpness * delta
    value = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    return min(max(int(MAX_MERIT * value), 0), MAX_MERIT)


def merits_from_deltas(deltas: npt.NDArray[np.float64], sharpness: float = DEFAULT_SHARPNESS) -> npt.NDArray[np.int64]:
    """`merit_from_delta` over an array. Where 100 x sigmoid lies within 1e-9 of an integer (numpy's
    and libm's exp may round differently there) the scalar decides; a zero delta is exactly 50."""
    flat = np.asarray(deltas, dtype=float).reshape(-1)
    x = -sharpness * flat
    e = np.exp(-np.abs(x))
    value = MAX_MERIT * np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    merits = np.clip(value.astype(np.int64), 0, MAX_MERIT)
    for k in np.flatnonzero((np.abs(value - np.rint(value)) < 1e-9) & (x != 0)).tolist():
        merits[k] = merit_from_delta(float(flat[k]), sharpness)
    return merits.reshape(np.shape(deltas))


def scores_from_merits(merits: Sequence[tuple[str, int]]) -> dict[str, int]:
    """0..10 wire scores that make kube-scheduler pick what the extender would pick.

    kube-scheduler breaks equal scores at random, which would scatter pods over equally good nodes;
    consolidating them is half of the benefit. So the first node (in the given order, which the
    caller keeps stable, e.g. by node name) with the top merit gets 10, the other top-merit nodes 9,
    and the rest at most 8, in proportion to their merit.
    """
    if not merits:
        return {}
    top = max(m for _, m in merits)
    out: dict[str, int] = {}
    first = True
    for name, m in merits:
        if m == top:
            out[name] = MAX_SCORE if first else MAX_SCORE - 1
            first = False
        else:
            out[name] = min(MAX_SCORE - 2, (MAX_SCORE - 1) * max(m, 0) // MAX_MERIT)
    return out


def score_nodes_fragaware(
    pod: PodRequest, names: Iterable[str], nodes: Mapping[str, NodeView], params: PolicyParams,
    mix: DemandMix, cpu_left_milli: Mapping[str, float] | None = None, pod_cpu_milli: float = 0.0,
    sharpness: float = DEFAULT_SHARPNESS,
) -> list[tuple[str, int]]:
    """Drop-in for `extender.policy.score_nodes` (same answer shape); nodes failing the filter score 0.

    Candidates are ranked in name order for the tie rule of `scores_from_merits`. A pod that is not a
    GPU job scores `neutral_score` everywhere unless `cpu_left_milli` is given.
    """
    order = sorted(dict.fromkeys(names))
    if not pod.gpu_job and cpu_left_milli is None:
        neutral = min(max(params.neutral_score, 0), MAX_SCORE)
        return [(name, neutral) for name in dict.fromkeys(names)]
    merits: list[tuple[str, int]] = []
    # Nodes in the same state (GPUs' free/capacity, CPU left) have the same merit: compute it once.
    known: dict[tuple[object, ...], int | None] = {}
    for name in order:
        node = nodes.get(name)
        if node is None or node_failure(pod, node, node.received_s, params) is not None:
            continue
        cpu = None if cpu_left_milli is None else cpu_left_milli.get(name)
        # a one-GPU pod's merit is its best GPU's, whatever their order; a multi-GPU pod takes the fitting
        # GPUs with the smallest leftover, then the lowest index, so their indices pick which GPUs (and
        # capacities) it takes: nodes with the same GPUs in another order may differ
        key = (cpu, *sorted((g.free_mib, g.capacity_mib, g.index if pod.gpus > 1 else 0) for g in node.gpus))
        if key not in known:
            found = fragmentation_delta(pod, node, mix, cpu, pod_cpu_milli, sharpness)
            known[key] = None if found is None else merit_from_delta(found[0], sharpness)
        merit = known[key]
        if merit is not None:
            merits.append((name, merit))
    scores = scores_from_merits(merits)
    return [(name, scores.get(name, 0)) for name in dict.fromkeys(names)]


def choose_gpus_fragaware(
    pod: PodRequest, node: NodeView, mix: DemandMix, cpu_left_milli: float | None = None, pod_cpu_milli: float = 0.0,
) -> tuple[GpuView, ...] | None:
    """The GPUs bind would take under the proposed rule (those minimising the fragmentation growth)."""
    found = fragmentation_delta(pod, node, mix, cpu_left_milli, pod_cpu_milli)
    return None if found is None else found[1]


def demand_mix(shapes: Sequence[tuple[float, int, float, float]]) -> DemandMix:
    """A mix from (memory_mib, gpus, weight, cpu_milli) rows, weights renormalised to sum to 1."""
    total = sum(w for _, _, w, _ in shapes)
    if total <= 0:
        return DemandMix(())
    return DemandMix([DemandShape(m, g, w / total, c) for m, g, w, c in shapes])


#: The recent admissions that make the live demand mix, and how it is binned (DemandWindow).
MIX_WINDOW = 2000
MIX_REBUILD = 50
MIX_COVER = 0.95
MIX_MEMORY_BIN_MIB = 512
MIX_CPU_BIN_MILLI = 1000


class DemandWindow:
    """The recent admissions as a demand mix for `score_nodes_fragaware`: (memory per GPU, GPUs, CPU)
    rounded up to bins, the most frequent shapes covering MIX_COVER of the window.

    Pure bookkeeping (no I/O, no clock); the extender feeds it at every bind, the simulator's replay
    at every placement. Not thread-safe: the caller serialises `admit` and `mix`.
    """

    def __init__(self, window: int = MIX_WINDOW, rebuild_every: int = MIX_REBUILD) -> None:
        self.recent: deque[tuple[float, int, float]] = deque(maxlen=window)
        self._rebuild_every = rebuild_every
        self._mix = demand_mix([])
        self._since = rebuild_every

    def admit(self, memory_mib: float, gpus: int, cpu_milli: float = 0.0) -> None:
        self.recent.append((math.ceil(memory_mib / MIX_MEMORY_BIN_MIB) * MIX_MEMORY_BIN_MIB, gpus,
                            math.ceil(cpu_milli / MIX_CPU_BIN_MILLI) * MIX_CPU_BIN_MILLI))
        self._since += 1

    def mix(self) -> DemandMix:
        if self._since >= self._rebuild_every or (not len(self._mix) and self.recent):  # first admissions count at once
            counts = Counter(self.recent)
            kept: list[tuple[float, int, float, float]] = []
            covered = 0
            for (memory, gpus, cpu), n in counts.most_common():
                if covered >= MIX_COVER * len(self.recent):
                    break
                kept.append((memory, gpus, float(n), cpu))
                covered += n
            self._mix = demand_mix(kept)
            self._since = 0
        return self._mix
