"""The fragmentation-aware packing score (`extender.policy.fragmentation`) on small hand-computed cases.

Units: every GPU below has 16,000 MiB unless said otherwise, so 4,000 MiB stranded is 0.25 GPU.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.policy import (
    DemandMix,
    DemandShape,
    GpuView,
    NodeView,
    PodRequest,
    PolicyParams,
    choose_gpus_fragaware,
    demand_mix,
    fragmentation,
    fragmentation_delta,
    merit_from_delta,
    score_nodes_fragaware,
    scores_from_merits,
)

CAP = 16_000.0


def node(name: str, free: list[float], cap: float = CAP, healthy: tuple[bool, ...] | None = None) -> NodeView:
    ok = healthy or (True,) * len(free)
    gpus = tuple(GpuView(uuid=f"{name}-{k}", index=k, capacity_mib=cap, used_mib=cap - f, healthy=ok[k])
                 for k, f in enumerate(free))
    return NodeView(name=name, gpus=gpus, received_s=0.0)


def pod(mib: float, gpus: int = 1, gpu_job: bool = True) -> PodRequest:
    return PodRequest(uid="u", namespace="ns", name="p", gpus=gpus, admission_mib=mib, predicted_mib=mib,
                      gpu_job=gpu_job)


def mix(*shapes: tuple[float, int, float, float]) -> DemandMix:
    return DemandMix([DemandShape(m, g, p, c) for m, g, p, c in shapes])


HALF_GPU = (8_000.0, 1, 1.0, 0.0)  # the mix of most cases: every request wants 8,000 MiB on one GPU


@pytest.mark.parametrize(("free", "shapes", "cpu_left", "expected"), [
    ([16_000], [HALF_GPU], None, 0.0),  # the request fits: nothing is stranded
    ([6_000], [HALF_GPU], None, 0.375),  # it cannot start: all 6,000 free MiB are stranded
    ([16_000, 6_000], [HALF_GPU], None, 0.375),  # it starts on GPU 0; GPU 1's 6,000 MiB are stranded
    ([16_000, 6_000], [(8_000, 1, 1.0, 4_000)], 2_000.0, 1.375),  # too little CPU left: everything is stranded
    ([16_000, 6_000], [(8_000, 1, 1.0, 4_000)], 4_000.0, 0.375),  # enough CPU: as without the CPU term
    ([8_000], [(0, 0, 1.0, 0)], None, 0.5),  # a CPU-only request never uses GPU memory
    ([10_000], [(8_000, 1, 0.5, 0), (12_000, 1, 0.5, 0)], None, 0.3125),  # 0.5 x 0 + 0.5 x 0.625
    ([16_000, 16_000, 4_000], [(8_000, 2, 1.0, 0)], None, 0.25),  # two GPUs fit; 4,000 MiB stranded
    ([16_000, 4_000], [(8_000, 2, 1.0, 0)], None, 1.25),  # a two-GPU request cannot start at all
    ([16_000], [], None, 0.0),  # no demand known: nothing counts as stranded
])
def test_fragmentation_is_the_expected_stranded_memory(
    free: list[float], shapes: list[tuple[float, int, float, float]], cpu_left: float | None, expected: float,
) -> None:
    assert fragmentation(free, [CAP] * len(free), mix(*shapes), cpu_left) == pytest.approx(expected)


@pytest.mark.parametrize(("delta", "expected"), [
    (0.0, 50),  # nothing changes
    (0.375, 40),  # int(100 / (1 + e^0.375)) = int(40.73)
    (-0.375, 59),  # int(59.27)
    (1_000.0, 0),  # no overflow far out
    (-1_000.0, 100),
])
def test_merit_is_a_truncated_sigmoid(delta: float, expected: int) -> None:
    assert merit_from_delta(delta) == expected


@pytest.mark.parametrize(("merits", "expected"), [
    ([], {}),
    ([("a", 50), ("b", 50), ("c", 40)], {"a": 10, "b": 9, "c": 3}),  # 9 x 40 // 100 = 3
    ([("a", 40), ("b", 100)], {"a": 3, "b": 10}),
    ([("a", 100), ("b", 99)], {"a": 10, "b": 8}),  # the runner-up never reaches the top's 9
    ([("a", 0)], {"a": 10}),  # a lone candidate is the best one, whatever its merit
    ([("a", 60), ("b", -5)], {"a": 10, "b": 0}),
])
def test_scores_from_merits(merits: list[tuple[str, int]], expected: dict[str, int]) -> None:
    assert scores_from_merits(merits) == expected


def test_a_placement_that_strands_memory_under_the_mix_scores_lower() -> None:
    """A 10,000 MiB pod: on `a` it leaves 6,000 MiB no 8,000 MiB request can use (growth 0.375 GPU,
    merit 40, score 9 x 40 // 100 = 3); on `b` it fills the 10,000 MiB GPU exactly (growth 0, merit 50)."""
    nodes = {"a": node("a", [16_000]), "b": node("b", [16_000, 10_000])}
    m = mix(HALF_GPU)
    assert dict(score_nodes_fragaware(pod(10_000), ["a", "b"], nodes, PolicyParams(), m)) == {"a": 3, "b": 10}
    found = fragmentation_delta(pod(10_000), nodes["a"], m)
    assert found is not None and found[0] == pytest.approx(0.375)
    chosen = choose_gpus_fragaware(pod(10_000), nodes["b"], m)
    assert chosen is not None and [g.index for g in chosen] == [1]


def test_without_the_mix_best_fit_alone_would_not_see_the_difference() -> None:
    """With requests of 4,000 MiB, the 6,000 MiB left on `a` is usable: both placements strand nothing."""
    nodes = {"a": node("a", [16_000]), "b": node("b", [16_000, 10_000])}
    m = mix((4_000, 1, 1.0, 0))
    assert dict(score_nodes_fragaware(pod(10_000), ["a", "b"], nodes, PolicyParams(), m)) == {"a": 10, "b": 9}


def test_cpu_left_decides_when_gpu_memory_does_not() -> None:
    """Same GPUs; on `a` the pod's 3,000 mCPU leaves 1,000, too little for the mix's 2,000 mCPU requests,
    so `a`'s 6,000 free MiB become stranded (growth 0.375 GPU); `b` keeps enough CPU."""
    nodes = {"a": node("a", [16_000, 6_000]), "b": node("b", [16_000, 6_000])}
    m = mix((6_000, 1, 1.0, 2_000))
    cpu = {"a": 4_000.0, "b": 8_000.0}
    scores = dict(score_nodes_fragaware(pod(6_000), ["a", "b"], nodes, PolicyParams(), m, cpu, 3_000.0))
    assert scores["b"] == 10 and scores["a"] < scores["b"]


def test_ties_go_to_the_first_name_whatever_the_input_order() -> None:
    nodes = {n: node(n, [16_000]) for n in ("c", "a", "b")}
    scores = score_nodes_fragaware(pod(8_000), ["c", "a", "b"], nodes, PolicyParams(), mix(HALF_GPU))
    assert scores == [("c", 9), ("a", 10), ("b", 9)]  # answered in input order, 10 to the first by name


@pytest.mark.parametrize(("nodes", "expected"), [
    ({"a": node("a", [4_000])}, 0),  # too little free memory: filtered out
    ({"a": node("a", [16_000], healthy=(False,))}, 0),  # no healthy GPU
    ({}, 0),  # unknown node
])
def test_nodes_that_fail_the_filter_score_zero(nodes: dict[str, NodeView], expected: int) -> None:
    scores = dict(score_nodes_fragaware(pod(8_000), ["a", "ok"], {**nodes, "ok": node("ok", [16_000])},
                                        PolicyParams(), mix(HALF_GPU)))
    assert scores == {"a": expected, "ok": 10}


def test_multi_gpu_pod_takes_the_smallest_fitting_leftovers() -> None:
    chosen = choose_gpus_fragaware(pod(8_000, gpus=2), node("n", [16_000, 9_000, 4_000, 8_000]), mix(HALF_GPU))
    assert chosen is not None and sorted(g.index for g in chosen) == [1, 3]
    assert choose_gpus_fragaware(pod(8_000, gpus=3), node("n", [16_000, 4_000, 8_000]), mix(HALF_GPU)) is None


def test_pods_without_gpus_score_neutrally_unless_cpu_is_known() -> None:
    nodes = {"a": node("a", [16_000]), "b": node("b", [16_000])}
    request = pod(0, gpus=0, gpu_job=False)
    m = mix((8_000, 1, 1.0, 2_000))
    neutral = PolicyParams().neutral_score
    assert score_nodes_fragaware(request, ["a", "b"], nodes, PolicyParams(), m) == [("a", neutral), ("b", neutral)]
    # With CPU known: on `a` the pod's 2,000 mCPU leaves 1,000 and strands the whole free GPU.
    scores = dict(score_nodes_fragaware(request, ["a", "b"], nodes, PolicyParams(), m,
                                        {"a": 3_000.0, "b": 10_000.0}, 2_000.0))
    assert scores["b"] == 10 and scores["a"] < scores["b"]


def test_demand_mix_renormalises_weights() -> None:
    m = demand_mix([(8_000, 1, 3.0, 0), (4_000, 1, 1.0, 0)])
    assert [s.probability for s in m.shapes] == [0.75, 0.25]
    assert len(demand_mix([(8_000, 1, 0.0, 0)])) == 0


free_lists = st.lists(st.sampled_from([0.0, 2_000.0, 6_000.0, 8_000.0, 12_000.0, 16_000.0]), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["n1", "n2", "n3", "n4", "n5"]), free_lists, max_size=5),
       st.lists(st.sampled_from(["n1", "n2", "n3", "n4", "n5", "zz"]), max_size=8),
       st.sampled_from([2_000.0, 8_000.0, 12_000.0]), st.integers(1, 2))
def test_scores_cover_exactly_the_input_within_0_to_10(
    frees: dict[str, list[float]], names: list[str], mib: float, gpus: int,
) -> None:
    nodes = {n: node(n, f) for n, f in frees.items()}
    m = mix(HALF_GPU, (2_000.0, 2, 0.5, 0))
    scores = score_nodes_fragaware(pod(mib, gpus), names, nodes, PolicyParams(), m)
    assert [n for n, _ in scores] == list(dict.fromkeys(names))
    assert all(0 <= s <= 10 for _, s in scores)
    assert sum(1 for _, s in scores if s == 10) <= 1
    # The node given 10 is the one whose placement grows fragmentation least (ties: first by name).
    deltas = {}
    for n in sorted(set(names)):
        if n in nodes and sum(1 for f in frees[n] if f >= mib) >= gpus:
            found = fragmentation_delta(pod(mib, gpus), nodes[n], m)
            assert found is not None
            deltas[n] = merit_from_delta(found[0])
    if deltas:
        best = max(deltas.values())
        assert dict(scores)[min(n for n, v in deltas.items() if v == best)] == 10
    else:
        assert all(s == 0 for _, s in scores)


GPU_STATES = st.tuples(st.sampled_from([0.0, 1_000.0, 3_500.0, 8_000.0, 11_111.0, 15_000.0, 16_000.0, 40_000.0]),
                       st.sampled_from([16_000.0, 40_960.0]), st.booleans())


def _views(gpus_by_node: dict[str, list[tuple[float, float, bool]]], rnd: object) -> dict[str, NodeView]:
    import random

    assert isinstance(rnd, random.Random)
    views: dict[str, NodeView] = {}
    for name, states in gpus_by_node.items():
        order = list(range(len(states)))
        rnd.shuffle(order)  # GPU indices need not follow the report's order
        gpu_views = tuple(GpuView(uuid=f"{name}-{k}", index=order[k], capacity_mib=cap, used_mib=max(cap - free, 0.0),
                                  healthy=ok or k == 0) for k, (free, cap, ok) in enumerate(states))
        views[name] = NodeView(name=name, gpus=gpu_views, received_s=0.0)
    return views


NODE_NAMES = st.sampled_from(["a", "b", "c", "d", "e", "f", "g"])
NODES_GPUS = st.dictionaries(NODE_NAMES, st.lists(GPU_STATES, min_size=1, max_size=8), max_size=7)


@settings(max_examples=150, deadline=None)
@given(NODES_GPUS, NODES_GPUS, st.lists(NODE_NAMES, max_size=4),
       st.lists(st.tuples(st.sampled_from([1_000.0, 4_000.0, 8_000.0, 20_000.0]), st.integers(0, 4),
                          st.floats(0.05, 1.0)), max_size=5),
       st.sampled_from([500.0, 3_000.0, 8_000.0, 15_000.0]), st.integers(1, 4), st.randoms(use_true_random=False))
def test_the_columnar_score_equals_the_scalar_one(
    first: dict[str, list[tuple[float, float, bool]]], then: dict[str, list[tuple[float, float, bool]]],
    removed: list[str], shapes: list[tuple[float, int, float]], mib: float, gpus: int, rnd: object,
) -> None:
    """`columnar.score_matrix_fragaware` is the live extender's fast path: the same scores as
    `score_nodes_fragaware`, for nodes of mixed sizes and GPU orders, with unhealthy GPUs, after
    nodes report again (with fewer or more GPUs) or leave and their rows are reused; with and
    without the memo of merits, asked twice (the second time from the memo)."""
    from extender.policy.columnar import FragmentationMemo, NodeMatrix, score_matrix_fragaware

    matrix = NodeMatrix(rows=2, cols=2)  # grows as nodes arrive
    memo = FragmentationMemo()
    views = _views(first, rnd)
    for view in views.values():
        matrix.put(view)
    for name in removed:
        if name in views:
            matrix.remove(name)
            del views[name]
    again = _views(then, rnd)
    views.update(again)
    for view in again.values():
        matrix.put(view)
    names = [*views, "missing"]
    m = demand_mix([(memory, count, weight, 0.0) for memory, count, weight in shapes])
    request = pod(mib, gpus)
    expected = score_nodes_fragaware(request, names, views, PolicyParams(), m)
    assert score_matrix_fragaware(request, names, matrix, PolicyParams(), m).pairs() == expected
    assert score_matrix_fragaware(request, names, matrix, PolicyParams(), m, memo=memo).pairs() == expected
    assert score_matrix_fragaware(request, names, matrix, PolicyParams(), m, memo=memo).pairs() == expected


def test_the_memo_recomputes_only_the_nodes_that_changed() -> None:
    from extender.policy.columnar import FragmentationMemo, NodeMatrix, score_matrix_fragaware

    matrix, memo = NodeMatrix(), FragmentationMemo()
    views = {f"n{i}": node(f"n{i}", [16_000.0 - 1_000.0 * i, 9_000.0]) for i in range(6)}
    for view in views.values():
        matrix.put(view)
    m = mix(HALF_GPU)
    score_matrix_fragaware(pod(2_000.0), list(views), matrix, PolicyParams(), m, memo=memo)
    assert (memo.computed, memo.reused) == (6, 0)
    score_matrix_fragaware(pod(2_000.0), list(views), matrix, PolicyParams(), m, memo=memo)
    assert (memo.computed, memo.reused) == (6, 6)
    views["n2"] = node("n2", [1_500.0, 1_500.0])  # a new report: n2 no longer fits
    views["n3"] = node("n3", [16_000.0, 16_000.0])
    for name in ("n2", "n3"):
        matrix.put(views[name])
    expected = score_nodes_fragaware(pod(2_000.0), list(views), views, PolicyParams(), m)
    assert score_matrix_fragaware(pod(2_000.0), list(views), matrix, PolicyParams(), m, memo=memo).pairs() == expected
    assert (memo.computed, memo.reused) == (7, 10)  # n3 anew; n2 fails the fit test before the memo
    other = mix((4_000.0, 1, 1.0, 0.0))  # another demand mix: nothing of the first one is reused
    score_matrix_fragaware(pod(2_000.0), list(views), matrix, PolicyParams(), other, memo=memo)
    assert (memo.computed, memo.reused) == (12, 10)


def test_nodes_with_the_same_gpus_in_another_order_are_scored_apart_for_a_multi_gpu_pod() -> None:
    """Found by the property test above: a 2-GPU pod takes the fitting GPUs with the smallest leftover,
    then the lowest index, so on `f` it takes two 40 GB GPUs and on `g` a 40 GB and a 16 GB one (the
    same GPUs, indexed otherwise): placing it there frees less of the smaller GPU's idle memory for the
    mix, so `g`'s fragmentation falls more. The scalar score memoised merits by the GPUs' (free,
    capacity) alone and gave `g` the merit of `f`; both scores now rank `g` first."""
    from extender.policy.columnar import NodeMatrix, score_matrix_fragaware

    def node(name: str, gpus: list[tuple[int, float, float]]) -> NodeView:
        return NodeView(name=name, gpus=tuple(GpuView(uuid=f"{name}-{i}", index=i, capacity_mib=cap,
                                                      used_mib=cap - free) for i, cap, free in gpus),
                        received_s=0.0)

    views = {"f": node("f", [(0, 40_960.0, 1_000.0), (1, 40_960.0, 1_000.0), (2, 40_960.0, 3_500.0),
                             (4, 16_000.0, 1_000.0)]),
             "g": node("g", [(0, 40_960.0, 1_000.0), (1, 40_960.0, 3_500.0), (3, 16_000.0, 1_000.0),
                             (4, 40_960.0, 1_000.0)])}
    m = demand_mix([(1_000.0, 0, 1.0, 0.0)])  # a CPU-only shape: all free GPU memory is idle for it
    scalar = dict(score_nodes_fragaware(pod(500.0, 2), ["f", "g"], views, PolicyParams(), m))
    assert scalar["g"] == 10 and scalar["f"] < 10
    matrix = NodeMatrix(rows=2, cols=2)
    for view in views.values():
        matrix.put(view)
    assert dict(score_matrix_fragaware(pod(500.0, 2), ["f", "g"], matrix, PolicyParams(), m).pairs()) == scalar
