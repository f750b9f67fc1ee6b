"""extender.policy.calibration: the rule alone (the live path is tests/integration/test_calibration_live.py)."""

from __future__ import annotations

import random

import pytest

from extender.policy import calibration as cal

KEY = ("GPU", "550/12.4", "exact")


def pods(n: int, reading, *, nodes: int = 4, seed: int = 0, upper_share: float = 1.1, start: int = 0,
         node_names: list[str] | None = None) -> list[cal.Observation]:
    rnd = random.Random(seed)
    names = node_names or [f"n{i}" for i in range(nodes)]
    out = []
    for i in range(start, start + n):
        point = rnd.uniform(2_000.0, 30_000.0)
        out.append(cal.Observation(f"p{i}", names[i % len(names)], *KEY, point, reading(point, rnd), float(i),
                                   point * upper_share))
    return out


def noisy(point: float, rnd: random.Random) -> float:
    """A GPU keeping 900 MiB more per process and 8% more per byte, with a 3% spread."""
    return (900.0 + 1.08 * point) * rnd.lognormvariate(0.0, 0.03)


def test_learns_an_affine_shift_and_a_bound_that_covers_new_pods() -> None:
    """Over 30 samples of 40 observed pods: the point within 3%, the bound above ~5% of new pods (the
    conformal rank: 2/41 in expectation; one sample of 40 varies by a few points around it)."""
    unders, ratios, errors = [], [], []
    new = pods(400, noisy, seed=100)
    for seed in range(30):
        shift = cal.learn(pods(40, noisy, seed=seed))[KEY]
        assert not shift.offline_holds  # the offline bound (point x 1.1) misses the extra context of small jobs
        fixed = [cal.corrected(o.point_mib, o.upper_mib, {KEY: shift}, KEY) for o in new]
        errors += [abs(f.memory_mib / o.peak_mib - 1) for f, o in zip(fixed, new, strict=True)]
        unders.append(sum(f.memory_mib_upper < o.peak_mib for f, o in zip(fixed, new, strict=True)) / len(new))
        ratios += [f.memory_mib_upper / o.peak_mib for f, o in zip(fixed, new, strict=True)]
    assert sorted(errors)[len(errors) // 2] < 0.03
    assert sum(unders) / len(unders) <= 0.08 and sorted(ratios)[len(ratios) // 2] < 1.15


@pytest.mark.parametrize(("count", "nodes", "learned"), [(11, 4, False), (12, 4, True), (40, 2, False), (40, 3, True)])
def test_needs_enough_pods_on_enough_nodes(count: int, nodes: int, learned: bool) -> None:
    assert (KEY in cal.learn(pods(count, noisy, nodes=nodes))) is learned


def test_a_holding_offline_bound_is_kept_while_few_pods_then_tightened() -> None:
    """A loose offline bound (1.5 x the point) that no pod went above: kept while the pods are too few
    for a conformal rank below their largest ratio, replaced by the tighter calibrated bound once
    they are not; a calibrated bound never goes below the readings' reach (0.98 x the point)."""
    reading = lambda p, rnd: p * rnd.uniform(0.7, 0.98)  # noqa: E731
    few = cal.learn(pods(20, reading, upper_share=1.5))[KEY]
    assert few.offline_holds
    assert cal.corrected(10_000.0, 15_000.0, {KEY: few}, KEY).memory_mib_upper == 15_000.0
    many = cal.learn(pods(150, reading, upper_share=1.5))[KEY]
    assert not many.offline_holds
    tightened = cal.corrected(10_000.0, 15_000.0, {KEY: many}, KEY).memory_mib_upper
    assert 9_500.0 <= tightened < 15_000.0 * 0.8


@pytest.mark.parametrize(("above", "holds"), [(0, True), (1, True), (2, False), (5, False)])
def test_the_offline_bound_holds_through_an_outlier_not_through_several(above: int, holds: bool) -> None:
    """20 pods, the offline bound 1.25 x the point, readings around the point, `above` of them at 1.6 x
    the point: one outlier among 20 is what a bound leaving 3% of pods above shows a third of the
    time, so it is kept (the largest of 20 ratios would be 1.6x); two or more say it does not hold,
    and the calibrated bound covers them."""
    def reading(point: float, rnd: random.Random) -> float:
        return point * rnd.uniform(0.9, 1.05)
    observed = pods(20, reading, upper_share=1.25)
    observed = [cal.Observation(o.pod_uid, o.node, *KEY, o.point_mib, o.point_mib * 1.6 if i < above else o.peak_mib,
                                o.order, o.upper_mib) for i, o in enumerate(observed)]
    shift = cal.learn(observed)[KEY]
    assert shift.offline_holds is holds
    bound = cal.corrected(10_000.0, 12_500.0, {KEY: shift}, KEY).memory_mib_upper
    if holds:
        assert bound == 12_500.0
    else:
        assert bound >= 15_500.0  # the pods above it (1.6x) are covered


def test_the_bound_scale_is_per_batch_regime() -> None:
    """Small-batch pods scattering 2% and large-batch ones 15% around the same line: a small-batch
    pod's bound is tighter than a large-batch one's, and each covers its regime's new pods."""
    def obs(n: int, seed: int, start: int = 0) -> list[cal.Observation]:
        rnd = random.Random(seed)
        out = []
        for i in range(start, start + n):
            point, small = rnd.uniform(2_000.0, 30_000.0), i % 2 == 0
            peak = point * rnd.lognormvariate(0.0, 0.02 if small else 0.15)
            out.append(cal.Observation(f"p{i}", f"n{i % 4}", *KEY, point, peak, float(i), point * 0.9,
                                       cal.regime(8 if small else 128)))
        return out
    shift = cal.learn(obs(200, 0))[KEY]
    assert not shift.offline_holds
    assert shift.factor("small") < shift.factor("large")
    new = obs(2_000, 1, start=1_000)
    for r in ("small", "large"):
        mine = [o for o in new if o.regime == r]
        under = sum(o.peak_mib > shift.bound(o.point_mib, o.upper_mib, r) for o in mine) / len(mine)
        assert under <= 0.06, (r, under)


@pytest.mark.parametrize("factor", [10.0, 0.1, 3.0])
def test_one_node_cannot_steer_it(factor: float) -> None:
    honest = pods(30, noisy, node_names=["a", "b", "c", "d"])
    clean = cal.learn(honest)[KEY]
    poison = pods(30, lambda p, rnd: noisy(p, rnd) * factor, start=100, node_names=["bad"])
    poisoned = cal.learn(honest + poison)[KEY]
    assert poisoned.left_out == ("bad",)
    for point in (2_000.0, 10_000.0, 30_000.0):
        assert poisoned.point(point) == pytest.approx(clean.point(point), rel=0.01)
        assert poisoned.bound(point, point * 1.1) == pytest.approx(clean.bound(point, point * 1.1), rel=0.01)


def test_one_value_per_pod_and_absurd_readings_are_no_observation() -> None:
    base = pods(12, noisy)
    repeated = [cal.Observation(o.pod_uid, o.node, *KEY, o.point_mib, o.peak_mib * 0.5, o.order, o.upper_mib)
                for o in base] * 20  # earlier, lower readings of the same pods
    assert cal.learn(base + repeated)[KEY] == cal.learn(base)[KEY]
    absurd = [cal.Observation(f"x{i}", "n0", *KEY, 5_000.0, value, 100.0 + i, 5_500.0)
              for i, value in enumerate([0.0, 1.0, 5_000.0 * 50])]
    assert cal.learn(base + absurd)[KEY] == cal.learn(base)[KEY]


def test_uncalibrated_key_is_unchanged() -> None:
    answer = cal.corrected(1_000.0, 1_200.0, {}, KEY)
    assert (answer.memory_mib, answer.memory_mib_upper, answer.calibrated, answer.pods) == (1_000.0, 1_200.0, False, 0)


@pytest.mark.parametrize("seed", range(5))
def test_the_intercept_makes_the_pods_relative_errors_least(seed: int) -> None:
    """The point is judged by |point / peak - 1|: under the fitted slope, no other intercept (the
    plain median of the residuals among them) gives the pods a smaller summed relative error."""
    observed = pods(25, noisy, seed=seed)
    xs, ys = [o.point_mib for o in observed], [o.peak_mib for o in observed]
    intercept, slope = cal._theil_sen(xs, ys)

    def cost(a: float) -> float:
        return sum(abs(a + slope * x - y) / y for x, y in zip(xs, ys, strict=True))

    residuals = sorted(y - slope * x for x, y in zip(xs, ys, strict=True))
    assert all(cost(intercept) <= cost(a) + 1e-9 for a in residuals)
    assert cost(intercept) < cost(residuals[len(residuals) // 2]) or intercept == residuals[len(residuals) // 2]
