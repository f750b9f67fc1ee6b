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


def test_perfect_prediction_and_constant_truth() -> None:
    assert regression_metrics([1.0, 2.0], [1.0, 2.0])["r2"] == pytest.approx(1.0)
    assert regression_metrics([3.0, 3.0], [2.0, 4.0])["r2"] == 0.0


def test_under_rate_and_over_reservation() -> None:
    truth = [100.0, 200.0, 300.0, 400.0]
    upper = [110.0, 190.0, 300.0, 600.0]  # one under; covered excess: 10%, 0%, 50%
    assert under_rate(truth, upper) == pytest.approx(0.25)
    assert over_reservation(truth, upper) == pytest.approx((0.1 + 0.0 + 0.5) / 3)


def test_upper_margin_covers_the_requested_share() -> None:
    truth = [float(v) for v in range(100, 200)]
    pred = [100.0] * 100
    m = upper_margin(truth, pred, 0.9)
    covered = sum(t <= p * math.exp(m) for t, p in zip(truth, pred, strict=True))
    assert covered >= 90
    assert upper_margin(truth, pred, 0.5) < m


@pytest.mark.parametrize("bad", [([], []), ([1.0], [1.0, 2.0])])
def test_mismatched_inputs_are_rejected(bad: tuple[list[float], list[float]]) -> None:
    with pytest.raises(ValueError, match="same length"):
        regression_metrics(*bad)
