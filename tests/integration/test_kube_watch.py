"""The extender's pod watch through the real `kubernetes` client against a loopback API stub: a watch
ended by 410 Gone relists at once, a watch that goes silent is cut by the client's read timeout and
relisted, and every call carries a timeout (a stuck API server never hangs the extender)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from extender.kube.cluster import ClusterError, ClusterHandlers, KubeCluster
from tests.fixtures.kube.loopback import Loopback, send_json


def pod(uid: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "status": {"phase": "Running"},
            "spec": {"schedulerName": "deepres-scheduler", "nodeName": "n1", "containers": []},
            "metadata": {"uid": uid, "name": name, "namespace": "ml", "resourceVersion": "9"}}


class ApiStub:
    """Pod list; watches answer, in turn: a 410 ERROR event, then silence (held open), then events."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0
        self.hang = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if "/namespaces/" in self.path:  # read one pod: never answers (a stuck API server)
                    stub.hang.wait(30)
                    return
                if query.get("watch") != ["true"]:
                    stub.lists += 1
                    body = json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
                                       "items": [pod("u1", "a")]}).encode()
                    self._send(body)
                    return
                stub.watches += 1
                if stub.watches == 1:
                    gone = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                        "code": 410, "reason": "Expired", "message": "too old"}}
                    self._send((json.dumps(gone) + "\n").encode())
                elif stub.watches == 2:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.flush()
                    stub.hang.wait(30)  # silent: no event, no close
                else:
                    self._send((json.dumps({"type": "MODIFIED", "object": pod("u1", "a")}) + "\n").encode())

            def _send(self, body: bytes) -> None:
                send_json(self, body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.loopback = Loopback(Handler)

    def cluster(self, api_timeout_s: float, resync_s: float) -> KubeCluster:
        return KubeCluster("deepres-scheduler", resync_s, 60, api_client=self.loopback.api_client(),
                           api_timeout_s=api_timeout_s)

    def __enter__(self) -> ApiStub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.hang.set()  # let the held requests go, then stop serving
        self.loopback.close()


def test_gone_relists_at_once_and_a_silent_watch_is_cut_and_relisted() -> None:
    with ApiStub() as stub:
        relists(stub)


def relists(stub: ApiStub) -> None:
    kube = stub.cluster(api_timeout_s=0.5, resync_s=1.0)
    listed: list[int] = []
    changed: list[bool] = []
    handlers = ClusterHandlers(pod_changed=lambda p, d: changed.append(d), pods_listed=lambda pods: listed.append(
        len(pods)), node_deleted=lambda n: None)
    thread = threading.Thread(target=kube._watch_pods, args=(handlers,), daemon=True)
    started = time.monotonic()
    thread.start()
    deadline = started + 15
    while not changed and time.monotonic() < deadline:
        time.sleep(0.05)
    kube.stop()
    # list, watch (410: relist at once), list, watch (silent: cut after resync + timeout), list, watch (event)
    assert changed[:1] == [False], (stub.lists, stub.watches)
    assert stub.lists >= 3 and stub.watches >= 3 and set(listed) == {1}
    assert time.monotonic() - started < 10


def test_a_pod_read_against_a_stuck_api_server_times_out_as_a_cluster_error() -> None:
    with ApiStub() as stub:
        kube = stub.cluster(api_timeout_s=0.5, resync_s=1.0)
        started = time.monotonic()
        with pytest.raises(ClusterError, match="read pod ml/a"):
            kube.read_pod("ml", "a")
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("what", ["pods", "nodes"])
def test_a_watch_that_ends_as_asked_resumes_where_it_stopped_without_a_relist(what: str) -> None:
    """A watch the API server ends after its timeoutSeconds is resumed from the last version it
    showed (a bookmark's included), as client-go's reflectors do; relisting instead sent every pod
    of the scheduler (every node) again every resync_s. Watches ask for bookmarks."""
    requests: list[tuple[str, str | None, bool]] = []  # (list | watch, resourceVersion, allowWatchBookmarks)
    kind = "Pod" if what == "pods" else "PartialObjectMetadata"

    def obj(version: str) -> dict[str, Any]:
        return {**pod("u1", "a"), "kind": kind, "metadata": {**pod("u1", "a")["metadata"], "resourceVersion": version}}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            watch = query.get("watch") == ["true"]
            requests.append(("watch" if watch else "list", (query.get("resourceVersion") or [None])[0],
                             query.get("allowWatchBookmarks") == ["true"]))
            if not watch:
                body = {"kind": "List", "metadata": {"resourceVersion": "10"}, "items": [obj("9")]}
                send_json(self, json.dumps(body).encode())
                return
            watches = sum(1 for r in requests if r[0] == "watch")
            if watches == 1:  # an event, a bookmark, then the end of the watch's time
                lines = [{"type": "MODIFIED", "object": obj("12")},
                         {"type": "BOOKMARK", "object": {"kind": kind, "metadata": {"resourceVersion": "15"}}}]
            elif watches == 2:
                lines = [{"type": "ADDED" if what == "nodes" else "MODIFIED", "object": obj("16")}]
            else:
                time.sleep(0.2)
                lines = []
            send_json(self, "".join(json.dumps(line) + "\n" for line in lines).encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    loopback = Loopback(Handler)
    kube = KubeCluster("deepres-scheduler", 300, 60, api_client=loopback.api_client(), api_timeout_s=2.0)
    seen: list[str] = []
    handlers = ClusterHandlers(pod_changed=lambda p, d: seen.append(p["metadata"]["resourceVersion"]),
                               pods_listed=lambda pods: seen.append("list"), node_deleted=lambda n: None,
                               nodes_listed=lambda names: seen.append("list"), node_added=lambda n: seen.append(n))
    thread = threading.Thread(target=kube._watch_pods if what == "pods" else kube._watch_nodes, args=(handlers,),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while sum(1 for r in requests if r[0] == "watch") < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    kube.stop()
    thread.join(timeout=5)
    loopback.close()
    assert requests[:4] == [("list", None, False), ("watch", "10", True), ("watch", "15", True),
                            ("watch", "16", True)], requests
    assert seen[0] == "list" and seen.count("list") == 1
    assert seen[1:] == (["12", "16"] if what == "pods" else ["a"])
