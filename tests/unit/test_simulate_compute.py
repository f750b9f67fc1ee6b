"""The compute-aware replay: co-located jobs run at the interference model's rate (checked against the
REAL co-location measurements), the "no slowdown" ablation runs them at full speed, no oracle in
the priority, and DeepRes's sharing rule keeps GPU-bound jobs apart where memory alone packs them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from extender.policy import PolicyParams
from extender.simulate import replay
from extender.simulate.traces import Node, Pod
from predictor import datapaths

COLOCATION = datapaths.COLOCATION / "h100-2026-11-27.json"  # in the repository (data/README.md)
REPORT = Path(__file__).resolve().parents[2] / "reports" / "simulation.json"
P = PolicyParams()


def _job(idx: int, duty: float, duration: float = 1000.0, arrival: float = 0.0, milli: int = 1000,
         predicted: float | None = None, spec_key: str = "") -> replay.Job:
    pod = Pod(f"p{idx}", 1000, 1024, 1, milli, (), "", int(arrival), int(arrival + duration))
    job = replay.Job(idx, pod, spec_key or f"sig{idx}", 4096.0, 4096.0, 5000.0, "", arrival, duration, None)
    job.duty = duty
    job.predicted_s = duration if predicted is None else predicted
    if milli < 1000:
        job.declared_share = job.admission_duty = milli / 1000
    return job


def _nodes(n: int = 1, gpus: int = 1) -> list[Node]:
    return [Node(f"n{i}", 64_000, 262_144, gpus, "V100M32") for i in range(n)]


@pytest.mark.skipif(not COLOCATION.is_file(), reason="no co-location data")
def test_two_gpu_bound_jobs_on_one_gpu_slow_as_measured() -> None:
    """`request` packs two half-GPU jobs on one GPU; with duty 1 they run at the model's rate, which
    matches the measured GPU-bound pairs of the H100 data within 15%."""
    jobs = [_job(0, 1.0, milli=500), _job(1, 1.0, milli=500)]
    out = replay.simulate(replay.Request, jobs, _nodes(), P, interference=True)
    slowdown = out.metrics["mean_jct_s"] / 1000.0
    raw = json.loads(COLOCATION.read_text(encoding="utf-8"))
    measured = [g["alone_steps_per_s"][s["job"]] / s["steps_per_s"] for g in raw["groups"] if len(g["jobs"]) == 2
                and all(raw["jobs"][j]["wait_ms"] == 0 for j in g["jobs"]) for s in g["shared_steps_per_s"]]
    median = sorted(measured)[len(measured) // 2]
    assert abs(slowdown - median) / median < 0.15, (slowdown, median)
    assert out.metrics["shared_jobs"] == 2 and out.metrics["shared_slowdown_p95"] == pytest.approx(slowdown, rel=1e-3)
    ablation = replay.simulate(replay.Request, jobs, _nodes(), P, interference=False)
    assert ablation.metrics["mean_jct_s"] == pytest.approx(1000.0)  # no slowdown: the replay of before


def test_a_job_speeds_up_when_its_neighbour_leaves() -> None:
    short, long = _job(0, 1.0, duration=100.0, milli=500), _job(1, 1.0, duration=1000.0, milli=500)
    out = replay.simulate(replay.Request, [short, long], _nodes(), P, interference=True)
    shared = 1.0 / replay.step_rate_fractions([1.0, 1.0])[0]
    # the short one runs shared all along; the long one shared until the short ends, then alone
    expected_long = 100.0 * shared + (1000.0 - 100.0)
    assert sorted(out.jct_s) == pytest.approx(sorted([100.0 * shared, expected_long]), rel=1e-6)


def test_the_priority_gets_the_predicted_run_time_not_the_true_one() -> None:
    job = _job(0, 1.0, duration=1000.0, predicted=123.0)
    strat = replay.DeepRes(replay.Cluster(_nodes()), [job], P)
    assert strat.inputs(job).gpu_seconds == 123.0


def test_deepres_keeps_gpu_bound_jobs_apart_where_memory_alone_packs_them() -> None:
    """Four GPU-bound jobs that fit two to a GPU by memory, two GPUs: deepres shares none
    (a pair would slow ~1.8x), the memory-only ablation packs them."""
    jobs = [_job(i, 1.0, duration=1000.0, arrival=float(i)) for i in range(4)]
    for job in jobs:
        job.upper_mib = job.predicted_mib = 4096.0
    deepres = replay.simulate(replay.DeepRes, jobs, _nodes(2), P, interference=True)
    memory = replay.simulate(replay.DeepResMemory, jobs, _nodes(2), P, interference=True)
    assert deepres.metrics["shared_jobs"] == 0
    assert memory.metrics["shared_jobs"] >= 2 and memory.metrics["shared_slowdown_p95"] > P.max_slowdown


def test_deepres_lets_input_bound_jobs_share_when_waiting_costs_more() -> None:
    """Two input-bound jobs (declared share 0.3) on one GPU, the second arriving while the first runs
    for long: sharing costs it little and waiting a lot, so it joins."""
    jobs = [_job(0, 0.3, duration=10_000.0, milli=300), _job(1, 0.3, duration=1000.0, arrival=10.0, milli=300)]
    out = replay.simulate(replay.DeepRes, jobs, _nodes(), P, interference=True)
    assert out.metrics["shared_jobs"] == 2
    assert out.metrics["shared_slowdown_max"] <= P.max_slowdown


@pytest.mark.skipif(not REPORT.is_file(), reason="no report")
def test_the_report_says_what_the_replay_modelled() -> None:
    report = json.loads(REPORT.read_text(encoding="utf-8"))["replay"]
    assert report["model"]["interference"] is True and report["model"]["memory_truth"] == "measured"
    assert report["model"]["oracle"] is False and report["seeds"] >= 5
    gb = report["gpu_bound"]
    for key in ("mean_jct_improvement", "median_jct_improvement"):
        by_seed = gb["deepres_vs_static"][f"{key}_by_seed"]
        assert len(by_seed) == report["seeds"] and gb["deepres_vs_static"][key] == min(by_seed)
    assert math.isfinite(gb["deepres"]["oom_rate"]) and gb["deepres"]["shared_slowdown_p95"] >= 1.0
