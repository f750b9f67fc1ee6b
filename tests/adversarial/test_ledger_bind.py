"""Binds under attack, against a real server process (`deepres serve --no-kube`) or the extender in
cluster mode on a loopback port, each reproduction repeated 20 times with 0 MiB over-committed:

- #3 a repeated bind of a bound pod succeeds without side effects (it used to release the first
  reservation and strip the pod's annotations: the GPU was promised twice), also 64 binds at once;
- #2 bind trusts the API server, not a filter body: a /filter reusing a real pod's uid with a tiny
  gpu-memory no longer shrinks what bind reserves, /bind refuses pods of other schedulers and of
  other uids, and a /filter for an invented or inflated high-priority pod evicts nobody.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.adversarial.ledger_support import GIB, api_server, cluster_mode, gpu, overcommitted, report
from tests.fixtures.kube.payloads import binding_args, extender_args, pod
from tests.fixtures.kube.server import TOKEN, post, running_server

ROUNDS = 20
T4_MIB = 15_360.0  # a 16 GB Tesla T4 as NVML reports it


def test_a_repeated_bind_succeeds_without_touching_the_first_reservation(tmp_path: Path) -> None:
    with running_server(tmp_path, use_real_predictor=False) as url:
        over = []
        for i in range(ROUNDS):
            node, other = f"rb-{i}", f"rb-other-{i}"
            for name in (node, other):
                body = report(name, 1, [gpu(f"{name}-gpu0", T4_MIB)])
                assert post(url + "/v1/telemetry", body, token=TOKEN)[0] == 200
            first = pod(f"first-{i}", {"deepres.io/gpu-memory": "10Gi"})
            assert post(url + "/filter", extender_args(first, names=[node]))[1]["NodeNames"] == [node]
            assert post(url + "/bind", binding_args(first, node)) == (200, {"Error": ""})
            assert post(url + "/bind", binding_args(first, node)) == (200, {"Error": ""})  # retried: no side effect
            elsewhere = post(url + "/bind", binding_args(first, other))[1]["Error"]
            assert "already" in elsewhere, elsewhere  # to another node: refused, the first stays
            bound = [10 * GIB]
            second = pod(f"second-{i}", {"deepres.io/gpu-memory": "10Gi"})
            post(url + "/filter", extender_args(second, names=[node]))
            if post(url + "/bind", binding_args(second, node))[1]["Error"] == "":
                bound.append(10 * GIB)
            over.append(overcommitted(bound, T4_MIB))
        assert over == [0.0] * ROUNDS


def race(url: str, node: str, bodies: list[dict[str, Any]]) -> set[str]:
    """Bind every body to `node` at once; the names of the pods whose bind succeeded."""
    barrier = threading.Barrier(len(bodies))
    placed: set[str] = set()
    lock = threading.Lock()

    def bind(p: dict[str, Any]) -> None:
        barrier.wait()
        status, out = post(url + "/bind", binding_args(p, node), timeout=30)
        if status == 200 and out["Error"] == "":
            with lock:
                placed.add(p["metadata"]["name"])

    threads = [threading.Thread(target=bind, args=(p,)) for p in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return placed


def test_64_binds_at_once_half_of_them_retries_of_one_pod(tmp_path: Path) -> None:
    gpu_mib = 10 * GIB + 700  # room for 10 pods of 1 GiB
    with running_server(tmp_path, env={"DEEPRES_THREADS": "16"}, use_real_predictor=False) as url:
        over = []
        for r in range(ROUNDS):
            node = f"race-{r}"
            assert post(url + "/v1/telemetry", report(node, 1, [gpu(f"{node}-gpu0", gpu_mib)]), token=TOKEN)[0] == 200
            same = pod(f"same-{r}", {"deepres.io/gpu-memory": "1Gi"})
            others = [pod(f"other-{r}-{i}", {"deepres.io/gpu-memory": "1Gi"}) for i in range(32)]
            for p in [same, *others]:
                post(url + "/filter", extender_args(p, names=[node]))
            placed = race(url, node, [same] * 32 + others)
            over.append(overcommitted([GIB] * len(placed), gpu_mib))
        assert over == [0.0] * ROUNDS


def test_a_filter_reusing_a_pods_uid_does_not_change_what_bind_reserves(tmp_path: Path) -> None:
    """The first filter naming a pod defines it in local mode (no API server to ask): an attacker's
    later filter with the same uid and `gpu-memory: 64Mi` is not what bind reads."""
    with running_server(tmp_path, use_real_predictor=False) as url:
        over = []
        for r in range(ROUNDS):
            node = f"poison-{r}"
            assert post(url + "/v1/telemetry", report(node, 1, [gpu(f"{node}-gpu0", 16_384.0)]), token=TOKEN)[0] == 200
            bound = []
            for i in range(6):
                real = pod(f"job-{r}-{i}", {"deepres.io/gpu-memory": "6.6Gi"})
                post(url + "/filter", extender_args(real, names=[node]))
                poisoned = pod(f"job-{r}-{i}", {"deepres.io/gpu-memory": "64Mi"})  # same name and uid
                post(url + "/filter", extender_args(poisoned, names=[node]))
                if post(url + "/bind", binding_args(real, node))[1]["Error"] == "":
                    bound.append(6.6 * GIB)
            over.append(overcommitted(bound, 16_384.0))
        assert over == [0.0] * ROUNDS


def test_cluster_mode_bind_reads_the_pod_from_the_api_server() -> None:
    cluster = api_server()
    with cluster_mode(cluster) as (url, ext):
        over = []
        for r in range(ROUNDS):
            node = ("a", "b", "c")[r % 3]
            if r < 3:
                assert post(url + "/v1/telemetry", report(node, 1, [gpu(f"{node}-gpu0", 16_384.0)]),
                            token=f"token-{node}")[0] == 200
            bound = []
            for i in range(6):
                real = pod(f"job-{r}-{i}", {"deepres.io/gpu-memory": "6.6Gi"})
                cluster.add_pod(real)  # what the API server has
                poisoned = pod(f"job-{r}-{i}", {"deepres.io/gpu-memory": "64Mi"})
                post(url + "/filter", extender_args(poisoned, names=[node]))
                if post(url + "/bind", binding_args(poisoned, node))[1]["Error"] == "":
                    bound.append(6.6 * GIB)
            over.append(overcommitted(bound, 16_384.0))
            for i in range(6):  # the round's pods end: the next round starts from an empty GPU
                cluster.delete_pod("default", f"job-{r}-{i}")
        assert over == [0.0] * ROUNDS
        # a pending pod of another scheduler, a pod with another uid, an invented pod: never bound
        foreign = pod("coredns-x", {"deepres.io/gpu-memory": "1Gi"}, namespace="kube-system")
        foreign["spec"]["schedulerName"] = "default-scheduler"
        cluster.add_pod(foreign)
        out = post(url + "/bind", binding_args(foreign, "a"))[1]["Error"]
        assert "scheduled by default-scheduler, not by deepres-scheduler" in out
        real = pod("real", {"deepres.io/gpu-memory": "1Gi"})
        cluster.add_pod(real)
        assert "has uid" in post(url + "/bind", binding_args(pod("real", uid="forged"), "a"))[1]["Error"]
        assert "does not exist" in post(url + "/bind", binding_args(pod("invented"), "a"))[1]["Error"]
        assert all((p.get("spec") or {}).get("nodeName") is None for p in (cluster.get_pod("kube-system", "coredns-x"),
                                                                           cluster.get_pod("default", "real")) if p)
        assert ext.state.reservations() == []


def test_a_filter_claiming_a_huge_priority_evicts_nobody() -> None:
    cluster = api_server()
    with cluster_mode(cluster) as (url, ext):
        assert post(url + "/v1/telemetry", report("a", 1, [gpu("a-gpu0", 16_384.0)]), token="token-a")[0] == 200
        victims = [pod(f"victim-{i}", {"deepres.io/gpu-memory": "6Gi", "deepres.io/criticality": "high"})
                   for i in range(2)]
        for v in victims:
            cluster.add_pod(v)
            assert post(url + "/bind", binding_args(v, "a")) == (200, {"Error": ""})
        real = pod("pending", {"deepres.io/gpu-memory": "12Gi"})  # normal criticality in the API server
        cluster.add_pod(real)
        for r in range(ROUNDS):
            invented = pod(f"evil-{r}", {"deepres.io/gpu-memory": "12Gi"}, priority=2_000_000_000,
                           priority_class="system-cluster-critical")
            inflated = pod("pending", {"deepres.io/gpu-memory": "12Gi", "deepres.io/criticality": "critical"},
                           priority=2_000_000_000, priority_class="system-cluster-critical")
            for body in (invented, inflated):
                out = post(url + "/filter", extender_args(body, names=["a"]))[1]
                assert out["NodeNames"] == []  # the filter answers; a worker decides on evictions
            ext._preempting.clear()  # let every round ask again
            worker = getattr(ext, "worker", None)  # (builds before the worker evicted in the filter)
            assert worker is None or worker.drain()
        assert cluster.evictions == []
        assert len(ext.state.reservations()) == 2
