"""`policy.bound_beyond_gpus` through the served verbs (real HTTP on loopback, the real server): what a
pod gets whose predictor bound fits none of its candidate GPUs while its point estimate does
(docs/rules.md, whole-GPU fallback; docs/admin.md). `whole-gpu`, the default, is
tests/integration/test_server_http.py's whole-GPU test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod, report
from tests.fixtures.kube.server import TOKEN, get, post, running_server

# a 350M-parameter transformer on the family path: the bound is far above the point estimate
BIG = {
    "deepres.io/model-type": "transformer", "deepres.io/params-millions": "350", "deepres.io/batch-size": "16",
    "deepres.io/input-dim": "1024", "deepres.io/num-layers": "24", "deepres.io/precision": "amp",
    "deepres.io/optimizer": "adamw",
}


def _server(tmp: Path, mode: str, **extra: str) -> Iterator[str]:
    env = {"DEEPRES_SELF_PREEMPTION": "false", "DEEPRES_ENGINE": "granian", "DEEPRES_BOUND_BEYOND_GPUS": mode,
           **extra}
    with running_server(tmp, env=env, use_real_predictor=True) as base:  # the shipped family path
        yield base


@pytest.fixture
def wait_url(tmp_path: Path) -> Iterator[str]:
    yield from _server(tmp_path, "wait")


@pytest.fixture
def point_url(tmp_path: Path) -> Iterator[str]:
    # memory alone decides who joins a busy GPU (the compute rule would keep a second job off it and hide
    # what the first one's admission leaves free)
    yield from _server(tmp_path, "point", DEEPRES_SHARING="false")


def _telemetry(url: str, node: str, seq: int, size_mib: float) -> None:
    status, out = post(url + "/v1/telemetry", report(node, seq, time.time(), [(size_mib, 0.0)]), token=TOKEN)
    assert status == 200 and out["accepted"], out


def _point_and_bound(url: str) -> tuple[float, float]:
    status, decided = post(url + "/v1/predict", {"annotations": BIG})
    assert status == 200, decided
    point, upper = decided["demand"]["memory_mib"], decided["demand"]["memory_mib_upper"]
    assert upper - point > 2048, (point, upper)  # room for a GPU size between them
    return point, upper


def _whole_gpu_binds(url: str) -> float:
    text = get(url + "/metrics")[1]
    line = next((li for li in text.splitlines() if li.startswith("deepres_extender_whole_gpu_binds_total ")), "")
    return float(line.split()[1]) if line else 0.0


def test_wait_refuses_with_a_reason_that_says_so_until_a_gpu_holds_the_bound(wait_url: str) -> None:
    point, upper = _point_and_bound(wait_url)
    size = round((point + upper) / 2)  # holds the point, not the bound
    _telemetry(wait_url, "mid", 1, float(size))
    big = pod("beyond-wait", BIG)
    status, out = post(wait_url + "/filter", extender_args(big, names=["mid"]))
    assert status == 200 and out["NodeNames"] == [], out
    reason = out["FailedAndUnresolvableNodes"]["mid"]
    assert reason.startswith(f"upper bound {upper / 1024:.1f} GiB per GPU exceeds this node's GPUs "
                             f"({size / 1024:.1f} GiB) while the prediction {point / 1024:.1f} GiB fits"), reason
    assert "policy.bound_beyond_gpus: wait" in reason
    # bind agrees: no whole GPU, no admission at the point
    status, error = post(wait_url + "/bind", binding_args(big, "mid"))
    assert status == 200 and error["Error"], error
    # a GPU that holds the bound becomes a candidate: the pod goes there
    _telemetry(wait_url, "large", 1, float(upper + 4096))
    status, out = post(wait_url + "/filter", extender_args(big, names=["mid", "large"]))
    assert status == 200 and out["NodeNames"] == ["large"], out
    assert _whole_gpu_binds(wait_url) == 0.0


def test_point_admits_at_the_point_times_the_usage_margin_and_shares_the_gpu(point_url: str) -> None:
    point, upper = _point_and_bound(point_url)
    size = round((point + upper) / 2)
    _telemetry(point_url, "mid", 1, float(size))
    big = pod("beyond-point", BIG)
    status, out = post(point_url + "/filter", extender_args(big, names=["mid"]))
    assert status == 200 and out["NodeNames"] == ["mid"], out
    assert post(point_url + "/bind", binding_args(big, "mid")) == (200, {"Error": ""})
    assert _whole_gpu_binds(point_url) == 0.0  # not a whole GPU
    _telemetry(point_url, "mid", 2, float(size))  # the job has not allocated yet: its reservation holds
    admitted = point * 1.10  # the usage rule's margin, policy.usage_margin's documented default
    room = size - admitted
    assert room > 1024, (size, admitted)

    def fits(name: str, mib: float) -> bool:
        small = pod(name, {**CNN_ANNOTATIONS, "deepres.io/gpu-memory": f"{int(mib)}Mi"})
        status, answer = post(point_url + "/filter", extender_args(small, names=["mid"]))
        assert status == 200, answer
        return bool(answer["NodeNames"] == ["mid"])

    # what is left beside it is the GPU less point x margin (to 256 MiB either way): it shares the GPU
    assert fits("beside-under", room - 256)
    assert not fits("beside-over", room + 256)
    assert room + 256 < size - 128  # a whole-GPU reservation would have refused both
