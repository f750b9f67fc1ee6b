"""Restart over real HTTP: a second extender process on the same cluster rebuilds the reservations
from the pods' annotations and never allocates the same memory twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flask import Flask
from werkzeug.serving import make_server

from extender.kube.local import InMemoryCluster
from extender.server.app import create_app
from extender.settings import Settings
from tests.fixtures.kube.doubles import FormulaPredictor
from tests.fixtures.kube.payloads import binding_args, extender_args, pod, report
from tests.fixtures.kube.server import post

TOKEN = "restart-token"


@contextmanager
def serving(cluster: InMemoryCluster) -> Iterator[str]:
    settings = Settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = TOKEN
    app: Flask = create_app(settings, predictor=FormulaPredictor(), cluster=cluster)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()


def test_restart_rebuilds_reservations_from_annotations() -> None:
    cluster = InMemoryCluster()  # outlives both extender processes, as the API server does
    gpus = [(20480.0, 0.0), (20480.0, 0.0)]
    first = [pod(f"before-{i}", {"deepres.io/gpu-memory": "12Gi"}) for i in range(2)]
    with serving(cluster) as url:
        post(url + "/v1/telemetry", report("n1", 1, time.time(), gpus), token=TOKEN)
        for p in first:
            post(url + "/filter", extender_args(p, names=["n1"]))
            assert post(url + "/bind", binding_args(p, "n1")) == (200, {"Error": ""})
    assigned = {cluster.pods[("default", p["metadata"]["name"])]["metadata"]["annotations"]["deepres.io/assigned-gpus"]
                for p in first}
    assert assigned == {"n1-gpu0", "n1-gpu1"}
    with serving(cluster) as url:  # restarted: nothing in memory but what the cluster says
        post(url + "/v1/telemetry", report("n1", 1, time.time(), gpus), token=TOKEN)
        late = pod("after", {"deepres.io/gpu-memory": "12Gi"})
        _status, out = post(url + "/filter", extender_args(late, names=["n1"]))
        assert out["NodeNames"] == [] and out["FailedNodes"]["n1"].endswith("needs 12.0 GiB, 8.0 GiB free")
        assert post(url + "/bind", binding_args(late, "n1"))[1]["Error"].startswith("cannot bind default/after")
        cluster.delete_pod("default", "before-0")  # the watch reports the deletion: memory comes back
        assert post(url + "/bind", binding_args(late, "n1")) == (200, {"Error": ""})
        annotations = cluster.pods[("default", "after")]["metadata"]["annotations"]
        assert annotations["deepres.io/assigned-gpus"] in assigned
