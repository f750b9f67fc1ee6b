"""The pod watch's typed decoding live (issue #48): through the real `kubernetes` client against a
loopback API stub, the pods the list and the watch give the extender (its handlers and its watched
copy, which the bind's trust check reads) hold every field the extender reads, as the API server
sent them, and not the ones it never reads (managedFields, volumes, the containers' commands); a
watch ERROR still ends the watch with its Status message (relisted at once)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

from extender.kube.cluster import ClusterHandlers, KubeCluster
from extender.protocol import parse_pod
from tests.fixtures.kube.loopback import Loopback, send_json


def _pod(name: str, version: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"uid": f"uid-{name}", "name": name, "namespace": "ml", "resourceVersion": version,
                         "creationTimestamp": "2026-11-24T08:00:00Z",
                         "annotations": {"deepres.io/assigned-gpus": "GPU-1"},
                         "ownerReferences": [{"kind": "Job", "name": "j", "uid": "job-1", "controller": True}],
                         "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"schedulerName": "deepres-scheduler", "nodeName": "n1", "priority": 5,
                     "volumes": [{"name": "v", "emptyDir": {}}],
                     "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "PodScheduled", "status": "True",
                                       "lastTransitionTime": "2026-11-24T08:00:01Z"}],
                       "containerStatuses": [{"name": "c", "ready": True, "imageID": "sha256:abc"}]}}


def _kept(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` less what the extender never reads: what the watch must give."""
    kept: dict[str, Any] = json.loads(json.dumps(pod))
    del kept["metadata"]["managedFields"], kept["spec"]["volumes"], kept["status"]["podIP"]
    kept["spec"]["containers"] = [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return kept


class _Stub:
    """A pod list (pod a), then watches: the first ends with a 410 ERROR, the next sends pod b."""

    def __init__(self) -> None:
        self.watches = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if query.get("watch") != ["true"]:
                    send_json(self, json.dumps({"apiVersion": "v1", "kind": "PodList",
                                                "metadata": {"resourceVersion": "10"},
                                                "items": [_pod("a", "9")]}).encode())
                    return
                stub.watches += 1
                if stub.watches == 1:
                    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
                    send_json(self, (json.dumps(gone) + "\n").encode())
                else:
                    send_json(self, (json.dumps({"type": "MODIFIED", "object": _pod("b", "11")}) + "\n").encode())

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.loopback = Loopback(Handler)


def test_the_watch_gives_the_fields_read_as_sent_and_drops_the_rest() -> None:
    stub = _Stub()
    kube = KubeCluster("deepres-scheduler", 60, 60, api_client=stub.loopback.api_client(), api_timeout_s=5)
    listed: list[list[dict[str, Any]]] = []
    changed: list[dict[str, Any]] = []
    got = threading.Event()

    def pod_changed(pod: dict[str, Any], deleted: bool) -> None:
        changed.append(pod)
        got.set()

    handlers = ClusterHandlers(pod_changed=pod_changed, pods_listed=listed.append, node_deleted=lambda n: None)
    thread = threading.Thread(target=kube._watch_pods, args=(handlers,), daemon=True)
    thread.start()
    try:
        assert got.wait(30), "no watch event reached the handler"
    finally:
        kube.stop()
        stub.loopback.close()
    # listed twice: at the start and after the 410 (the ERROR's Status ended the watch)
    assert len(listed) >= 2 and all(pods == [_kept(_pod("a", "9"))] for pods in listed)
    assert changed[0] == _kept(_pod("b", "11"))
    assert parse_pod(changed[0]) == parse_pod(_pod("b", "11"))
    assert kube.watched_pod("ml", "b") == _kept(_pod("b", "11"))  # the copy the bind's trust check reads
    assert kube.watched_pod("ml", "a") == _kept(_pod("a", "9"))
