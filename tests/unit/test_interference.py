"""The interference model against REAL co-location measurements (read from the shared data file here,
not copied from the code), its inverse, and its input checks."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from extender.policy.interference import (
    PRECEDENCE,
    SHARED_SERVICE,
    DutyError,
    busy_shares,
    max_slowdown,
    standalone_duties,
    step_rate_fractions,
)
from extender.simulate.interference import COLOCATION, build_report, load

DATA = COLOCATION / "h100-2026-11-27.json"
NVML = COLOCATION / "nvml-process-utilization-h100-2026-11-27.json"
pytestmark = pytest.mark.skipif(not DATA.is_file(), reason=f"{DATA} not present")
REPORT = Path(__file__).resolve().parents[2] / "reports" / "interference.json"


def _nvml_busy() -> dict[str, float]:
    """role -> mean per-process busy share (0..1) in the NVML file, the first (warm-up) second left out."""
    raw: dict[str, Any] = json.loads(NVML.read_text(encoding="utf-8"))
    role = {pid: name for name, pid in raw["pids"].items()}
    seen: dict[str, list[float]] = {}
    for sample in raw["samples"][1:]:
        for process in sample["process"]:
            seen.setdefault(role[process["pid"]], []).append(process["smUtil"] / 100)
    return {name: sum(values) / len(values) for name, values in seen.items()}


def _nvml_duties() -> dict[str, float]:
    """The alone duties of the NVML file's two jobs (resnet50 batch 64: r50_64 GPU-bound, r50_64w with a
    40 ms wait), from their busy shares measured together."""
    busy = _nvml_busy()
    gpu, waits = standalone_duties([busy["gpu_bound"], busy["input_bound"]])
    return {"r50_64": gpu, "r50_64w": waits}


def _measured(jobs: list[str]) -> tuple[list[float], list[float]]:
    """(alone duties, measured shared/alone fractions) of the data file's group of exactly `jobs`:
    NVML-measured duties where the data has samples, GPU-bound (1.0) otherwise."""
    raw: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
    (group,) = [g for g in raw["groups"] if sorted(g["jobs"]) == sorted(jobs)]
    measured = _nvml_duties()
    duties, fractions = [], []
    for shared in group["shared_steps_per_s"]:
        alone = group["alone_steps_per_s"][shared["job"]]
        duties.append(measured.get(shared["job"], 1.0))
        fractions.append(shared["steps_per_s"] / alone)
    return duties, fractions


@pytest.mark.parametrize(("jobs", "tolerance"), [
    (["r50_64w", "r50_64w"], 0.05),            # input-bound pair: ~0.81 each
    (["r50_64w", "r50_64w", "r50_64w"], 0.10),  # input-bound triple: ~0.68
    (["r50_64", "r50_64"], 0.20),               # GPU-bound pair: ~0.6 (the model: 0.53)
    (["r18_128", "r18_128", "r18_128"], 0.20),  # GPU-bound triple: ~0.34
    (["r50_256", "mlp_256"], 0.10),
])
def test_predicts_measured_groups(jobs: list[str], tolerance: float) -> None:
    duties, measured = _measured(jobs)
    predicted = step_rate_fractions(duties)
    for p, m in zip(predicted, measured, strict=True):
        assert abs(p - m) / m <= tolerance, (jobs, predicted, measured)


def test_sharing_is_not_free_for_gpu_bound_jobs_and_nearly_free_for_input_bound_ones() -> None:
    gpu_bound, _ = _measured(["r50_64", "r50_64"])
    input_bound, _ = _measured(["r50_64w", "r50_64w"])
    assert max_slowdown(gpu_bound) > 1.5
    assert max_slowdown(input_bound) < 1.3
    assert step_rate_fractions([1.0]) == (1.0,) and step_rate_fractions([]) == ()


def test_a_busier_neighbour_slows_a_job_more_up_to_its_own_duty() -> None:
    fractions = [step_rate_fractions([0.5, other])[0] for other in (0.0, 0.2, 0.35, 0.5)]
    assert fractions[0] == pytest.approx(1.0, abs=0.05)
    assert all(a > b for a, b in itertools.pairwise(fractions))
    # any neighbour slows a job, and the neighbour slows more the busier it is itself
    for other in (0.3, 0.6, 0.9, 1.0):
        mine, theirs = step_rate_fractions([0.5, other])
        assert mine < 0.95 and theirs < step_rate_fractions([0.5, other - 0.1])[1]


@pytest.mark.parametrize("duties", [[1.0, 0.1], [1.0, 0.4], [0.9, 0.5, 0.2], [1.0, 1.0, 0.3], [0.7, 0.05]])
def test_a_shared_gpu_is_never_busier_than_whole(duties: list[float]) -> None:
    """Time-slicing runs one context at a time: what the jobs show busy adds up to at most the GPU (up to
    Schweitzer's approximation, a few percent over with three jobs)."""
    assert sum(busy_shares(duties)) <= (1.0 + 1e-6 if len(duties) == 2 else 1.03)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return build_report(load(COLOCATION))


def test_leave_one_group_out_error_and_the_fitted_constants(report: dict[str, Any]) -> None:
    logo = report["leave_one_group_out"]
    assert logo["median_abs_rel_err"] <= 0.10
    # the model beats ignoring the duty (1/n), the old replay's "no slowdown", and itself before the refit
    assert logo["mean_abs_rel_err"] < report["baselines"]["one_over_n"]["mean_abs_rel_err"]
    assert logo["median_abs_rel_err"] < report["baselines"]["wait_rule_one_parameter"]["median_abs_rel_err"]
    # the live constants are the fit's
    assert report["fit"]["shared_service"] == pytest.approx(SHARED_SERVICE, abs=1e-9)
    assert report["fit"]["precedence"] == pytest.approx(PRECEDENCE, abs=1e-9)
    assert REPORT.is_file()
    committed = json.loads(REPORT.read_text(encoding="utf-8"))  # the committed report is what this data gives
    assert committed["fit"] == report["fit"]
    assert committed["leave_one_group_out"]["median_abs_rel_err"] == logo["median_abs_rel_err"]
    assert committed["leave_one_group_out"]["per_group"] == logo["per_group"]


def test_held_out_input_bound_groups_are_predicted_from_the_measurement(report: dict[str, Any]) -> None:
    """Each group with an input-bound job, held out of the fit, against the rates in the data file."""
    per_group = {g["group"]: g for g in report["leave_one_group_out"]["per_group"]}
    for jobs in (["r50_64w", "r50_64w"], ["r50_64w", "r50_64w", "r50_64w"]):
        _, measured = _measured(jobs)
        held = per_group["+".join(jobs)]
        for member, m in zip(held["members"], measured, strict=True):
            assert member["duty_source"] == "nvml"
            assert abs(member["predicted_fraction"] - m) / m <= 0.10, (jobs, member, m)  # the LOGO bound


def test_held_out_input_and_gpu_bound_busy_shares_match_the_measurement(report: dict[str, Any]) -> None:
    """The NVML file (an input-bound job beside a GPU-bound one) left out entirely: the model's busy
    shares against the samples, read here from the raw file, within the error the report states."""
    (held,) = report["held_out_input_and_gpu_bound"]
    busy = _nvml_busy()
    for member, role in zip(held["members"], ("gpu_bound", "input_bound"), strict=True):
        assert member["duty_source"] != "nvml"
        err = abs(member["predicted_busy"] - busy[role]) / busy[role]
        assert err == pytest.approx(member["abs_rel_err"], abs=1e-3)
        assert err <= 0.25, (role, member, busy[role])



@pytest.mark.parametrize("duties", [[1.0, 1.0], [0.435, 0.435, 0.435], [0.2, 0.9], [0.6, 0.3, 1.0, 0.05]])
def test_standalone_duties_invert_busy_shares(duties: list[float]) -> None:
    observed = busy_shares(duties)
    assert all(u <= d + 1e-9 for u, d in zip(observed, duties, strict=True))  # sharing lowers what is seen
    # duties that explain what was seen; with precedence a heavy job beside several lighter ones can
    # show as little busy as a lighter one, so from 4 jobs on the answer need not be the one that made it
    assert busy_shares(standalone_duties(observed)) == pytest.approx(observed, abs=0.01)
    if len(duties) <= 3:
        assert standalone_duties(observed) == pytest.approx(duties, abs=0.01)
    assert standalone_duties([0.7]) == (0.7,)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "x", None])
def test_bad_duties_are_refused_with_their_value(bad: Any) -> None:
    with pytest.raises(DutyError, match=r"duties\[1\]"):
        step_rate_fractions([0.5, bad])
