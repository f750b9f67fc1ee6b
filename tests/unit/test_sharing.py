"""Sharing only where it pays (policy/sharing.py) and preemption bounded by attained service or a
declared checkpoint interval (policy/preemption.py). The slowdowns that make the rule refuse are
checked against the REAL co-location measurements, not only against the model."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from extender.policy import GpuView, NodeView, PodRequest, PolicyParams, PriorityInputs, Reservation, filter_nodes
from extender.policy.preemption import evictable, plan_victims, progress_lost_s
from extender.policy.sharing import may_join, predicted_join, sharing_view, wait_for_empty_s
from predictor import datapaths

GIB = 1024.0
P = PolicyParams()
COLOCATION = datapaths.COLOCATION / "h100-2026-11-27.json"  # in the repository (data/README.md)


def pod(duty: float = 1.0, run_s: float = 3600.0, priority: float = 10.0, need: float = 8 * GIB) -> PodRequest:
    return PodRequest("p", "ns", "p", 1, need, need, priority, duty=duty, predicted_run_s=run_s)


def busy(duties: tuple[float, ...], used: float = 20 * GIB, index: int = 0, strict: bool = False) -> GpuView:
    return GpuView(f"g{index}", index, 80 * GIB, used, used, duties=duties, strict=strict)


def empty(index: int = 1) -> GpuView:
    return GpuView(f"g{index}", index, 80 * GIB)


def _measured_slowdown(job: str) -> float:
    raw = json.loads(COLOCATION.read_text(encoding="utf-8"))
    group = next(g for g in raw["groups"] if g["jobs"] == [job, job])
    return max(group["alone_steps_per_s"][job] / s["steps_per_s"] for s in group["shared_steps_per_s"])


@pytest.mark.skipif(not COLOCATION.is_file(), reason="no co-location data")
def test_two_gpu_bound_jobs_really_slow_beyond_the_bound_and_the_rule_refuses() -> None:
    assert _measured_slowdown("r50_64") > P.max_slowdown  # measured: ~1.6-1.7
    assert not may_join(pod(1.0), busy((1.0,)), P, wait_s=math.inf)


@pytest.mark.skipif(not COLOCATION.is_file(), reason="no co-location data")
def test_two_input_bound_jobs_really_share_well_and_the_rule_lets_them() -> None:
    assert _measured_slowdown("r50_64w") < P.max_slowdown  # measured: ~1.23
    # r50_64w's duty as NVML measures it: 0.43 (reports/interference.json measured_duties; 0.5 by its waits)
    assert may_join(pod(0.45), busy((0.45,)), P, wait_s=math.inf)


def test_high_and_critical_pods_get_the_tighter_bound() -> None:
    own, others = predicted_join(pod(0.45), busy((0.45,)))
    assert P.max_slowdown_high < max(own, others) <= P.max_slowdown
    assert not may_join(pod(0.45, priority=25.0), busy((0.45,)), P, wait_s=math.inf)  # the pod is high
    assert not may_join(pod(0.45), busy((0.45,), strict=True), P, wait_s=math.inf)  # a high pod runs there
    assert may_join(pod(0.1, priority=25.0), busy((0.1,)), P, wait_s=math.inf)


def test_joining_must_beat_waiting_for_an_empty_gpu() -> None:
    gpu = busy((0.45,))
    own, _ = predicted_join(pod(0.45), gpu)
    run = 3600.0
    assert not may_join(pod(0.45, run_s=run), gpu, P, wait_s=0.0)  # an empty GPU now: take it
    assert not may_join(pod(0.45, run_s=run), gpu, P, wait_s=run * (own - 1) * 0.9)
    assert may_join(pod(0.45, run_s=run), gpu, P, wait_s=run * (own - 1) * 1.1)


def test_work_of_unknown_duty_counts_as_gpu_bound() -> None:
    foreign = GpuView("g0", 0, 80 * GIB, 20 * GIB, 0.0, foreign_mib=20 * GIB)
    assert not may_join(pod(0.3), foreign, P, wait_s=math.inf)


def test_the_filter_sees_unjoinable_gpus_as_full_and_says_compute() -> None:
    node = NodeView("n", (busy((1.0,)),), 0.0)
    view = sharing_view(pod(1.0), node, P, wait_s=math.inf)
    result = filter_nodes(pod(1.0), ["n"], {"n": view}, 0.0, P)
    assert result.passed == () and "compute" in result.failed["n"]
    assert filter_nodes(pod(1.0), ["n"], {"n": node}, 0.0, P).passed == ("n",)  # memory alone would pass
    with_empty = NodeView("n", (busy((1.0,)), empty()), 0.0)
    assert filter_nodes(pod(1.0), ["n"], {"n": sharing_view(pod(1.0), with_empty, P, 0.0)}, 0.0, P).passed == ("n",)
    off = PolicyParams(sharing=False)
    assert sharing_view(pod(1.0), node, off, math.inf) is node  # the memory-only ablation


def test_wait_for_empty_uses_predicted_end_times() -> None:
    assert wait_for_empty_s(100.0, [[(0.0, 500.0), (50.0, 100.0)], [(90.0, 60.0)]]) == 50.0
    assert wait_for_empty_s(100.0, [[(0.0, 500.0)], []]) == 0.0
    assert wait_for_empty_s(100.0, [[(0.0, 10.0)]]) == 50.0  # overdue: half its attained time again
    assert wait_for_empty_s(100.0, []) == math.inf


def _res(uid: str, bound_s: float, checkpoint: float | None = None) -> Reservation:
    return Reservation(uid, "ns", uid, "n", ("g0",), 40 * GIB, 40 * GIB, 40 * GIB, PriorityInputs(criticality=0),
                       bound_s, checkpoint_interval_s=checkpoint)


def test_preemption_never_throws_away_long_progress() -> None:
    now = 10_000.0
    young, old = _res("young", now - 600.0), _res("old", now - 7200.0)
    checkpointed = _res("ckpt", now - 7200.0 - 300.0, checkpoint=1800.0)  # 5 min since its last checkpoint
    assert progress_lost_s(checkpointed, now) == pytest.approx(300.0)
    assert evictable(young, now, P) and not evictable(old, now, P) and evictable(checkpointed, now, P)
    node = NodeView("n", (GpuView("g0", 0, 80 * GIB, 80 * GIB, 80 * GIB),), now)
    high = PodRequest("h", "ns", "h", 1, 40 * GIB, 40 * GIB, 30.0)
    assert plan_victims(high, node, [old], now, P) is None  # 2 h of work: not thrown away
    assert plan_victims(high, node, [old, young], now, P) == ("young",)
    assert plan_victims(high, node, [old, checkpointed], now, P) == ("ckpt",)


def test_the_live_filter_and_bind_apply_the_rule() -> None:
    """The extender's columnar filter knows memory only: `apply_sharing` moves a node whose busy GPUs
    the pod may not join to the failed ones; the ledger's reserve_on (bind) refuses it there too."""
    from extender.ledger import Ledger
    from extender.policy.columnar import filter_matrix
    from extender.policy.sharing import apply_sharing
    from extender.telemetry import GpuReport, NodeReport

    ledger = Ledger(P)
    ledger.apply_report(NodeReport("n", 1, 1.0, "0", "nvml", (GpuReport("g0", 0, "H100", 80 * GIB, 0.0),),
                                   boot_id="b"), 0.0)
    first = pod(1.0, run_s=3600.0, need=8 * GIB)
    template = Reservation("first", "ns", "first", "n", (), 8 * GIB, 8 * GIB, 8 * GIB,
                           PriorityInputs(gpu_seconds=3600.0), 0.0, duty=1.0)
    assert not isinstance(ledger.reserve_on(first, template, 0.0), str)
    second = PodRequest("second", "ns", "second", 1, 8 * GIB, 8 * GIB, 10.0, duty=1.0, predicted_run_s=3600.0)
    memory_only = filter_matrix(second, ["n"], ledger.matrix, ledger.views, 1.0, P)
    assert memory_only.passed == ("n",)  # 72 GiB free: memory alone would pack it
    wait = ledger.wait_for_empty_s(1, 1.0)
    assert wait == pytest.approx(3599.0)
    shared = apply_sharing(second, memory_only, ledger.views, P, wait)
    assert shared.passed == () and "compute" in shared.failed["n"] and shared.kinds.get("compute") == 1
    refused = ledger.reserve_on(second, replace_uid(template, "second"), 1.0)
    assert isinstance(refused, str)
    light = PodRequest("light", "ns", "light", 1, 8 * GIB, 8 * GIB, 10.0, duty=0.05, predicted_run_s=0.0)
    assert apply_sharing(light, memory_only, ledger.views, P, wait).passed == ("n",)


def replace_uid(res: Reservation, uid: str) -> Reservation:
    from dataclasses import replace

    return replace(res, pod_uid=uid, name=uid)


def test_attained_service_reads_the_clock_of_the_bind() -> None:
    """The live extender's priority runs on wall time, its reservations' bind time on its monotonic
    clock: the attained-service limit must read the latter (`service_now_s`)."""
    wall, mono = 1.8e9, 5_000.0
    young = _res("young", mono - 600.0)
    node = NodeView("n", (GpuView("g0", 0, 80 * GIB, 80 * GIB, 80 * GIB),), mono)
    high = PodRequest("h", "ns", "h", 1, 40 * GIB, 40 * GIB, 30.0)
    assert plan_victims(high, node, [young], wall, P) is None  # read on the wrong clock: 1.8e9 s attained
    assert plan_victims(high, node, [young], wall, P, service_now_s=mono) == ("young",)


def test_wait_for_empty_over_the_cluster_is_exact_and_does_not_scan_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger's wait over every node (asked by each filter and bind) is the least, over the nodes,
    of the k-th shortest wait of a node's GPUs (issue 31: computed by going through every node's GPUs
    and reservations, O(cluster) per pod). Where a node without reservations has k healthy GPUs the
    answer is 0 at once; elsewhere the full answer, the same as node by node."""
    import random

    import extender.ledger as ledger_module
    from extender.ledger import Ledger
    from extender.telemetry import GpuReport, NodeReport

    rng = random.Random(31)
    ledger = Ledger(P)
    names = [f"n{i:03d}" for i in range(200)]
    for name in names:
        gpus = tuple(GpuReport(f"{name}-g{j}", j, "H100", 80 * GIB, 0.0) for j in range(4))
        ledger.apply_report(NodeReport(name, 1, 1.0, "0", "nvml", gpus, boot_id="b"), 0.0)

    def place(i: int, node: str, gpus: int = 1) -> bool:
        job = PodRequest(f"p{i}", "ns", f"p{i}", gpus, 50 * GIB, 50 * GIB, 10.0, duty=0.05, predicted_run_s=0.0)
        template = Reservation(f"p{i}", "ns", f"p{i}", node, (), 50 * GIB, 50 * GIB, 50 * GIB,
                               PriorityInputs(gpu_seconds=rng.uniform(60.0, 7200.0)), rng.uniform(0.0, 1.0),
                               duty=0.05)
        return not isinstance(ledger.reserve_on(job, template, 1.0), str)  # telemetry fresh (sent at 0)

    def node_by_node(k: int, now: float) -> float:  # the rule's definition, per node
        return min(ledger.wait_for_empty_s(k, now, [n]) for n in names)

    calls = []
    real = ledger_module.wait_for_empty_s
    monkeypatch.setattr(ledger_module, "wait_for_empty_s", lambda now, gpus: calls.append(1) or real(now, gpus))
    for i in range(150):  # most nodes still empty: the wait is 0, found without a scan
        place(i, names[i % 60])
    calls.clear()
    assert ledger.wait_for_empty_s(2, 150.0) == 0.0
    assert len(calls) < 4 * 5, f"{len(calls)} GPUs looked at for a wait an empty node answers"
    i = 150
    for name in names:  # every GPU holds a pod now (one 50 GiB pod each): the full answer, exact
        while place(i, name, rng.choice((1, 2))) or place(i + 1, name):
            i += 2
    for k in (1, 2, 4):
        for now in (150.0, 900.0, 5000.0):
            assert ledger.wait_for_empty_s(k, now) == pytest.approx(node_by_node(k, now))
    assert node_by_node(1, 150.0) > 0.0  # (the case above is not the trivial one)


def test_a_gpu_holding_memory_deepres_did_not_place_is_no_gpu_to_wait_for() -> None:
    """W (the wait for an empty GPU) counted every GPU without a reservation of ours as empty now: one GPU
    full of another scheduler's pod (or any process deepres did not place) made W 0 for the whole cluster,
    and then no pod with a run time joined a busy GPU (joining had to beat waiting no time at all), while
    that GPU emptied at no time deepres could predict. Now such a GPU waits forever and W is that of the
    GPUs deepres holds."""
    from extender.ledger import Ledger
    from extender.telemetry import GpuReport, NodeReport

    ledger = Ledger(P)
    full = GpuReport("x-g0", 0, "H100", 80 * GIB, 79 * GIB)  # used, no process of ours on it
    ledger.apply_report(NodeReport("x", 1, 1.0, "0", "nvml", (full,), boot_id="b"), 0.0)
    ledger.apply_report(NodeReport("y", 1, 1.0, "0", "nvml", (GpuReport("y-g0", 0, "H100", 80 * GIB, 0.0),),
                                   boot_id="b"), 0.0)
    job = PodRequest("p", "ns", "p", 1, 20 * GIB, 20 * GIB, 10.0, duty=0.3, predicted_run_s=1000.0)
    held = Reservation("p", "ns", "p", "y", (), 20 * GIB, 20 * GIB, 20 * GIB, PriorityInputs(gpu_seconds=1000.0),
                       0.0, duty=0.3)
    assert not isinstance(ledger.reserve_on(job, held, 1.0), str)
    assert ledger.wait_for_empty_s(1, 100.0) == pytest.approx(900.0)  # y's pod ends then; x is not empty
    assert ledger.wait_for_empty_s(1, 100.0, ["x"]) == math.inf
    # an empty GPU elsewhere is still found at once
    ledger.apply_report(NodeReport("z", 1, 1.0, "0", "nvml", (GpuReport("z-g0", 0, "H100", 80 * GIB, 0.0),),
                                   boot_id="b"), 0.0)
    assert ledger.wait_for_empty_s(1, 100.0) == 0.0


def random_nodes(rng: Any, count: int) -> dict[str, NodeView]:
    """`count` nodes of 1-8 80 GB GPUs, empty, partly or fully used, by jobs of random duties."""
    nodes = {}
    for i in range(count):
        gpus = []
        for j in range(rng.choice((1, 2, 4, 8))):
            used = rng.choice((0.0, 0.0, 4 * GIB, 30 * GIB, 70 * GIB, 80 * GIB))
            duties = tuple(rng.choice((0.05, 0.3, 0.9)) for _ in range(rng.choice((0, 1, 2)))) if used else ()
            gpus.append(GpuView(f"n{i}g{j}", j, 80 * GIB, rng.uniform(0.0, used), used, healthy=rng.random() > 0.1,
                                foreign_mib=rng.choice((0.0, 2 * GIB)), duties=duties, strict=rng.random() < 0.3))
        nodes[f"n{i}"] = NodeView(f"n{i}", tuple(gpus), 0.0)
    return nodes


def test_the_filters_sharing_rule_agrees_with_the_view_bind_uses() -> None:
    """`apply_sharing` (the filter) decides without building `sharing_view` (issue 31); bind decides
    on the view (`Ledger.reserve_on`). Over random nodes, pods and waits both pass the same nodes."""
    import random

    from extender.policy.filtering import gpus_fit
    from extender.policy.sharing import apply_sharing
    from extender.policy.types import FilterResult

    rng = random.Random(7)
    for trial in range(300):
        nodes = random_nodes(rng, 6)
        need = rng.choice((0.0, 8 * GIB, 40 * GIB))
        request = PodRequest("p", "ns", "p", rng.choice((1, 2, 3)), need, need, rng.choice((5.0, 10.0, 30.0)),
                             duty=rng.choice((0.05, 0.5, 1.0)), predicted_run_s=rng.choice((0.0, 600.0, 7200.0)))
        wait = rng.choice((0.0, 300.0, 1e5))
        result = FilterResult(passed=tuple(nodes), failed={}, unresolvable={}, kinds={"passed": len(nodes)},
                              request=request)
        shared = apply_sharing(request, result, nodes, P, wait)
        views = {n: sharing_view(request, v, P, wait) for n, v in nodes.items()}  # unchanged: passed on memory
        by_view = tuple(n for n, v in views.items()
                        if v is nodes[n] or gpus_fit(v.free_desc, request.gpus, request.admission_mib))
        assert shared.passed == by_view, (trial, shared.passed, by_view)


def test_the_filters_sharing_rule_builds_no_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter's rule builds no per-node view (issue 31: one GpuView per busy GPU of every node that
    fits, per filter); its answer is the views' (test above)."""
    from extender.policy import sharing
    from extender.policy.types import FilterResult

    node = NodeView("n", (busy((0.9,), index=0), empty(1)), 0.0)
    request = pod(duty=1.0, run_s=3600.0, need=8 * GIB)
    monkeypatch.setattr(sharing, "sharing_view", lambda *a: pytest.fail("the filter built a view"))
    result = FilterResult(passed=("n",), failed={}, unresolvable={}, kinds={"passed": 1}, request=request)
    assert sharing.apply_sharing(request, result, {"n": node}, P, 0.0).passed == ("n",)  # the empty GPU fits
    # and with enough empty GPUs that fit, the busy ones are not even asked (most nodes of a large cluster)
    monkeypatch.setattr(sharing, "may_join", lambda *a: pytest.fail("a busy GPU was asked"))
    assert sharing.apply_sharing(request, result, {"n": node}, P, 0.0).passed == ("n",)


def test_a_busy_gpu_drains_while_a_higher_priority_pod_waits() -> None:
    drain = PolicyParams(drain=True)
    gpu = busy((0.1,))
    assert may_join(pod(0.1, priority=10.0), gpu, drain, wait_s=math.inf)  # nobody waits
    assert not may_join(pod(0.1, priority=10.0), gpu, drain, wait_s=math.inf, waiting_priority=20.0)
    assert may_join(pod(0.1, priority=30.0), gpu, drain, wait_s=math.inf, waiting_priority=20.0)  # it outranks
    assert may_join(pod(0.1, priority=10.0), gpu, P, wait_s=math.inf, waiting_priority=20.0)  # rule off
    assert may_join(pod(0.1, priority=10.0), empty(), drain, wait_s=math.inf, waiting_priority=20.0)  # empty GPU
    node = NodeView("n", (gpu, empty()), 0.0)
    shown = sharing_view(pod(0.1, priority=10.0), node, drain, math.inf, waiting_priority=20.0)
    assert [g.compute_full for g in shown.gpus] == [True, False]


def test_the_model_error_margin_refuses_joins_the_bare_forecast_allows() -> None:
    own, others = predicted_join(pod(0.45), busy((0.45,)))
    worst = max(own, others)
    assert worst <= P.max_slowdown  # the bare forecast joins
    assert may_join(pod(0.45), busy((0.45,)), P, wait_s=math.inf)
    # the worst held-out error of the model (true slowdown = forecast ** 1.28) would take it past the bound
    assert worst ** 1.28 > P.max_slowdown
    assert not may_join(pod(0.45), busy((0.45,)), PolicyParams(slowdown_error_exponent=1.28), wait_s=math.inf)


def test_sharers_keep_a_memory_margin_on_busy_gpus_only() -> None:
    margin = PolicyParams(share_memory_margin=0.5)
    tight = busy((0.05,), used=70 * GIB)  # 10 GiB free: an 8 GiB pod fits, not with 50 % headroom
    assert may_join(pod(0.05), tight, P, wait_s=math.inf)
    assert not may_join(pod(0.05), tight, margin, wait_s=math.inf)
    assert may_join(pod(0.05), empty(), margin, wait_s=math.inf)


class _NoLookups(dict):  # type: ignore[type-arg]
    """A name index that refuses to be read: a lookup that was remembered never reads it."""

    def get(self, *args: object) -> object:
        raise AssertionError("a name was looked up")


def test_the_filters_columnar_sharing_pass_equals_the_per_name_one_and_remembers_its_list() -> None:
    """`columnar.sharing_matrix` (what the filter runs, issue 31) answers as `apply_sharing`, the rule,
    over random nodes, pods and waits: the same nodes passed in the same order, the same failures and
    counts; and the list it passes is remembered with its rows, so the shortlist and the prioritize
    after it read no name (a filter used to look ~900 fresh names up again there)."""
    import random

    from extender.policy.columnar import NodeMatrix, filter_matrix, sharing_matrix
    from extender.policy.sharing import apply_sharing

    rng = random.Random(11)
    dropped_some = passed_untouched = 0
    for trial in range(400):
        nodes = random_nodes(rng, rng.choice((1, 3, 8)))
        matrix = NodeMatrix(rows=2, cols=1)  # small: grown as nodes arrive
        for view in nodes.values():
            matrix.put(view)
        need = rng.choice((0.0, 8 * GIB, 40 * GIB))
        request = PodRequest("p", "ns", "p", rng.choice((1, 2, 3)), need, need, rng.choice((5.0, 10.0, 30.0)),
                             duty=rng.choice((0.05, 0.5, 1.0)), predicted_run_s=rng.choice((0.0, 600.0, 7200.0)))
        wait = rng.choice((0.0, 300.0, 1e5))
        names = list(nodes)
        rng.shuffle(names)
        memory_only = filter_matrix(request, names, matrix, nodes, 1.0, P)
        expected = apply_sharing(request, memory_only, nodes, P, wait)
        shared = sharing_matrix(request, memory_only, matrix, nodes, P, wait)
        assert shared == expected, (trial, shared, expected)
        if shared.passed == memory_only.passed:
            passed_untouched += 1
            continue
        dropped_some += 1
        index, matrix.index = matrix.index, _NoLookups(matrix.index)
        looked = matrix.lookup(shared.passed)
        matrix.index = index
        assert looked.names == list(shared.passed)
        assert looked.rows.tolist() == [index[n] for n in shared.passed]
    assert dropped_some > 20 and passed_untouched > 20  # both branches were exercised
