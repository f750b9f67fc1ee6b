"""The agent's API adapters through the real `kubernetes` client against a loopback API stub:
the pod list + watch on the node (field selector, resource versions) and the Node annotation PATCH."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from kubernetes import client

from extender.agent.kube import FREE_AT_ANNOTATION, FREE_MIB_ANNOTATION, KubeNodeAnnotator, KubePods
from tests.fixtures.kube.loopback import Loopback


def pod(uid: str, name: str, version: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "status": {"phase": "Running"},
            "metadata": {"uid": uid, "name": name, "namespace": "ml", "resourceVersion": version,
                         "annotations": {"deepres.io/assigned-gpus": "GPU-1"}}}


class ApiStub:
    """GET /api/v1/pods (list, or watch=true: newline-delimited events); PATCH /api/v1/nodes/<name>."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.patches: list[tuple[str, str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                stub.requests.append(("GET", url.path, query))
                if query.get("watch") == ["true"]:
                    events = [{"type": "ADDED", "object": pod("u2", "b", "11")},
                              {"type": "DELETED", "object": pod("u1", "a", "12")}]
                    body = "".join(json.dumps(e) + "\n" for e in events).encode()
                else:
                    body = json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
                                       "items": [pod("u1", "a", "9")]}).encode()
                self._send(200, body)

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                stub.patches.append((self.path, self.headers.get("Content-Type", ""), body))
                node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-7"}}
                self._send(200, json.dumps(node).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.loopback = Loopback(Handler)

    def api(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.loopback.api_client())

    def close(self) -> None:
        self.loopback.close()


@pytest.fixture()
def stub() -> Iterator[ApiStub]:
    server = ApiStub()
    yield server
    server.close()


def test_list_then_watch_with_the_real_client(stub: ApiStub) -> None:
    pods = KubePods(stub.api(), "gpu-7", watch_timeout_s=5)
    pods.watch_once()
    assert [(p.uid, p.name, p.namespace) for p in pods.pods()] == [("u2", "b", "ml")]
    (list_call, watch_call) = stub.requests
    assert list_call[2]["fieldSelector"] == ["spec.nodeName=gpu-7"] and "watch" not in list_call[2]
    assert watch_call[2]["fieldSelector"] == ["spec.nodeName=gpu-7"]
    assert watch_call[2]["resourceVersion"] == ["10"] and watch_call[2]["watch"] == ["true"]


def test_node_annotation_patch_with_the_real_client(stub: ApiStub) -> None:
    assert KubeNodeAnnotator(stub.api(), "gpu-7", clock=lambda: 1_800_000_000.0).patch_now(40960)
    ((path, content_type, body),) = stub.patches
    assert path == "/api/v1/nodes/gpu-7"
    assert "patch" in content_type and "json" in content_type
    assert body == {"metadata": {"annotations": {FREE_MIB_ANNOTATION: "40960", FREE_AT_ANNOTATION: "1800000000000"}}}
