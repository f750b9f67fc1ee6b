"""The filter and the score over a columnar copy of the NodeViews: the same answers as
`filter_nodes` / `score_nodes` (a property test holds them equal), computed with numpy over all
candidates at once, so a kube-scheduler request with 500 names costs tens of microseconds of
policy work instead of milliseconds.

`NodeMatrix` keeps one row per node (its healthy GPUs in columns, in the NodeView's order) and is
updated by whoever replaces a NodeView (ClusterState, under its lock). Readers take no lock: a row
being rewritten can at worst give one answer from the previous telemetry, never an over-commit,
because bind re-checks under the lock. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress, repeat

import numpy as np
import numpy.typing as npt

from extender.policy.filtering import PASSED, node_failure
from extender.policy.scoring import _UTILISATION_SCALE, _WHOLE_PENALTY_MIB, MAX_SCORE, MIN_SCORE, score_node
from extender.policy.types import EMPTY_SLACK_MIB, FilterResult, NodeView, PodRequest, PolicyParams

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass
class _Arrays:
    free: F64  # (rows, cols) effective free MiB; -inf where no healthy GPU
    cap: F64
    util: F64
    empty: F64  # 1.0 for a whole GPU (as float: it enters the pack key)
    partly: I64  # 1 for a partly used GPU
    free_desc: F64  # each row's free memory sorted, largest first
    healthy: I64  # (rows,) healthy GPUs
    partly_count: I64
    received: F64  # (rows,) -inf for a free row

    @classmethod
    def allocate(cls, rows: int, cols: int) -> _Arrays:
        return cls(
            free=np.full((rows, cols), -np.inf), cap=np.zeros((rows, cols)), util=np.zeros((rows, cols)),
            empty=np.zeros((rows, cols)), partly=np.zeros((rows, cols), dtype=np.int64),
            free_desc=np.full((rows, cols), -np.inf), healthy=np.zeros(rows, dtype=np.int64),
            partly_count=np.zeros(rows, dtype=np.int64), received=np.full(rows, -np.inf),
        )

    def grown(self, rows: int, cols: int) -> _Arrays:
        bigger = _Arrays.allocate(rows, cols)
        r, c = self.free.shape
        for name in ("free", "cap", "util", "empty", "partly", "free_desc"):
            getattr(bigger, name)[:r, :c] = getattr(self, name)
        for name in ("healthy", "partly_count", "received"):
            getattr(bigger, name)[:r] = getattr(self, name)
        return bigger


class NodeMatrix:
    """Row-per-node numpy copy of NodeViews. Writers serialise themselves (one lock outside)."""

    def __init__(self, rows: int = 1024, cols: int = 8) -> None:
        self.arrays = _Arrays.allocate(rows, cols)
        self.index: dict[str, int] = {}
        self._spare: list[int] = []
        self._next = 0

    def put(self, view: NodeView) -> None:
        healthy = view.healthy
        rows, cols = self.arrays.free.shape
        if len(healthy) > cols or (view.name not in self.index and not self._spare and self._next >= rows):
            self.arrays = self.arrays.grown(rows * 2 if self._next >= rows else rows, max(cols, len(healthy)))
        row = self.index.get(view.name)
        if row is None:
            row = self._spare.pop() if self._spare else self._take()
        a = self.arrays
        n = len(healthy)
        a.free[row, :] = -np.inf
        a.free_desc[row, :] = -np.inf
        a.free[row, :n] = [g.free_mib for g in healthy]
        a.cap[row, :n] = [g.capacity_mib for g in healthy]
        a.util[row, :n] = [g.utilization for g in healthy]
        a.empty[row, :n] = [1.0 if g.empty else 0.0 for g in healthy]
        a.partly[row, :n] = [1 if g.partly else 0 for g in healthy]
        a.free_desc[row, :n] = view.free_desc
        a.healthy[row] = n
        a.partly_count[row] = view.partly_count
        a.received[row] = view.received_s
        self.index[view.name] = row

    def remove(self, name: str) -> None:
        row = self.index.pop(name, None)
        if row is None:
            return
        a = self.arrays
        a.received[row] = -np.inf
        a.healthy[row] = 0
        a.free[row, :] = -np.inf
        a.free_desc[row, :] = -np.inf
        self._spare.append(row)

    def _take(self) -> int:
        row = self._next
        self._next += 1
        return row


def _rows(matrix: NodeMatrix, names: list[str]) -> I64:
    """Row of each name, -1 for a node without one (looked up in C: map over dict.get)."""
    return np.array(list(map(matrix.index.get, names, repeat(-1))), dtype=np.int64)


def filter_matrix(
    pod: PodRequest,
    names: Iterable[str],
    matrix: NodeMatrix,
    nodes: Mapping[str, NodeView],
    now_s: float,
    params: PolicyParams,
) -> FilterResult:
    """`filter_nodes` computed over the matrix; failures are explained from `nodes` (the NodeViews)."""
    unique = list(dict.fromkeys(names))
    if not unique:
        return FilterResult((), {}, {}, {})
    a = matrix.arrays  # one reference: a concurrent grow swaps the whole set
    rows = _rows(matrix, unique)
    known = rows >= 0
    safe = np.where(known, rows, 0)
    ok = known & (a.received[safe] >= now_s - params.telemetry_ttl_s)
    if not pod.gpu_job:  # not a GPU job: every node passes, telemetry or not
        ok[:] = True
    else:
        count = max(pod.gpus, 1)
        if count > a.free_desc.shape[1]:
            ok[:] = False
        else:
            ok &= (a.healthy[safe] >= count) & (a.free_desc[safe, count - 1] >= pod.admission_mib)
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    kinds: dict[str, int] = {}
    fits = ok.tolist()
    for i in np.flatnonzero(~ok).tolist():  # only the failures need words
        name = unique[i]
        failure = node_failure(pod, nodes.get(name), now_s, params)
        if failure is None:  # the row was being rewritten: the NodeView has the last word
            fits[i] = True
            continue
        kind, reason, final = failure
        (unresolvable if final else failed)[name] = reason
        kinds[kind] = kinds.get(kind, 0) + 1
    passed = tuple(compress(unique, fits))
    if passed:
        kinds[PASSED] = len(passed)
    return FilterResult(passed, failed, unresolvable, kinds)


def score_matrix(
    pod: PodRequest,
    names: Iterable[str],
    matrix: NodeMatrix,
    nodes: Mapping[str, NodeView],
    params: PolicyParams,
) -> list[tuple[str, int]]:
    """`score_nodes` computed over the matrix (1-GPU pods vectorised; larger pods per node)."""
    unique = list(dict.fromkeys(names))
    if not pod.gpu_job or not unique:
        neutral = min(max(params.neutral_score, MIN_SCORE), MAX_SCORE)
        return [(n, neutral) for n in unique]
    count = max(pod.gpus, 1)
    if count > 1:
        return [(n, score_node(pod, nodes.get(n), params)) for n in unique]
    a = matrix.arrays
    rows = _rows(matrix, unique)
    known = rows >= 0
    safe = np.where(known, rows, 0)
    need = pod.admission_mib
    ok = known & (a.healthy[safe] >= 1) & (a.free_desc[safe, 0] >= need)
    scores = np.zeros(len(unique), dtype=np.int64)
    sub = safe[ok]
    if len(sub):
        spread = pod.priority >= params.spread_priority
        weight = min(max(params.fragmentation_weight, 0.0), 1.0)
        free = a.free[sub]
        # the scalar keys of scoring._pick_one, for every candidate at once
        key = a.util[sub] * _UTILISATION_SCALE - free if spread else free - need + a.empty[sub] * _WHOLE_PENALTY_MIB
        key = np.where(free >= need, key, np.inf)
        col = key.argmin(axis=1)
        at = np.arange(len(sub))
        f = free[at, col]
        c = a.cap[sub, col]
        if spread:
            main = np.minimum(1.0 - a.util[sub, col], np.where(c > 0, f / np.where(c > 0, c, 1.0), 0.0))
        else:
            main = np.where(f > 0, need / np.where(f > 0, f, 1.0), 1.0)
        occupied = c - f + need
        after: I64 = ((occupied > EMPTY_SLACK_MIB) & (occupied < c - EMPTY_SLACK_MIB)).astype(np.int64)
        partly = a.partly_count[sub] + after - a.partly[sub, col]
        whole = 1.0 - partly / a.healthy[sub]
        value = (1.0 - weight) * np.clip(main, 0.0, 1.0) + weight * whole
        scores[ok] = np.clip(np.rint(MAX_SCORE * value), MIN_SCORE, MAX_SCORE).astype(np.int64)
    return list(zip(unique, scores.tolist(), strict=True))
