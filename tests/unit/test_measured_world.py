"""Issue 46, items 1 and 5: the capacity experiment's measured world (`simulate.measuredworld`: its own
physics fitted on the measured step rates, not the policy's model; duty per job signature; a time
cost per extra context) and the capacity search without truncation, with the oracle ceiling beside it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from extender.policy.interference import step_rate_fractions
from extender.simulate import capacity, capworld, measuredworld
from extender.simulate.interference import COLOCATION, build_report, load
from extender.simulate.traces import DEFAULT_DATA, Pod
from extender.simulate.world import Job

RATES_FILE = COLOCATION / "h100-2026-11-27.json"
needs_data = pytest.mark.skipif(not RATES_FILE.is_file(), reason="no co-location data")


def _rows() -> list[tuple[tuple[float, ...], int, float]]:
    return measuredworld.measured_rows(build_report(load(COLOCATION)))


def test_a_lone_job_runs_at_full_speed_and_more_contexts_cost_more() -> None:
    assert measuredworld.slice_fractions([0.7], 0.2) == (1.0,)
    light = [measuredworld.slice_fractions([0.05] * n, 0.155)[0] for n in (2, 4, 8)]
    assert light[0] > light[1] > light[2]  # each extra light context costs time, however light
    assert measuredworld.slice_fractions([0.05] * 4, 0.155)[0] < measuredworld.slice_fractions([0.05] * 4, 0.0)[0]


@needs_data
def test_the_fitted_world_reproduces_the_measured_groups_from_the_raw_file() -> None:
    """TAU is fitted on the interference report's rows; judged here on the raw rate file's GPU-bound
    pairs and the input-bound twins (steps per second alone and shared, read directly)."""
    tau = measuredworld.fit_tau(_rows())
    raw = json.loads(RATES_FILE.read_text(encoding="utf-8"))
    pairs = [g["alone_steps_per_s"][s["job"]] / s["steps_per_s"] for g in raw["groups"] if len(g["jobs"]) == 2
             and all(raw["jobs"][j]["wait_ms"] == 0 for j in g["jobs"]) for s in g["shared_steps_per_s"]]
    world_pair = 1.0 / measuredworld.slice_fractions([1.0, 1.0], tau)[0]
    assert abs(world_pair - statistics.median(pairs)) / statistics.median(pairs) < 0.15
    twins = next(g for g in raw["groups"] if g["jobs"] == ["r50_64w", "r50_64w"])
    alone_busy = raw["groups"][0]["alone_steps_per_s"]["r50_64"]  # the same net without its 40 ms wait
    duty = twins["alone_steps_per_s"]["r50_64w"] / alone_busy
    measured = statistics.fmean(s["steps_per_s"] for s in twins["shared_steps_per_s"]) / \
        twins["alone_steps_per_s"]["r50_64w"]
    assert measuredworld.slice_fractions([duty, duty], tau)[0] == pytest.approx(measured, rel=0.1)


@needs_data
def test_light_beside_heavy_is_harsher_than_the_model_in_the_harsh_world_only() -> None:
    """Issue 46 (a figure from elsewhere: real co-location groups held out from the project): a duty-0.43
    job beside a GPU-bound one ran 1.33x slower where the model said 1.10x. The harsh world lands within
    15% of 1.33 and the model does not; the kind world keeps the model's answer for such a mix."""
    tau = measuredworld.fit_tau(_rows())
    harsh = measuredworld.MeasuredWorld(1, [1.0], tau=tau, variant="measured-harsh")
    kind = measuredworld.MeasuredWorld(1, [1.0], tau=tau, variant="measured-kind")
    light, heavy = _job(0, "a"), _job(1, "b")
    light.duty, heavy.duty = 0.43, 1.0
    model = 1.0 / step_rate_fractions([0.43, 1.0])[0]
    world = 1.0 / harsh.fractions([light, heavy])[0]
    assert abs(world - 1.33) / 1.33 < 0.15 and abs(model - 1.33) / 1.33 > 0.15
    assert kind.fractions([light, heavy]) == step_rate_fractions([0.43, 1.0])
    twin = _job(2, "a")
    twin.duty = 0.43
    assert kind.fractions([light, twin]) == harsh.fractions([light, twin])  # alike jobs: measured in both


def _job(idx: int, signature: str) -> Job:
    pod = Pod(f"p{idx}", 1000, 1024, 1, 1000, (), "", 0, 100)
    return Job(idx, pod, signature, 1024.0, 1024.0, 1024.0, "", 0.0, 100.0, None)


def test_duty_is_the_signatures_with_run_to_run_noise() -> None:
    jobs = [_job(i, f"sig{i % 20}") for i in range(400)]
    world = capworld.World(7, [1.0])
    duties = measuredworld.assign_by_signature(jobs, world, capacity.duty_draw("philly"), seed=7)
    assert [j.base_duty for j in jobs if j.declared_share is None] == duties
    by_sig: dict[str, list[float]] = {}
    for job in jobs:
        by_sig.setdefault(job.spec_key, []).append(job.duty)
    within = statistics.fmean(float(np.std(np.log(v))) for v in by_sig.values())
    means = [statistics.fmean(v) for v in by_sig.values()]
    assert 0.03 < within < 0.25  # runs of one script vary little (the premise's noise, 0.1)
    assert float(np.std(np.log(means))) > 2 * within  # scripts differ far more than runs of one do


def test_a_sweep_runs_every_rate_and_reports_the_oracle_ceiling(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No early stop (issue 46): with the wait bound at 1 s every policy is above it at every rate, and
    still every rate is run (before: two rates above the bound in a row ended a policy's search); the
    oracle ceiling and the default's share of it stand beside the capacities; the model says which
    world it was."""
    monkeypatch.setattr(capacity, "WAIT_BOUND_S", 1.0)
    rates = (1.0, 4.0, 6.0, 8.0)
    out = capacity.run(tmp_path, DEFAULT_DATA, [42], quick=True, workers=1, dists=("philly",), rates=rates,
                       policies=("static", "static-sjf", "deepres", "deepres-oracle"), count=60, write=False,
                       log=lambda line: None, world="measured-harsh")
    model = out["model"]
    assert model["truncated"] is False and model["same_interference_model"] is False
    assert model["duty_per_signature"] is True and model["context_cost"] is True
    assert model["measured_world"]["tau_per_extra_context"] > 0.0
    doc = out["philly"]
    assert doc["per_rate"]["1x"]["static"]["p95_wait_s"] > capacity.WAIT_BOUND_S
    assert doc["per_rate"]["4x"]["static"]["p95_wait_s"] > capacity.WAIT_BOUND_S
    assert {f"{r:g}x" for r in rates} == set(doc["per_rate"])
    assert all({"static", "static_sjf", "deepres", "deepres_oracle"} <= set(row) for row in doc["per_rate"].values())
    caps = doc["capacity_by_seed"]
    expected = [round(d / o, 4) if o else None for d, o in zip(caps["deepres"], caps["deepres_oracle"], strict=True)]
    assert doc["deepres_vs_deepres_oracle"]["by_seed"] == expected
    assert doc["deepres"]["jobs_per_run"] == 60
