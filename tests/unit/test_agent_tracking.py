"""Pure agent logic: attribution, per-pod peaks, when to report, when to annotate the node."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extender.agent.cgroups import PodRef
from extender.agent.tracking import (
    FreeMemoryTrigger,
    PodTracker,
    attribute_processes,
    free_memory_mib,
    significant_change,
)
from extender.telemetry import GpuReport, NodeReport, ProcessReport

A, B = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"


def gpu(
    uuid: str, used: float = 0.0, total: float = 40960.0, procs: tuple[ProcessReport, ...] = (), **kw: object
) -> GpuReport:
    return GpuReport(uuid=uuid, index=0, model="m", memory_total_mib=total, memory_used_mib=used, processes=procs,
                     **kw)  # type: ignore[arg-type]


def proc(pid: int, mib: float, pod: str = "") -> ProcessReport:
    return ProcessReport(pid=pid, used_memory_mib=mib, pod_uid=pod)


def report(*gpus: GpuReport, pods: tuple = ()) -> NodeReport:  # type: ignore[type-arg]
    return NodeReport(node="n", sequence=1, timestamp_s=1.0, agent_version="t", source="nvml", gpus=gpus, pods=pods)


def test_attribution_fills_pods_and_looks_each_pid_up_once() -> None:
    lookups: list[int] = []

    def pod_of(pid: int) -> PodRef | None:
        lookups.append(pid)
        return PodRef(A, "c1") if pid == 10 else None

    gpus = (gpu("g0", procs=(proc(10, 100), proc(11, 50))), gpu("g1", procs=(proc(10, 70), proc(12, 5, pod=B))))
    out = attribute_processes(gpus, pod_of)
    assert [(p.pid, p.pod_uid, p.container_id) for g in out for p in g.processes] == [
        (10, A, "c1"), (11, "", ""), (10, A, "c1"), (12, B, "")]
    assert sorted(lookups) == [10, 11]  # 12 was already attributed by its source


def test_pod_peak_follows_the_sum_over_its_gpus_and_never_drops() -> None:
    tracker = PodTracker(forget_after_s=60)
    first = tracker.update([gpu("g0", procs=(proc(1, 1000, A),)), gpu("g1", procs=(proc(2, 1500, A),))], now_s=100)
    assert [(p.pod_uid, p.current_memory_mib, p.peak_memory_mib, p.gpu_uuids, p.first_seen_s) for p in first] == [
        (A, 2500, 2500, ("g0", "g1"), 100)]
    lower = tracker.update([gpu("g0", procs=(proc(1, 800, A), proc(3, 10, B)))], now_s=105)
    by_uid = {p.pod_uid: p for p in lower}
    assert (by_uid[A].current_memory_mib, by_uid[A].peak_memory_mib) == (800, 2500)
    assert by_uid[A].gpu_uuids == ("g0", "g1") and by_uid[A].first_seen_s == 100
    assert by_uid[B].first_seen_s == 105


def test_gone_pods_report_zero_then_are_forgotten() -> None:
    tracker = PodTracker(forget_after_s=30)
    tracker.update([gpu("g0", procs=(proc(1, 500, A),))], now_s=0)
    (gone,) = tracker.update([gpu("g0")], now_s=20)
    assert (gone.current_memory_mib, gone.peak_memory_mib) == (0, 500)
    assert tracker.update([gpu("g0")], now_s=31) == ()


def test_unattributed_processes_are_not_pods() -> None:
    assert PodTracker().update([gpu("g0", procs=(proc(1, 500),))], now_s=0) == ()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda g: g, False),
        (lambda g: replace(g, memory_used_mib=g.memory_used_mib + 255), False),
        (lambda g: replace(g, memory_used_mib=g.memory_used_mib + 256), True),
        (lambda g: replace(g, memory_used_mib=g.memory_used_mib - 300), True),
        (lambda g: replace(g, healthy=False, error="GPU is lost"), True),
        (lambda g: replace(g, uuid="other"), True),
        (lambda g: replace(g, utilization_gpu=0.9), False),  # utilisation alone waits for the heartbeat
    ],
)
def test_significant_change(change, expected: bool) -> None:  # type: ignore[no-untyped-def]
    before = gpu("g0", used=1000)
    assert significant_change(report(before), report(change(before)), threshold_mib=256) is expected


def test_significant_change_on_pods_and_first_report() -> None:
    tracker = PodTracker()
    base = report(gpu("g0"), pods=tracker.update([gpu("g0", procs=(proc(1, 100, A),))], 0))
    assert significant_change(None, base, 256)
    grown = report(gpu("g0"), pods=tracker.update([gpu("g0", procs=(proc(1, 900, A),))], 5))
    assert significant_change(base, grown, 256)
    assert significant_change(base, report(gpu("g0")), 256)  # pod set changed


def test_free_memory_counts_healthy_gpus_only() -> None:
    assert free_memory_mib([gpu("a", used=1000, total=4000), gpu("b", used=0, total=9999, healthy=False)]) == 3000


def test_trigger_publishes_at_start_then_on_growth_rate_limited() -> None:
    trigger = FreeMemoryTrigger(threshold_mib=1000, min_interval_s=10)
    assert trigger.observe(50_000, now_s=0) == 50_000  # start: tell the scheduler what we have
    assert trigger.observe(20_000, now_s=1) is None  # a job started: no news for waiting pods
    assert trigger.observe(20_900, now_s=2) is None  # grew, but not by more than the threshold
    assert trigger.observe(50_000, now_s=5) is None  # the job ended, within 10 s of the last patch
    assert trigger.observe(50_000, now_s=10) == 50_000  # same value as before, but memory did free up
    assert trigger.observe(52_000, now_s=21) == 52_000
    assert trigger.observe(52_500, now_s=40) is None


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    import random

    from extender.agent.reporter import backoff_s

    rng = random.Random(3)
    for attempt in range(1, 12):
        step = min(30.0, 0.5 * 2 ** (attempt - 1))
        delays = [backoff_s(attempt, 0.5, 30.0, rng) for _ in range(50)]
        assert all(step / 2 <= d <= step for d in delays)
        assert len(set(delays)) > 1  # jittered
