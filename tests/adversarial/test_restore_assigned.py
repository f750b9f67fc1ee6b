"""A forged or edited `deepres.io/assigned-gpus` after a restart (the leftover of issue 34).

The restarted extender rebuilds its reservations from the pods' annotations. Whoever can write a pod's
annotations past the chart's admission policy (or create a pod with spec.nodeName where the policy is
not installed) could make the restore book GPUs deepres never assigned, GPUs that do not exist, GPUs of
another node (claiming them away from their node's agent), or a GPU beyond its memory. Each case here is
a restart of a real extender in cluster mode over HTTP against the in-memory API server, then the nodes'
reports: what the restore books, what a newcomer's filter sees, and the Warning Event and metric.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from extender.settings import Settings
from tests.adversarial.ledger_support import GIB, api_server, cluster_mode, gpu, report
from tests.fixtures.kube.payloads import CREATED, extender_args, pod
from tests.fixtures.kube.server import get, post

GPU_MIB = 16_384.0


def bound(name: str, node: str, gpus: str, mib: float, *, created: datetime = CREATED,
          **annotations: str) -> dict[str, Any]:
    """A running pod with what bind writes (`assigned-gpus` = `gpus`), and what the test forges."""
    body = pod(name, {"deepres.io/model-type": "cnn", "deepres.io/gpu-memory": f"{int(mib)}Mi",
                      "deepres.io/assigned-gpus": gpus, "deepres.io/admission-memory-mib": f"{mib:.0f}",
                      "deepres.io/predicted-memory-mib": f"{mib:.0f}", "deepres.io/assigned-node": node,
                      **{"deepres.io/" + k: v for k, v in annotations.items()}}, node_name=node, created=created)
    body["status"] = {"phase": "Running"}
    return body


def settings() -> Settings:
    out = Settings()
    out.kube.telemetry_grace_s = 0.0
    out.policy.sharing = False  # several pods on a GPU: the memory rule is what is attacked here
    out.kube.assume_on_prioritize = False  # `fits` probes with a filter: its one node is not kept for a bind
    return out


def gpus_of(ext: Any) -> dict[str, tuple[str, ...]]:
    return {r.name: r.gpu_uuids for r in ext.state.reservations()}


def wait(what: str, check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """`check()` once it is truthy (the events are sent by a worker thread)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got, f"timed out waiting for {what}"
            return got
        time.sleep(0.02)


def events_of(cluster: Any, name: str) -> list[tuple[str, str, str, bool]]:
    return [e for e in cluster.events if e[0] == f"default/{name}"]


def metric(url: str, reason: str) -> float:
    for line in get(url + "/metrics")[1].splitlines():
        if line.startswith(f'deepres_extender_restore_invalid_pods_total{{reason="{reason}"}} '):
            return float(line.split()[-1])
    return 0.0


def fits(url: str, node: str, gib: float) -> bool:
    newcomer = pod(f"newcomer-{int(gib)}", {"deepres.io/gpu-memory": f"{int(gib)}Gi"})
    return node in post(url + "/filter", extender_args(newcomer, names=[node]))[1]["NodeNames"]


def test_a_gpu_the_node_does_not_have_is_not_booked() -> None:
    cluster = api_server()
    cluster.add_pod(bound("phantom", "n1", "n1-gpu0,GPU-does-not-exist", 10 * GIB))
    with cluster_mode(cluster, settings=settings()) as (url, ext):
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
        assert gpus_of(ext) == {"phantom": ("n1-gpu0",)}  # the real one stays booked
        assert metric(url, "unknown_gpu") == 1.0
        events = wait("a RestoredInvalid event", lambda: events_of(cluster, "phantom"))
        assert events[0][1] == "RestoredInvalid" and events[0][3] is True
        assert "GPU-does-not-exist" in events[0][2] and "not a GPU of node n1" in events[0][2], events
        assert not fits(url, "n1", 10)  # no over-commit of the GPU it does hold


def test_another_nodes_gpu_is_not_claimed_from_its_agent() -> None:
    """Before: the restore claimed the named GPU for the pod's node, so its real node's agent was
    answered 409 and its GPU was lost to placement (issue 34 row 3, through an annotation)."""
    cluster = api_server()
    thief = bound("thief", "n1", "n2-gpu0", 10 * GIB)
    cluster.add_pod(thief)
    with cluster_mode(cluster, settings=settings()) as (url, ext):
        status, answer = post(url + "/v1/telemetry", report("n2", 1, [gpu("n2-gpu0", GPU_MIB)]), token="token-n2")
        assert status == 200, answer
        assert fits(url, "n2", 10)  # the owner's GPU is free and healthy
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
        assert gpus_of(ext) == {}  # it names no GPU of its node, and no process of it runs on one
        assert metric(url, "unknown_gpu") == 1.0 and fits(url, "n1", 10)
        ext.on_pod_changed(thief, False)  # its next watch event: not restored (nor warned) again
        ext.on_pods_listed([thief])
        assert gpus_of(ext) == {} and metric(url, "unknown_gpu") == 1.0


@pytest.mark.parametrize("uses", [None, "n1-gpu1"])
def test_more_gpus_than_the_pod_asks_for_are_cut_to_its_request(uses: str | None) -> None:
    """One GPU asked (deepres.io/gpus default 1), three named: one is booked, the one its processes use
    when the agent sees them, else the first named; the others are free for a newcomer."""
    cluster = api_server()
    forged = bound("greedy", "n1", "n1-gpu0,n1-gpu1,n1-gpu2", 10 * GIB)
    cluster.add_pod(forged)
    uid = forged["metadata"]["uid"]
    processes = {u: [(7, 9 * GIB, uid)] if u == uses else [] for u in ("n1-gpu0", "n1-gpu1", "n1-gpu2")}
    gpus = [gpu(u, GPU_MIB, used=9 * GIB if u == uses else 0.0, index=i, processes=processes[u])
            for i, u in enumerate(processes)]
    with cluster_mode(cluster, settings=settings()) as (url, ext):
        post(url + "/v1/telemetry", report("n1", 1, gpus), token="token-n1")
        assert gpus_of(ext) == {"greedy": (uses or "n1-gpu0",)}
        assert metric(url, "gpu_count") == 1.0
        message = wait("a RestoredInvalid event", lambda: events_of(cluster, "greedy"))[0][2]
        assert "the pod asks for 1" in message, message
        for i in range(2):  # two GPUs left for two newcomers of 10 GiB
            newcomer = pod(f"after-{i}", {"deepres.io/gpu-memory": "10Gi"})
            cluster.add_pod(newcomer)
            assert fits(url, "n1", 10)
            assert post(url + "/bind", {"PodName": f"after-{i}", "PodNamespace": "default",
                                        "PodUID": newcomer["metadata"]["uid"], "Node": "n1"})[1] == {"Error": ""}
        held = gpus_of(ext)
        assert sorted(held[f"after-{i}"][0] for i in range(2)) == sorted(set(processes) - {uses or "n1-gpu0"})


@pytest.mark.parametrize("forged_first", [True, False])
def test_two_pods_on_one_gpu_beyond_its_memory_the_earlier_bind_wins(forged_first: bool) -> None:
    """An honest pod holds 12 of a GPU's 16 GiB; a pod created an hour later names the same GPU for
    12 GiB more and backdates its `bound-at` to before the honest one's. Whatever order the API server
    lists them in, the later pod is the one named (Warning Event, metric); both stay booked (the GPU
    shows full: nothing more is admitted), the honest pod's reservation untouched."""
    cluster = api_server()
    honest = bound("honest", "n1", "n1-gpu0", 12 * GIB, **{"bound-at": "2026-11-21T12:00:30Z"})
    forged = bound("forged", "n1", "n1-gpu0", 12 * GIB, created=CREATED + timedelta(hours=1),
                   **{"bound-at": "2026-11-21T11:00:00Z"})
    for body in ((forged, honest) if forged_first else (honest, forged)):
        cluster.add_pod(body)
    with cluster_mode(cluster, settings=settings(), clock=lambda: (CREATED + timedelta(hours=2)).timestamp()) as (
            url, ext):
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB), gpu("n1-gpu1", GPU_MIB, index=1)],
                                           timestamp_s=(CREATED + timedelta(hours=2)).timestamp()), token="token-n1")
        assert gpus_of(ext) == {"honest": ("n1-gpu0",), "forged": ("n1-gpu0",)}
        assert metric(url, "overbooked") == 1.0
        events = wait("a RestoredOverbooked event", lambda: events_of(cluster, "forged"))
        assert events[0][1] == "RestoredOverbooked" and events[0][3] is True and "n1-gpu0" in events[0][2]
        assert events_of(cluster, "honest") == []
        newcomer = pod("newcomer", {"deepres.io/gpu-memory": "2Gi"})
        cluster.add_pod(newcomer)
        assert post(url + "/bind", {"PodName": "newcomer", "PodNamespace": "default",
                                    "PodUID": newcomer["metadata"]["uid"], "Node": "n1"})[1] == {"Error": ""}
        assert gpus_of(ext)["newcomer"] == ("n1-gpu1",)  # never onto the overbooked GPU


def test_an_unparsable_list_books_only_what_can_be_a_gpu() -> None:
    cluster = api_server()
    cluster.add_pod(bound("garbled", "n1", "n1-gpu0,,n1-gpu0,has space," + "x" * 300, 10 * GIB))
    with cluster_mode(cluster, settings=settings()) as (url, ext):
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
        assert gpus_of(ext) == {"garbled": ("n1-gpu0",)}
        assert metric(url, "gpu_list") >= 3.0
        assert get(url + "/readyz")[0] == 200
