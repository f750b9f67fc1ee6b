"""Restarts: the verbs wait for the rebuild (#4), `--no-kube` keeps what it bound and lets go of what
is gone (#12), and fresh telemetry after a restart wakes the pods set aside for the lack of it.
Cluster-mode reproductions run the extender on a loopback port beside an in-memory API server; the
local-mode ones a real `deepres serve --no-kube` process. Over-commit reproductions: 20 rounds, 0 MiB.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from extender.kube.cluster import ClusterHandlers
from extender.kube.local import InMemoryCluster
from extender.settings import Settings
from tests.adversarial.ledger_support import GIB, NODE_TOKENS, cluster_mode, gpu, overcommitted, report
from tests.fixtures.kube.payloads import binding_args, extender_args, pod
from tests.fixtures.kube.server import TOKEN, get, post, running_server

ROUNDS = 20
GPU_MIB = 16_384.0


class SlowListCluster(InMemoryCluster):
    """An API server whose first pod list takes `delay_s` (a large cluster): the handlers get it late."""

    def __init__(self, delay_s: float) -> None:
        try:
            super().__init__(NODE_TOKENS, learn_pods=False)
        except TypeError:  # builds before learn_pods
            super().__init__(NODE_TOKENS)
        self.delay_s = delay_s
        self.listed = threading.Event()

    def start(self, handlers: ClusterHandlers) -> None:
        def later() -> None:
            time.sleep(self.delay_s)
            super(SlowListCluster, self).start(handlers)
            self.listed.set()

        threading.Thread(target=later, daemon=True).start()

    def synced(self) -> bool:
        return self.listed.is_set()


def running_pod(name: str, node: str, gpu_uuid: str, mib: float) -> dict[str, Any]:
    """A pod bound before the restart, with the annotations bind wrote."""
    body = pod(name, {"deepres.io/gpu-memory": f"{int(mib)}Mi", "deepres.io/assigned-gpus": gpu_uuid,
                      "deepres.io/admission-memory-mib": f"{mib:.0f}", "deepres.io/predicted-memory-mib": f"{mib:.0f}",
                      "deepres.io/assigned-node": node}, node_name=node)
    body["status"] = {"phase": "Running"}
    return body


def test_binds_during_the_restart_rebuild_never_overcommit() -> None:
    over = []
    waited = 0  # rounds whose filter came inside the window (a loaded machine may miss a few)
    for r in range(ROUNDS):
        cluster = SlowListCluster(delay_s=0.3)
        cluster.add_pod(running_pod(f"old-{r}", "n1", "n1-gpu0", 10 * GIB))
        new = pod(f"new-{r}", {"deepres.io/gpu-memory": "10Gi"})
        cluster.add_pod(new)
        settings = Settings()
        settings.kube.telemetry_grace_s = 0.0
        with cluster_mode(cluster, settings=settings) as (url, _ext):
            post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
            bound = [10 * GIB]
            during = post(url + "/filter", extender_args(new, names=["n1"]))[1]
            if post(url + "/bind", binding_args(new, "n1"))[1]["Error"] == "":
                bound.append(10 * GIB)
            else:
                waited += "not ready" in during["Error"]
                assert cluster.listed.wait(5)
                if post(url + "/bind", binding_args(new, "n1"))[1]["Error"] == "":  # after the rebuild
                    bound.append(10 * GIB)
            over.append(overcommitted(bound, GPU_MIB))
    assert over == [0.0] * ROUNDS
    assert waited > 0


def test_readyz_waits_for_the_first_sync_and_a_telemetry_quorum() -> None:
    cluster = SlowListCluster(delay_s=1.0)
    for i, node in enumerate(("n1", "n2", "n3")):
        cluster.add_pod(running_pod(f"old-{i}", node, f"{node}-gpu0", 4 * GIB))
    with cluster_mode(cluster) as (url, _ext):  # default: half of the 3 nodes with reservations
        status, text = get(url + "/readyz")
        assert status == 503 and "first cluster sync" in text
        assert cluster.listed.wait(5)
        status, text = get(url + "/readyz")
        assert status == 503 and "telemetry quorum (0 of 3 nodes" in text
        for seq, node in enumerate(("n1", "n2"), start=1):
            post(url + "/v1/telemetry", report(node, seq, [gpu(f"{node}-gpu0", GPU_MIB)]), token=f"token-{node}")
        assert get(url + "/readyz")[0] == 200


def test_fresh_telemetry_after_rejections_nudges_the_node() -> None:
    """Pods failed for a node without telemetry sit Pending until a cluster event: the extender
    annotates the Node when that node's telemetry arrives (a Node update is such an event)."""
    cluster = InMemoryCluster(NODE_TOKENS)
    with cluster_mode(cluster) as (url, ext):
        waiting = pod("waiting", {"deepres.io/gpu-memory": "1Gi"})
        out = post(url + "/filter", extender_args(waiting, names=["n1", "n2"]))[1]
        assert out["FailedAndUnresolvableNodes"]["n1"] == "no agent report"
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
        worker = getattr(ext, "worker", None)  # (builds before the worker: nothing would nudge)
        assert worker is None or worker.drain()
        annotations = getattr(cluster, "node_annotations", {})
        assert "deepres.io/telemetry-since" in annotations.get("n1", {})
        post(url + "/v1/telemetry", report("n1", 2, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
        assert worker.drain() and list(annotations) == ["n1"]  # once per arrival, not per report


def test_no_kube_restart_keeps_what_it_bound(tmp_path: Path) -> None:
    # the restarted server is ready once half the nodes with reservations reported, or after 2 s
    env = {"DEEPRES_STATE_FILE": str(tmp_path / "bound.json"), "DEEPRES_TELEMETRY_GRACE_S": "2"}
    with running_server(tmp_path, env=env, use_real_predictor=False) as url:
        for r in range(ROUNDS):
            node = f"keep-{r}"
            post(url + "/v1/telemetry", report(node, 1, [gpu(f"{node}-gpu0", GPU_MIB)]), token=TOKEN)
            p = pod(f"before-{r}", {"deepres.io/gpu-memory": "10Gi"})
            post(url + "/filter", extender_args(p, names=[node]))
            assert post(url + "/bind", binding_args(p, node))[1]["Error"] == ""
    with running_server(tmp_path, env=env, use_real_predictor=False) as url:  # restarted
        over = []
        for r in range(ROUNDS):
            node = f"keep-{r}"
            post(url + "/v1/telemetry", report(node, 1, [gpu(f"{node}-gpu0", GPU_MIB)], boot_id="b2"), token=TOKEN)
            late = pod(f"after-{r}", {"deepres.io/gpu-memory": "10Gi"})
            post(url + "/filter", extender_args(late, names=[node]))
            bound = [10 * GIB] + ([10 * GIB] if post(url + "/bind", binding_args(late, node))[1]["Error"] == ""
                                  else [])
            over.append(overcommitted(bound, GPU_MIB))
        assert over == [0.0] * ROUNDS
        again = pod("before-0", {"deepres.io/gpu-memory": "10Gi"})  # a retried bind of a remembered pod
        assert post(url + "/bind", binding_args(again, "keep-0")) == (200, {"Error": ""})


def test_no_kube_lets_go_of_silent_nodes_and_unseen_reservations() -> None:
    from extender.server.app import create_app, extender_of
    from tests.fixtures.kube.doubles import FormulaPredictor

    now = [1000.0]
    settings = Settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = TOKEN
    settings.kube.local_expiry_s = 600.0
    settings.policy.sharing = False  # two GPU-bound pods on one GPU: memory decides here, not compute
    app = create_app(settings, predictor=FormulaPredictor(), clock=lambda: now[0], cluster=InMemoryCluster())
    client, ext = app.test_client(), extender_of(app)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    seq = 0

    def send(node: str, pods: list[dict[str, Any]] | None = None) -> None:
        nonlocal seq
        seq += 1
        body = report(node, seq, [gpu(f"{node}-gpu0", GPU_MIB)], pods=pods, timestamp_s=now[0])
        assert client.post("/v1/telemetry", json=body, headers=headers).status_code == 200

    send("kept")
    send("phantom")
    kept, gone = pod("kept-pod", {"deepres.io/gpu-memory": "4Gi"}), pod("gone-pod", {"deepres.io/gpu-memory": "4Gi"})
    for p in (kept, gone):
        client.post("/filter", json=extender_args(p, names=["kept"]))
        assert client.post("/bind", json=binding_args(p, "kept")).get_json() == {"Error": ""}
    for _ in range(7):  # 700 s: "kept" reports and names its pod; "phantom" never again; "gone-pod" unnamed
        now[0] += 100.0
        send("kept", [{"pod_uid": kept["metadata"]["uid"], "current_memory_mib": 100.0, "peak_memory_mib": 100.0}])
    assert ext.state.node_view("phantom") is None and ext.state.node_view("kept") is not None
    assert [r.name for r in ext.state.reservations()] == ["kept-pod"]
