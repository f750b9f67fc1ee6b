"""The interference model against REAL co-location measurements (read from the shared data file here,
not copied from the code), its inverse, and its input checks."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from extender.policy.interference import (
    SHARED_SERVICE,
    DutyError,
    busy_shares,
    max_slowdown,
    standalone_duties,
    step_rate_fractions,
)
from extender.simulate.interference import COLOCATION, build_report, fit_shared_service, load_groups

DATA = COLOCATION / "h100-2026-11-27.json"
pytestmark = pytest.mark.skipif(not DATA.is_file(), reason=f"{DATA} not present")
REPORT = Path(__file__).resolve().parents[2] / "reports" / "interference.json"


def _measured(jobs: list[str]) -> tuple[list[float], list[float]]:
    """(alone duties, measured shared/alone fractions) of the data file's group of exactly `jobs`."""
    raw: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
    (group,) = [g for g in raw["groups"] if sorted(g["jobs"]) == sorted(jobs)]
    duties, fractions = [], []
    for shared in group["shared_steps_per_s"]:
        alone = group["alone_steps_per_s"][shared["job"]]
        wait_s = raw["jobs"][shared["job"]]["wait_ms"] / 1000
        duties.append(1 - wait_s * alone)
        fractions.append(shared["steps_per_s"] / alone)
    return duties, fractions


@pytest.mark.parametrize(("jobs", "tolerance"), [
    (["r50_64w", "r50_64w"], 0.05),            # input-bound pair: ~0.81 each
    (["r50_64w", "r50_64w", "r50_64w"], 0.10),  # input-bound triple: ~0.68
    (["r50_64", "r50_64"], 0.15),               # GPU-bound pair: ~0.6
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


def test_a_busier_neighbour_slows_a_job_more() -> None:
    fractions = [step_rate_fractions([0.5, other])[0] for other in (0.0, 0.2, 0.5, 0.8, 1.0)]
    assert fractions[0] == pytest.approx(1.0, abs=0.05)
    assert all(a > b for a, b in itertools.pairwise(fractions))


def test_leave_one_group_out_error_and_the_fitted_constant() -> None:
    groups = load_groups([DATA])
    report = build_report([DATA])
    assert report["leave_one_group_out"]["median_abs_rel_err"] <= 0.15
    # the model beats ignoring the duty (1/n) and the old replay's "no slowdown"
    assert report["leave_one_group_out"]["mean_abs_rel_err"] < report["baselines"]["one_over_n"]["mean_abs_rel_err"]
    assert fit_shared_service(groups) == pytest.approx(SHARED_SERVICE, abs=0.002)
    if REPORT.is_file():  # the committed report is the one this data and code give
        committed = json.loads(REPORT.read_text(encoding="utf-8"))
        assert committed["fit"]["shared_service"] == pytest.approx(SHARED_SERVICE, abs=0.002)
        assert committed["leave_one_group_out"]["median_abs_rel_err"] == report["leave_one_group_out"][
            "median_abs_rel_err"]


@pytest.mark.parametrize("duties", [[1.0, 1.0], [0.435, 0.435, 0.435], [0.2, 0.9], [0.6, 0.3, 1.0, 0.05]])
def test_standalone_duties_invert_busy_shares(duties: list[float]) -> None:
    observed = busy_shares(duties)
    assert all(u <= d + 1e-9 for u, d in zip(observed, duties, strict=True))  # sharing lowers what is seen
    assert standalone_duties(observed) == pytest.approx(duties, abs=0.01)
    assert standalone_duties([0.7]) == (0.7,)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "x", None])
def test_bad_duties_are_refused_with_their_value(bad: Any) -> None:
    with pytest.raises(DutyError, match=r"duties\[1\]"):
        step_rate_fractions([0.5, bad])
