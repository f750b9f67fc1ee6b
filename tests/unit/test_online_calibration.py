"""Online calibration per (GPU model, node software, path) (issues 25 and 30): extender.policy.calibration
keyed per GPU model, and the replay on a GPU keeping more per process (the rule alone is
tests/unit/test_calibration_policy.py; the live path tests/integration/test_calibration_live.py)."""

from __future__ import annotations

import random

from extender.policy import calibration as C
from extender.simulate import calibration_replay

A100, H100, SOFTWARE = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "550.54/12.4"


def observed(gpu: str, factor: float, n: int = 16) -> list[C.Observation]:
    rnd = random.Random(gpu)
    out = []
    for i in range(n):
        point = rnd.uniform(2_000.0, 20_000.0)
        out.append(C.Observation(f"{gpu}-{i}", f"node-{i % 4}", gpu, SOFTWARE, "exact", point,
                                 point * factor * rnd.uniform(0.98, 1.02), float(i), point * 1.1))
    return out


def test_per_gpu_model_and_node_software() -> None:
    learned = C.learn([*observed(A100, 1.3), *observed(H100, 0.9)])
    assert learned[(A100, SOFTWARE, "exact")].point(10_000.0 * 1.0) > 12_500.0
    assert learned[(H100, SOFTWARE, "exact")].point(10_000.0) < 9_300.0
    other = C.corrected(1_000.0, 1_200.0, learned, (A100, "535.0/12.2", "exact"))  # other node software
    assert (other.memory_mib, other.memory_mib_upper, other.calibrated) == (1_000.0, 1_200.0, False)


def test_a_gpu_with_700_mib_more_per_process_is_corrected_within_20_pods() -> None:
    """Measured exact-path jobs replayed on a GPU model keeping +700 MiB per process: the bound's
    under-rate is far above 5% without the learner and back near 5% on the pods after the 20th."""
    jobs = calibration_replay.exact_jobs()[:120]
    runs = [calibration_replay.replay(jobs, 700.0, after=20, seed=seed) for seed in range(3)]
    assert all(r["under_rate_without"] > 0.2 for r in runs)
    assert sum(r["under_rate_with"] for r in runs) / len(runs) <= 0.07
