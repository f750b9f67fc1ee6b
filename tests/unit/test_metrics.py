"""Metrics against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from predictor.metrics import over_reservation, regression_metrics, under_rate, upper_margin


def test_regression_metrics_by_hand() -> None:
    # errors: +1, -2, 0, +1 ; truth mean 5 -> SS_tot = 9 + 1 + 1 + 9 = 20 ; SS_res = 1 + 4 + 0 + 1 = 6
    m = regression_metrics([2.0, 4.0, 6.0, 8.0], [3.0, 2.0, 6.0, 9.0])
    assert m["mse"] == pytest.approx(6 / 4)
    assert m["rmse"] == pytest.approx(math.sqrt(1.5))
    assert m["mae"] == pytest.approx(4 / 4)
    assert m["mape"] == pytest.approx((1 / 2 + 2 / 4 + 0 + 1 / 8) / 4 * 100)
    assert m["r2"] == pytest.approx(1 - 6 / 20)
    # relative errors 0.5, 0.5, 0, 0.125: median 0.3125; p90 by linear interpolation 0.5
    assert m["median_abs_rel_err"] == pytest.approx((0.125 + 0.5) / 2)
    assert m["p90_abs_rel_err"] == pytest.approx(0.5)


def test_perfect_prediction_and_constant_truth() -> None:
    assert regression_metrics([1.0, 2.0], [1.0, 2.0])["r2"] == pytest.approx(1.0)
    assert regression_metrics([3.0, 3.0], [2.0, 4.0])["r2"] == 0.0


def test_under_rate_and_over_reservation() -> None:
    truth = [100.0, 200.0, 300.0, 400.0]
    upper = [110.0, 190.0, 300.0, 600.0]  # one under; upper / truth - 1: 10%, -5%, 0%, 50%
    assert under_rate(truth, upper) == pytest.approx(0.25)
    assert over_reservation(truth, upper) == pytest.approx((0.1 - 0.05 + 0.0 + 0.5) / 4)


def test_upper_margin_covers_the_requested_share() -> None:
    truth = [float(v) for v in range(100, 200)]
    pred = [100.0] * 100
    m = upper_margin(truth, pred, 0.9)
    covered = sum(t <= p * math.exp(m) for t, p in zip(truth, pred, strict=True))
    assert covered >= 90
    assert upper_margin(truth, pred, 0.5) < m


def test_upper_margin_is_the_conformal_rank() -> None:
    # 9 calibration jobs, coverage 0.8: rank ceil(10 * 0.8) = 8 -> the 8th smallest ratio (not the 0.8 quantile)
    truth = [float(v) for v in range(101, 110)]
    m = upper_margin(truth, [100.0] * 9, 0.8)
    assert m == pytest.approx(math.log(108 / 100))
    # too few jobs for the coverage asked: the largest
    assert upper_margin(truth, [100.0] * 9, 0.99) == pytest.approx(math.log(109 / 100))


@pytest.mark.parametrize("bad", [([], []), ([1.0], [1.0, 2.0])])
def test_mismatched_inputs_are_rejected(bad: tuple[list[float], list[float]]) -> None:
    with pytest.raises(ValueError, match="same length"):
        regression_metrics(*bad)
