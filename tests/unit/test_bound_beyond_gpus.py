"""`policy.bound_beyond_gpus`: the setting and the fallback's three answers (policy/filtering.py). The
live verbs: tests/integration/test_bound_beyond_gpus.py."""

from __future__ import annotations

import pytest

from extender.policy.filtering import filter_nodes, whole_gpu_for
from extender.policy.types import EMPTY_SLACK_MIB, GpuView, NodeView, PodRequest, PolicyParams
from extender.settings import SettingsError, load_settings

# bound 30 GiB, point 18 GiB: above a 24 GiB GPU, the point fits it
POD = PodRequest("u", "ml", "big", 1, admission_mib=30_720.0, predicted_mib=18_432.0, fallback=True)
GPU_MIB = 24_576.0


def test_the_setting_is_read_and_a_bad_value_is_refused_clearly() -> None:
    assert load_settings(env={}).policy.params().bound_beyond_gpus == "whole-gpu"
    assert load_settings(env={"DEEPRES_BOUND_BEYOND_GPUS": "wait"}).policy.params().bound_beyond_gpus == "wait"
    with pytest.raises(SettingsError) as err:
        load_settings(env={"DEEPRES_BOUND_BEYOND_GPUS": "sometimes"})
    assert "policy.bound_beyond_gpus must be whole-gpu, point or wait, got 'sometimes'" in str(err.value)


def test_each_mode_answers_its_own_request() -> None:
    whole = whole_gpu_for(POD, GPU_MIB, PolicyParams())
    assert whole is not None and whole.whole_gpu and whole.admission_mib == GPU_MIB - EMPTY_SLACK_MIB
    point = whole_gpu_for(POD, GPU_MIB, PolicyParams(bound_beyond_gpus="point", usage_margin=1.2))
    assert point is not None and not point.whole_gpu
    assert point.admission_mib == pytest.approx(18_432.0 * 1.2)
    assert whole_gpu_for(POD, GPU_MIB, PolicyParams(bound_beyond_gpus="wait")) is None
    # the point mode never asks for more than an idle GPU of that size has free
    tight = whole_gpu_for(POD, 19_000.0, PolicyParams(bound_beyond_gpus="point", usage_margin=1.2))
    assert tight is not None and tight.admission_mib == 19_000.0 - EMPTY_SLACK_MIB
    # the user's gpu-memory (no fallback) and a point above every GPU get none of it, in any mode
    for mode in ("whole-gpu", "point", "wait"):
        params = PolicyParams(bound_beyond_gpus=mode)
        assert whole_gpu_for(PodRequest("u", "ml", "o", 1, 30_720.0, 18_432.0, fallback=False), GPU_MIB, params) is None
        assert whole_gpu_for(PodRequest("u", "ml", "p", 1, 30_720.0, 25_000.0, fallback=True), GPU_MIB, params) is None


def test_wait_names_the_bound_the_gpu_and_the_point() -> None:
    node = NodeView("n", (GpuView("GPU-0", 0, GPU_MIB, 0.0),), received_s=0.0)
    out = filter_nodes(POD, ["n"], {"n": node}, 0.0, PolicyParams(bound_beyond_gpus="wait"))
    assert out.passed == () and out.request is None
    assert out.unresolvable == {"n": "upper bound 30.0 GiB per GPU exceeds this node's GPUs (24.0 GiB) while the "
                                     "prediction 18.0 GiB fits: it waits for a GPU that holds the bound "
                                     "(policy.bound_beyond_gpus: wait; whole-gpu or point would admit it)"}
    placed = filter_nodes(POD, ["n"], {"n": node}, 0.0, PolicyParams(bound_beyond_gpus="point"))
    assert placed.passed == ("n",) and placed.request is not None and not placed.request.whole_gpu
