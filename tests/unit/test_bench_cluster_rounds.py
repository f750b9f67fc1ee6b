"""`deepres bench cluster --repeats`: which round a report shows, and what it says of the others."""

from __future__ import annotations

from typing import Any

from devtools import bench_cluster_rounds as rounds


def phase(pods_per_s: float, extender_ms: float = 0.0, unplaced: int = 0, p50_ms: float = 500.0) -> dict[str, Any]:
    cpu = {"extender": extender_ms, "kube-apiserver": 5.0}
    return {"pods_per_s": pods_per_s, "latency_p50_s": 0.5, "latency_p99_s": 1.0, "latency_p50_ms": p50_ms,
            "latency_p99_ms": 2 * p50_ms, "cpu_ms_per_pod": cpu,
            "cpu_ms_per_pod_settled": cpu, "extender_ms_per_call": {"filter": 2.0}, "telemetry_reports_per_s": 80.0,
            "per_1000_pods": {}, "running_share_at_bound": 0.5, "apiserver_binding_ms": 10.0,
            "gpu_pods_unplaced": unplaced, "gpus_overcommitted": 0}


def test_the_report_shows_the_round_of_median_ratio_whole_and_lists_every_round() -> None:
    ran = [rounds.figures(500, phase(200.0), phase(160.0, 3.0)),   # ratio 0.8
           rounds.figures(500, phase(200.0), phase(100.0, 5.0)),   # 0.5
           rounds.figures(500, phase(100.0), phase(70.0, 4.0, unplaced=2))]  # 0.7: the median
    shown = rounds.shown(ran, "deepres bench cluster --repeats 3")
    assert shown["shown_round"] == 3 and shown["ratio"] == 0.7
    assert (shown["gpu_pods_per_s"], shown["plain_pods_per_s"], shown["extender_cpu_ms_per_pod"]) == (70.0, 100.0, 4.0)
    assert [r["ratio"] for r in shown["rounds"]] == [0.8, 0.5, 0.7], "in the order they ran"
    assert shown["across_rounds_median"]["extender_cpu_ms_per_pod"] == 4.0
    assert shown["across_rounds_median"]["plain_pods_per_s"] == 200.0
    assert shown["worst_round"]["gpu_pods_unplaced"] == 2
    assert not rounds.all_placed(shown)


def test_one_round_is_shown_as_it_ran_and_an_unplaced_pod_in_any_round_fails_the_run() -> None:
    one = rounds.shown([rounds.figures(50, phase(100.0), phase(90.0, 4.0))], "deepres bench cluster --repeats 1")
    assert one["ratio"] == 0.9 and "rounds" not in one and rounds.all_placed(one)
    ran = [rounds.figures(500, phase(100.0), phase(x, 4.0, unplaced=u)) for x, u in ((80.0, 0), (60.0, 1), (70.0, 0))]
    shown = rounds.shown(ran, "deepres bench cluster --repeats 3")
    assert shown["gpu_pods_unplaced"] == 0, "the shown round placed every pod"
    assert not rounds.all_placed(shown), "another round did not"


def test_a_round_names_each_kind_s_scheduling_latency_in_ms() -> None:
    """Issue #48's keys: `scheduling_latency_ms.{gpu,plain}.{p50,p99}`, each phase's own."""
    shown = rounds.shown([rounds.figures(50, phase(100.0, p50_ms=120.5), phase(90.0, 4.0, p50_ms=480.0))],
                         "deepres bench cluster --repeats 1")
    assert shown["scheduling_latency_ms"] == {"gpu": {"p50": 480.0, "p99": 960.0},
                                              "plain": {"p50": 120.5, "p99": 241.0}}


def test_the_floor_is_the_median_of_its_rounds_and_lists_them() -> None:
    floors = [phase(90.0, 2.5), phase(80.0, 1.9, unplaced=1), phase(85.0, 2.2)]
    out = rounds.floor(floors, "deepres bench cluster --with-floor")
    assert out["extender_cpu_ms_per_pod_floor"] == 2.2
    assert out["floor_rounds"]["extender_cpu_ms_per_pod"] == [2.5, 1.9, 2.2]  # in the order they ran
    assert out["floor_rounds"]["gpu_pods_unplaced"] == [0, 1, 0]
    assert out["floor_rounds"]["provenance"]["command"] == "deepres bench cluster --with-floor"
