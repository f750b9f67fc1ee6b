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

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from typing import cast

import numpy as np
import numpy.typing as npt

from extender.policy.filtering import PASSED, whole_gpu_for
from extender.policy.fragmentation import DEFAULT_SHARPNESS, MAX_MERIT, DemandMix, merits_from_deltas
from extender.policy.reasons import KINDS, Reasons, Wording, joined
from extender.policy.scoring import _UTILISATION_SCALE, _WHOLE_PENALTY_MIB, MAX_SCORE, MIN_SCORE, score_node, spreads
from extender.policy.sharing import COMPUTE, apply_sharing
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
    empty_desc: F64  # each row's empty GPUs' free memory sorted, largest first; -inf past them
    cap_desc: F64  # each row's capacities sorted, largest first; 0 past its healthy GPUs
    index: F64  # the GPU's index on its node (the tie break of multi-GPU choices)
    healthy: I64  # (rows,) healthy GPUs
    partly_count: I64
    busy: I64  # (rows,) healthy GPUs not empty
    received: F64  # (rows,) -inf for a free row
    version: I64  # (rows,) changes with every write of the row (what FragmentationMemo keys on)

    @classmethod
    def allocate(cls, rows: int, cols: int) -> _Arrays:
        return cls(
            free=np.full((rows, cols), -np.inf), cap=np.zeros((rows, cols)), util=np.zeros((rows, cols)),
            empty=np.zeros((rows, cols)), partly=np.zeros((rows, cols), dtype=np.int64),
            free_desc=np.full((rows, cols), -np.inf), empty_desc=np.full((rows, cols), -np.inf),
            cap_desc=np.zeros((rows, cols)), index=np.zeros((rows, cols)),
            healthy=np.zeros(rows, dtype=np.int64), partly_count=np.zeros(rows, dtype=np.int64),
            busy=np.zeros(rows, dtype=np.int64), received=np.full(rows, -np.inf),
            version=np.zeros(rows, dtype=np.int64),
        )

    def grown(self, rows: int, cols: int) -> _Arrays:
        bigger = _Arrays.allocate(rows, cols)
        r, c = self.free.shape
        for name in ("free", "cap", "util", "empty", "partly", "free_desc", "empty_desc", "cap_desc", "index"):
            getattr(bigger, name)[:r, :c] = getattr(self, name)
        for name in ("healthy", "partly_count", "busy", "received", "version"):
            getattr(bigger, name)[:r] = getattr(self, name)
        return bigger


@dataclass(frozen=True)
class Lookup:
    """Candidate names without repeats (first kept) and the row of each (-1: none), as of `layout`.
    `derived` keeps what callers compute from the list alone (the answer's JSON template), so that it
    is computed once per list, like the rows."""

    names: list[str]
    rows: I64
    layout: int
    derived: dict[str, object] = field(default_factory=dict, compare=False)

    def known_safe(self) -> tuple[B, I64]:
        """(which names have a row, the rows with 0 for a name without): what every step over the list
        reads first, computed once per list."""
        got = self.derived.get(_KNOWN_SAFE)
        if got is None:
            known: B = self.rows >= 0
            safe: I64 = self.rows if bool(known.all()) else np.where(known, self.rows, 0)
            got = self.derived[_KNOWN_SAFE] = (known, safe)
        return cast(tuple[B, I64], got)

    def names_array(self) -> npt.NDArray[np.object_]:
        """The names as an array of objects, made once per list: a part of the list is taken by a mask
        in C (`subset`), ~4x faster at 5,000 names than a `compress` over a list of booleans."""
        got = self.derived.get(_NAMES)
        if got is None:
            array = np.empty(len(self.names), dtype=object)
            array[:] = self.names
            got = self.derived[_NAMES] = array
        return cast(npt.NDArray[np.object_], got)

    def subset(self, mask: B) -> tuple[tuple[str, ...], Lookup]:
        """The names where `mask` holds, in their order, and their Lookup (their rows as of this one's
        layout, their names' array): what a step passes the next, found by identity there."""
        picked = self.names_array()[mask]
        rows = self.rows[mask]
        rows.flags.writeable = False
        names: list[str] = picked.tolist()
        return tuple(names), Lookup(names, rows, self.layout, {_NAMES: picked})


_KNOWN_SAFE = "known_safe"
_NAMES = "names_array"


@dataclass(frozen=True)
class Scores:
    """Scores of the candidates (`names`: repeats dropped, first kept) as an array, so that the
    answer is encoded without a Python pair per node; `lookup` is the list's (see Lookup.derived)."""

    names: list[str]
    values: I64
    lookup: Lookup | None = None

    def pairs(self) -> list[tuple[str, int]]:
        """As `scoring.score_nodes` answers: (name, score) in the candidates' order."""
        return list(zip(self.names, self.values.tolist(), strict=True))


#: Writes of rows (reports, reservations) without a node joining or leaving before NodeMatrix compacts
#: its index of names.
COMPACT_AFTER_PUTS = 64
#: Candidate lists whose rows NodeMatrix remembers (a few per concurrent scheduling cycle).
LOOKUP_MEMO = 64
#: Lists NodeMatrix finds by identity before hashing them: the lists of the verbs in flight (a filter
#: makes up to ~6: its names, each GPU model's, the merged, the shared, the shortlist), a few at once.
RECENT_LISTS = 32


class NodeMatrix:
    """Row-per-node numpy copy of NodeViews. Writers serialise themselves (one lock outside)."""

    def __init__(self, rows: int = 1024, cols: int = 8) -> None:
        self.arrays = _Arrays.allocate(rows, cols)
        self.index: dict[str, int] = {}
        self._spare: list[int] = []
        self._next = 0
        self._version = 0
        self._layout = 0  # changes whenever a name gains or loses its row
        self._compacted = 0  # the layout `index` was last compacted at (see _compact)
        self._puts_since_layout = 0
        self._lookups: dict[int, tuple[tuple[str, ...], Lookup]] = {}  # hash of a list -> (the list, its rows)
        self._recent: tuple[tuple[tuple[str, ...], Lookup], ...] = ()  # the latest lists, found by identity
        self._lookups_lock = threading.Lock()
        self._ranks: tuple[int, I64] = (-1, np.zeros(0, dtype=np.int64))

    def lookup(self, names: Iterable[str]) -> Lookup:
        """The rows of a candidate list, remembered per list.

        Names arrive as fresh strings in every request, so each of 500 dict lookups misses the CPU
        caches on the stored key: ~170 us per verb in the server, the largest single cost of a
        names-mode pod. kube-scheduler sends a pod's prioritize the names its filter passed (the
        filter `remember`s them), so the second verb costs one tuple hash and compare instead.
        Within one verb the same list object goes from step to step (the filter, the sharing pass,
        the shortlist, the score): found by identity among the latest lists, it is not hashed again
        (a tuple does not keep its hash: 5,000 names cost ~70 us per hash, taken 4 times per filter
        before)."""
        key = names if isinstance(names, tuple) else tuple(names)
        layout = self._layout  # read first: a name added meanwhile invalidates this lookup next time
        for known, found in self._recent:
            if known is key and found.layout == layout:
                return found
        hashed = hash(key)
        entry = self._lookups.get(hashed)
        if entry is not None and entry[1].layout == layout and (entry[0] is key or entry[0] == key):
            self._recent = ((key, entry[1]), *self._recent[: RECENT_LISTS - 1])
            return entry[1]
        rows: I64 = np.array(list(map(self.index.get, key, repeat(-1))), dtype=np.int64)
        if _repeats(key, rows):  # rare: kube-scheduler never repeats a name
            unique = list(dict.fromkeys(key))
            rows = np.array(list(map(self.index.get, unique, repeat(-1))), dtype=np.int64)
        else:
            unique = list(key)
        rows.flags.writeable = False  # shared by every verb over the same list
        looked = Lookup(unique, rows, layout)
        self.remember(key, looked, hashed)
        return looked

    def name_ranks(self, layout: int) -> I64 | None:
        """Each row's place in the order of the node names (the packing score's tie rule: first by
        name), for lookups as of `layout`: computed once per layout (nodes come and go rarely), so
        that the tie among thousands of equal nodes is an argmin, not a comparison of their names.
        None when the layout has moved on since (the caller compares the names)."""
        cached_layout, ranks = self._ranks
        if cached_layout == layout:
            return ranks
        if layout != self._layout:
            return None
        pairs = sorted(list(self.index.items()))  # list() first: one C-level copy, safe against writers
        rows = np.fromiter((row for _, row in pairs), dtype=np.int64, count=len(pairs))
        size = max(len(self.arrays.version), int(rows.max()) + 1 if len(rows) else 0)
        ranks = np.full(size, len(pairs), dtype=np.int64)
        ranks[rows] = np.arange(len(pairs))
        ranks.flags.writeable = False
        self._ranks = (layout, ranks)
        return ranks

    def remember(self, key: tuple[str, ...], looked: Lookup, hashed: int | None = None, *,
                 by_identity: bool = False) -> None:
        """Keep `looked` as the rows of the list `key` (the LOOKUP_MEMO most recent lists; `hashed`:
        hash(key) when the caller has it). `by_identity`: found only as this very object, by the
        steps of the same verb (a list of 5,000 names is not hashed for them: `keep` it if the next
        verb is sent it)."""
        if by_identity:
            self._recent = ((key, looked), *self._recent[: RECENT_LISTS - 1])
            return
        hashed = hash(key) if hashed is None else hashed
        with self._lookups_lock:
            self._lookups.pop(hashed, None)
            self._lookups[hashed] = (key, looked)
            while len(self._lookups) > LOOKUP_MEMO:
                del self._lookups[next(iter(self._lookups))]
            self._recent = ((key, looked), *self._recent[: RECENT_LISTS - 1])

    def keep(self, key: tuple[str, ...]) -> None:
        """`key`, a list a verb remembered `by_identity`, remembered by its names too: the list a filter
        answers with, which kube-scheduler sends its prioritize in a request of its own."""
        layout = self._layout
        for known, found in self._recent:
            if known is key and found.layout == layout:
                self.remember(key, found)
                return

    def put(self, view: NodeView) -> None:
        healthy = view.healthy
        rows, cols = self.arrays.free.shape
        if len(healthy) > cols or (view.name not in self.index and not self._spare and self._next >= rows):
            self.arrays = self.arrays.grown(rows * 2 if self._next >= rows else rows, max(cols, len(healthy)))
        row = self.index.get(view.name)
        added = row is None
        if row is None:
            row = self._spare.pop() if self._spare else self._take()
        a = self.arrays
        n = len(healthy)
        self._clear(row)  # columns past this node's healthy GPUs: free -inf, capacity 0
        a.free[row, :n] = [g.free_mib for g in healthy]
        a.cap[row, :n] = [g.capacity_mib for g in healthy]
        a.util[row, :n] = [g.utilization for g in healthy]
        a.empty[row, :n] = [1.0 if g.empty else 0.0 for g in healthy]
        a.partly[row, :n] = [1 if g.partly else 0 for g in healthy]
        a.index[row, :n] = [g.index for g in healthy]
        a.free_desc[row, :n] = view.free_desc
        a.empty_desc[row, :len(view.empty_free_desc)] = view.empty_free_desc
        a.cap_desc[row, :n] = view.capacity_desc
        a.healthy[row] = n
        a.partly_count[row] = view.partly_count
        a.busy[row] = view.busy_count
        a.received[row] = view.received_s
        self.index[view.name] = row
        if added:
            self._layout += 1  # after the name has its row: a lookup as of the old layout is not kept
            self._puts_since_layout = 0
        a.version[row] = self._bump()  # last: a reader that sees the new version sees the new row
        self._puts_since_layout += 1
        if self._compacted != self._layout and self._puts_since_layout >= COMPACT_AFTER_PUTS:
            self._compact()

    def _compact(self) -> None:
        """Replace `index` by a copy whose names and rows are new objects made one after the other.

        A filter looks up thousands of names in `index` per request, in kube-scheduler's order, and
        each lookup reads the stored name and row: objects made when each node first reported, spread
        over the heap among everything else, so each is a cache miss (measured in the verbs' loop at
        5,000 names, 1.5 ms per lookup of a new list against 0.7 ms after compaction, CPU time).
        Done once the layout has been stable for COMPACT_AFTER_PUTS writes (so not once per node
        while a cluster's nodes first report). Readers take the old dict or the new one whole."""
        pairs = list(self.index.items())
        self.index = {name.encode().decode(): int(str(row)) for name, row in pairs}
        self._compacted = self._layout

    def touch(self, name: str, received_s: float) -> None:
        """The node reported again with nothing changed: only its receipt time moves. The row keeps
        its version, which says when its GPUs last changed (what FragmentationMemo keys on)."""
        row = self.index.get(name)
        if row is not None:
            self.arrays.received[row] = received_s

    def remove(self, name: str) -> None:
        row = self.index.pop(name, None)
        if row is None:
            return
        a = self.arrays
        a.received[row] = -np.inf
        a.healthy[row] = 0
        a.busy[row] = 0
        self._clear(row)
        a.version[row] = self._bump()
        self._spare.append(row)
        self._layout += 1
        self._puts_since_layout = 0

    def _clear(self, row: int) -> None:
        a = self.arrays
        a.free[row, :] = -np.inf
        a.free_desc[row, :] = -np.inf
        a.empty_desc[row, :] = -np.inf
        a.cap_desc[row, :] = 0.0
        a.cap[row, :] = 0.0
        a.util[row, :] = 0.0
        a.empty[row, :] = 0.0
        a.partly[row, :] = 0
        a.index[row, :] = 0.0

    def _bump(self) -> int:
        self._version += 1
        return self._version

    def _take(self) -> int:
        row = self._next
        self._next += 1
        return row


def _repeats(names: tuple[str, ...], rows: I64) -> bool:
    """Whether a name occurs twice: known names share a row, unknown ones (-1) are compared. A
    count per row costs a fraction of dropping repeats with a dict (0.26 against 0.39 ms at 5,000)."""
    known = rows[rows >= 0]
    if len(known) and int(np.bincount(known).max()) > 1:
        return True
    if len(known) >= len(rows) - 1:
        return False
    unknown = list(compress(names, (rows < 0).tolist()))
    return len(set(unknown)) != len(unknown)


def fits_rows(a: _Arrays, rows: I64, gpus: int, need_mib: float, whole: bool = False) -> B:
    """`filtering.gpus_fit` for the given rows at once (its vectorised twin, property-tested); `whole`:
    over the empty GPUs only, as `filtering.fit_free_desc` for a whole-GPU request."""
    count = max(gpus, 1)
    if count > a.free_desc.shape[1]:
        return np.zeros(len(rows), dtype=bool)
    if whole:  # the empty GPUs' free memory, sorted when the row was written
        whole_fits: B = (a.healthy[rows] >= count) & (a.empty_desc[rows, count - 1] >= need_mib)
        return whole_fits
    fits: B = (a.healthy[rows] >= count) & (a.free_desc[rows, count - 1] >= need_mib)
    return fits


def largest_gpu_rows(matrix: NodeMatrix, names: Iterable[str], gpus: int) -> float:
    """`filtering.largest_gpu_mib` over the nodes `names` (its vectorised twin, property-tested): the
    most, over the named nodes with `gpus` healthy GPUs, of their `gpus`-th largest (the matrix holds
    only healthy GPUs, capacity 0 in the columns past them)."""
    looked = matrix.lookup(names)
    rows = looked.rows[looked.rows >= 0]
    a = matrix.arrays
    count = max(gpus, 1)
    if not len(rows) or count > a.cap.shape[1]:
        return 0.0
    caps = a.cap[rows]
    kth = caps.max(axis=1) if count == 1 else -np.partition(-caps, count - 1, axis=1)[:, count - 1]
    return float(kth.max())


def fresh_rows(a: _Arrays, rows: I64, now_s: float, params: PolicyParams) -> B:
    """`filtering.is_fresh` for the given rows at once (a free row, received -inf, is never fresh)."""
    fresh: B = now_s - a.received[rows] <= params.telemetry_ttl_s
    return fresh


def gpu_keys(free: F64, util: F64, empty: F64, need_mib: float, spread: bool) -> F64:
    """`scoring.gpu_key` over arrays (same constants; a property test holds the choices equal)."""
    keys: F64 = util * _UTILISATION_SCALE - free if spread else free - need_mib + empty * _WHOLE_PENALTY_MIB
    return keys


def filter_matrix(
    pod: PodRequest,
    names: Iterable[str],
    matrix: NodeMatrix,
    nodes: Mapping[str, NodeView],
    now_s: float,
    params: PolicyParams,
) -> FilterResult:
    """`filter_nodes` computed over the matrix; failures are explained from `nodes` (the NodeViews).
    The passed names' rows are remembered for the pod's prioritize (`NodeMatrix.lookup`). The
    whole-GPU fallback as there (`filtering.whole_gpu_request`): looked at only when no node passed,
    so a cluster with room pays nothing for it."""
    if not isinstance(names, tuple):  # read again by the whole-GPU fallback
        names = tuple(names)
    looked = matrix.lookup(names)
    unique = looked.names
    if not unique:
        return FilterResult((), {}, {}, {})
    a = matrix.arrays  # one reference: a concurrent grow swaps the whole set
    known, safe = looked.known_safe()
    if not pod.gpu_job:  # not a GPU job: every node passes, telemetry or not
        ok = fresh = np.ones(len(unique), dtype=bool)
    else:
        fresh = known & fresh_rows(a, safe, now_s, params)
        ok = fresh & fits_rows(a, safe, pod.gpus, pod.admission_mib, pod.whole_gpu)
    if ok.all():  # every candidate passes (the usual answer in a cluster with room): no per-node work
        key = names if isinstance(names, tuple) else None
        passed_all = key if key is not None and len(key) == len(unique) else tuple(unique)
        if passed_all is not key:  # else `lookup` remembered this very list
            matrix.remember(passed_all, looked)  # the list kube-scheduler sends to prioritize next
        return FilterResult(passed_all, {}, {}, {PASSED: len(passed_all)})
    if pod.fallback and not ok.any():  # before wording any failure: the fallback's answer replaces it
        whole = whole_gpu_for(pod, largest_gpu_rows(matrix, names, pod.gpus), params)
        if whole is not None:
            return replace(filter_matrix(whole, names, matrix, nodes, now_s, params), request=whole)
    # Only the failures need words, and only when read: kube-scheduler reads them when no node is left
    # (the shortlist drops them otherwise), so a cluster of 5,000 nodes with thousands full words none
    # per pod. Their kinds (the metrics) are node_failure's conditions, in its order, over the rows.
    fail = ~ok
    count = max(pod.gpus, 1)
    few = fresh & (a.healthy[safe] < count)
    if count <= a.cap_desc.shape[1]:
        large = fail & fresh & ~few & (a.cap_desc[safe, count - 1] < pod.admission_mib)
    else:
        large = np.zeros(len(unique), dtype=bool)
    stale = known & ~fresh
    final = ~known | stale | few | large  # fail whatever happens (no preemption helps)
    memory = fail & ~final
    counts = (len(unique) - int(np.count_nonzero(known)), int(np.count_nonzero(stale)), int(np.count_nonzero(few)),
              int(np.count_nonzero(large)), int(np.count_nonzero(memory)))
    kinds = {kind: n for kind, n in zip(KINDS, counts, strict=True) if n}
    words = Wording(pod, nodes, now_s, params)
    unresolvable = Reasons(tuple(looked.names_array()[final]), words)
    failed = Reasons(tuple(looked.names_array()[memory]), words)
    passed, passed_lookup = looked.subset(ok)
    if passed:
        kinds[PASSED] = len(passed)
        matrix.remember(passed, passed_lookup)
    return FilterResult(passed, failed, unresolvable, kinds)


def sharing_matrix(pod: PodRequest, result: FilterResult, matrix: NodeMatrix, nodes: Mapping[str, NodeView],
                   params: PolicyParams, wait_s: float, waiting_priority: float = -math.inf) -> FilterResult:
    """`sharing.apply_sharing` over the matrix (its vectorised twin, property-tested equal): a passed
    node with no busy GPU, or whose empty GPUs alone hold the pod, passes without a look (one numpy
    pass over the rows `filter_matrix` remembered for the passed list); only the others are asked GPU
    by GPU, from their NodeViews, by `apply_sharing` itself. The answer's list is the filter's own
    when no node is dropped, else its rows are remembered: the shortlist and the prioritize that
    follow look no name up again (issue 31: the per-name pass and that second lookup of ~900 fresh
    names were a third of the filter's CPU at 1,000 nodes)."""
    if not pod.gpu_job or not params.sharing or not result.passed:
        return result
    request = result.request or pod
    looked = matrix.lookup(result.passed)
    names = looked.names
    if len(names) != len(result.passed):  # a repeated name (never from the filter): the per-name pass
        return apply_sharing(pod, result, nodes, params, wait_s, waiting_priority)
    a = matrix.arrays  # one reference: a concurrent grow swaps the whole set
    known, safe = looked.known_safe()
    count = max(request.gpus, 1)
    # a busy GPU, and fewer than `count` empty GPUs that hold the pod (the columns sorted at the write)
    empty_short = a.empty_desc[safe, count - 1] < request.admission_mib if count <= a.empty_desc.shape[1] else True
    look = ~known | ((a.busy[safe] > 0) & empty_short)
    if not look.any():
        return result
    at = np.flatnonzero(look).tolist()
    asked = FilterResult(tuple(names[i] for i in at), {}, {}, {PASSED: len(at)}, result.request)
    shared = apply_sharing(pod, asked, nodes, params, wait_s, waiting_priority)
    if not shared.failed:
        return result
    keep = np.ones(len(names), dtype=bool)
    keep[[i for i in at if names[i] in shared.failed]] = False
    passed, kept = looked.subset(keep)
    kinds = dict(result.kinds)
    dropped = len(shared.failed)
    kinds[COMPUTE] = kinds.get(COMPUTE, 0) + dropped
    kinds[PASSED] = kinds.get(PASSED, len(result.passed)) - dropped
    if kinds[PASSED] == 0:
        kinds.pop(PASSED)
    if passed:
        matrix.remember(passed, kept, by_identity=True)
    return replace(result, passed=passed, failed=joined(result.failed, shared.failed), kinds=kinds)


def score_matrix(
    pod: PodRequest,
    names: Iterable[str],
    matrix: NodeMatrix,
    nodes: Mapping[str, NodeView],
    params: PolicyParams,
) -> Scores:
    """`score_nodes` computed over the matrix (1-GPU pods vectorised; larger pods per node)."""
    looked = matrix.lookup(names)
    unique = looked.names
    if not pod.gpu_job or not unique:
        neutral = min(max(params.neutral_score, MIN_SCORE), MAX_SCORE)
        return Scores(unique, np.full(len(unique), neutral, dtype=np.int64), looked)
    count = max(pod.gpus, 1)
    if count > 1:
        values = np.array([score_node(pod, nodes.get(n), params) for n in unique], dtype=np.int64)
        return Scores(unique, values, looked)
    a = matrix.arrays
    known, safe = looked.known_safe()
    need = pod.admission_mib
    ok = known & fits_rows(a, safe, 1, need, pod.whole_gpu)
    scores = np.zeros(len(unique), dtype=np.int64)
    sub = safe[ok]
    if len(sub):
        spread = spreads(pod, params)
        weight = min(max(params.fragmentation_weight, 0.0), 1.0)
        free = a.free[sub]
        # scoring.gpu_key for every candidate's GPUs at once
        usable = (free >= need) & (a.empty[sub] > 0) if pod.whole_gpu else free >= need
        key = np.where(usable, gpu_keys(free, a.util[sub], a.empty[sub], need, spread), np.inf)
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
    return Scores(unique, scores, looked)


def score_matrix_fragaware(
    pod: PodRequest,
    names: Iterable[str],
    matrix: NodeMatrix,
    params: PolicyParams,
    mix: DemandMix,
    sharpness: float = DEFAULT_SHARPNESS,
    memo: FragmentationMemo | None = None,
) -> Scores:
    """`fragmentation.score_nodes_fragaware` (without a CPU term) over the matrix: the live extender's
    packing score at 500 candidates in about a millisecond instead of ~15 ms; with a `memo`, only
    the nodes whose rows changed since the last pod of the same shape and mix are evaluated.

    Each node's fragmentation before and after each possible placement is computed for all
    candidates at once; for a one-GPU pod the state after placing on GPU g differs from the state
    before in g alone, so it is updated from the state before instead of recomputed. Sums taken in
    another order can differ from the scalar's in the last bit, which moves a truncated merit only if
    it lies within ~1e-15 of an integer; a property test holds the scores equal.
    """
    looked = matrix.lookup(names)
    unique = looked.names
    if not pod.gpu_job or not unique:
        neutral = min(max(params.neutral_score, 0), MAX_SCORE)
        return Scores(unique, np.full(len(unique), neutral, dtype=np.int64), looked)
    a = matrix.arrays
    known, safe = looked.known_safe()
    count, need = max(pod.gpus, 1), pod.admission_mib
    ok = known & fits_rows(a, safe, count, need)
    members = np.flatnonzero(ok)
    member_rows = safe[members]
    versions = a.version[member_rows]  # read before the rows: a row rewritten meanwhile is not reused later
    if memo is None:
        node_merits = _merits(a, member_rows, pod, mix, sharpness)
    else:
        node_merits, todo, packed = memo.lookup(mix, pod, sharpness, a.version, member_rows, versions)
        if todo.any():
            fresh = _merits(a, member_rows[todo], pod, mix, sharpness)
            node_merits[todo] = fresh
            packed[member_rows[todo]] = (versions[todo] << MERIT_BITS) | fresh
            memo.computed += int(todo.sum())
        memo.reused += int(len(todo) - todo.sum())
    scores = np.zeros(len(unique), dtype=np.int64)
    if len(members):  # `fragmentation.scores_from_merits`, vectorised
        top = node_merits == node_merits.max()
        ranked = np.minimum(MAX_SCORE - 2, (MAX_SCORE - 1) * np.maximum(node_merits, 0) // MAX_MERIT)
        ranked[top] = MAX_SCORE - 1
        scores[members] = ranked
        tied = members[top]
        ranks = matrix.name_ranks(looked.layout) if len(tied) > 1 else None
        if ranks is not None:  # the tie rule: first by name
            first = int(tied[np.argmin(ranks[safe[tied]])])
        else:
            first = min(tied.tolist(), key=unique.__getitem__)
        scores[first] = MAX_SCORE
    return Scores(unique, scores, looked)


def _merits(a: _Arrays, r: I64, pod: PodRequest, mix: DemandMix, sharpness: float) -> I64:
    """Merits (0..100) of the rows `r` (each fits the pod) under the fragmentation-aware rule."""
    count, need = max(pod.gpus, 1), pod.admission_mib
    free, caps = a.free[r], a.cap[r]  # missing GPU columns: free -inf, capacity 0 (they never fit, weigh 0)
    before = _Fragmentation(free, caps, mix)
    if count == 1:  # every fitting GPU is an option; the node's merit is the best option's
        option_merits = merits_from_deltas(before.after_one(need) - before.value[:, None], sharpness)
        merits: I64 = np.where(free >= need, option_merits, -1).max(axis=1)
        return merits
    leftover = np.where(free >= need, free - need, np.inf)  # the fitting GPUs with the smallest leftover
    chosen = np.lexsort((a.index[r], leftover), axis=-1)[:, :count]  # then the lowest index
    after = free.copy()
    after[np.arange(len(r))[:, None], chosen] -= need
    return merits_from_deltas(_Fragmentation(after, caps, mix).value - before.value, sharpness)


#: A memo entry packs (row version << MERIT_BITS) | merit into one int64, written in one store, so
#: a concurrent reader sees a version with its own merit or nothing.
MERIT_BITS = 7
MEMO_KEYS = 256


class FragmentationMemo:
    """Merits already computed, per (demand mix, pod shape) and node row version.

    A node's merit depends only on its row, the pod's memory and GPU count and the mix; rows change
    when telemetry or a reservation changes the node. So for the next pod of the same shape (the
    replicas of a Job, a retried pod) under the same mix only the rewritten rows are evaluated. The
    mix is the key by content (DemandWindow rebuilds it every MIX_REBUILD admissions). Bounded: the
    MEMO_KEYS most recent keys, one int64 per matrix row each. Safe without a lock (see MERIT_BITS)."""

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self._entries: OrderedDict[tuple[object, ...], I64] = OrderedDict()
        self._lock = lock if lock is not None else threading.Lock()  # the owner's (the ledger's) lock
        self.computed = 0
        self.reused = 0

    def lookup(self, mix: DemandMix, pod: PodRequest, sharpness: float, version: I64, r: I64,
               versions: I64) -> tuple[I64, B, I64]:
        """(merits with the reusable ones filled in, which rows are still to compute, the entry)."""
        key = (mix.shapes, pod.admission_mib, max(pod.gpus, 1), sharpness)
        with self._lock:
            packed = self._entries.get(key)
            if packed is None or len(packed) < len(version):
                grown = np.full(len(version), -1, dtype=np.int64)
                if packed is not None:
                    grown[: len(packed)] = packed
                packed = grown
            self._entries[key] = packed
            self._entries.move_to_end(key)
            while len(self._entries) > MEMO_KEYS:
                self._entries.popitem(last=False)
        stored = packed[r]
        todo: B = (stored >> MERIT_BITS) != versions
        merits: I64 = stored & ((1 << MERIT_BITS) - 1)
        return merits, todo, packed


class _Fragmentation:
    """`DemandMix.fragmentation_many` for N nodes at once (no CPU term), laid out GPU x node so that
    numpy's work runs along the long node axis. Free and capacities come in as (N, G).

    Shapes sharing a memory size share one test per GPU (`free >= memory`); a shape of k GPUs can
    start where at least k GPUs pass it, so with `table[j, c]` = the probability of the shapes of
    size j that start with c fitting GPUs, the fragmentation is
    sum_j table[j, c_j] x stranded_j + (p_j - table[j, c_j]) x idle. The per-size terms are kept so
    that one-GPU placements are evaluated incrementally (`after_one`).
    """

    def __init__(self, free: F64, caps: F64, mix: DemandMix) -> None:
        memory, gpus, p = mix.arrays()
        self.sizes, which = np.unique(memory, return_inverse=True)
        count = free.shape[1]
        table = np.zeros((len(self.sizes), count + 1))
        for j, k, q in zip(which.tolist(), gpus.tolist(), p.tolist(), strict=True):
            if 0 < k <= count:  # a shape needing more GPUs than the node has never starts there
                table[j, k:] += q
        self.table = table.ravel()
        self.offset = np.arange(len(self.sizes)) * (count + 1)
        self.total = np.bincount(which, weights=p, minlength=len(self.sizes))
        self.free = np.ascontiguousarray(free.T)  # (G, N); missing GPUs: free -inf, capacity 0
        self.caps = np.ascontiguousarray(caps.T)
        self.safe = np.where(self.caps > 0, self.caps, 1.0)
        self.fraction = np.where(self.caps > 0, self.free / self.safe, 0.0)  # (G, N)
        self.fits = self.free[None] >= self.sizes[:, None, None]  # (J, G, N)
        self.terms = np.where(self.fits, 0.0, self.fraction[None])  # (J, G, N)
        self.stranded = self.terms.sum(axis=1)  # (J, N)
        self.fit_count = self.fits.sum(axis=1)  # (J, N)
        self.idle = self.fraction.sum(axis=0)  # (N,)
        self.value = self._combine(self.stranded, self.fit_count, self.idle, self.offset[:, None])

    def _combine(self, stranded: F64, fit_count: I64, idle: F64, offset: I64) -> F64:
        weight = np.take(self.table, fit_count + offset)
        total = self.total.reshape((-1,) + (1,) * (stranded.ndim - 1))
        starting = weight * stranded
        not_starting = (total - weight) * idle
        value: F64 = (starting + not_starting).sum(axis=0)
        return value

    def after_one(self, need: float) -> F64:
        """(N, G): the fragmentation after taking `need` MiB from GPU g alone, for every g."""
        free = self.free - need
        fraction = np.where(self.caps > 0, free / self.safe, 0.0)
        fits = free[None] >= self.sizes[:, None, None]
        stranded = self.stranded[:, None, :] - self.terms + np.where(fits, 0.0, fraction[None])
        fit_count = self.fit_count[:, None, :] - self.fits + fits
        idle = self.idle - self.fraction + fraction
        after: F64 = self._combine(stranded, fit_count, idle[None], self.offset[:, None, None]).T
        return after
