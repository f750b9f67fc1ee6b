"""Sharing's promise kept by feedback (issue 46, item 2) through the production server over real HTTP on
a loopback port: the agent's per-process samples show two pods sharing a GPU each running twice as slow
as alone (their busy shares halve); the GPU then takes no third pod, and the newest joiner is moved
(evicted: the metric and the pod's Warning event say so). With the feedback off (the default) the same
reports change nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod, report
from tests.fixtures.kube.server import TOKEN, get, post, running_server
from tests.unit.test_app import NEED

LIGHT = {**CNN_ANNOTATIONS, "deepres.io/gpu-share": "0.2", "deepres.io/iterations": str(10**10)}
ENV = {"DEEPRES_SELF_PREEMPTION": "false", "DEEPRES_DEFAULT_GPU_SHARE_FLOOR": "0", "DEEPRES_USAGE_WARMUP_S": "0",
       "DEEPRES_SHARING_MOVE_AFTER_S": "0"}
CAPACITY = NEED * 4


class Agent:
    """One node's agent: reports with growing sequence numbers, pods with per-process busy shares."""

    def __init__(self, url: str, node: str) -> None:
        self.url, self.node, self.sequence = url, node, 0

    def send(self, busy: dict[str, float]) -> None:
        self.sequence += 1
        pods = [{"pod_uid": uid, "current_memory_mib": NEED / 2, "peak_memory_mib": NEED / 2,
                 "gpu_uuids": [f"{self.node}-gpu0"], "gpu_duty": share, "duty_source": "process"}
                for uid, share in busy.items()]
        used = NEED / 2 * len(busy)
        body = report(self.node, self.sequence, time.time(), [(CAPACITY, used)], pods=pods)
        status, out = post(self.url + "/v1/telemetry", body, token=TOKEN)
        assert status == 200, out


def _place(url: str, body: dict[str, Any], node: str) -> None:
    status, out = post(url + "/filter", extender_args(body, names=[node]))
    assert status == 200 and out["NodeNames"] == [node], out
    assert post(url + "/bind", binding_args(body, node)) == (200, {"Error": ""})


def _moves(url: str) -> float:
    status, text = get(url + "/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith('deepres_extender_sharing_moves_total{outcome="moved"}'):
            return float(line.split()[-1])
    return 0.0


def _scenario(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    agent = Agent(url, "y")
    agent.send({})
    first, second = pod("first", LIGHT), pod("second", LIGHT)
    _place(url, first, "y")
    for _ in range(2):  # alone: its busy share is its solo duty
        agent.send({first["metadata"]["uid"]: 0.2})
    _place(url, second, "y")  # light beside light: the forecast says it pays
    for _ in range(6):  # together each shows half its solo busy share: each runs 2x slower than alone
        agent.send({first["metadata"]["uid"]: 0.1, second["metadata"]["uid"]: 0.1})
    return first, second


def test_a_gpu_over_its_bound_takes_no_joiner(tmp_path: Path) -> None:
    env = {**ENV, "DEEPRES_SHARING_FEEDBACK": "true", "DEEPRES_SHARING_MOVE_AFTER_S": "1000000"}
    with running_server(tmp_path, env=env, use_real_predictor=False) as url:
        _scenario(url)
        third = pod("third", LIGHT)
        status, out = post(url + "/filter", extender_args(third, names=["y"]))
        assert status == 200 and out["NodeNames"] in ([], None), out
        assert "compute" in str(out["FailedNodes"].get("y", "")), out
        assert _moves(url) == 0.0  # not yet: the GPU has not stayed over its bound long enough


def test_the_newest_joiner_of_a_gpu_that_stays_over_its_bound_is_moved(tmp_path: Path) -> None:
    with running_server(tmp_path, env={**ENV, "DEEPRES_SHARING_FEEDBACK": "true"}, use_real_predictor=False) as url:
        _scenario(url)
        deadline = time.monotonic() + 30.0
        while _moves(url) < 1.0:  # the worker evicts off the request: wait for the state, not a time
            assert time.monotonic() < deadline, "the newest joiner was never moved"
            time.sleep(0.1)
        assert _moves(url) == 1.0  # one move (the newest joiner: tests/unit/test_feedback.py), not both


def test_with_the_feedback_off_the_same_reports_change_nothing(tmp_path: Path) -> None:
    with running_server(tmp_path, env=ENV, use_real_predictor=False) as url:
        _scenario(url)
        third = pod("third", LIGHT)
        status, out = post(url + "/filter", extender_args(third, names=["y"]))
        assert status == 200 and out["NodeNames"] == ["y"], out
        assert _moves(url) == 0.0
