"""Step time per GPU model (issue 25, part 3)."""

from __future__ import annotations

import json

import pytest

from predictor import steptime
from predictor.runtime import Predictor
from predictor.spec import Demand, JobSpec


def test_gpu_names_as_nvidia_smi_spells_them() -> None:
    assert steptime.gpu_model("NVIDIA H100 80GB HBM3") == (steptime.gpu_model("h100-sxm")[0], True)
    assert steptime.gpu_model("NVIDIA A100-SXM4-40GB")[0].name == "a100-40gb"
    assert steptime.gpu_model("NVIDIA A100-SXM4-80GB")[0].name == "a100-80gb"
    assert steptime.gpu_model("Tesla V100-SXM2-16GB")[0].name == "v100"
    assert steptime.gpu_model("NVIDIA L40S")[0].name == "l40s"
    assert steptime.gpu_model("NVIDIA H100 PCIe")[0].name == "h100-pcie"
    model, known = steptime.gpu_model("Some Future GPU")
    assert not known and model == steptime.FALLBACK_GPU


def test_scaling_follows_the_published_peaks_and_bandwidth() -> None:
    """An A100 has 312/989 of an H100's half-precision tensor peak and 1.555/3.35 of its bandwidth
    (data sheets): a compute-only step takes 989/312 as long, a traffic-only one 3.35/1.555, the
    per-step host cost the same."""
    assert steptime.on_gpu((0.0, 1.0, 0.0), "amp", "NVIDIA A100-SXM4-40GB") == pytest.approx(989 / 312)
    assert steptime.on_gpu((0.0, 1.0, 0.0), "fp32", "NVIDIA A100-SXM4-40GB") == pytest.approx(67 / 19.5)
    assert steptime.on_gpu((0.0, 0.0, 1.0), "amp", "NVIDIA A100-SXM4-40GB") == pytest.approx(3.35 / 1.555)
    assert steptime.on_gpu((0.5, 0.0, 0.0), "amp", "Tesla T4") == pytest.approx(0.5)
    assert steptime.on_gpu((), "amp", "Tesla T4") == 0.0


def test_the_demand_carries_the_step_time_and_stays_backward_compatible() -> None:
    old = Demand(1000.0, 1200.0, 5.0, 60.0, "v1")  # built as before the step time existed
    assert old.step_seconds == 0.0 and old.step_parts == ()
    predictor = Predictor.load()
    small = JobSpec.parse({"model": "timm/resnet18", "batch-size": "8", "precision": "amp"})
    large = JobSpec.parse({"model": "timm/resnet152", "batch-size": "128", "precision": "amp"})
    d_small, d_large = predictor.predict(small), predictor.predict(large)
    assert d_small.step_seconds == pytest.approx(sum(d_small.step_parts), rel=1e-5)
    assert 0 < d_small.step_seconds < d_large.step_seconds
    on_t4 = steptime.step_seconds(large, d_large, "Tesla T4")
    on_h100 = steptime.step_seconds(large, d_large, "NVIDIA H100 80GB HBM3")
    assert on_t4 > on_h100 == pytest.approx(d_large.step_seconds, rel=1e-5)
    assert json.loads(json.dumps(d_large.to_dict()))["step_parts"] == list(d_large.step_parts)


def test_held_out_error_is_recorded_with_the_coefficients() -> None:
    data = steptime.coefficients()
    assert data["held_out_by_group"]["n"] >= 500
    assert len(data["weights"]) == len(steptime.features(1, 1, 1, "amp"))
    assert all(w >= 0 for w in data["weights"])
