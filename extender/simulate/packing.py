"""Experiment 1, packing: FGD's ATC'23 experiment (METHOD.md) with our policies beside FGD's.

Every pod of a seed's workload is tried once, in arrival order, and never leaves. A policy picks the
feasible node with the highest integer score (ties to the lowest node rank) and a GPU on it. Node
state is kept as numpy arrays in rank order, so "lowest rank" is "lowest index" and feasibility is a
handful of vector comparisons over all nodes.

Speed: FGD's score needs the node's fragmentation before and after a hypothetical placement. Nodes
in the same state (GPU model, CPU left, per-GPU milli left) score the same for the same pod shape,
and states recur constantly, so scores are memoised by (state, pod shape); a step only computes the
states it has not seen.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from extender.policy import DemandMix
from extender.policy import NodeView as GpuNodeView
from extender.simulate.traces import MILLI, Node, Pod, TypicalPod

IntArray = npt.NDArray[np.int64]
StateKey = tuple[int, int, tuple[int, ...]]  # (GPU model index, CPU left, per-GPU milli left)
BoolArray = npt.NDArray[np.bool_]

#: BestFit's normalising maxima (FGD: MaxSpecCpu, MaxSpecGpu).
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000
MAX_GPUS_PER_NODE = 8
_UNKNOWN = -(2**62)  # score-table cell not computed yet


class CpuLevels:
    """Buckets of CPU left that no fragmentation measure can tell apart.

    FGD's F_n and DeepRes's fragmentation read a node's CPU left only through comparisons with the
    demand mix's CPU requests (`cpu_left >= c_m`). Two values with the same count of thresholds at or
    below them give every comparison the same outcome, so results keyed by that count are exactly
    those of the exact value: memo keys use the bucket, not the milli, and hit far more often.
    """

    def __init__(self, thresholds: Sequence[float]) -> None:
        self.levels = sorted(set(float(t) for t in thresholds))

    def __call__(self, cpu_milli: float | None) -> int:
        return -1 if cpu_milli is None else bisect.bisect_right(self.levels, cpu_milli)


class NodeView:
    """The cluster's mutable state in node-rank order (index 0 = rank 0)."""

    def __init__(self, nodes: Sequence[Node], order: Sequence[int]) -> None:
        ranked = [nodes[i] for i in order]
        self.names = [n.name for n in ranked]
        self.models = sorted({n.model for n in nodes})
        self.model_index = {m: i for i, m in enumerate(self.models)}
        self.model: IntArray = np.array([self.model_index[n.model] for n in ranked], dtype=np.int64)
        self.n_gpu: IntArray = np.array([n.gpus for n in ranked], dtype=np.int64)
        if int(self.n_gpu.max()) > MAX_GPUS_PER_NODE:
            raise ValueError(f"a node has more than {MAX_GPUS_PER_NODE} GPUs")
        self.cpu_left: IntArray = np.array([n.cpu_milli for n in ranked], dtype=np.int64)
        self.mem_left: IntArray = np.array([n.memory_mib for n in ranked], dtype=np.int64)
        width = MAX_GPUS_PER_NODE
        self.gpu_left: IntArray = np.full((len(ranked), width), -1, dtype=np.int64)  # -1: no such GPU
        for i, n in enumerate(ranked):
            self.gpu_left[i, : n.gpus] = MILLI
        self.gpu_left_sum: IntArray = self.n_gpu * MILLI
        self.free_gpus: IntArray = self.n_gpu.copy()
        self.max_left: IntArray = np.where(self.n_gpu > 0, MILLI, -1).astype(np.int64)
        self.capacity_milli = int(self.n_gpu.sum()) * MILLI
        self._key_ids: dict[tuple[int, int, tuple[int, ...]], int] = {}
        self.state_id: IntArray = np.array([self._intern(i) for i in range(len(ranked))], dtype=np.int64)
        self.state_keys: list[tuple[int, int, tuple[int, ...]]] = list(self._key_ids)
        self._tables: dict[Hashable, IntArray] = {}

    def _intern(self, i: int) -> int:
        key = (int(self.model[i]), int(self.cpu_left[i]), tuple(int(v) for v in self.gpu_left[i, : self.n_gpu[i]]))
        found = self._key_ids.get(key)
        if found is None:
            found = len(self._key_ids)
            self._key_ids[key] = found
            if hasattr(self, "state_keys"):
                self.state_keys.append(key)
        return found

    def spec_ok(self, pod: Pod) -> BoolArray:
        """Nodes whose GPU model is one of the pod's acceptable models (all, for an empty spec)."""
        if not pod.spec or pod.num_gpu == 0:
            return np.ones(len(self.names), dtype=bool)
        allowed = np.zeros(len(self.models), dtype=bool)
        for model in pod.spec:
            if model in self.model_index:
                allowed[self.model_index[model]] = True
        return allowed[self.model]

    def feasible(self, pod: Pod) -> BoolArray:
        """CPU, memory, GPU model and GPU fit (METHOD.md §3)."""
        ok = (self.cpu_left >= pod.cpu_milli) & (self.mem_left >= pod.memory_mib)
        if pod.num_gpu:
            ok &= self.spec_ok(pod)
            if pod.is_share:
                ok &= self.max_left >= pod.gpu_milli
            else:
                ok &= self.free_gpus >= pod.num_gpu
        return ok

    def place(self, i: int, pod: Pod, gpus: Sequence[int]) -> None:
        """Commit `pod` on node rank `i`, GPUs `gpus`; refuses anything that would go negative."""
        if self.cpu_left[i] < pod.cpu_milli or self.mem_left[i] < pod.memory_mib:
            raise ValueError(f"pod {pod.name} does not fit node {self.names[i]} (cpu/memory)")
        if len(gpus) != pod.num_gpu:
            raise ValueError(f"pod {pod.name} needs {pod.num_gpu} GPUs, got {list(gpus)}")
        for g in gpus:
            if not 0 <= g < self.n_gpu[i] or self.gpu_left[i, g] < pod.gpu_milli:
                raise ValueError(f"pod {pod.name} does not fit GPU {g} of node {self.names[i]}")
        self.cpu_left[i] -= pod.cpu_milli
        self.mem_left[i] -= pod.memory_mib
        for g in gpus:
            self.gpu_left[i, g] -= pod.gpu_milli
        row = self.gpu_left[i, : self.n_gpu[i]]
        self.gpu_left_sum[i] = int(row.sum()) if len(row) else 0
        self.free_gpus[i] = int((row == MILLI).sum())
        self.max_left[i] = int(row.max()) if len(row) else -1
        self.state_id[i] = self._intern(i)

    def state_scores(self, table_key: Hashable, feasible: IntArray, compute: Callable[[int], int]) -> IntArray:
        """Per feasible node, the score `compute(state id)` of its state, computed once per state.

        Node states are interned, so a table per (policy, pod shape) indexed by state id answers most
        nodes with one vectorised gather; only states not seen yet with this shape are computed.
        """
        table = self._tables.get(table_key)
        size = len(self.state_keys)
        if table is None or len(table) < size:
            grown = np.full(max(size * 2, 64), _UNKNOWN, dtype=np.int64)
            if table is not None:
                grown[: len(table)] = table
            table = self._tables[table_key] = grown
        ids = self.state_id[feasible]
        values = table[ids]
        missing = values == _UNKNOWN
        if missing.any():
            for sid in np.unique(ids[missing]).tolist():
                table[sid] = compute(sid)
            values = table[ids]
        return values

    def whole_gpus(self, i: int, count: int) -> list[int]:
        """The lowest-index fully free GPUs (FGD's choice for whole-GPU pods)."""
        return [int(g) for g in np.flatnonzero(self.gpu_left[i] == MILLI)[:count]]

    def best_fit_gpu(self, i: int, milli: int) -> int:
        """The smallest GPU left that still fits, ties to the lowest index."""
        row = self.gpu_left[i]
        fits = np.where(row >= milli, row, MILLI + 1)
        return int(np.argmin(fits))


class Policy(Protocol):
    """Chooses (node rank, GPU indices) among the feasible nodes, or None to leave the pod unplaced."""

    name: str

    def choose(self, view: NodeView, pod: Pod, feasible: IntArray) -> tuple[int, list[int]] | None: ...


def default_gpus(view: NodeView, i: int, pod: Pod) -> list[int]:
    if pod.num_gpu == 0:
        return []
    if pod.is_share:
        return [view.best_fit_gpu(i, pod.gpu_milli)]
    return view.whole_gpus(i, pod.num_gpu)


@dataclass
class RandomPolicy:
    """A uniform feasible node and a uniform fitting GPU. Go's Random is not reproducible either, so a
    numpy generator seeded by the run's seed stands in for it."""

    seed: int
    name: str = "random"
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def choose(self, view: NodeView, pod: Pod, feasible: IntArray) -> tuple[int, list[int]]:
        i = int(feasible[self.rng.integers(len(feasible))])
        if pod.is_share:
            fitting = np.flatnonzero(view.gpu_left[i] >= pod.gpu_milli)
            return i, [int(fitting[self.rng.integers(len(fitting))])]
        return i, default_gpus(view, i, pod)


def best_fit_raw(cpu_left: IntArray, gpu_left_sum: IntArray, pod: Pod) -> IntArray:
    """FGD's BestFit before normalisation: int(100 (1 - [.5 (cL - rc)/Cm + .5 (gL - rg)/Gm])), in Go's order."""
    score = (cpu_left - pod.cpu_milli) / MAX_SPEC_CPU_MILLI * 0.5
    score = score + (gpu_left_sum - pod.total_gpu_milli) / MAX_SPEC_GPU_MILLI * 0.5
    return np.trunc((1.0 - score) * 100.0).astype(np.int64)


def normalize_scores(raw: IntArray) -> IntArray:
    """kube-scheduler style integer min-max normalisation to 0..100 (0 everywhere when all equal)."""
    lo, hi = int(raw.min()), int(raw.max())
    if hi == lo:
        return np.zeros_like(raw)
    return (raw - lo) * 100 // (hi - lo)


@dataclass
class BestFitPolicy:
    name: str = "bestfit"

    def choose(self, view: NodeView, pod: Pod, feasible: IntArray) -> tuple[int, list[int]]:
        raw = best_fit_raw(view.cpu_left[feasible], view.gpu_left_sum[feasible], pod)
        i = int(feasible[int(np.argmax(normalize_scores(raw)))])
        return i, default_gpus(view, i, pod)


class Fragmentation:
    """F_n, a node's expected unusable GPU milli under the typical pod mix (METHOD.md §5), memoised."""

    def __init__(self, typical: Sequence[TypicalPod], models: Sequence[str], memoise: bool = True) -> None:
        index = {m: i for i, m in enumerate(models)}
        self.memoise = memoise
        self.items: list[tuple[int, int, int, frozenset[int] | None, float]] = []
        for t in typical:
            allowed = None if not t.spec or t.num_gpu == 0 else frozenset(index[m] for m in t.spec if m in index)
            self.items.append((t.cpu_milli, t.gpu_milli, t.num_gpu, allowed, t.probability))
        self.cpu_levels = CpuLevels([t.cpu_milli for t in typical])
        self._memo: dict[tuple[int, int, tuple[int, ...]], float] = {}

    def amount(self, model: int, cpu_left: int, gpu_left: tuple[int, ...]) -> float:
        # F_n does not depend on the GPUs' order, and reads the CPU left only through its level
        key = (model, self.cpu_levels(cpu_left), tuple(sorted(gpu_left)))
        found = self._memo.get(key)
        if found is not None:
            return found
        idle = sum(gpu_left)
        total = 0.0
        for cpu, milli, k, allowed, p in self.items:
            if k == 0 or (allowed is not None and model not in allowed) or cpu_left < cpu:
                total += p * idle
                continue
            fitting = 0
            stranded = 0
            for left in gpu_left:
                if left >= milli:
                    fitting += 1
                else:
                    stranded += left
            total += p * (stranded if fitting >= k else idle)
        if self.memoise:
            self._memo[key] = total
        return total


def fgd_node_score(frag: Fragmentation, key: tuple[int, int, tuple[int, ...]], pod: Pod) -> tuple[int, list[int]]:
    """FGD's score of one node state for `pod`, and the GPU(s) it would use (fgd_score.go semantics)."""
    model, cpu_left, gpus = key
    before = frag.amount(model, cpu_left, gpus)
    cpu_after = cpu_left - pod.cpu_milli
    if pod.is_share:
        best_score, best_gpu = 0, -1
        for g, left in enumerate(gpus):
            if left >= pod.gpu_milli:
                after_gpus = (*gpus[:g], left - pod.gpu_milli, *gpus[g + 1:])
                score = _sigmoid_score(before - frag.amount(model, cpu_after, after_gpus))
                if best_gpu < 0 or score > best_score:
                    best_score, best_gpu = score, g
        return best_score, [best_gpu]
    chosen = [g for g, left in enumerate(gpus) if left == MILLI][: pod.num_gpu]
    after = tuple(0 if g in chosen else left for g, left in enumerate(gpus))
    return _sigmoid_score(before - frag.amount(model, cpu_after, after)), chosen


def _sigmoid_score(delta: float) -> int:
    return int(100.0 / (1.0 + math.exp(-delta / 1000.0)))


class FgdPolicy:
    """Fragmentation Gradient Descent: the node and GPU whose placement grows F_n the least."""

    name = "fgd"

    def __init__(self, frag: Fragmentation) -> None:
        self.frag = frag
        self._memo: dict[tuple[int, int, int, tuple[int, ...], int, int], tuple[int, list[int]]] = {}

    def _answer(self, view: NodeView, sid: int, pod: Pod) -> tuple[int, list[int]]:
        """Memoised by (model, CPU level before and after, GPUs left, pod's GPU shape): exact, since the
        score reads the CPU left only through F_n (`CpuLevels`)."""
        state = view.state_keys[sid]
        model, cpu_left, gpus = state
        level = self.frag.cpu_levels
        key = (model, level(cpu_left), level(cpu_left - pod.cpu_milli), gpus, pod.gpu_milli, pod.num_gpu)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = fgd_node_score(self.frag, state, pod)
        return hit

    def choose(self, view: NodeView, pod: Pod, feasible: IntArray) -> tuple[int, list[int]] | None:
        scores = view.state_scores((self.name, pod.cpu_milli, pod.gpu_milli, pod.num_gpu), feasible,
                                   lambda sid: self._answer(view, sid, pod)[0])
        i = int(feasible[int(np.argmax(scores))])
        return i, list(self._answer(view, int(view.state_id[i]), pod)[1])


@dataclass
class PackingResult:
    """Per-attempt log: arrived and allocated GPU milli after each attempt, and the outcome."""

    policy: str
    seed: int
    arrived_milli: IntArray
    allocated_milli: IntArray
    placed: BoolArray
    capacity_milli: int
    seconds: float = 0.0


def run_packing(nodes: Sequence[Node], pods: Sequence[Pod], order: Sequence[int], policy: Policy,
                seed: int = 0, progress: Callable[[int, int], None] | None = None) -> PackingResult:
    """Try every pod once in order; failures are dropped (no retry, no departures)."""
    view = NodeView(nodes, order)
    n = len(pods)
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    total_arrived = total_alloc = 0
    for k, pod in enumerate(pods):
        total_arrived += pod.total_gpu_milli
        feasible = np.flatnonzero(view.feasible(pod))
        choice = policy.choose(view, pod, feasible) if len(feasible) else None
        if choice is not None:
            i, gpus = choice
            view.place(i, pod, gpus)
            total_alloc += pod.total_gpu_milli
            placed[k] = True
        arrived[k] = total_arrived
        allocated[k] = total_alloc
        if progress is not None and k % 1000 == 0:
            progress(k, n)
    return PackingResult(policy.name, seed, arrived, allocated, placed, view.capacity_milli)


def bin_allocation(result: PackingResult, columns: int = 130) -> list[float | None]:
    """FGD's `analysis_allo_discrete` columns 0..`columns` (METHOD.md §6).

    x_i = round(A_i / 1% of capacity) and y_i = round(U_i / 1% of capacity, 2) per attempt; a column is
    round(mean y_i over x_i = x, 2), else the mean over x-1..x+1, else None.
    """
    unit = result.capacity_milli / 100
    xs = [round(a / unit) for a in result.arrived_milli.tolist()]
    ys = [round(u / unit, 2) for u in result.allocated_milli.tolist()]
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for x, y in zip(xs, ys, strict=True):
        sums[x] = sums.get(x, 0.0) + y
        counts[x] = counts.get(x, 0) + 1
    out: list[float | None] = []
    for x in range(columns + 1):
        if counts.get(x):
            out.append(round(sums[x] / counts[x], 2))
            continue
        near = [(sums[c], counts[c]) for c in (x - 1, x, x + 1) if counts.get(c)]
        if near:
            out.append(round(sum(s for s, _ in near) / sum(c for _, c in near), 2))
        else:
            out.append(None)
    return out


class DeepResPolicy:
    """DeepRes's filter, best-fit score and GPU choice (`extender.policy.score_nodes`, the live score
    for high-priority pods; the "no frag term" ablation of packing) in the packing experiment;
    kube-scheduler's part (CPU, memory, GPU model) stays in `NodeView.feasible`.

    Answers are memoised by (node state, pod shape). The live functions are pure and score each node
    on its own GPUs alone, so a memoised answer is the one the live call gives for any node in that
    state (tests compare with unmemoised calls over all nodes). `score` may be replaced by a candidate
    improvement with the signature of `score_nodes`.
    """

    def __init__(self, name: str = "deepres-nofrag", score: Callable[..., list[tuple[str, int]]] | None = None,
                 memoise: bool = True, reference_model: str | None = None) -> None:
        from extender.policy import PolicyParams, choose_gpus, filter_nodes, score_nodes

        self.name = name
        self.params = PolicyParams()
        self.memoise = memoise
        self.reference_model = reference_model
        self._filter = filter_nodes
        self._choose = choose_gpus
        self._score_nodes = score if score is not None else score_nodes
        # memo keys leave the CPU left out: the live filter and score read the node's GPUs alone
        self._views: dict[tuple[int, tuple[int, ...]], GpuNodeView] = {}
        self._answers: dict[tuple[int, tuple[int, ...], int, int], int] = {}  # (model, GPUs, shape) -> score

    def _view(self, view: NodeView, sid: int) -> GpuNodeView:
        from extender.simulate.adapters import node_view

        model, _, gpus = view.state_keys[sid]
        key = (model, gpus)
        found = self._views.get(key)
        if found is None:
            found = node_view(f"s{sid}", view.models[model], gpus)
            if self.memoise:
                self._views[key] = found
        return found

    def _score_state(self, view: NodeView, sid: int, pod: Pod) -> int:
        """The live filter + score for one node state (-1: filtered out), memoised by state."""
        from extender.simulate.adapters import pod_request

        model, _, gpus = view.state_keys[sid]
        key = (model, gpus, pod.gpu_milli, pod.num_gpu)
        hit = self._answers.get(key)
        if hit is None:
            request = pod_request(pod, view.models[model], reference_model=self.reference_model)
            node = self._view(view, sid)
            name = node.name
            nodes = {name: node}
            passed = self._filter(request, [name], nodes, 0.0, self.params).passed
            hit = dict(self._score_nodes(request, passed, nodes, self.params)).get(name, -1)
            self._answers[key] = hit
        return hit

    def _score_all(self, view: NodeView, pod: Pod, feasible: IntArray) -> IntArray:
        """The live filter + score called over every feasible node by its own name (no memo)."""
        from extender.simulate.adapters import node_view, pod_request

        scores = np.full(len(feasible), -1, dtype=np.int64)
        by_model: dict[int, list[int]] = {}
        for pos, i in enumerate(feasible.tolist()):
            by_model.setdefault(int(view.model[i]), []).append(pos)
        for model, positions in by_model.items():
            request = pod_request(pod, view.models[model], reference_model=self.reference_model)
            names = [view.names[int(feasible[p])] for p in positions]
            nodes = {view.names[int(feasible[p])]: node_view(view.names[int(feasible[p])], view.models[model],
                                                              view.state_keys[int(view.state_id[feasible[p]])][2])
                     for p in positions}
            passed = self._filter(request, names, nodes, 0.0, self.params).passed
            answer = dict(self._score_nodes(request, passed, nodes, self.params))
            for p, name in zip(positions, names, strict=True):
                scores[p] = answer.get(name, -1)
        return scores

    def choose(self, view: NodeView, pod: Pod, feasible: IntArray) -> tuple[int, list[int]] | None:
        from extender.simulate.adapters import pod_request

        if self.memoise:
            scores = view.state_scores((self.name, pod.gpu_milli, pod.num_gpu), feasible,
                                       lambda sid: self._score_state(view, sid, pod))
        else:
            scores = self._score_all(view, pod, feasible)
        best = int(np.argmax(scores))
        if int(scores[best]) < 0:
            return None
        i = int(feasible[best])
        if pod.num_gpu == 0:
            return i, []
        sid = int(view.state_id[i])
        chosen = self._choose(pod_request(pod, view.models[view.state_keys[sid][0]],
                                          reference_model=self.reference_model), self._view(view, sid), self.params)
        if not chosen:
            raise RuntimeError(f"choose_gpus found no GPU on node {view.names[i]}, which passed the filter")
        return i, [g.index for g in chosen]


class FragAwarePolicy:
    """DeepRes's packing score (`extender.policy.fragmentation`, the live extender's score for
    low-priority pods) in the packing experiment.

    Each node gets its merit (`merit_from_delta`); the highest wins, ties to the lowest rank:
    exactly the node `score_nodes_fragaware` gives 10 when its stable order is the rank order. The GPUs
    are `choose_gpus_fragaware`'s. Answers are memoised by (node state, pod shape), which is
    exact because the score of a node depends on that node alone. The demand mix is the trace's
    typical pods as memory of each GPU model (a shape whose gpu_spec excludes the model can never
    start there: infinite memory); `use_cpu=False` drops the CPU condition and CPU-only pods.
    """

    def __init__(self, typical: Sequence[TypicalPod], name: str = "deepres", use_cpu: bool = True,
                 sharpness: float | None = None) -> None:
        from extender.policy import PolicyParams
        from extender.policy.fragmentation import DEFAULT_SHARPNESS

        self.name = name
        self.use_cpu = use_cpu
        self.sharpness = DEFAULT_SHARPNESS if sharpness is None else sharpness
        self.params = PolicyParams()
        self.typical = [t for t in typical if t.num_gpu > 0 or use_cpu]
        self._mixes: dict[str, DemandMix] = {}
        self._views: dict[tuple[int, tuple[int, ...]], GpuNodeView] = {}
        self.cpu_levels = CpuLevels([t.cpu_milli for t in self.typical])
        self._memo: dict[tuple[int, tuple[int, ...], int, int, int, int], tuple[int, list[int]]] = {}

    def mix(self, model: str) -> DemandMix:
        from extender.policy import demand_mix
        from extender.simulate.adapters import capacity_mib

        found = self._mixes.get(model)
        if found is None:
            cap = capacity_mib(model)
            found = demand_mix([(t.gpu_milli * cap / MILLI if not t.spec or model in t.spec else math.inf,
                                 t.num_gpu, t.probability, t.cpu_milli) for t in self.typical])
            self._mixes[model] = found
        return found

    def _answer(self, view: NodeView, sid: int, pod: Pod) -> tuple[int, list[int]]:
        from extender.policy import fragmentation_delta, merit_from_delta
        from extender.simulate.adapters import node_view, pod_request

        model, cpu_left, gpus = view.state_keys[sid]
        name = view.models[model]
        cpu = float(cpu_left) if self.use_cpu else None
        node = self._views.get((model, gpus))
        if node is None:
            node = self._views[(model, gpus)] = node_view(f"s{sid}", name, gpus)
        found = fragmentation_delta(pod_request(pod, name), node,
                                    self.mix(name), cpu, float(pod.cpu_milli), self.sharpness)
        if found is None:
            return -1, []
        return merit_from_delta(found[0], self.sharpness), [g.index for g in found[1]]

    def _cached(self, view: NodeView, sid: int, pod: Pod) -> tuple[int, list[int]]:
        """Memoised by (model, GPUs left, CPU level before and after, pod's GPU shape): exact, since
        `fragmentation_delta` reads the CPU only through comparisons with the mix's (`CpuLevels`)."""
        model, cpu_left, gpus = view.state_keys[sid]
        if self.use_cpu:
            before, after = self.cpu_levels(cpu_left), self.cpu_levels(cpu_left - pod.cpu_milli)
        else:
            before = after = -1
        key = (model, gpus, before, after, pod.gpu_milli, pod.num_gpu)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._answer(view, sid, pod)
        return hit

    def choose(self, view: NodeView, pod: Pod, feasible: IntArray) -> tuple[int, list[int]] | None:
        if pod.num_gpu == 0 and not self.use_cpu:
            return int(feasible[0]), []
        scores = view.state_scores((self.name, pod.gpu_milli, pod.num_gpu, pod.cpu_milli), feasible,
                                   lambda sid: self._cached(view, sid, pod)[0])
        best = int(np.argmax(scores))
        if int(scores[best]) < 0:
            return None
        i = int(feasible[best])
        return i, list(self._cached(view, int(view.state_id[i]), pod)[1])
