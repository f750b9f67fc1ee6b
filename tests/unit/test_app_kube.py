"""KubeCluster (the real client adapter) against fake API objects: Binding and patch bodies,
Events, TokenReview with node binding and caching, watches that list, watch and release."""

from __future__ import annotations

import json
import time
import urllib.parse
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from kubernetes.client import (
    ApiClient,
    Configuration,
)
from kubernetes.client.exceptions import ApiException

from extender.kube.cluster import NODE_NAME_EXTRA, ClusterError, ClusterHandlers, KubeCluster, TokenIdentity
from tests.fixtures.kube.loopback import Loopback, send_json

POD = {"metadata": {"name": "p", "namespace": "ml", "uid": "u-1"}}


class FakeCore:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.kwargs: list[dict[str, Any]] = []
        self.fail: ApiException | None = None

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, **kw: Any) -> None:
        self.kwargs.append(kw)
        self.calls.append(("evict", (name, namespace, body)))
        if self.fail:
            raise self.fail


def cluster() -> tuple[KubeCluster, FakeCore]:
    kube = KubeCluster("deepres-scheduler", 300, 60, api_client=ApiClient(Configuration(host="http://127.0.0.1:9")))
    core = FakeCore()
    kube._core = core
    return kube, core


class ApiServer:
    """A loopback stand-in for the API server's POST endpoints: records each (path, JSON body) and
    answers `status` (after `delay_s`) with a Status body, as the API server does on a refusal."""

    def __init__(self, status: int = 201, reason: str = "Created", delay_s: float = 0.0) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.peers: set[tuple[str, int]] = set()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                recorder.posts.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                recorder.headers.append(dict(self.headers))
                recorder.peers.add(self.client_address)
                time.sleep(delay_s)
                body = json.dumps({"kind": "Status", "code": status, "reason": reason}).encode()
                try:
                    self.send_response(status, reason)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up waiting (the timeout test)
                    pass

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.loopback = Loopback(Handler)
        self.kube = KubeCluster("deepres-scheduler", 300, 60, api_client=self.loopback.api_client())

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.loopback.close()


def test_bind_posts_one_binding_with_uid_node_target_and_the_annotations() -> None:
    with ApiServer() as api:
        api.kube.bind(POD, "n1", {"deepres.io/assigned-gpus": "GPU-1"})
        api.kube.bind({"metadata": {"name": "q", "namespace": "ml"}}, "n2")  # no uid known: no precondition
    (path, body), (_, bare) = api.posts
    assert path == "/api/v1/namespaces/ml/pods/p/binding"
    assert body == {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": "p", "namespace": "ml", "uid": "u-1",
                                 "annotations": {"deepres.io/assigned-gpus": "GPU-1"}},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    assert bare["metadata"] == {"name": "q", "namespace": "ml"} and bare["target"]["name"] == "n2"
    assert api.headers[0]["Content-Type"] == "application/json"


def test_posts_carry_the_clients_current_credentials_and_host_path() -> None:
    """The Binding and the Event go out with the client's default headers, its cookie and its bearer
    token as the client has it at that moment (a rotated token, through the client's refresh hook, is sent
    from the next call on), to the configured host's own path, over one kept-alive connection."""
    with ApiServer() as api:
        config = api.kube._api.configuration
        config.host += "/through/a/gateway"
        config.api_key = {"authorization": "Bearer token-1"}  # as the kubeconfig loader sets it
        tokens = iter(["Bearer token-2", "Bearer token-3"])

        def rotate(configuration: Configuration) -> None:
            configuration.api_key["authorization"] = next(tokens)

        api.kube._api.cookie = "session=s1"
        api.kube.bind(POD, "n1")
        config.refresh_api_key_hook = rotate
        api.kube.bind(POD, "n1")
        api.kube.event(POD, "Placed", "x")
    assert [h["authorization"] for h in api.headers] == ["Bearer token-1", "Bearer token-2", "Bearer token-3"]
    assert [path for path, _ in api.posts] == ["/through/a/gateway/api/v1/namespaces/ml/pods/p/binding"] * 2 + [
        "/through/a/gateway/api/v1/namespaces/ml/events"]
    assert all(h["User-Agent"] == api.kube._api.user_agent and h["Accept"] == "application/json"
               and h["Cookie"] == "session=s1" for h in api.headers)
    assert len(api.peers) == 1  # the client's pool kept the connection


def test_a_pod_name_is_quoted_in_the_binding_path() -> None:
    with ApiServer() as api:
        api.kube.bind({"metadata": {"name": "a b", "namespace": "ml", "uid": "u"}}, "n1")
    assert api.posts[0][0] == "/api/v1/namespaces/ml/pods/a%20b/binding"


def test_every_api_call_carries_a_client_timeout() -> None:
    """An API server that does not answer: the calls give up after `api_timeout_s`, never hang a
    request thread (the bind fails, the event is dropped, the eviction fails)."""
    with ApiServer(delay_s=3.0) as api:
        api.kube.api_timeout_s = 0.3
        started = time.monotonic()
        with pytest.raises(ClusterError, match="bind pod ml/p to n1"):
            api.kube.bind(POD, "n1")
        api.kube.event(POD, "Placed", "x")
        with pytest.raises(ClusterError, match="evict pod ml/p"):
            api.kube.evict("ml", "p", "u-1")
        assert time.monotonic() - started < 2.5


def test_api_failures_become_cluster_errors_naming_the_call() -> None:
    with ApiServer(409, "Conflict") as api:
        with pytest.raises(ClusterError, match=r"bind pod ml/p to n1: HTTP 409 Conflict"):
            api.kube.bind(POD, "n1")
        api.kube.event(POD, "Placed", "x")  # events are best effort: no exception
    assert [path for path, _ in api.posts] == ["/api/v1/namespaces/ml/pods/p/binding", "/api/v1/namespaces/ml/events"]


def test_eviction_carries_the_uid_precondition_and_pdb_refusals_surface() -> None:
    kube, core = cluster()
    kube.evict("ml", "low", "u-9")
    name, namespace, body = core.calls[0][1]
    assert (name, namespace, body.metadata.name, body.delete_options.preconditions.uid) == ("low", "ml", "low", "u-9")
    core.fail = ApiException(status=429, reason="Too Many Requests")
    with pytest.raises(ClusterError, match=r"evict pod ml/low: HTTP 429"):
        kube.evict("ml", "low", "u-9")


def test_event_bodies() -> None:
    with ApiServer() as api:
        api.kube.event(POD, "InvalidAnnotation", "deepres.io/gpus='x' is not valid", warning=True)
    (path, event), = api.posts
    assert path == "/api/v1/namespaces/ml/events" and event["metadata"]["namespace"] == "ml"
    assert event["metadata"]["name"].startswith("p.") and event["kind"] == "Event"
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "InvalidAnnotation",
                                                                  "deepres.io/gpus='x' is not valid")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ml", "uid": "u-1"}
    assert event["source"] == {"component": "deepres-extender"} and event["count"] == 1
    first = datetime.strptime(event["firstTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - first).total_seconds()) < 60 and event["lastTimestamp"] == event["firstTimestamp"]


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
        # the audiences are passed on as given (empty included): extender/server/auth.py judges them
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
    from extender.kube.cluster import backoff_s

    assert [backoff_s(n, rng=lambda: 0.5) for n in (1, 2, 3, 7, 8, 50)] == [1.0, 2.0, 4.0, 60.0, 60.0, 60.0]
    assert backoff_s(1, rng=lambda: 0.0) == pytest.approx(0.8) and backoff_s(1, rng=lambda: 1.0) == pytest.approx(1.2)


def test_the_connection_pool_holds_a_connection_per_request_thread_besides_the_watches() -> None:
    """The client's default pool (5 per CPU) is smaller than the binds in flight at 100 pods/s: each
    call beyond it opened a TLS connection that the pool then dropped."""
    from extender.kube.cluster import POOL_SPARE

    default = Configuration().connection_pool_maxsize
    assert KubeCluster.pool_configuration(Configuration(), 0).connection_pool_maxsize == default
    assert KubeCluster.pool_configuration(Configuration(), 32).connection_pool_maxsize == max(default, 32 + POOL_SPARE)
    big = Configuration()
    big.connection_pool_maxsize = 500
    assert KubeCluster.pool_configuration(big, 32).connection_pool_maxsize == 500  # never made smaller
