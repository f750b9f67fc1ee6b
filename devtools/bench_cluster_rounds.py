"""`deepres bench cluster`'s rounds: one round's figures at a client limit, and which round a report shows.

A round is the plain phases, then the GPU phases, on one control plane (devtools/bench_cluster.py).
A phase is a few seconds on this 2-CPU machine, and identical runs of one tree gave ratios from
0.57 to 0.85 (docs/benchmarks.md): one round is one draw, so the bench runs several and the report
shows the median one, whole, with every round's main figures beside it.
"""

from __future__ import annotations

import statistics
from typing import Any

from extender.provenance import stamp

#: The figures of each round that a report with several lists beside the one it shows.
ROUND_KEYS = ("gpu_pods_per_s", "plain_pods_per_s", "ratio", "extender_cpu_ms_per_pod", "cpu_ratio_gpu_over_plain",
              "cpu_ratio_settled")


def figures(qps: int, plain: dict[str, Any], gpu: dict[str, Any]) -> dict[str, Any]:
    """One round's figures at one client limit: its plain phase and its GPU phase."""
    return {
        "kube_api_qps": qps,
        "gpu_pods_per_s": gpu["pods_per_s"], "plain_pods_per_s": plain["pods_per_s"],
        "ratio": round(gpu["pods_per_s"] / plain["pods_per_s"], 2),
        "gpu_latency_p50_s": gpu["latency_p50_s"], "gpu_latency_p99_s": gpu["latency_p99_s"],
        "plain_latency_p50_s": plain["latency_p50_s"],
        "plain_latency_p99_s": plain["latency_p99_s"],
        # from the pod's creation to the watch showing it bound (issue #48's name for the above, in ms)
        "scheduling_latency_ms": {kind: {"p50": phase["latency_p50_ms"], "p99": phase["latency_p99_ms"]}
                                  for kind, phase in (("gpu", gpu), ("plain", plain))},
        "extender_cpu_ms_per_pod": gpu["cpu_ms_per_pod"]["extender"],
        "extender_ms_per_call": gpu["extender_ms_per_call"],
        "telemetry_reports_per_s": gpu["telemetry_reports_per_s"],
        "extender_outcomes_per_1000_pods": gpu["per_1000_pods"],
        "gpu_cpu_ms_per_pod": gpu["cpu_ms_per_pod"], "plain_cpu_ms_per_pod": plain["cpu_ms_per_pod"],
        # all processes' CPU per GPU pod over that per plain pod (the bench's own included in both)
        "cpu_ratio_gpu_over_plain": round(sum(gpu["cpu_ms_per_pod"].values())
                                          / max(sum(plain["cpu_ms_per_pod"].values()), 1e-9), 2),
        # the same, each window until kwok had every pod Running (`phase`): a plain phase ends its
        # window with most of its pods' status writes still to come, a GPU phase with few
        "gpu_cpu_ms_per_pod_settled": gpu["cpu_ms_per_pod_settled"],
        "plain_cpu_ms_per_pod_settled": plain["cpu_ms_per_pod_settled"],
        "cpu_ratio_settled": round(sum(gpu["cpu_ms_per_pod_settled"].values())
                                   / max(sum(plain["cpu_ms_per_pod_settled"].values()), 1e-9), 2),
        "running_share_at_bound": {"gpu": gpu["running_share_at_bound"], "plain": plain["running_share_at_bound"]},
        "apiserver_binding_ms": {"gpu": gpu["apiserver_binding_ms"], "plain": plain["apiserver_binding_ms"]},
        "gpu_pods_unplaced": int(gpu["gpu_pods_unplaced"]),
        "gpus_overcommitted": int(gpu["gpus_overcommitted"]),
    }


def shown(rounds: list[dict[str, Any]], command: str) -> dict[str, Any]:
    """The figures a report shows for one client limit: the round whose ratio is the median (the lower
    middle one of an even count), every figure from that one run; with several rounds, each round's
    main figures (`rounds`, in the order they ran), which one is shown (`shown_round`, from 1), the
    median of each (`across_rounds_median`) and the worst round's unplaced and over-committed counts
    (the shown round's own stay where they are)."""
    order = sorted(range(len(rounds)), key=lambda k: (rounds[k]["ratio"], k))
    middle = order[(len(rounds) - 1) // 2]
    out = {**rounds[middle], "provenance": stamp(command)}
    if len(rounds) > 1:
        out["rounds"] = [{key: r[key] for key in ROUND_KEYS} for r in rounds]
        out["shown_round"] = middle + 1
        out["across_rounds_median"] = {key: round(statistics.median(r[key] for r in rounds), 2)
                                       for key in ROUND_KEYS}
        out["worst_round"] = {"gpu_pods_unplaced": max(r["gpu_pods_unplaced"] for r in rounds),
                              "gpus_overcommitted": max(r["gpus_overcommitted"] for r in rounds)}
    return out


def all_placed(figures: dict[str, Any]) -> bool:
    """Every GPU pod of every round placed (the shown round's count, or the worst round's)."""
    return int(figures.get("worst_round", figures).get("gpu_pods_unplaced", 1)) == 0


def floor(phases: list[dict[str, Any]], command: str) -> dict[str, Any]:
    """`--with-floor`: the floor extender's GPU phases (one per round, at the default limits) ->
    `extender_cpu_ms_per_pod_floor` (their median) and each phase's figure, in the order they ran."""
    each = [phase["cpu_ms_per_pod"]["extender"] for phase in phases]
    return {"extender_cpu_ms_per_pod_floor": round(statistics.median(each), 2),
            "floor_rounds": {"extender_cpu_ms_per_pod": each,
                             "gpu_pods_per_s": [phase["pods_per_s"] for phase in phases],
                             "gpu_pods_unplaced": [int(phase["gpu_pods_unplaced"]) for phase in phases],
                             "provenance": stamp(command)}}
