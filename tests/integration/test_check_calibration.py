"""The independent calibration check (devtools/check_calibration.py) in its quick mode: real `deepres serve`
processes on loopback, the H100 campaign's real peaks, the attacker and the clean shutdown. Asserts what
the live path must do (calibrated after 20 pods, no owner moving another's admission below its need,
nothing learned lost at SIGTERM) and that the report has every key the tools read; no timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import check_calibration

pytestmark = pytest.mark.slow  # (the shipped predictor is in the tree: never skipped)

TOP = {"gpu", "data", "quick", "observed_pods", "seeds", "accuracy", "by_seed", "accuracy_same_pool", "targets",
       "attacker", "learning", "shutdown", "verdict", "took_s", "provenance"}
FIGURES = {"n", "median_abs_rel_err", "above_bound", "bound_over_peak", "calibrated"}


def test_the_quick_check_measures_through_the_live_path(tmp_path: Path) -> None:
    out = tmp_path / "calibration-check.json"
    assert check_calibration.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) == TOP
    assert report["quick"] is True and report["seeds"] == 1
    # the scorer: the server learned from the 20 observed pods of each path and answered calibrated
    for path in ("exact", "family"):
        for seed in (report["by_seed"]["0"][path], report["accuracy_same_pool"]["by_seed"]["0"][path]):
            assert set(seed) >= FIGURES, seed
            assert seed["observed"] == check_calibration.OBSERVED
            assert seed["calibrated"] == 1.0, f"{path}: answers not calibrated after 20 pods: {seed}"
            assert seed["n"] >= 100  # the held-out groups' rows, answered
            assert set(seed["uncalibrated"]) == {"median_abs_rel_err", "above_bound", "bound_over_peak"}
        seed = report["by_seed"]["0"][path]
        assert 0.0 <= seed["above_bound"] <= 1.0 and seed["bound_over_peak"] >= 1.0
        for figure in ("median_abs_rel_err", "above_bound", "bound_over_peak"):
            assert set(report["accuracy"][f"{path}.{figure}"]) == {"median", "worst"}
    # the attacker: one owner's pods either never moved the victim by 10%, or did (and then by 10%)
    attacker = report["attacker"]
    for direction in ("down", "up"):
        found = attacker[direction]
        assert attacker[f"{direction}_pods_to_shift"] == found["pods_to_shift"]
        assert found["attack_pods"] >= 1
        if found["pods_to_shift"] is not None:
            moved = (found["lowest_admission_mib"] if direction == "down" else found["highest_admission_mib"])
            assert abs(moved / found["clean_admission_mib"] - 1.0) >= check_calibration.SHIFT
        assert found["below_need"] is False, f"{direction}: the victim admitted below its real peak: {found}"
    # the learning servers compare like with like: one learned every key, the other none
    learning = report["learning"]
    assert learning["keys_calibrated"] == learning["keys"]
    assert learning["keys_calibrated_on_none"] == 0
    assert all(r["keys_p99_ms"] > 0 and r["none_p99_ms"] > 0 for r in learning["rounds"])
    # a clean shutdown after a peak grew: the restarted server answers the grown line
    stop = report["shutdown"]
    assert stop["exit_code"] == 0
    assert stop["grew"] is True
    assert stop["nothing_lost"] is True, stop
    assert stop["after_restart"] == stop["before_sigterm"]
    assert all(isinstance(v, bool) for v in report["verdict"].values())
    assert report["provenance"]["command"] == "python -m devtools.check_calibration --quick"
