"""The production server (`deepres serve --no-kube`) over real HTTP on a loopback port, under each
engine (granian, the default, and gunicorn): kube-scheduler's golden payloads, the four verbs,
telemetry auth and staleness, probes."""

from __future__ import annotations

import copy
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod, preemption_args, report
from tests.fixtures.kube.server import TOKEN, get, post, running_server

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kube"


@pytest.fixture(scope="module", params=["granian", "gunicorn"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # the preempt verb is tested here; the extender's own evictions are tested in test_app
    env = {"DEEPRES_SELF_PREEMPTION": "false", "DEEPRES_ENGINE": request.param}
    with running_server(tmp_path_factory.mktemp("server"), env=env) as base:
        yield base


@pytest.fixture(params=["granian", "gunicorn"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A server of its own: no node of another test (an empty GPU anywhere makes the preemption gain
    check's wait 0, so no eviction would pay)."""
    env = {"DEEPRES_SELF_PREEMPTION": "false", "DEEPRES_ENGINE": request.param}
    with running_server(tmp_path, env=env) as base:
        yield base


def golden(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def telemetry(url: str, node: str, seq: int, gpus: list[tuple[float, float]], **kw: Any) -> tuple[int, Any]:
    return post(url + "/v1/telemetry", report(node, seq, time.time(), gpus, **kw), token=TOKEN)


def _only(args: dict[str, Any], node: str) -> dict[str, Any]:
    """The golden ExtenderArgs with `node` as the only candidate (by name or as its Node object)."""
    if args.get("NodeNames") is not None:
        return {**args, "NodeNames": [node]}
    return {**args, "Nodes": {**args["Nodes"], "items": [n for n in args["Nodes"]["items"]
                                                         if n["metadata"]["name"] == node]}}


def test_golden_filter_prioritize_in_both_node_modes(url: str) -> None:
    assert telemetry(url, "gpu-node-1", 1, [(40960.0, 0.0), (40960.0, 30000.0)])[0] == 200
    assert telemetry(url, "gpu-node-2", 1, [(40960.0, 40000.0)])[0] == 200
    for name in ("filter_names.json", "filter_nodes.json"):
        status, out = post(url + "/filter", golden(name))
        assert status == 200 and out["Error"] == ""
        assert out["NodeNames"] == ["gpu-node-1"]
        assert out["FailedNodes"] == {} == out["FailedAndUnresolvableNodes"]  # a node fits: no reasons
        if name == "filter_nodes.json":
            assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-node-1"]
        status, alone = post(url + "/filter", _only(golden(name), "gpu-node-2"))
        assert status == 200 and alone["NodeNames"] == []
        assert alone["FailedNodes"]["gpu-node-2"].startswith("gpu-0: needs ")
        assert alone["FailedNodes"]["gpu-node-2"].endswith("0.9 GiB free")
        status, scores = post(url + "/prioritize", golden(name))
        assert status == 200
        assert {s["Host"] for s in scores} == {"gpu-node-1", "gpu-node-2"}
        by_host = {s["Host"]: s["Score"] for s in scores}
        assert by_host["gpu-node-2"] == 0 and 0 < by_host["gpu-node-1"] <= 10


def test_missing_and_stale_telemetry_reasons(tmp_path: Path, url: str) -> None:
    status, out = post(url + "/filter", extender_args(pod("lonely", CNN_ANNOTATIONS), names=["never-reported"]))
    assert status == 200
    assert out["FailedAndUnresolvableNodes"] == {"never-reported": "no agent report"}
    with running_server(tmp_path, env={"DEEPRES_TELEMETRY_TTL_S": "1"}) as short:
        telemetry(short, "n", 1, [(40960.0, 0.0)])
        time.sleep(2.2)
        _, out = post(short + "/filter", extender_args(pod("p", CNN_ANNOTATIONS), names=["n"]))
    reason = out["FailedAndUnresolvableNodes"]["n"]
    assert reason.startswith("telemetry stale (") and reason.endswith("s old)")
    assert int(reason.removeprefix("telemetry stale (").removesuffix("s old)")) >= 2


def test_telemetry_needs_the_token(url: str) -> None:
    body = report("x", 1, time.time(), [(1000.0, 0.0)])
    assert post(url + "/v1/telemetry", body)[0] == 401
    assert post(url + "/v1/telemetry", body, token="wrong")[0] == 401
    status, out = post(url + "/v1/telemetry", {**body, "source": "guess"}, token=TOKEN)
    assert status == 400 and "report.source" in out["error"]


def test_bind_then_preempt_over_http(fresh_url: str) -> None:
    url = fresh_url
    telemetry(url, "pn", 1, [(12000.0, 0.0)])
    # a long job (10^9 steps: days by any predictor, the test double's included): evicting it just after
    # its bind pays by the gain check (policy.preemption.preemption_pays: the high pod would otherwise wait
    # its whole run, far more than the restart the eviction costs)
    low = pod("low-job", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low", "deepres.io/gpu-memory": "8Gi",
                          "deepres.io/iterations": "1000000000"})
    post(url + "/filter", extender_args(low, names=["pn"]))
    assert post(url + "/bind", binding_args(low, "pn")) == (200, {"Error": ""})
    high = pod("high-job", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high", "deepres.io/gpu-memory": "8Gi"})
    status, out = post(url + "/filter", extender_args(high, names=["pn"]))
    assert out["FailedNodes"] == {"pn": "gpu-0: needs 8.0 GiB, 3.7 GiB free"}
    status, out = post(url + "/preempt", preemption_args(high, {"pn": []}))
    assert out == {"NodeNameToMetaVictims": {"pn": {"Pods": [{"UID": low["metadata"]["uid"]}],
                                                    "NumPDBViolations": 0}}}
    status, out = post(url + "/preempt", preemption_args(low, {"pn": []}))
    assert status == 200 and out == {"NodeNameToMetaVictims": {}}
    status, error = post(url + "/bind", binding_args(high, "pn"))
    assert status == 200
    assert error["Error"].startswith("cannot bind default/high-job to pn: gpu-0: needs 8.0 GiB")


# a 350M-parameter transformer: the predictor's bound is far above its point estimate
BIG_ANNOTATIONS = {
    "deepres.io/model-type": "transformer", "deepres.io/params-millions": "350", "deepres.io/batch-size": "16",
    "deepres.io/input-dim": "1024", "deepres.io/num-layers": "24", "deepres.io/precision": "amp",
    "deepres.io/optimizer": "adamw",
}


def _whole_gpu_binds(url: str) -> float:
    text = get(url + "/metrics")[1]
    line = next((li for li in text.splitlines() if li.startswith("deepres_extender_whole_gpu_binds_total ")), "")
    return float(line.split()[1]) if line else -1.0


def test_a_pod_whose_bound_exceeds_every_gpu_gets_a_whole_gpu_that_no_other_pod_shares(url: str) -> None:
    """The whole-GPU fallback through the served verbs: the node's only GPU is smaller than the
    predictor's upper bound for the pod and larger than its point estimate."""
    status, decided = post(url + "/v1/predict", {"annotations": BIG_ANNOTATIONS})
    assert status == 200
    point, upper = decided["demand"]["memory_mib"], decided["demand"]["memory_mib_upper"]
    assert upper - point > 512  # room for a GPU size between them
    size = round((point + upper) / 2)
    telemetry(url, "whole-n", 1, [(float(size), 0.0)])
    before = _whole_gpu_binds(url)
    first = pod("whole-first", BIG_ANNOTATIONS)
    status, out = post(url + "/filter", extender_args(first, names=["whole-n"]))
    assert status == 200 and out["NodeNames"] == ["whole-n"], out  # before the fallback: too large, forever
    status, scores = post(url + "/prioritize", extender_args(first, names=["whole-n"]))
    assert status == 200 and scores[0]["Host"] == "whole-n" and scores[0]["Score"] > 0
    assert post(url + "/bind", binding_args(first, "whole-n")) == (200, {"Error": ""})
    assert _whole_gpu_binds(url) == before + 1
    telemetry(url, "whole-n", 2, [(float(size), 0.0)])  # the job has not allocated yet: the reservation holds
    second = pod("whole-second", BIG_ANNOTATIONS)
    status, out = post(url + "/filter", extender_args(second, names=["whole-n"]))
    assert status == 200 and out["NodeNames"] == []
    free = f"{(size - 128) / 1024:.1f}"
    assert out["FailedNodes"] == {"whole-n": f"gpu-0: needs a whole GPU ({free} GiB free), 0.0 GiB free"}
    tiny = pod("whole-tiny", {**CNN_ANNOTATIONS, "deepres.io/gpu-memory": "512Mi"})  # no share of it either
    status, out = post(url + "/filter", extender_args(tiny, names=["whole-n"]))
    assert out["NodeNames"] == [] and out["FailedNodes"] == {"whole-n": "gpu-0: needs 0.5 GiB, 0.0 GiB free"}
    status, error = post(url + "/bind", binding_args(tiny, "whole-n"))
    assert status == 200 and error["Error"].startswith("cannot bind default/whole-tiny to whole-n: gpu-0: needs")


def announced_huge_body_status(url: str, path: str, token: str = "") -> int:
    """Announce a 20 MB body and send none: the server must refuse on the header alone."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", path)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", "20000000")
    if token:
        conn.putheader("Authorization", f"Bearer {token}")
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


def test_bad_input_never_5xx_never_traceback(url: str) -> None:
    for path in ("/filter", "/prioritize", "/bind", "/preempt"):
        for raw in (b"{", b"\xc3\x28", b"null", b'{"Pod": {"metadata": null}, "NodeNames": [null]}'):
            status, out = post(url + path, None, raw=raw)
            assert status == 200 and "Traceback" not in json.dumps(out)
    assert announced_huge_body_status(url, "/filter") == 413
    assert announced_huge_body_status(url, "/v1/telemetry", token=TOKEN) == 413
    changed = copy.deepcopy(golden("filter_names.json"))
    changed["Pod"]["metadata"]["annotations"]["deepres.io/precision"] = "fp64"
    status, out = post(url + "/filter", changed)
    assert set(out["FailedAndUnresolvableNodes"]) == {"gpu-node-1", "gpu-node-2"}
    assert "deepres.io/precision='fp64'" in out["FailedAndUnresolvableNodes"]["gpu-node-1"]


def test_probes_metrics_openapi(url: str) -> None:
    assert get(url + "/healthz")[0] == 200
    status, body = get(url + "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True
    status, text = get(url + "/metrics")
    assert status == 200 and 'deepres_extender_request_seconds_count{verb="filter"}' in text
    status, body = get(url + "/openapi.json")
    assert json.loads(body)["paths"]["/filter"]["post"]["responses"]["200"]
