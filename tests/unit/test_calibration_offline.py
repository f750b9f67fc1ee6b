"""devtools.calibration_offline: the rule run over rows without a server (the bench's split and the
bound-side draws) observes only what fits and scores only what it did not observe."""

from __future__ import annotations

import random

from devtools import calibration_offline as offline


def rows(n: int, seed: int = 0) -> list[offline.Row]:
    """A GPU whose processes keep 1.5 GiB less than the offline point, +-3%; one row too large for any GPU."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        point = 200_000.0 if i == 3 else rnd.uniform(2_000.0, 30_000.0)
        out.append(offline.Row(point, point * 1.1, "large", (point - 1_536.0) * rnd.uniform(0.97, 1.03)))
    return out


def test_the_bench_split_learns_from_the_first_rows_and_scores_the_rest() -> None:
    data = rows(260)
    before = offline.run(data[:200], data[200:], "exact", 0)  # nothing observed: the offline demand
    after = offline.run(data[:200], data[200:], "exact", 20)
    assert before["median_abs_rel_err"] > 0.1 and after["median_abs_rel_err"] < 0.04
    assert after["under_rate"] <= 0.05 and after["median_bound_ratio"] <= before["median_bound_ratio"]  # it held: kept


def test_a_bound_side_draw_scores_the_rows_it_did_not_observe() -> None:
    figures = offline.bound_side(rows(200), "exact", 20, draw=1)
    assert figures["observed"] == 20 and figures["scored"] == 180  # the row too large is scored, not observed
    assert figures["median_abs_rel_err"] < 0.04
