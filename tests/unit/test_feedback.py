"""Sharing's promise kept by feedback (issue 46, item 2): the pure rule (`policy.feedback`), the join rule
that reads it (`policy.sharing.may_join`), and the replay that calls both (`simulate.replay`).

The inputs are the agent's samples as physics makes them: a job whose GPU work per step is fixed shows
busy share d alone and d / s when it runs s times slower. The expected answers follow from that and from
the admin's bound, never from the module's constants."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from extender.policy.feedback import Sharer, SharingFeedback, observed_slowdown
from extender.policy.sharing import may_join
from extender.policy.types import GpuView, PodRequest, PolicyParams

PARAMS = replace(PolicyParams(), sharing=True, sharing_feedback=True, max_slowdown=1.25)


def _sharer(uid: str, busy: float | None, bound_s: float, duty: float = 0.5, signature: str = "sig-a",
            bound: float = 1.25) -> Sharer:
    return Sharer(uid=uid, signature=signature, busy=busy, duty=duty, bound_s=bound_s, bound=bound, warm=True)


def _run(fb: SharingFeedback, gpu: str, pairs: list[tuple[str, float, float]], reports: int, start_s: float,
         step_s: float = 10.0, move_after_s: float = 1e9) -> list:
    out = []
    for k in range(reports):
        out.append(fb.observe(gpu, "H100", [_sharer(uid, busy, bound_s) for uid, busy, bound_s in pairs], False,
                              start_s + k * step_s, move_after_s))
    return out


def test_a_slowdown_is_the_solo_duty_over_the_busy_share_while_shared() -> None:
    assert observed_slowdown(0.6, 0.3) == pytest.approx(2.0)
    assert observed_slowdown(0.6, 0.6) == pytest.approx(1.0)
    assert observed_slowdown(None, 0.3) is None and observed_slowdown(0.6, None) is None
    assert observed_slowdown(0.6, 0.0) is None  # idle is not slowed
    assert observed_slowdown(0.6, math.nan) is None
    assert observed_slowdown(0.05, 0.02) is None  # too light for whole-percent samples to show 2.5x


def test_a_gpu_whose_jobs_run_slower_than_the_bound_stops_taking_joiners_then_moves_the_newest() -> None:
    fb = SharingFeedback()
    # each job alone: busy 0.6 (their solo duties)
    _run(fb, "g0", [("old", 0.6, 0.0)], 1, 100.0)
    _run(fb, "g1", [("new", 0.6, 50.0)], 1, 100.0)
    fb.forget_gpu("g1")
    # together on g0 each shows 0.3: both run 2x slower than alone, beyond 1.25
    verdicts = _run(fb, "g0", [("old", 0.3, 0.0), ("new", 0.3, 50.0)], 6, 200.0, move_after_s=30.0)
    assert not verdicts[0].over_bound  # one report never decides
    assert any(v.over_bound for v in verdicts) and fb.is_over("g0")
    moved = [v.move for v in verdicts if v.move]
    assert moved and set(moved) == {"new"}  # the newest joiner, never the job that was there first
    assert max(v.worst for v in verdicts) == pytest.approx(2.0, rel=0.05)


def test_jobs_within_the_bound_are_left_alone() -> None:
    fb = SharingFeedback()
    _run(fb, "g0", [("a", 0.5, 0.0)], 1, 10.0)
    _run(fb, "gx", [("b", 0.5, 5.0)], 1, 10.0)
    verdicts = _run(fb, "g0", [("a", 0.45, 0.0), ("b", 0.45, 5.0)], 8, 100.0, move_after_s=0.0)  # 1.11x each
    assert not any(v.over_bound or v.move for v in verdicts)
    assert not fb.is_over("g0")


def test_a_lone_pod_is_never_moved_and_an_unknown_solo_duty_decides_nothing() -> None:
    fb = SharingFeedback()
    assert not any(v.over_bound or v.move for v in _run(fb, "g0", [("a", 0.05, 0.0)], 8, 10.0, move_after_s=0.0))
    fb2 = SharingFeedback()  # never seen alone: no slowdown can be read
    verdicts = _run(fb2, "g0", [("a", 0.1, 0.0), ("b", 0.1, 1.0)], 8, 10.0, move_after_s=0.0)
    assert not any(v.over_bound or v.move for v in verdicts)


def test_the_forecast_error_becomes_the_margin_of_later_joins() -> None:
    fb = SharingFeedback()
    assert fb.margin("sig-a") == 1.0
    _run(fb, "g0", [("a", 0.4, 0.0)], 1, 10.0)
    _run(fb, "gx", [("b", 0.4, 5.0)], 1, 10.0)
    _run(fb, "g0", [("a", 0.2, 0.0), ("b", 0.2, 5.0)], 6, 100.0)  # 2x, where the model forecasts far less
    learned = fb.margin("sig-a")
    assert learned > 1.3
    # a pod of that signature that the bare forecast lets join is refused with the margin
    gpu = GpuView(uuid="g9", index=0, capacity_mib=80_000.0, used_mib=10_000.0, reserved_mib=10_000.0,
                  duties=(0.4,))
    pod = PodRequest(uid="c", namespace="ns", name="c", gpus=1, admission_mib=5_000.0, predicted_mib=5_000.0,
                     priority=10.0, duty=0.4, predicted_run_s=0.0)
    assert may_join(pod, gpu, PARAMS, wait_s=math.inf)
    assert not may_join(replace(pod, slowdown_margin=learned), gpu, PARAMS, wait_s=math.inf)
    assert not may_join(pod, replace(gpu, resident_margin=learned), PARAMS, wait_s=math.inf)
    assert not may_join(pod, replace(gpu, over_bound=True), PARAMS, wait_s=math.inf)
    off = replace(PARAMS, sharing_feedback=False)  # the switch: the forecast alone decides
    assert may_join(pod, replace(gpu, over_bound=True, resident_margin=learned), off, wait_s=math.inf)


def test_state_is_bounded() -> None:
    fb = SharingFeedback(capacity=50)
    for i in range(500):
        fb.observe(f"g{i}", "m", [_sharer(f"p{i}", 0.5, 0.0, signature=f"s{i}")], False, float(i), 0.0)
        fb.observe(f"h{i}", "m", [_sharer(f"q{i}", 0.2, 0.0, signature=f"s{i}"),
                                  _sharer(f"p{i}", 0.2, 1.0, signature=f"s{i}")], False, float(i), 0.0)
    assert len(fb._solo) <= 50 and len(fb._solo_pod) <= 50 and len(fb._smoothed) <= 50
    assert len(fb._errors) <= 50 and len(fb._over) <= 50


def _replay(feedback: bool) -> dict[str, float]:
    """Two light jobs on one GPU in a world where sharing costs far more than the model forecasts (each
    extra context doubles every GPU phase): the replay's DeepRes with and without the feedback."""
    from extender.simulate import measuredworld, replay
    from extender.simulate.traces import Node, Pod

    class Policy(replay.DeepRes):  # truthful declarations (share floor 0), the sharing rule on
        def __init__(self, cluster: replay.Cluster, jobs: list[replay.Job], params: PolicyParams) -> None:
            super().__init__(cluster, jobs, replace(params, sharing=True, sharing_feedback=feedback))

    jobs = []
    for idx, (arrival, duration) in enumerate(((0.0, 200_000.0), (1_000.0, 100_000.0))):  # the first seen alone
        pod = Pod(f"p{idx}", 1000, 1024, 1, 300, (), "", int(arrival), int(arrival + duration))
        job = replay.Job(idx, pod, "light-script", 4 * 1024.0, 4 * 1024.0, 4 * 1024.0, "", arrival, duration, None)
        job.predicted_s, job.declared_share = duration, 0.3
        job.duty = job.base_duty = 0.3
        jobs.append(job)
    world = measuredworld.MeasuredWorld(7, [1.0], tau=1.0, variant="measured-harsh")
    out = replay.simulate(Policy, jobs, [Node("n0", 64_000, 1 << 20, 1, "H100")], PolicyParams(), world=world)
    return out.metrics


def test_the_replay_moves_a_bad_join_and_the_moved_job_does_not_join_again() -> None:
    without, with_feedback = _replay(False), _replay(True)
    assert without["sharing_moves"] == 0.0 and without["shared_slowdown_p95"] > 1.25  # the broken promise
    assert with_feedback["sharing_moves"] >= 1.0
    assert with_feedback["shared_slowdown_p95"] <= 1.25  # the job that finished shared ran within the bound
    assert with_feedback["completed"] == 2.0
