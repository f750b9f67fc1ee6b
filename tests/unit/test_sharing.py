"""Sharing only where it pays (policy/sharing.py) and preemption bounded by attained service or a
declared checkpoint interval (policy/preemption.py). The slowdowns that make the rule refuse are
checked against the REAL co-location measurements, not only against the model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from extender.policy import GpuView, NodeView, PodRequest, PolicyParams, PriorityInputs, Reservation, filter_nodes
from extender.policy.preemption import evictable, plan_victims, progress_lost_s
from extender.policy.sharing import may_join, predicted_join, sharing_view, wait_for_empty_s

GIB = 1024.0
P = PolicyParams()
COLOCATION = Path(__file__).resolve().parents[3] / "shared" / "data" / "colocation" / "h100-2026-11-27.json"


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
