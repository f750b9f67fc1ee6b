"""extender.policy.calibration's cheaper fit and its screens, alone (the live path is
tests/integration/test_calibration_safety.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from extender.policy import calibration as cal

KEY = ("GPU", "550/12.4", "exact")


def direct_held_out(xs: list[float], ys: list[float]) -> list[float]:
    """The jackknife written out: for each pod, the line fitted again on the others (Theil-Sen slope over
    their pairs, shrunk; the weighted-median intercept), evaluated at the pod."""
    out = []
    for k in range(len(xs)):
        x = np.array([v for i, v in enumerate(xs) if i != k])
        y = np.array([v for i, v in enumerate(ys) if i != k])
        slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(x.size) for j in range(i + 1, x.size)
                  if abs(x[j] - x[i]) > 1e-6 * max(abs(x[i]), 1.0)]
        slope = float(np.median(slopes)) if slopes else float(np.median(y / x))
        slope = cal._shrunk(slope, x.size)
        out.append(max(cal._intercept(x, y, slope) + slope * xs[k], 1.0))
    return out


@pytest.mark.parametrize("n", [12, 13, 40, 97])
def test_the_fast_jackknife_is_the_direct_one(n: int) -> None:
    rnd = random.Random(n)
    xs = [rnd.uniform(1_000.0, 30_000.0) for _ in range(n)]
    xs[2] = xs[5]  # a tie: a pair without a slope
    ys = [(600.0 + 1.3 * x) * rnd.lognormvariate(0.0, 0.1) for x in xs]
    assert cal._held_out_fits(xs, ys) == pytest.approx(direct_held_out(xs, ys), rel=1e-12)


def obs(i: int, point: float, peak: float, *, node: str, tenant: str, owner: str = "",
        settled: bool = True) -> cal.Observation:
    return cal.Observation(f"p{i}", node, *KEY, point, peak, float(i), point * 1.1, "large", tenant, owner, settled)


def honest(n: int, tenant: str = "a", start: int = 0, nodes: int = 4) -> list[cal.Observation]:
    rnd = random.Random(start)
    out = []
    for i in range(start, start + n):
        point = rnd.uniform(2_000.0, 30_000.0)
        out.append(obs(i, point, (900.0 + 1.08 * point) * rnd.lognormvariate(0.0, 0.03), node=f"n{i % nodes}",
                       tenant=tenant))
    return out


def test_a_pod_not_yet_settled_is_no_observation() -> None:
    pods = honest(16)
    unsettled = [cal.Observation(**{**o.__dict__, "settled": False}) for o in pods]
    assert KEY in cal.learn(pods) and KEY not in cal.learn(unsettled)


def test_a_flood_of_one_tenant_never_pushes_the_others_out_of_the_window() -> None:
    """300 newer pods of one tenant (each its own owner, agreeing with nobody): the window still holds
    the other tenants' pods, and the line is theirs."""
    clean = cal.learn(honest(20, "a") + honest(20, "b", start=100))[KEY]
    flood = [obs(1_000 + i, 5_000.0 + 10 * i, (5_000.0 + 10 * i) * 0.1, node=f"n{i % 4}", tenant="m", owner=f"j{i}")
             for i in range(300)]
    poisoned = cal.learn(honest(20, "a") + honest(20, "b", start=100) + flood)[KEY]
    assert poisoned.point(10_000.0) == pytest.approx(clean.point(10_000.0), rel=0.02)


def test_small_clusters_need_only_their_nodes() -> None:
    pods = honest(16, nodes=1)
    assert KEY not in cal.learn(pods)  # without the cluster's size: 3 nodes needed
    assert KEY in cal.learn(pods, nodes_of={KEY[:2]: 1})
    assert KEY not in cal.learn(pods, nodes_of={KEY[:2]: 4})  # 4 nodes of the model: 3 must agree


def test_one_pod_of_a_regime_moves_the_kept_offline_bound_by_a_quarter_at_most() -> None:
    """19 small-batch pods far under their offline bound, one large-batch pod right at it: the large
    regime's bound is widened, by 25% at most (not by the whole distance one pod says)."""
    pods = [cal.Observation(f"p{i}", f"n{i % 4}", *KEY, 10_000.0 + 100 * i, 6_000.0 + 60 * i, float(i),
                            11_000.0 + 110 * i, "small", "a") for i in range(19)]
    pods.append(cal.Observation("big", "n3", *KEY, 10_000.0, 11_000.0, 19.0, 11_000.0, "large", "a"))
    shift = cal.learn(pods)[KEY]
    assert shift.offline_holds
    assert shift.bound(10_000.0, 11_000.0, "large") == pytest.approx(11_000.0 * 1.25, rel=1e-3)
    assert shift.bound(10_000.0, 11_000.0, "small") <= 11_000.0


def test_the_file_is_one_canonical_json_of_the_pods() -> None:
    """The pods encoded piece by piece (the learner yields between pieces) are byte for byte one
    json.dumps of them with sorted keys and no spaces, the form the checksum is verified on."""
    import hashlib
    import json

    from extender.calibration_store import Placed, encode

    pods = [(f"uid-{i:04d}-é" if i % 7 == 0 else f"uid-{(i * 37) % 601}", Placed(
        f"node-{i % 5}", "NVIDIA Tëst 80GB", "580.1/13.0", "exact", 1_000.0 + i / 3, float(i), 1_234.5 + i, 1_500.0,
        "large", "team", "owner/j", i % 2 == 0)) for i in range(600)]
    whole = json.dumps({uid: dict(vars(p)) for uid, p in pods}, sort_keys=True, separators=(",", ":"),
                       ensure_ascii=True)
    written = json.loads(encode(pods))
    assert json.dumps(written["pods"], sort_keys=True, separators=(",", ":"), ensure_ascii=True) == whole
    assert written["sha256"] == hashlib.sha256(whole.encode()).hexdigest()
