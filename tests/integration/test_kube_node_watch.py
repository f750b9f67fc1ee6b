"""The extender's Node list and watch through the real `kubernetes` client against a loopback API
stub that negotiates the media type as kube-apiserver does (the first acceptable choice of the Accept
header): the extender asks for the nodes' metadata only (it needs their names; a Node's status is
most of its bytes, and every kubelet heartbeat would otherwise reach it whole), and still works
with an API server that only serves whole Nodes."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from extender.kube.cluster import ClusterHandlers, KubeCluster
from tests.fixtures.kube.loopback import Loopback, send_json

META = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
META_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def node(name: str, metadata_only: bool) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-{name}", "resourceVersion": "11", "labels": {"type": "kwok"}}
    if metadata_only:
        return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
    return {"kind": "Node", "apiVersion": "v1", "metadata": meta,
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "images": [
                {"names": [f"registry.example/image-{i}:v1"], "sizeBytes": 1 << 28} for i in range(50)]}}


class NodeStub:
    """Lists n1 and n2; a watch sends ADDED n3 and DELETED n1, then ends. `metadata` says whether it
    serves PartialObjectMetadata (kube-apiserver >= 1.15) or only whole Nodes."""

    def __init__(self, metadata: bool) -> None:
        self.accepts: list[tuple[str, str]] = []  # (list | watch, Accept)
        self.body_bytes = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                watch = query.get("watch") == ["true"]
                accept = self.headers.get("Accept", "")
                stub.accepts.append(("watch" if watch else "list", accept))
                wanted = META if watch else META_LIST
                offered = [part.strip().replace(" ", "") for part in accept.split(",")]
                chosen = next((m for m in offered if m in (wanted, "application/json", "*/*")
                               and (metadata or m != wanted)), None)
                if chosen is None:
                    send_json(self, json.dumps({"kind": "Status", "code": 406, "reason": "NotAcceptable"}).encode(),
                              406)
                    return
                slim = chosen == wanted
                if watch:
                    body = "".join(json.dumps({"type": kind, "object": node(name, slim)}) + "\n"
                                   for kind, name in (("ADDED", "n3"), ("DELETED", "n1"))).encode()
                else:
                    body = json.dumps({"kind": "PartialObjectMetadataList" if slim else "NodeList",
                                       "apiVersion": "meta.k8s.io/v1" if slim else "v1",
                                       "metadata": {"resourceVersion": "10"},
                                       "items": [node("n1", slim), node("n2", slim)]}).encode()
                stub.body_bytes += len(body)
                send_json(self, body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.loopback = Loopback(Handler)

    def run_watch(self) -> tuple[list[list[str]], list[str], list[str]]:
        """The extender's node watch until it has seen the deletion: (lists, added, deleted)."""
        kube = KubeCluster("deepres-scheduler", 1.0, 60, api_client=self.loopback.api_client(), api_timeout_s=2.0)
        listed: list[list[str]] = []
        added: list[str] = []
        deleted: list[str] = []
        handlers = ClusterHandlers(pod_changed=lambda p, d: None, pods_listed=lambda pods: None,
                                   node_deleted=deleted.append, nodes_listed=listed.append, node_added=added.append)
        thread = threading.Thread(target=kube._watch_nodes, args=(handlers,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not deleted and time.monotonic() < deadline:
            time.sleep(0.02)
        kube.stop()
        thread.join(timeout=10)
        self.loopback.close()
        return listed, added, deleted


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata-server", "whole-nodes-server"])
def test_the_node_watch_asks_for_metadata_only_and_learns_every_name(metadata: bool) -> None:
    stub = NodeStub(metadata)
    listed, added, deleted = stub.run_watch()
    assert listed[:1] == [["n1", "n2"]] and added[:1] == ["n3"] and deleted[:1] == ["n1"]
    kinds = {kind for kind, _ in stub.accepts}
    assert kinds == {"list", "watch"}
    for kind, accept in stub.accepts:  # metadata first, whole objects only as the fallback
        first = accept.split(",")[0].replace(" ", "")
        assert first == (META if kind == "watch" else META_LIST), accept
        assert "application/json" in [part.strip() for part in accept.split(",")[1:]], accept


def test_metadata_only_is_a_fraction_of_the_bytes() -> None:
    """What the API server encodes and the extender decodes per Node (the stub's Nodes carry a status
    with 50 images, as kubelets report them)."""
    slim, whole = NodeStub(True), NodeStub(False)
    slim.run_watch()
    whole.run_watch()
    assert slim.body_bytes * 10 < whole.body_bytes, (slim.body_bytes, whole.body_bytes)
