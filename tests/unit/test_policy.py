"""The pure DeepRes policies: filter, score, GPU choice, priority, usage rule, preemption."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.policy import (
    FilterResult,
    GpuView,
    NodeView,
    PeakStore,
    PodRequest,
    PolicyParams,
    PriorityInputs,
    Reservation,
    cap_criticality,
    choose_gpus,
    choose_preemption,
    corrected_admission,
    criticality_from_priority_class,
    criticality_level,
    filter_nodes,
    follow_usage,
    gpu_key,
    gpus_fit,
    is_fresh,
    observe_usage,
    plan_victims,
    priority_of,
    score_node,
    score_nodes,
    shortlist,
)
from extender.policy.columnar import (
    NodeMatrix,
    filter_matrix,
    fits_rows,
    fresh_rows,
    gpu_keys,
    largest_gpu_rows,
    score_matrix,
)
from extender.policy.filtering import largest_gpu_mib, reserved_per_gpu, whole_gpu_request
from extender.policy.types import EMPTY_SLACK_MIB
from extender.policy.usage import usage_reports_s

P = PolicyParams()
NOW = 1_000_000.0
GIB = 1024.0


def node(name: str, *gpus: tuple[float, float, float], received_s: float = NOW, util: float = 0.0) -> NodeView:
    """gpus as (capacity, used, reserved) in GiB."""
    return NodeView(name, tuple(GpuView(f"{name}-g{i}", i, c * GIB, u * GIB, r * GIB, util)
                                for i, (c, u, r) in enumerate(gpus)), received_s)


def pod(need_gib: float, gpus: int = 1, priority: float = 10.0, gpu_job: bool = True, fallback: bool = False,
        point: float = 0.9) -> PodRequest:
    """A pod needing `need_gib` per GPU, its point estimate `point` x that (`fallback`: the predictor's)."""
    return PodRequest("uid-p", "ns", "p", gpus, need_gib * GIB, need_gib * GIB * point, priority, gpu_job,
                      fallback)


# ---- filter ----

@pytest.mark.parametrize(
    ("view", "need", "gpus", "kind", "reason", "final"),
    [
        (node("n", (40, 10, 0)), 20, 1, None, None, False),
        (node("n", (40, 0, 25)), 20, 1, "memory", "gpu-0: needs 20.0 GiB, 15.0 GiB free", False),
        (node("n", (40, 30, 5)), 20, 1, "memory", "gpu-0: needs 20.0 GiB, 10.0 GiB free", False),
        (node("n", (16, 0, 0)), 20, 1, "too_large", "needs 20.0 GiB per GPU, larger than this node's GPUs (16.0 GiB)",
         True),
        (node("n", (40, 0, 0)), 10, 2, "too_few_gpus", "needs 2 GPU(s), node has 1 healthy", True),
        (node("n", (40, 0, 0), received_s=NOW - 95), 10, 1, "stale", "telemetry stale (95s old)", True),
        (node("n", (40, 30, 0), (40, 0, 0)), 20, 2, "memory",
         "needs 2 GPUs with 20.0 GiB free each; gpu-1: 40.0 GiB free, gpu-0: 10.0 GiB free", False),
    ],
)
def test_filter_reasons(view: NodeView, need: float, gpus: int, kind: str | None, reason: str | None,
                        final: bool) -> None:
    result = filter_nodes(pod(need, gpus), ["n"], {"n": view}, NOW, P)
    if kind is None:
        assert result.passed == ("n",)
        return
    assert result.passed == ()
    assert (result.unresolvable if final else result.failed) == {"n": reason}
    assert result.kinds == {kind: 1}


def test_unknown_node_has_no_agent_report_and_duplicates_are_answered_once() -> None:
    result = filter_nodes(pod(1), ["a", "a", "b"], {"b": node("b", (40, 0, 0))}, NOW, P)
    assert result.passed == ("b",)
    assert result.unresolvable == {"a": "no agent report"}


def test_unhealthy_gpu_never_fits() -> None:
    view = NodeView("n", (GpuView("u0", 0, 40 * GIB, healthy=False), GpuView("u1", 1, 40 * GIB, 39 * GIB)), NOW)
    result = filter_nodes(pod(2), ["n"], {"n": view}, NOW, P)
    assert result.failed == {"n": "gpu-1: needs 2.0 GiB, 1.0 GiB free"}


def test_not_a_gpu_job_passes_fresh_nodes_and_scores_neutrally() -> None:
    nodes = {"a": node("a", (40, 40, 0)), "b": node("b")}
    request = pod(0, gpu_job=False)
    assert filter_nodes(request, ["a", "b"], nodes, NOW, P).passed == ("a", "b")
    assert {s for _, s in score_nodes(request, ["a", "b"], nodes, P)} == {P.neutral_score}


def test_not_a_gpu_job_passes_nodes_without_or_with_stale_telemetry() -> None:
    """DESIGN: pods that are not GPU jobs pass all nodes, agent or not (e.g. CPU pods of our scheduler)."""
    stale = NodeView("old", node("old").gpus, NOW - 10 * P.telemetry_ttl_s)
    nodes = {"old": stale}
    request = pod(0, gpu_job=False)
    result = filter_nodes(request, ["old", "no-agent"], nodes, NOW, P)
    assert result.passed == ("old", "no-agent")
    assert not result.failed and not result.unresolvable


names_st = st.lists(st.sampled_from([f"n{i}" for i in range(8)]), max_size=12)
gpu_st = st.tuples(st.floats(1, 80), st.floats(0, 1), st.floats(0, 1.2), st.floats(0, 1), st.booleans())


@st.composite
def cluster_st(draw: st.DrawFn) -> dict[str, NodeView]:
    """Up to 8 nodes of 0-4 GPUs (GiB capacity, used and reserved shares, utilisation, healthy)."""
    out = {}
    for i in range(draw(st.integers(0, 8))):
        gpus = draw(st.lists(gpu_st, min_size=0, max_size=4))
        age = draw(st.floats(0, 60))
        out[f"n{i}"] = NodeView(f"n{i}", tuple(
            GpuView(f"n{i}-g{j}", j, c * GIB, c * u * GIB, c * r * GIB, util, healthy or j == 0)
            for j, (c, u, r, util, healthy) in enumerate(gpus)), NOW - age)
    return out


# bounds up to 90 GiB against GPUs up to 80 GiB, point estimates 20-100 % of the bound: the whole-GPU
# fallback applies in some draws (its request then answers)
pod_st = st.builds(pod, st.floats(0, 90), st.integers(1, 4), st.floats(0, 45), st.just(True), st.booleans(),
                   st.floats(0.2, 1.0))


@settings(max_examples=200, deadline=None)
@given(cluster_st(), names_st, pod_st)
def test_filter_is_a_partition_of_a_subset_of_its_input(nodes: dict[str, NodeView], names: list[str],
                                                       request: PodRequest) -> None:
    result: FilterResult = filter_nodes(request, names, nodes, NOW, P)
    answered = set(result.passed) | set(result.failed) | set(result.unresolvable)
    assert answered == set(names)
    assert len(result.passed) + len(result.failed) + len(result.unresolvable) == len(set(names))
    assert sum(result.kinds.values()) == len(set(names))
    placed = result.request or request  # the whole-GPU request when the fallback applied
    for name in result.passed:  # what passes really fits: the GPUs bind would choose exist
        chosen = choose_gpus(placed, nodes[name], P)
        assert chosen is not None and len(chosen) == request.gpus
        assert all(g.free_mib >= placed.admission_mib for g in chosen)
        if placed.whole_gpu:  # ... and are empty GPUs, at least the point estimate, on a node below the bound
            assert all(g.empty and request.predicted_mib <= g.capacity_mib for g in chosen)
            assert nodes[name].capacity_desc[request.gpus - 1] < request.admission_mib


@settings(max_examples=200, deadline=None)
@given(cluster_st(), names_st, pod_st)
def test_scores_lie_in_0_to_10_and_non_fitting_nodes_score_0(nodes: dict[str, NodeView], names: list[str],
                                                            request: PodRequest) -> None:
    scores = score_nodes(request, names, nodes, P)
    assert [n for n, _ in scores] == list(dict.fromkeys(names))
    for name, score in scores:
        assert 0 <= score <= 10
        if name not in nodes or choose_gpus(request, nodes[name], P) is None:
            assert score == 0


# ---- the whole-GPU fallback ----

def fallback_pod(bound_gib: float, point_gib: float, gpus: int = 1) -> PodRequest:
    return PodRequest("uid-w", "ns", "w", gpus, bound_gib * GIB, point_gib * GIB, 10.0, True, fallback=True)


def test_whole_gpu_request_only_when_the_bound_exceeds_every_gpu_and_the_point_fits_one() -> None:
    small, large = node("s", (16, 0, 0)), node("l", (32, 0, 0))
    whole = whole_gpu_request(fallback_pod(40, 20), [small, large, None])
    assert whole is not None and whole.whole_gpu
    assert whole.admission_mib == 32 * GIB - EMPTY_SLACK_MIB  # an empty GPU of the largest size
    assert (whole.predicted_mib, whole.gpus, whole.uid) == (20 * GIB, 1, "uid-w")
    assert whole_gpu_request(fallback_pod(40, 33), [small, large]) is None  # the point fits no GPU: refused
    assert whole_gpu_request(fallback_pod(30, 20), [small, large]) is None  # the bound fits the 32 GiB GPU
    assert whole_gpu_request(fallback_pod(40, 20), [small, large, node("x", (80, 79, 0))]) is None  # fits 80 GiB
    override = PodRequest("uid-o", "ns", "o", 1, 40 * GIB, 20 * GIB, 10.0, True)  # the user's gpu-memory
    assert whole_gpu_request(override, [small, large]) is None
    assert whole_gpu_request(whole, [small, large]) is None  # never applied twice
    assert whole_gpu_request(fallback_pod(40, 20), []) is None
    assert whole_gpu_request(fallback_pod(40, 20), [None]) is None


def test_whole_gpu_request_of_a_multi_gpu_pod_reads_the_per_gpu_size_of_nodes_with_enough_gpus() -> None:
    two_small = node("a", (32, 0, 0), (24, 0, 0))  # a 2-GPU pod gets 24 GiB GPUs here at most
    one_big = node("b", (80, 0, 0))  # too few GPUs for a 2-GPU pod
    assert largest_gpu_mib([two_small, one_big], 2) == 24 * GIB
    assert largest_gpu_mib([two_small, one_big], 1) == 80 * GIB
    assert largest_gpu_mib([one_big], 2) == 0.0
    whole = whole_gpu_request(fallback_pod(30, 20, gpus=2), [two_small, one_big])
    assert whole is not None and whole.admission_mib == 24 * GIB - EMPTY_SLACK_MIB
    assert whole_gpu_request(fallback_pod(30, 25, gpus=2), [two_small, one_big]) is None
    assert whole_gpu_request(fallback_pod(30, 20, gpus=1), [two_small, one_big]) is None  # 80 GiB holds it


def test_filter_admits_a_pod_whose_bound_exceeds_every_gpu_to_an_empty_gpu_only() -> None:
    nodes = {"small": node("small", (16, 0, 0)), "busy": node("busy", (32, 0, 4)), "idle": node("idle", (32, 0.05, 0))}
    request = fallback_pod(40, 20)
    for result in (filter_nodes(request, list(nodes), nodes, NOW, P), _columnar(request, list(nodes), nodes)):
        assert result.passed == ("idle",)
        assert result.request is not None and result.request.whole_gpu
        assert result.unresolvable == {"small": "needs a whole GPU of 32.0 GiB (its upper bound exceeds every GPU it "
                                                "could be given), larger than this node's GPUs (16.0 GiB)"}
        assert result.failed == {"busy": "gpu-0: needs a whole GPU (31.9 GiB free), 28.0 GiB free"}
        assert result.kinds == {"passed": 1, "too_large": 1, "memory": 1}
    chosen = choose_gpus(result.request, nodes["idle"], P)
    assert chosen is not None
    assert reserved_per_gpu(result.request, (g.capacity_mib for g in chosen)) == 32 * GIB  # the whole GPU
    assert reserved_per_gpu(request, [32 * GIB]) == 40 * GIB  # not whole: its admission


def test_a_bound_that_fits_a_busy_larger_gpu_waits_for_it_and_a_point_above_every_gpu_is_refused() -> None:
    nodes = {"small": node("small", (16, 0, 0)), "big": node("big", (80, 0, 60))}
    result = filter_nodes(fallback_pod(40, 20), list(nodes), nodes, NOW, P)
    assert result.passed == () and result.request is None  # no fallback: the 80 GiB GPU will free
    assert result.failed == {"big": "gpu-0: needs 40.0 GiB, 20.0 GiB free"}
    only_small = {"small": nodes["small"]}
    result = filter_nodes(fallback_pod(40, 17), ["small"], only_small, NOW, P)
    assert result.passed == () and result.request is None
    assert result.unresolvable == {"small": "predicted 17.0 GiB per GPU (upper bound 40.0 GiB), larger than this "
                                            "node's GPUs (16.0 GiB)"}
    assert _columnar(fallback_pod(40, 17), ["small"], only_small) == result


def test_a_whole_gpu_is_not_shared_and_a_smaller_pod_does_not_take_it() -> None:
    """After bind (its whole capacity reserved) nothing else fits on that GPU, however small."""
    taken = node("n", (32, 0.05, 32), (32, 0, 0))
    nodes = {"n": taken}
    second = filter_nodes(fallback_pod(40, 20), ["n"], nodes, NOW, P)
    assert second.passed == ("n",) and second.request is not None
    assert [g.index for g in choose_gpus(second.request, taken, P) or ()] == [1]
    full = {"n": node("n", (32, 0.05, 32))}
    assert filter_nodes(pod(0.2), ["n"], full, NOW, P).failed == {"n": "gpu-0: needs 0.2 GiB, 0.0 GiB free"}
    assert filter_nodes(fallback_pod(40, 20), ["n"], full, NOW, P).failed == {
        "n": "gpu-0: needs a whole GPU (31.9 GiB free), 0.0 GiB free"}


@st.composite
def fallback_case_st(draw: st.DrawFn) -> tuple[dict[str, NodeView], list[str], PodRequest]:
    """GPUs of common sizes, often idle; a pod whose bound is above or near the largest GPU of the
    candidates and whose point estimate is around it: the whole-GPU fallback applies in many draws."""
    nodes = {}
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.lists(st.tuples(st.sampled_from([16.0, 24.0, 32.0, 40.0, 80.0]),
                                       st.sampled_from([0.0, 0.0, 0.001, 0.3, 1.0]),
                                       st.sampled_from([0.0, 0.0, 0.5, 1.0]),
                                       st.booleans()), min_size=1, max_size=4))
        nodes[f"n{i}"] = NodeView(f"n{i}", tuple(GpuView(f"n{i}-g{j}", j, c * GIB, c * u * GIB, c * r * GIB, 0.1,
                                                         healthy or j == 0)
                                                 for j, (c, u, r, healthy) in enumerate(gpus)),
                                  NOW - draw(st.sampled_from([0.0, 5.0, 60.0])))
    names = draw(st.lists(st.sampled_from([*nodes, "ghost"]), min_size=1, max_size=8))
    gpus = draw(st.integers(1, 3))
    largest = largest_gpu_mib(map(nodes.get, names), gpus) or 16 * GIB
    request = PodRequest("uid-w", "ns", "w", gpus, largest * draw(st.floats(0.9, 1.6)),
                         largest * draw(st.floats(0.3, 1.1)), draw(st.floats(0, 45)), True, draw(st.booleans()))
    return nodes, names, request


@settings(max_examples=300, deadline=None)
@given(fallback_case_st())
def test_columnar_filter_equals_the_reference_under_the_whole_gpu_fallback(
        case: tuple[dict[str, NodeView], list[str], PodRequest]) -> None:
    nodes, names, request = case
    result = filter_nodes(request, names, nodes, NOW, P)
    assert _columnar(request, names, nodes) == result
    matrix = NodeMatrix(rows=2, cols=1)
    for view in nodes.values():
        matrix.put(view)
    for gpus in (1, 2, 3, 5):
        assert largest_gpu_rows(matrix, names, gpus) == largest_gpu_mib(map(nodes.get, names), gpus)
    if result.request is not None:  # what the fallback placed: empty GPUs the point fits, the bound does not
        assert result.request.whole_gpu and request.fallback
        assert result.request.admission_mib == largest_gpu_mib(map(nodes.get, names), request.gpus) - EMPTY_SLACK_MIB
        for name in result.passed:
            chosen = choose_gpus(result.request, nodes[name], P)
            assert chosen is not None and len(chosen) == request.gpus
            assert all(g.empty and request.predicted_mib <= g.capacity_mib for g in chosen)
            assert nodes[name].capacity_desc[request.gpus - 1] < request.admission_mib
    else:
        plain = filter_nodes(replace(request, fallback=False), names, nodes, NOW, P)  # only the words may differ
        assert (result.passed, result.failed.keys(), result.unresolvable.keys(), result.kinds) == (
            plain.passed, plain.failed.keys(), plain.unresolvable.keys(), plain.kinds)


def _columnar(request: PodRequest, names: list[str], nodes: dict[str, NodeView]) -> FilterResult:
    matrix = NodeMatrix()
    for view in nodes.values():
        matrix.put(view)
    return filter_matrix(request, names, matrix, nodes, NOW, P)


def test_a_multi_gpu_whole_gpu_request_takes_empty_gpus_only() -> None:
    """Found by the property above: a 2-GPU pod falls back to whole GPUs of the second-largest size
    (16 GiB) while the node also has a larger GPU half held (32 GiB, 16 GiB reserved, 16 GiB free). The
    fit test saw 16 GiB free there, bind took it and reserved it whole (32 GiB) over the 16 GiB it
    held: an over-commit. Whole GPUs are empty GPUs, in the reference and the columnar filter alike."""
    mixed = node("n0", (32, 0, 16), (16, 0, 0))
    request = fallback_pod(24, 16, gpus=2)
    for result in (filter_nodes(request, ["n0"], {"n0": mixed}, NOW, P), _columnar(request, ["n0"], {"n0": mixed})):
        assert result.passed == (), result
    spare = node("n1", (32, 0, 16), (16, 0, 0), (16, 0, 0))
    result = filter_nodes(request, ["n1"], {"n1": spare}, NOW, P)
    assert result.passed == ("n1",) and result.request is not None and result.request.whole_gpu
    assert _columnar(request, ["n1"], {"n1": spare}) == result
    chosen = choose_gpus(result.request, spare, P)
    assert chosen is not None and sorted(g.index for g in chosen) == [1, 2]


# ---- scoring rules ----

def test_low_priority_packs_into_partly_used_gpu() -> None:
    nodes = {"busy": node("busy", (40, 28, 0)), "idle": node("idle", (40, 0, 0))}
    low = pod(10, priority=5)
    scores = dict(score_nodes(low, ["busy", "idle"], nodes, P))
    assert scores["busy"] > scores["idle"]


def test_high_priority_spreads_to_least_utilised_gpu() -> None:
    nodes = {"busy": node("busy", (40, 28, 0), util=0.9), "idle": node("idle", (40, 0, 0))}
    high = pod(10, priority=30)
    scores = dict(score_nodes(high, ["busy", "idle"], nodes, P))
    assert scores["idle"] > scores["busy"]


def test_choose_gpus_best_fit_prefers_partly_used_and_keeps_whole_gpus() -> None:
    view = node("n", (40, 0, 0), (40, 20, 0), (40, 35, 0))
    assert [g.index for g in choose_gpus(pod(10, priority=0), view, P) or ()] == [1]
    assert [g.index for g in choose_gpus(pod(10, priority=40), view, P) or ()] == [0]
    assert choose_gpus(pod(30, gpus=2), view, P) is None


def test_ties_broken_towards_fewer_fragmented_gpus() -> None:
    # same fit on the chosen GPU, but placing on "frag" leaves one more partly used GPU
    whole = node("whole", (40, 20, 0), (40, 0, 0))
    frag = node("frag", (40, 20, 0), (40, 10, 0))
    low = pod(20, priority=0)
    assert score_node(low, whole, P) > score_node(low, frag, P)


# ---- priority ----

def test_priority_formula() -> None:
    base = PriorityInputs(criticality=1, gpu_seconds=3600.0, gpus=1)
    size = 5 * (1 - math.log10(3601) / math.log10(1 + 1e6))
    assert priority_of(base, NOW, P) == pytest.approx(10 + size)
    urgent = PriorityInputs(criticality=1, deadline_s=NOW + 7200, gpu_seconds=3600.0, gpus=1)
    assert priority_of(urgent, NOW, P) == pytest.approx(10 + 5 + size)
    late = PriorityInputs(criticality=1, deadline_s=NOW - 10, gpu_seconds=3600.0, gpus=1)
    assert priority_of(late, NOW, P) == pytest.approx(10 + 10 + size)


@given(st.integers(0, 3), st.one_of(st.none(), st.floats(-1e7, 1e7)), st.floats(0, 1e9), st.integers(1, 64),
       st.floats(0, 1e7))
def test_priority_bounded_and_criticality_dominates(level: int, deadline: float | None, gpu_s: float, gpus: int,
                                                   now: float) -> None:
    value = priority_of(PriorityInputs(level, None if deadline is None else now + deadline, gpu_s, gpus), now, P)
    assert 10 * level <= value <= 10 * level + 15 + 1e-9
    if level < 3:
        above = priority_of(PriorityInputs(level + 1, None, 1e12, gpus), now, P)
        assert above >= value - 15 + 10 - 1e-9


def test_criticality_helpers() -> None:
    assert criticality_level(" High ") == 2
    with pytest.raises(ValueError):
        criticality_level("urgent")
    assert cap_criticality(3, 1) == 1 and cap_criticality(0, 2) == 0
    assert [criticality_from_priority_class(v) for v in (-5, 0, 1000, 2_000_000_000)] == [0, 1, 2, 3]


# ---- usage ----

def reservation(uid: str = "r", gpus: tuple[str, ...] = ("n-g0",), mem_gib: float = 10, level: int = 1,
                bound_s: float = NOW - 1000, node_name: str = "n", deadline: float | None = None) -> Reservation:
    return Reservation(uid, "ns", uid, node_name, gpus, mem_gib * GIB, mem_gib * GIB, mem_gib * GIB,
                       PriorityInputs(level, deadline, 1e5, len(gpus)), bound_s, "sig")


def observed(res: Reservation, peak_mib: float, times: list[float]) -> Reservation:
    for t in times:
        res = follow_usage(res, peak_mib, t, P)
    return res


def test_usage_goes_up_at_once_and_down_only_once_the_peak_is_shown() -> None:
    fresh = reservation(bound_s=NOW - 10)
    assert follow_usage(fresh, 2 * GIB, NOW, P).memory_mib == fresh.memory_mib  # before the warm-up: held
    old = reservation()
    assert follow_usage(old, 2 * GIB, NOW, P).memory_mib == old.memory_mib  # one sample shows no plateau
    assert follow_usage(fresh, 20 * GIB, NOW, P).memory_mib == pytest.approx(20 * GIB * P.usage_margin)  # up: at once
    plateau = [NOW + P.usage_plateau_s * k / (P.usage_plateau_samples - 1) for k in range(P.usage_plateau_samples)]
    assert observed(old, 2 * GIB, plateau[:-1]).memory_mib == old.memory_mib  # flat, but not long enough
    assert observed(old, 2 * GIB, plateau).memory_mib == pytest.approx(2 * GIB * P.usage_margin)
    assert observed(old, 10.0, plateau).memory_mib == P.min_reservation_mib
    growing = observed(old, 2 * GIB, plateau[:-1])
    growing = observed(growing, 3 * GIB, [plateau[-1]])  # it grew: the plateau starts again, nothing lowered
    assert growing.memory_mib == old.memory_mib and growing.track is not None and growing.track.peak_mib == 3 * GIB


def test_a_lowered_reservation_whose_job_grows_again_is_restored_and_marked() -> None:
    old = reservation()
    times = [NOW + P.usage_plateau_s * k / (P.usage_plateau_samples - 1) for k in range(P.usage_plateau_samples)]
    lowered = observed(old, 2 * GIB, times)
    assert lowered.memory_mib == pytest.approx(2 * GIB * P.usage_margin)
    regrown = follow_usage(lowered, 6 * GIB, times[-1] + 5, P)
    assert regrown.track is not None and regrown.track.regrown
    assert regrown.memory_mib == pytest.approx(6 * GIB * P.usage_margin)  # back to what it is seen to need
    settled = observed(regrown, 6 * GIB, [times[-1] + 5 + t - NOW for t in times])
    assert settled.track is not None and not settled.track.regrown
    assert settled.memory_mib == pytest.approx(6 * GIB * P.usage_margin)
    within = follow_usage(lowered, 2 * GIB * 1.01, times[-1] + 5, P)  # creep below PLATEAU_GROWTH: followed,
    assert within.track is not None and not within.track.regrown  # still flat: no alarm
    assert within.memory_mib == pytest.approx(2 * GIB * 1.01 * P.usage_margin)


def test_peak_store_is_bounded_and_corrects_admission() -> None:
    store = PeakStore(capacity=2)
    store.record("a", 1000.0)
    store.record("a", 800.0)
    store.record("b", 500.0)
    store.record("c", 100.0)
    assert store.get("a") is None and len(store) == 2
    correction = store.get("b")
    assert correction is not None and correction.observations == 1
    one = PolicyParams(correction_min_pods=1, correction_min_nodes=1)
    assert corrected_admission(9000.0, correction, one) == pytest.approx(max(500.0 * P.usage_margin,
                                                                               P.min_reservation_mib))
    assert corrected_admission(9000.0, correction, P) == 9000.0  # one pod on one node: not enough
    assert corrected_admission(9000.0, None, P) == 9000.0


def test_no_single_node_moves_a_signatures_admission() -> None:
    store = PeakStore()
    upper = 8000.0
    for i in range(5):  # one node's agent reports peaks of 0.001 and of a whole GPU, many pods
        store.record("low", 1.0, f"l{i}", "liar")
        store.record("high", 80_000.0, f"h{i}", "liar")
    assert corrected_admission(upper, store.get("low"), P) == upper
    assert corrected_admission(upper, store.get("high"), P) == upper
    store.record("low", 6000.0, "honest-1", "n2")  # now two nodes: lower only to what every node saw
    assert corrected_admission(upper, store.get("low"), P) == pytest.approx(6000.0 * P.usage_margin)
    store.record("high", 7000.0, "honest-2", "n2")  # one node above the bound, one below: the bound holds
    assert corrected_admission(upper, store.get("high"), P) == upper
    store.record("high", 9000.0, "honest-3", "n3")  # two nodes above it: up to the second largest
    assert corrected_admission(upper, store.get("high"), P) == pytest.approx(9000.0 * P.usage_margin)
    correction = store.get("high")
    assert correction is not None and (correction.observations, correction.nodes) == (7, 3)
    store.record("high", 9500.0, "honest-3", "n3")  # the same pod again is not another pod
    correction = store.get("high")
    assert correction is not None and correction.observations == 7


# ---- preemption ----

#: the strictness of the rule itself, without the minimum gap of a criticality level
FINE = replace(P, preempt_min_gap=0.0)


def test_preemption_evicts_only_strictly_lower_priority_and_minimal_sets() -> None:
    view = node("n", (40, 0, 35))
    low = reservation("low", mem_gib=20, level=0)
    mid = reservation("mid", mem_gib=15, level=1)
    request = pod(20, priority=priority_of(mid.priority_inputs, NOW, P))  # equal to mid: mid is no victim
    assert plan_victims(request, view, [low, mid], NOW, FINE) == ("low",)
    assert plan_victims(request, view, [low, mid], NOW, P) is None  # low is less than one level below
    assert plan_victims(pod(20, priority=priority_of(low.priority_inputs, NOW, P) + 10.5), view, [low, mid], NOW,
                        P) == ("low",)
    request_low = pod(20, priority=0.0)
    assert plan_victims(request_low, view, [low, mid], NOW, FINE) is None
    assert plan_victims(pod(4), view, [low, mid], NOW, P) == ()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(1, 20), st.integers(0, 1)), max_size=6),
       st.floats(1, 40), st.floats(0, 45))
def test_preemption_victims_are_lower_priority_and_make_room(res_spec: list[tuple[int, float, int]],
                                                            need: float, prio: float) -> None:
    reservations = [reservation(f"r{i}", (f"n-g{g}",), mem, level) for i, (level, mem, g) in enumerate(res_spec)]
    reserved = [sum(r.memory_mib for r in reservations if r.gpu_uuids[0] == f"n-g{g}") for g in range(2)]
    view = NodeView("n", tuple(GpuView(f"n-g{g}", g, 40 * GIB, 0.0, reserved[g]) for g in range(2)), NOW)
    request = pod(need, priority=prio)
    victims = plan_victims(request, view, reservations, NOW, P)
    if victims is None:
        return
    by_uid = {r.pod_uid: r for r in reservations}
    for uid in victims:
        assert priority_of(by_uid[uid].priority_inputs, NOW, P) <= prio - P.preempt_min_gap
    freed = [reserved[g] - sum(by_uid[u].memory_mib for u in victims if by_uid[u].gpu_uuids[0] == f"n-g{g}")
             for g in range(2)]
    assert any(40 * GIB - f >= need * GIB - 1e-6 for f in freed)


@settings(max_examples=150, deadline=None)
@given(cluster_st(), names_st, pod_st)
def test_batch_scoring_equals_per_node_scoring(nodes: dict[str, NodeView], names: list[str],
                                              request: PodRequest) -> None:
    assert score_nodes(request, names, nodes, P) == [(n, score_node(request, nodes.get(n), P))
                                                     for n in dict.fromkeys(names)]


# ---- the columnar (numpy) path gives the same answers ----

@settings(max_examples=200, deadline=None)
@given(cluster_st(), names_st, pod_st, st.lists(st.sampled_from([f"n{i}" for i in range(8)]), max_size=4))
def test_columnar_filter_and_score_equal_the_reference(nodes: dict[str, NodeView], names: list[str],
                                                      request: PodRequest, removed: list[str]) -> None:
    matrix = NodeMatrix(rows=2, cols=1)  # small: exercises growing rows and columns
    for view in nodes.values():
        matrix.put(view)
    for name in removed:  # nodes that left: their rows are reused
        matrix.remove(name)
        nodes.pop(name, None)
    for view in nodes.values():
        matrix.put(view)
    assert filter_matrix(request, names, matrix, nodes, NOW, P) == filter_nodes(request, names, nodes, NOW, P)
    assert score_matrix(request, names, matrix, nodes, P).pairs() == score_nodes(request, names, nodes, P)
    spread = PodRequest(request.uid, "ns", "p", request.gpus, request.admission_mib, 0.0, 40.0)
    assert score_matrix(spread, names, matrix, nodes, P).pairs() == score_nodes(spread, names, nodes, P)


@settings(max_examples=150, deadline=None)
@given(cluster_st(), names_st, pod_st,
       st.lists(st.tuples(st.booleans(), st.sampled_from([f"n{i}" for i in range(8)])), max_size=12))
def test_remembered_lookups_follow_nodes_joining_and_leaving(nodes: dict[str, NodeView], names: list[str],
                                                             request: PodRequest,
                                                             changes: list[tuple[bool, str]]) -> None:
    matrix = NodeMatrix(rows=2, cols=1)
    for view in nodes.values():
        matrix.put(view)
    for join, name in changes:
        result = filter_matrix(request, names, matrix, nodes, NOW, P)  # remembers its list and the passed one
        if join:
            nodes[name] = node(name, (40, 0, 0))
            matrix.put(nodes[name])
        else:
            matrix.remove(name)
            nodes.pop(name, None)
        for listed in (names, list(result.passed)):
            looked = matrix.lookup(list(listed))  # new list objects, same names
            assert looked.names == list(dict.fromkeys(listed))
            assert looked.rows.tolist() == [matrix.index.get(n, -1) for n in looked.names]
        assert filter_matrix(request, names, matrix, nodes, NOW, P) == filter_nodes(request, names, nodes, NOW, P)


def test_the_passed_names_of_a_filter_are_looked_up_once() -> None:
    nodes = {n.name: n for n in (node("a", (40, 0, 0)), node("b", (16, 0, 0)), node("c", (40, 10, 0)))}
    matrix = NodeMatrix()
    for view in nodes.values():
        matrix.put(view)
    result = filter_matrix(pod(20), ["c", "b", "a", "c"], matrix, nodes, NOW, P)
    assert result.passed == ("c", "a")
    rows = dict(matrix.index)
    matrix.index = Unreadable(rows)
    looked = matrix.lookup(["c", "a"])  # what kube-scheduler sends to prioritize next: no name is looked up
    assert looked.names == ["c", "a"] and looked.rows.tolist() == [rows["c"], rows["a"]]
    assert not looked.rows.flags.writeable  # shared between verbs
    with pytest.raises(AssertionError):
        matrix.lookup(["a", "c"])  # another list is


@pytest.mark.parametrize("names", [("c", "a", "b"), ("c", "a", "c", "b"), ["c", "a", "b"]])
def test_when_every_candidate_passes_the_prioritize_list_is_looked_up_once(names: Any) -> None:
    """The usual answer (every node passes), with the names as ExtenderArgs has them (a tuple),
    repeated, or a list: the passed list is what the filter looked up, remembered for prioritize."""
    nodes = {n.name: n for n in (node("a", (40, 0, 0)), node("b", (40, 10, 0)), node("c", (40, 0, 0)))}
    matrix = NodeMatrix()
    for view in nodes.values():
        matrix.put(view)
    result = filter_matrix(pod(20), names, matrix, nodes, NOW, P)
    assert result == filter_nodes(pod(20), names, nodes, NOW, P)
    assert result.passed == ("c", "a", "b")
    rows = dict(matrix.index)
    matrix.index = Unreadable(rows)
    looked = matrix.lookup(list(result.passed))
    assert looked.names == ["c", "a", "b"] and looked.rows.tolist() == [rows["c"], rows["a"], rows["b"]]


def test_the_index_is_compacted_once_the_nodes_stop_changing_and_answers_the_same() -> None:
    """After COMPACT_AFTER_PUTS writes without a node joining or leaving, the name index is rebuilt
    from new objects; lookups and filters answer as before, and a join afterwards still counts."""
    from extender.policy.columnar import COMPACT_AFTER_PUTS

    nodes = {n.name: n for n in (node("a", (40, 0, 0)), node("b", (16, 0, 0)), node("c", (40, 10, 0)))}
    matrix = NodeMatrix()
    for view in nodes.values():
        matrix.put(view)
    before = matrix.index
    expected = filter_nodes(pod(20), ["c", "b", "a", "x"], nodes, NOW, P)
    for _ in range(COMPACT_AFTER_PUTS - 2):  # the last join's own write counts as the first
        matrix.put(nodes["b"])
    assert matrix.index is before
    matrix.put(nodes["b"])
    assert matrix.index is not before and matrix.index == dict(before)
    assert all(a is not b for a, b in zip(matrix.index, before, strict=True))
    assert filter_matrix(pod(20), ["c", "b", "a", "x"], matrix, nodes, NOW, P) == expected
    nodes["d"] = node("d", (40, 0, 0))
    matrix.put(nodes["d"])
    matrix.remove("a")
    del nodes["a"]
    assert filter_matrix(pod(20), ["d", "c", "a"], matrix, nodes, NOW, P) == \
        filter_nodes(pod(20), ["d", "c", "a"], nodes, NOW, P)


class Unreadable(dict[str, int]):
    def get(self, *_: object) -> None:  # type: ignore[override]
        raise AssertionError("a remembered lookup read the index")


# ---- one definition per rule: the preemption node choice, the columnar twins ----

def test_preemption_node_choice_prefers_the_lowest_victim_priority_over_fewer_victims() -> None:
    """`choose_preemption` (self-preemption and the replay): node "a" needs one normal-criticality victim,
    node "b" two low ones; "b" wins (its highest victim ranks lower), though "a" needs fewer victims."""
    a = node("a", (16, 0, 12))
    b = node("b", (16, 0, 12))
    on_a = [reservation("a1", ("a-g0",), 12, level=1, node_name="a")]
    on_b = [reservation("b1", ("b-g0",), 6, level=0, node_name="b"),
            reservation("b2", ("b-g0",), 6, level=0, node_name="b")]
    request = pod(14, priority=25.0)
    found = choose_preemption(request, [(a, on_a), (b, on_b)], NOW, P)
    assert found is not None
    assert found[0] == "b" and sorted(r.pod_uid for r in found[1]) == ["b1", "b2"]
    # equal highest priority: the fewer victims win, then the first name
    on_b_normal = [reservation("b1", ("b-g0",), 12, level=1, node_name="b")]
    found = choose_preemption(request, [(b, on_b_normal), (a, on_a)], NOW, P)
    assert found is not None and found[0] == "a" and [r.pod_uid for r in found[1]] == ["a1"]
    assert choose_preemption(pod(14, priority=0.5), [(a, on_a), (b, on_b)], NOW, P) is None  # no one lower


@settings(max_examples=200, deadline=None)
@given(cluster_st(), pod_st, st.floats(0, 60))
def test_columnar_twins_equal_the_single_scalar_rules(nodes: dict[str, NodeView], request: PodRequest,
                                                      age: float) -> None:
    """fits_rows / fresh_rows / gpu_keys hold the same answers as gpus_fit / is_fresh / gpu_key."""
    matrix = NodeMatrix(rows=2, cols=1)
    for view in nodes.values():
        matrix.put(view)
    names = list(nodes)
    rows = np.array([matrix.index[n] for n in names], dtype=np.int64)
    now = NOW + age
    a = matrix.arrays
    assert fits_rows(a, rows, request.gpus, request.admission_mib).tolist() == [
        gpus_fit(nodes[n].free_desc, request.gpus, request.admission_mib) for n in names]
    assert fresh_rows(a, rows, now, P).tolist() == [is_fresh(nodes[n].received_s, now, P) for n in names]
    for n, r in zip(names, rows.tolist(), strict=True):
        healthy = nodes[n].healthy
        for spread in (False, True):
            keys = gpu_keys(a.free[r, :len(healthy)], a.util[r, :len(healthy)], a.empty[r, :len(healthy)],
                            request.admission_mib, spread)
            assert keys.tolist() == [gpu_key(g.free_mib, g.utilization, g.empty, request.admission_mib, spread)
                                     for g in healthy]


def test_observe_usage_records_peaks_only_once_shown() -> None:
    """The extender's state and the replay share this: before the pod has shown its peak neither the
    reservation nor the signature's peak moves down; after it both do."""
    peaks = PeakStore(10)
    young = reservation(bound_s=NOW - P.usage_warmup_s + 1)
    assert observe_usage(young, 3 * GIB, NOW, P, peaks).memory_mib == young.memory_mib and peaks.get("sig") is None
    old = reservation(bound_s=NOW - P.usage_warmup_s)
    for t in usage_reports_s(P):
        old = observe_usage(old, 3 * GIB, NOW + t, P, peaks)
    assert old.memory_mib == pytest.approx(3 * GIB * P.usage_margin)
    correction = peaks.get("sig")
    assert correction is not None and correction.peak_mib == 3 * GIB


def test_occupied_memory_counts_foreign_use_beside_reservations() -> None:
    import numpy as np

    from extender.policy.usage import occupied_mib, occupied_mib_array

    # 9 GiB used by a process deepres did not place, 6 GiB reserved for a pod that has not allocated yet
    assert occupied_mib(9216.0, 6144.0, 9216.0) == 15360.0
    assert occupied_mib(12000.0, 6144.0, 0.0) == 12000.0  # never less than what the GPU uses
    used, reserved, foreign = np.array([9216.0, 12000.0]), np.array([6144.0, 6144.0]), np.array([9216.0, 0.0])
    assert occupied_mib_array(used, reserved, foreign).tolist() == [15360.0, 12000.0]
    gpu = GpuView("u", 0, 16384.0, used_mib=9216.0, reserved_mib=6144.0, foreign_mib=9216.0)
    assert gpu.free_mib == 1024.0


def test_pending_reservations_come_on_top_of_unattributed_use() -> None:
    import numpy as np

    from extender.policy.usage import occupied_mib, occupied_mib_array

    # 20 GiB used, no process list; 8 GiB reserved of which 6 GiB by pods too young to show in it
    assert occupied_mib(20480.0, 8192.0, 0.0, 6144.0) == 20480.0 + 6144.0
    assert occupied_mib(20480.0, 8192.0, 0.0, 0.0) == 20480.0  # all settled: they may be inside the use
    assert occupied_mib(0.0, 8192.0, 0.0, 8192.0) == 8192.0  # an idle GPU: the reservations, once
    assert occupied_mib(0.0, 1024.0, 0.0, 4096.0) == 1024.0  # never more pending than reserved
    used, reserved, pending = np.array([20480.0, 0.0]), np.array([8192.0, 1024.0]), np.array([6144.0, 4096.0])
    assert occupied_mib_array(used, reserved, 0.0, pending).tolist() == [26624.0, 1024.0]
    gpu = GpuView("u", 0, 32768.0, used_mib=20480.0, reserved_mib=8192.0, pending_mib=6144.0)
    assert gpu.free_mib == 32768.0 - 26624.0


def test_shortlist_keeps_the_best_scores_in_input_order_ties_to_the_earlier() -> None:
    scores = [3, 9, 5, 9, 1, 5, 10, 5]
    assert shortlist(scores, 3).tolist() == [1, 3, 6]
    assert shortlist(scores, 5).tolist() == [1, 2, 3, 5, 6]  # the 5s at 2 and 5 before the one at 7
    assert shortlist(scores, 0).tolist() == list(range(8))  # 0: off
    assert shortlist(scores, 8).tolist() == shortlist(scores, 50).tolist() == list(range(8))
    assert shortlist([], 4).tolist() == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10), max_size=60), st.integers(0, 70))
def test_shortlist_no_node_left_out_scores_above_one_kept(scores: list[int], keep: int) -> None:
    """What the shortlist stands on: every node left out scores at most as high as every node kept,
    and a node left out that ties one kept comes later in kube-scheduler's order."""
    chosen = shortlist(scores, keep).tolist()
    assert chosen == sorted(set(chosen)) and len(chosen) == (min(keep, len(scores)) if keep else len(scores))
    left = [i for i in range(len(scores)) if i not in chosen]
    for i in left:
        for j in chosen:
            assert scores[i] < scores[j] or (scores[i] == scores[j] and i > j)
