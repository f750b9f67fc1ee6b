"""W over what the pod can use (issue 46, item 3) through the production server over real HTTP on a
loopback port: an empty GPU too small for the pod, or on a node kube-scheduler did not send, is no GPU
the pod waits for; the pod shares a GPU instead (and its bind agrees with its filter)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod, report
from tests.fixtures.kube.server import TOKEN, post, running_server
from tests.unit.test_app import NEED

LIGHT_LONG = {**CNN_ANNOTATIONS, "deepres.io/gpu-share": "0.05", "deepres.io/iterations": str(10**10)}


def _telemetry(url: str, node: str, capacity_mib: float) -> None:
    status, _ = post(url + "/v1/telemetry", report(node, 1, time.time(), [(capacity_mib, 0.0)]), token=TOKEN)
    assert status == 200


def test_a_high_pod_shares_rather_than_wait_for_a_gpu_that_cannot_hold_it(tmp_path: Path) -> None:
    env = {"DEEPRES_SELF_PREEMPTION": "false", "DEEPRES_DEFAULT_GPU_SHARE_FLOOR": "0"}
    with running_server(tmp_path, env=env, use_real_predictor=False) as url:
        _telemetry(url, "small", NEED * 0.8)  # empty, but smaller than the pod's admission
        _telemetry(url, "y", NEED * 2.5)
        _telemetry(url, "z", NEED * 2.5)  # empty and large, but sent only in the last filter below
        first = pod("first", {**LIGHT_LONG, "deepres.io/criticality": "low"})
        status, out = post(url + "/filter", extender_args(first, names=["y"]))
        assert status == 200 and out["NodeNames"] == ["y"]
        assert post(url + "/bind", binding_args(first, "y")) == (200, {"Error": ""})
        second = pod("second", {**LIGHT_LONG, "deepres.io/criticality": "high"})
        status, out = post(url + "/filter", extender_args(second, names=["small", "y"]))
        assert status == 200 and out["NodeNames"] == ["y"], out
        assert post(url + "/bind", binding_args(second, "y")) == (200, {"Error": ""})
        third = pod("third", {**LIGHT_LONG, "deepres.io/criticality": "high"})
        status, out = post(url + "/filter", extender_args(third, names=["small", "y", "z"]))
        assert status == 200 and out["NodeNames"] == ["z"], out  # an empty GPU it may use: no sharing
