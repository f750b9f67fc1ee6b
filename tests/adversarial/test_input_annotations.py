"""What a user who can annotate a pod may write (#34 rows 1 and 12).

Row 1: numbers Python's `int()`/`float()` or `str.isdigit()` take but an annotation must not
(`²`, `①`, 5,000 digits, `nan`, `inf`, `1e400`) get a clear refusal naming the key from every verb and
`/v1/predict`, never a 500 or an "internal error"; and a bound pod whose annotations stop parsing
after its bind neither keeps a restarted extender unready nor frees its GPUs (cluster mode against the
in-memory API server here, local mode against a real `deepres serve --no-kube` and its state file).

Row 12: the bind time and the checkpoint interval survive a restart, so a long job is no easier to
evict after an upgrade of the extender than before it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from extender.kube import statefile
from extender.settings import Settings
from tests.adversarial.ledger_support import GIB, api_server, cluster_mode, gpu, report
from tests.fixtures.kube.payloads import CREATED, binding_args, extender_args, pod, preemption_args
from tests.fixtures.kube.server import TOKEN, get, post, running_server

GPU_MIB = 16_384.0
#: Values `str.isdigit()`, `int()` or `float()` take (or overflow on) that no annotation means.
HOSTILE = ("²", "⁴", "①", "٣", "1_0", "1" * 5000, "nan", "inf", "-inf", "1e400", "Infinity")
#: (key, a job around it): the integer, fraction and GPU-count keys.
NUMERIC_KEYS = ("gpus", "batch-size", "iterations", "params-millions", "gpu-share", "input-dim")


def hostile_pod(name: str, key: str, value: str, **extra: Any) -> dict[str, Any]:
    return pod(name, {"deepres.io/model-type": "cnn", "deepres.io/" + key: value}, **extra)


@pytest.mark.parametrize("key", NUMERIC_KEYS)
def test_hostile_numbers_are_refused_by_name_on_every_verb(key: str) -> None:
    cluster = api_server()
    settings = Settings()
    settings.kube.telemetry_grace_s = 0.0
    with cluster_mode(cluster, settings=settings) as (url, _ext):
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
        for i, value in enumerate(HOSTILE):
            body = hostile_pod(f"p{i}", key, value)
            cluster.add_pod(body)
            status, answer = post(url + "/v1/predict", body)
            assert status == 400, (value[:10], answer)
            assert "deepres.io/" + key in answer["error"] and "internal" not in answer["error"]
            status, out = post(url + "/filter", extender_args(body, names=["n1"]))
            reasons = {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}
            assert status == 200 and out["NodeNames"] == [] and "deepres.io/" + key in reasons["n1"], out
            status, bound = post(url + "/bind", binding_args(body, "n1"))
            assert status == 200 and "deepres.io/" + key in bound["Error"], bound
            status, preempted = post(url + "/preempt", preemption_args(body, {"n1": []}))
            assert status == 200 and preempted["NodeNameToMetaVictims"] == {}
        assert cluster.pods and all(not (p.get("spec") or {}).get("nodeName") for p in cluster.pods.values())


def bound_pod(name: str, node: str, gpu_uuid: str, mib: float, **annotations: str) -> dict[str, Any]:
    """A pod bound before the restart, with what bind wrote (and what the user changed since)."""
    body = pod(name, {"deepres.io/model-type": "cnn", "deepres.io/gpu-memory": f"{int(mib)}Mi",
                      "deepres.io/assigned-gpus": gpu_uuid, "deepres.io/admission-memory-mib": f"{mib:.0f}",
                      "deepres.io/predicted-memory-mib": f"{mib:.0f}", "deepres.io/assigned-node": node,
                      **{"deepres.io/" + k: v for k, v in annotations.items()}}, node_name=node)
    body["status"] = {"phase": "Running"}
    return body


#: (what the user patched on the bound pod after its bind, the metric part the restore reports)
TAMPERED = [
    ({"gpus": "²"}, "annotations"),
    ({"batch-size": "1" * 5000}, "annotations"),
    ({"gpu-share": "nan"}, "annotations"),
    ({"admission-memory-mib": "²", "predicted-memory-mib": "1e400"}, "memory"),
    ({"admission-memory-mib": "nan"}, None),  # the predicted figure still books the GPU
]


@pytest.mark.parametrize(("patched", "part"), TAMPERED)
def test_restart_with_unparsable_annotations_is_ready_and_keeps_the_gpu_booked(
        patched: dict[str, str], part: str | None) -> None:
    cluster = api_server()
    cluster.add_pod(bound_pod("tampered", "n1", "n1-gpu0", 10 * GIB, **patched))
    cluster.add_pod(bound_pod("honest", "n2", "n2-gpu0", 10 * GIB))
    newcomer = pod("newcomer", {"deepres.io/gpu-memory": "10Gi"})
    cluster.add_pod(newcomer)
    settings = Settings()
    settings.kube.telemetry_grace_s = 0.0
    with cluster_mode(cluster, settings=settings) as (url, ext):  # the restarted extender
        for seq, node in enumerate(("n1", "n2"), start=1):
            post(url + "/v1/telemetry", report(node, seq, [gpu(f"{node}-gpu0", GPU_MIB)]), token=f"token-{node}")
        status, text = get(url + "/readyz")
        assert status == 200, text
        assert sorted(r.name for r in ext.state.reservations()) == ["honest", "tampered"]
        out = post(url + "/filter", extender_args(newcomer, names=["n1", "n2"]))[1]
        assert out["NodeNames"] == [] and "n1" in out["FailedNodes"]  # the tampered pod's GPU is still booked
        metrics = get(url + "/metrics")[1]
        if part is None:
            assert "deepres_extender_restore_unparsable_pods_total{" not in metrics
            return
        assert f'deepres_extender_restore_unparsable_pods_total{{part="{part}"}} 1.0' in metrics
        assert ext.worker.drain() if hasattr(ext, "worker") else True
        events = [e for e in cluster.events if e[0] == "default/tampered"]
        assert events and events[0][1] == "RestoredUnparsable" and events[0][3] is True, cluster.events


def test_no_kube_restart_from_a_state_file_with_unparsable_annotations(tmp_path: Path) -> None:
    state = tmp_path / "bound.json"
    statefile.write(state, [bound_pod("tampered", "keep", "keep-gpu0", 10 * GIB, gpus="²")])
    env = {"DEEPRES_STATE_FILE": str(state), "DEEPRES_TELEMETRY_GRACE_S": "1"}
    with running_server(tmp_path, env=env, use_real_predictor=False, ready_timeout_s=30) as url:
        assert get(url + "/readyz")[0] == 200
        post(url + "/v1/telemetry", report("keep", 1, [gpu("keep-gpu0", GPU_MIB)]), token=TOKEN)
        late = pod("late", {"deepres.io/gpu-memory": "10Gi"})
        out = post(url + "/filter", extender_args(late, names=["keep"]))[1]
        assert out["NodeNames"] == [] and "keep" in out["FailedNodes"], out
        assert 'deepres_extender_restore_unparsable_pods_total{part="annotations"} 1.0' in get(url + "/metrics")[1]


# ---- row 12: what preemption protects survives the restart ----

#: (checkpoint interval or None, time from bind to the restart, a victim after the restart?). The limit
#: is `policy.preempt_max_loss_s` (30 min): the progress lost is the attained service, or with an
#: interval the time since the last checkpoint (attained mod interval).
SERVICE = [
    (None, timedelta(hours=5), False),  # 5 h of work: never thrown away
    ("2h", timedelta(hours=5), False),  # 1 h since its last checkpoint
    ("2h", timedelta(hours=2, minutes=10), True),  # 10 min since its last checkpoint
    (None, timedelta(minutes=10), True),  # young: 10 min of work
]


@pytest.mark.parametrize(("interval", "after", "victim"), SERVICE)
def test_restart_keeps_attained_service_and_checkpoint_interval(interval: str | None, after: timedelta,
                                                                victim: bool) -> None:
    cluster = api_server()
    declared = {"deepres.io/checkpoint-interval": interval} if interval else {}
    long_job = pod("long-job", {"deepres.io/gpu-memory": "12Gi", "deepres.io/criticality": "low", **declared})
    cluster.add_pod(long_job)
    wall = [(CREATED + timedelta(minutes=5)).timestamp()]
    settings = Settings()
    settings.kube.telemetry_grace_s = 0.0
    with cluster_mode(cluster, settings=settings, clock=lambda: wall[0]) as (url, _ext):
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)]), token="token-n1")
        assert post(url + "/bind", binding_args(long_job, "n1"))[1] == {"Error": ""}
    wall[0] += after.total_seconds()
    urgent = pod("urgent", {"deepres.io/gpu-memory": "12Gi", "deepres.io/criticality": "high"})
    cluster.add_pod(urgent)
    with cluster_mode(cluster, settings=settings, clock=lambda: wall[0]) as (url, ext):  # restarted
        post(url + "/v1/telemetry", report("n1", 2, [gpu("n1-gpu0", GPU_MIB)], timestamp_s=wall[0]),
             token="token-n1")
        assert [r.name for r in ext.state.reservations()] == ["long-job"]
        out = post(url + "/preempt", preemption_args(urgent, {"n1": []}))[1]["NodeNameToMetaVictims"]
        chosen = [v["UID"] for v in out.get("n1", {}).get("Pods", [])]
        assert chosen == ([long_job["metadata"]["uid"]] if victim else []), out


def test_a_rewritten_bound_at_cannot_backdate_the_bind() -> None:
    """A user who rewrites `deepres.io/bound-at` to hours ago gains nothing: the restore never counts
    more than the time since the API server's PodScheduled condition (and the pod's creation)."""
    wall = (CREATED + timedelta(hours=12)).timestamp()
    cluster = api_server()
    forged = bound_pod("forged", "n1", "n1-gpu0", 12 * GIB,
                       **{"criticality": "low", "bound-at": "2026-11-21T12:30:00Z"})
    scheduled_at = (CREATED + timedelta(hours=11, minutes=50)).strftime("%Y-%m-%dT%H:%M:%SZ")  # 10 min ago
    forged["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at}]
    cluster.add_pod(forged)
    urgent = pod("urgent", {"deepres.io/gpu-memory": "12Gi", "deepres.io/criticality": "high"})
    cluster.add_pod(urgent)
    settings = Settings()
    settings.kube.telemetry_grace_s = 0.0
    with cluster_mode(cluster, settings=settings, clock=lambda: wall) as (url, _ext):
        post(url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", GPU_MIB)], timestamp_s=wall), token="token-n1")
        out = post(url + "/preempt", preemption_args(urgent, {"n1": []}))[1]["NodeNameToMetaVictims"]
        assert [v["UID"] for v in out.get("n1", {}).get("Pods", [])] == [forged["metadata"]["uid"]], out
