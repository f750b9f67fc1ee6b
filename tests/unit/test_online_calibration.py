"""Online calibration per (GPU model, node image) (issue 25, part 5): extender.policy.calibration."""

from __future__ import annotations

from extender.policy import calibration as C
from extender.simulate import calibration_replay

GPU, IMAGE = "NVIDIA A100-SXM4-40GB", "ubuntu-22.04-driver-550"


def obs(uid: str, predicted: float, peak: float, order: float = 0.0, admitted: float = 0.0,
        gpu: str = GPU) -> C.Observation:
    return C.Observation(uid, gpu, IMAGE, predicted, peak, order, admitted)


def test_never_from_one_pod_nor_from_fewer_than_min_pods() -> None:
    one_pod_many_reports = [obs("p1", 1000.0, 3000.0, t) for t in range(100)]
    assert C.learn(one_pod_many_reports) == {}
    four = [obs(f"p{i}", 1000.0, 1700.0) for i in range(C.MIN_PODS - 1)]
    assert C.learn(four) == {}
    assert C.corrected(1000.0, 1200.0, C.learn(four), GPU, IMAGE) == (1000.0, 1200.0)


def test_a_pod_counts_once_with_its_highest_peak() -> None:
    pods = [obs(f"p{i}", 1000.0, 1700.0) for i in range(5)]
    noisy = pods + [obs("p0", 1000.0, 900.0, 1.0)] * 50  # many low readings of one pod
    assert C.learn(noisy)[(GPU, IMAGE)].mib == 700.0


def test_robust_to_an_outlier_and_bounded() -> None:
    pods = [obs(f"p{i}", 1000.0, 1700.0 + i, admitted=1200.0) for i in range(9)]
    outlier = obs("oom", 1000.0, 80_000.0, admitted=1200.0)
    learned = C.learn([*pods, outlier])[(GPU, IMAGE)]
    assert 700.0 <= learned.mib <= 709.0 and learned.bound_mib < 1000.0
    huge = C.learn([obs(f"p{i}", 1000.0, 70_000.0) for i in range(6)])[(GPU, IMAGE)]
    assert huge.mib == C.MAX_UP_MIB and huge.raw_median_mib == 69_000.0
    down = C.learn([obs(f"p{i}", 9000.0, 1000.0) for i in range(6)])[(GPU, IMAGE)]
    assert down.mib == -C.MAX_DOWN_MIB


def test_per_gpu_model_and_image() -> None:
    a100 = [obs(f"a{i}", 1000.0, 1700.0) for i in range(5)]
    h100 = [obs(f"h{i}", 1000.0, 900.0, gpu="NVIDIA H100 80GB HBM3") for i in range(5)]
    learned = C.learn([*a100, *h100])
    assert learned[(GPU, IMAGE)].mib == 700.0
    assert learned[("NVIDIA H100 80GB HBM3", IMAGE)].mib == -50.0  # downwards: half of -100
    assert C.corrected(1000.0, 1200.0, learned, "Tesla T4", IMAGE) == (1000.0, 1200.0)


def test_a_gpu_with_700_mib_more_per_process_is_corrected_within_20_pods() -> None:
    """The measured exact-path jobs replayed on a GPU model keeping +700 MiB per process: the bound's
    under-rate is far above 5% without the learner and back to <= 5% on the pods after the 20th."""
    jobs = calibration_replay.exact_jobs()
    for seed in range(3):
        result = calibration_replay.replay(jobs, 700.0, after=20, seed=seed)
        assert result["under_rate_without"] > 0.2
        assert result["under_rate_with"] <= 0.05
