"""Bounded answers from a real `deepres serve` (issue 13, item 8): one bad annotation value, however
large, and however many candidate nodes, gives an answer of bounded size that still names the key."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

from devtools.localserver import LocalServer
from tests.fixtures.kube.payloads import extender_args, pod
from tests.fixtures.kube.server import TOKEN

DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}


def test_a_huge_bad_value_times_many_nodes_gives_a_bounded_answer(tmp_path: Path) -> None:
    value = "9" * 250_000 + "Gi?"
    names = [f"gpu-node-{i:05d}" for i in range(5_000)]
    body = json.dumps(extender_args(pod("huge", {"deepres.io/gpu-memory": value}), names=names)).encode()
    with LocalServer(tmp_path, token=TOKEN, env=DOUBLE) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        conn.close()
    assert response.status == 200
    assert len(answer) < 5_000 * 400  # ~300 bytes of reason per node; it was 250 KB per node
    out = json.loads(answer)
    reasons = out["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(names) and out["NodeNames"] == []
    reason = reasons[names[0]]
    assert reason.startswith("deepres.io/gpu-memory='9999") and f"({len(value)} characters)" in reason
