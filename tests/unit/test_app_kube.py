"""KubeCluster (the real client adapter) against fake API objects: Binding and patch bodies,
Events, TokenReview with node binding and caching, watches that list, watch and release."""

from __future__ import annotations

import json
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from kubernetes.client import (
    ApiClient,
    Configuration,
)
from kubernetes.client.exceptions import ApiException

from extender.kube import NODE_NAME_EXTRA, ClusterError, ClusterHandlers, KubeCluster, TokenIdentity
from tests.fixtures.kube.loopback import Loopback, send_json

POD = {"metadata": {"name": "p", "namespace": "ml", "uid": "u-1"}}


class FakeCore:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.kwargs: list[dict[str, Any]] = []
        self.fail: ApiException | None = None

    def create_namespaced_pod_binding(self, name: str, namespace: str, body: Any, **kw: Any) -> None:
        assert name == body.metadata.name
        self.kwargs.append(kw)
        self.calls.append(("bind", (namespace, body, kw)))
        if self.fail:
            raise self.fail

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, **kw: Any) -> None:
        self.kwargs.append(kw)
        self.calls.append(("evict", (name, namespace, body)))
        if self.fail:
            raise self.fail

    def create_namespaced_event(self, namespace: str, body: Any, **kw: Any) -> None:
        self.kwargs.append(kw)
        self.calls.append(("event", (namespace, body)))
        if self.fail:
            raise self.fail


def cluster() -> tuple[KubeCluster, FakeCore]:
    kube = KubeCluster("deepres-scheduler", 300, 60, api_client=ApiClient(Configuration(host="http://127.0.0.1:9")))
    core = FakeCore()
    kube._core = core
    return kube, core


def test_bind_creates_a_binding_with_uid_node_target_and_the_annotations() -> None:
    kube, core = cluster()
    kube.bind(POD, "n1", {"deepres.io/assigned-gpus": "GPU-1"})
    namespace, body, kw = core.calls[0][1]
    assert namespace == "ml" and kw == {"_preload_content": False, "_request_timeout": 10.0}
    assert (body.metadata.name, body.metadata.uid, body.target.kind, body.target.name) == ("p", "u-1", "Node", "n1")
    assert body.metadata.annotations == {"deepres.io/assigned-gpus": "GPU-1"} and len(core.calls) == 1


def test_every_api_call_carries_a_client_timeout() -> None:
    kube, core = cluster()
    kube.api_timeout_s = 3.5
    kube.bind(POD, "n1")
    kube.evict("ml", "p", "u-1")
    kube.event(POD, "Placed", "x")
    assert [kw.get("_request_timeout") for kw in core.kwargs] == [3.5] * 3


def test_api_failures_become_cluster_errors_naming_the_call() -> None:
    kube, core = cluster()
    core.fail = ApiException(status=409, reason="Conflict")
    with pytest.raises(ClusterError, match=r"bind pod ml/p to n1: HTTP 409 Conflict"):
        kube.bind(POD, "n1")
    kube.event(POD, "Placed", "x")  # events are best effort: no exception


def test_eviction_carries_the_uid_precondition_and_pdb_refusals_surface() -> None:
    kube, core = cluster()
    kube.evict("ml", "low", "u-9")
    name, namespace, body = core.calls[0][1]
    assert (name, namespace, body.metadata.name, body.delete_options.preconditions.uid) == ("low", "ml", "low", "u-9")
    core.fail = ApiException(status=429, reason="Too Many Requests")
    with pytest.raises(ClusterError, match=r"evict pod ml/low: HTTP 429"):
        kube.evict("ml", "low", "u-9")


def test_event_bodies() -> None:
    kube, core = cluster()
    kube.event(POD, "InvalidAnnotation", "deepres.io/gpus='x' is not valid", warning=True)
    namespace, event = core.calls[0][1]
    assert namespace == "ml" and event.type == "Warning" and event.reason == "InvalidAnnotation"
    assert event.involved_object.uid == "u-1" and event.source.component == "deepres-extender"


def test_token_review_reports_the_node_and_the_audiences_the_api_server_gave() -> None:
    """Through the real client over loopback HTTP, with TokenReview answers as the API server writes
    them (JSON, Kubernetes casing); anything but an authenticated user with a name is no identity."""
    answers: dict[str, tuple[int, dict[str, Any]]] = {
        "tok": (201, {"status": {"authenticated": True, "audiences": ["deepres-extender"], "user": {
            "username": "system:serviceaccount:deepres:agent", "uid": "9",
            "extra": {NODE_NAME_EXTRA: ["gpu-7"], "authentication.kubernetes.io/pod-name": ["x"]}}}}),
        "other": (201, {"status": {"authenticated": False, "error": "invalid bearer token"}}),
        "no-audience": (201, {"status": {"authenticated": True, "user": {"username": "x"}}}),
        "odd": (201, {"status": {"authenticated": "yes", "user": {"username": "x"}}}),
        "broken": (201, {"status": {"authenticated": True, "user": "x"}}),
        "forbidden": (403, {"kind": "Status", "code": 403, "reason": "Forbidden"}),
    }
    sent: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            assert self.path == "/apis/authentication.k8s.io/v1/tokenreviews"
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            sent.append(review)
            status, body = answers[review["spec"]["token"]]
            send_json(self, json.dumps({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                                        "spec": review["spec"], **body}).encode(), status)

        def log_message(self, format: str, *args: object) -> None:
            pass

    loopback = Loopback(Handler)
    kube = KubeCluster("deepres-scheduler", 300, 60, api_client=loopback.api_client())
    try:
        first = kube.review_token("tok", "deepres-extender")
        assert first == TokenIdentity("system:serviceaccount:deepres:agent", "gpu-7", ("deepres-extender",))
        assert sent[0]["spec"] == {"token": "tok", "audiences": ["deepres-extender"]}
        for refused in ("other", "odd", "broken", "forbidden"):
            assert kube.review_token(refused, "deepres-extender") is None, refused
        # the audiences are passed on as given (empty included): extender/auth.py judges them
        assert kube.review_token("no-audience", "deepres-extender") == TokenIdentity("x", "", ())
    finally:
        loopback.close()


class RawAnswer:
    """What the client returns with `_preload_content=False`: the API server's bytes."""

    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body).encode()
        self.released = False

    def release_conn(self) -> None:
        self.released = True


def test_pod_watch_lists_then_streams_and_reports_deletions() -> None:
    """Through the real client over loopback HTTP: the list, then the watch from its resourceVersion;
    a stop during the stream handles no further event."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ml", "uid": "u-1",
                        "annotations": {"deepres.io/assigned-gpus": "GPU-1"}},
           "spec": {"containers": [], "schedulerName": "deepres-scheduler", "nodeName": "n1"}}
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            paths.append(self.path)
            if "/namespaces/" in self.path:  # read one pod: gone
                send_json(self, json.dumps({"kind": "Status", "code": 404, "reason": "NotFound"}).encode(), 404)
                return
            if "watch=true" not in self.path:
                send_json(self, json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "10"},
                                            "items": [pod]}).encode())
                return
            lines = [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}},
                     {"type": "DELETED", "object": pod}, {"type": "MODIFIED", "object": pod}]
            send_json(self, "".join(json.dumps(line) + "\n" for line in lines).encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    loopback = Loopback(Handler)
    kube = KubeCluster("deepres-scheduler", 300, 60, api_client=loopback.api_client())
    listed: list[list[dict[str, Any]]] = []
    changed: list[tuple[dict[str, Any], bool]] = []

    def pod_changed(p: dict[str, Any], deleted: bool) -> None:
        changed.append((p, deleted))
        kube.stop()

    try:
        kube._watch_pods(ClusterHandlers(pod_changed=pod_changed, pods_listed=listed.append,
                                         node_deleted=lambda n: None))
    finally:
        loopback.close()
    selector = urllib.parse.quote("spec.schedulerName=deepres-scheduler")
    assert paths[0] == f"/api/v1/pods?fieldSelector={selector}" and kube.synced()
    assert "resourceVersion=10" in paths[1] and "watch=true" in paths[1]
    assert listed[0][0]["metadata"]["annotations"] == {"deepres.io/assigned-gpus": "GPU-1"}
    assert listed[0][0]["spec"]["nodeName"] == "n1"  # Kubernetes casing, as the parser expects
    assert [(p["metadata"]["uid"], deleted) for p, deleted in changed] == [("u-1", True)]  # stopped after one
    assert kube.watched_pod("ml", "p") is None  # the deletion left the cache


def test_watched_pod_is_the_watch_copy_and_read_pod_parses_the_raw_answer() -> None:
    kube, _ = cluster()
    pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u-1"}, "spec": {"nodeName": ""}}

    class Core:
        def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> RawAnswer:
            assert kw["_preload_content"] is False and kw["_request_timeout"] == 10.0
            if name == "gone":
                raise ApiException(status=404, reason="Not Found")
            if name == "broken":
                raise ApiException(status=500, reason="Internal Server Error")
            return RawAnswer(pod)

    kube._core = Core()
    assert kube.watched_pod("ml", "p") is None  # not seen by the watch yet
    kube._pods[("ml", "p")] = pod
    assert kube.watched_pod("ml", "p") is pod
    assert kube.read_pod("ml", "p") == pod and kube.read_pod("ml", "gone") is None
    with pytest.raises(ClusterError, match="read pod ml/broken: HTTP 500"):
        kube.read_pod("ml", "broken")


def test_watch_restarts_back_off_exponentially_to_a_minute() -> None:
    from extender.kube import backoff_s

    assert [backoff_s(n, rng=lambda: 0.5) for n in (1, 2, 3, 7, 8, 50)] == [1.0, 2.0, 4.0, 60.0, 60.0, 60.0]
    assert backoff_s(1, rng=lambda: 0.0) == pytest.approx(0.8) and backoff_s(1, rng=lambda: 1.0) == pytest.approx(1.2)


def test_the_connection_pool_holds_a_connection_per_request_thread_besides_the_watches() -> None:
    """The client's default pool (5 per CPU) is smaller than the binds in flight at 100 pods/s: each
    call beyond it opened a TLS connection that the pool then dropped."""
    from extender.kube import POOL_SPARE

    default = Configuration().connection_pool_maxsize
    assert KubeCluster.pool_configuration(Configuration(), 0).connection_pool_maxsize == default
    assert KubeCluster.pool_configuration(Configuration(), 32).connection_pool_maxsize == max(default, 32 + POOL_SPARE)
    big = Configuration()
    big.connection_pool_maxsize = 500
    assert KubeCluster.pool_configuration(big, 32).connection_pool_maxsize == 500  # never made smaller
