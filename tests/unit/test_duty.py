"""The usage rule for compute: the GPU-bound prior, the declared share, observation corrected for the
sharing it ran under (on the REAL recorded NVML answers of two resnet50 jobs sharing an H100), bad
samples never lowering a duty, per job signature in the ledger."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from extender.annotations import PREFIX, AnnotationError, parse_job
from extender.ledger import Ledger
from extender.policy import PodRequest, PolicyParams, PriorityInputs, Reservation
from extender.policy.duty import DutyStore, admission_duty, alone_duties, follow_duty, prior_duty
from extender.telemetry import GpuReport, NodeReport, PodUsage
from predictor import datapaths

P = PolicyParams(usage_warmup_s=60.0, sharing=False)  # two GPU-bound pods share a GPU here (learning only)
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "nvml-process-utilization-h100-580.json"
COLOCATION = datapaths.COLOCATION / "h100-2026-11-27.json"  # in the repository (data/README.md)


def res(duty: float = 1.0, bound_s: float = 0.0, uid: str = "a", signature: str = "sig") -> Reservation:
    return Reservation(uid, "ns", uid, "n1", ("u0",), 1000.0, 1000.0, 1000.0, PriorityInputs(), bound_s,
                       signature=signature, duty=duty)


def test_prior_is_gpu_bound_unless_declared_and_observation_replaces_the_declaration() -> None:
    assert prior_duty(None) == 1.0
    assert prior_duty(0.3) == 0.3
    assert admission_duty(0.3, None) == 0.3
    assert admission_duty(0.3, 0.8) == 0.8  # observed: replaces what was declared
    assert admission_duty(None, float("nan")) == 1.0  # a bad learned value is none


def test_the_annotation_is_parsed_and_bad_values_name_the_key() -> None:
    base = {PREFIX + "model-type": "cnn"}
    assert parse_job(base, created_s=0, now_s=0).gpu_share is None
    assert parse_job({**base, PREFIX + "gpu-share": "0.3"}, created_s=0, now_s=0).gpu_share == 0.3
    job = parse_job({**base, PREFIX + "checkpoint-interval": "30m"}, created_s=0, now_s=0)
    assert job.checkpoint_interval_s == 1800.0
    for key, bad in (("gpu-share", "1.5"), ("gpu-share", "abc"), ("gpu-share", "nan"), ("gpu-share", "-0.1"),
                     ("checkpoint-interval", "0s"), ("checkpoint-interval", "soon")):
        with pytest.raises(AnnotationError, match=key) as err:
            parse_job({**base, PREFIX + key: bad}, created_s=0, now_s=0)
        assert bad in str(err.value)


@pytest.mark.parametrize("bad", [None, float("nan"), -0.2, 1.7, math.inf])
def test_bad_or_missing_samples_never_lower_a_duty(bad: Any) -> None:
    held = res(duty=1.0, bound_s=0.0)
    assert follow_duty(held, bad, 1000.0, P) is held
    assert alone_duties({"a": bad}) == {}
    store = DutyStore()
    store.record("sig", 0.9, "p1")
    assert store.record("sig", bad, "p2") == 0.9


def test_duty_follows_observation_only_after_the_warm_up_down_as_well_as_up() -> None:
    held = res(duty=1.0, bound_s=0.0)
    assert follow_duty(held, 0.4, 30.0, P) is held  # warming up
    assert follow_duty(held, 0.4, 61.0, P).duty == 0.4
    assert follow_duty(res(duty=0.3), 0.9, 61.0, P).duty == 0.9


def _window_means() -> tuple[float, float]:
    """The two pods' mean busy shares over the recorded reads after the first (start-up) second."""
    record = json.loads(FIXTURE.read_text(encoding="utf-8"))
    means = []
    for pid in (record["pids"]["gpu_bound"], record["pids"]["input_bound"]):
        values = [p["smUtil"] / 100 for s in record["samples"][1:] for p in s["process"] if p["pid"] == pid]
        means.append(sum(values) / len(values))
    return means[0], means[1]


def test_busy_shares_seen_while_sharing_are_corrected_to_alone_duties() -> None:
    """Seen together, the GPU-bound pod shows ~58% busy and the input-bound one ~38%: alone, the
    first is GPU-bound and the second busy about half its time (the co-location data's alone step
    rate with a 40 ms wait per step gives 1 - 0.040 x 12.586 = 0.50)."""
    gpu_bound, input_bound = _window_means()
    duties = alone_duties({"gpu": gpu_bound, "input": input_bound})
    assert duties["gpu"] >= 0.9 > gpu_bound
    assert input_bound < duties["input"] < 0.75
    if COLOCATION.is_file():
        raw = json.loads(COLOCATION.read_text(encoding="utf-8"))
        alone = next(g["alone_steps_per_s"]["r50_64w"] for g in raw["groups"] if "r50_64w" in g["jobs"])
        assert abs(duties["input"] - (1 - 0.040 * alone)) < 0.15
    assert alone_duties({"only": 0.42}) == {"only": 0.42}  # alone: its own share


def _report(seq: int, pods: tuple[PodUsage, ...]) -> NodeReport:
    return NodeReport("n1", seq, 100.0 + seq, "0.1", "nvml", (GpuReport("u0", 0, "H100", 80_000.0, 9000.0),), pods,
                      boot_id="b")


def test_the_ledger_learns_duties_per_pod_and_signature_and_shows_them_per_gpu() -> None:
    ledger = Ledger(P)
    ledger.apply_report(_report(0, ()), 0.0)
    for uid in ("gpu", "input"):
        req = PodRequest(uid, "ns", uid, 1, 4000.0, 4000.0, 10.0)
        out = ledger.reserve_on(req, Reservation(uid, "ns", uid, "n1", (), 4000.0, 4000.0, 4000.0, PriorityInputs(),
                                                 0.0, signature=f"sig-{uid}"), 0.0)
        assert not isinstance(out, str), out
    ledger.apply_report(_report(1, ()), 1.0)
    assert ledger.views["n1"].gpus[0].duties == (1.0, 1.0)  # the prior: GPU-bound
    gpu_bound, input_bound = _window_means()
    usage = (PodUsage("gpu", 4230.0, 4230.0, ("u0",), gpu_duty=gpu_bound, duty_source="process"),
             PodUsage("input", 4230.0, 4230.0, ("u0",), gpu_duty=input_bound, duty_source="process"))
    ledger.apply_report(_report(2, usage), 30.0)  # before the warm-up: nothing learned
    assert ledger.learned_duty("sig-input") is None and ledger.views["n1"].gpus[0].duties == (1.0, 1.0)
    ledger.apply_report(_report(3, usage), 100.0)
    learned = ledger.learned_duty("sig-input")
    assert learned is not None and input_bound < learned < 0.75
    assert ledger.reservation("input").duty == learned
    assert ledger.reservation("gpu").duty >= 0.9
    # a report without duties (no samples) lowers nothing
    blind = tuple(PodUsage(u.pod_uid, 4230.0, 4230.0, ("u0",)) for u in usage)
    ledger.apply_report(_report(4, blind), 200.0)
    assert ledger.reservation("input").duty == learned
    assert sorted(ledger.views["n1"].gpus[0].duties) == sorted((ledger.reservation("gpu").duty, learned))


def test_a_declared_share_counts_only_down_to_the_namespace_floor_until_observed() -> None:
    from extender.policy.duty import admission_duty
    from extender.settings import Settings

    assert admission_duty(0.01, None, floor=1.0) == 1.0  # the default: a prior, not a pass
    assert admission_duty(0.01, None, floor=0.3) == 0.3
    assert admission_duty(0.5, None, floor=0.3) == 0.5
    assert admission_duty(0.01, 0.2, floor=1.0) == 0.2  # observed: the observation decides
    settings = Settings()
    settings.policy.namespace_gpu_share_floors = {"research": 0.0}
    assert settings.policy.share_floor("research") == 0.0 and settings.policy.share_floor("default") == 1.0
    settings.policy.default_gpu_share_floor = 1.5
    settings.policy.namespace_gpu_share_floors = {"x": -0.1}
    problems = settings.validate()
    assert "policy.default_gpu_share_floor must be in [0, 1], got 1.5" in problems
    assert "policy.namespace_gpu_share_floors.x must be in [0, 1], got -0.1" in problems
