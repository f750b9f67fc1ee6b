"""The online calibration with the API server: kept in its ConfigMap by the chart's extender (its own
RBAC), merged on a conflict, and read back after a restart (extender/calibration_store.py,
extender/kube/calibration_configmap.py)."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from tests.cluster.conftest import SCHEDULER_SELECTOR, LocalCluster
from tests.e2e.scenarios import JOBS_NAMESPACE, NAMESPACE, PREFIX, create, scheduled, wait_for, workload

KEY = "calibration.json"
#: An exact-path job (a named architecture) whose peak the simulated agent reports as `usage_mib`.
JOB = {f"{PREFIX}model": "timm/resnet50", f"{PREFIX}batch-size": "32", f"{PREFIX}gpu-share": "0.05"}
SEEN = re.compile(r'^deepres_calibration_pods_seen\{([^}]*)\} ([0-9.e+]+)$', re.M)


def configmap_name(cluster: LocalCluster) -> str:
    """The ConfigMap the chart tells the extender to keep the calibration in."""
    pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector=SCHEDULER_SELECTOR).items
    env = {e.name: e.value for p in pods for c in p.spec.containers if c.name == "extender" for e in c.env or []}
    name: str = env["DEEPRES_CALIBRATION_CONFIGMAP"]
    return name


def kept(cluster: LocalCluster, name: str) -> tuple[str, dict[str, Any]]:
    """(resourceVersion, the kept pods by uid); ("", {}) while there is no ConfigMap."""
    from kubernetes.client import ApiException

    try:
        cm = cluster.core.read_namespaced_config_map(name, NAMESPACE)
    except ApiException as err:
        if err.status == 404:
            return "", {}
        raise
    pods: dict[str, Any] = json.loads((cm.data or {}).get(KEY) or "{}").get("pods", {})
    return cm.metadata.resource_version, pods


def seen(cluster: LocalCluster) -> dict[tuple[str, str, str], float]:
    """deepres_calibration_pods_seen by (GPU model, software, path)."""
    out = {}
    for labels, value in SEEN.findall(cluster.extender_metrics()):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out[(fields["gpu_model"], fields["software"], fields["path"])] = float(value)
    return out


def predict(cluster: LocalCluster, gpu: str, software: str) -> dict[str, Any]:
    body = json.dumps({"annotations": JOB, "gpu": gpu, "software": software}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{cluster.extender_port}/v1/predict", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())["on_gpu"]
    return answer


def test_the_calibration_is_kept_in_its_configmap_merged_on_conflict_and_read_after_a_restart(
    clean: LocalCluster,
) -> None:
    cluster = clean
    name = configmap_name(cluster)
    # 1. a pod deepres places and whose peak the agent reports: the extender writes it to its ConfigMap
    create(cluster, workload("calib-1", JOB, usage_mib=7000))
    scheduled(cluster, "calib-1")
    uid1 = cluster.pod("calib-1").metadata.uid
    wait_for("calib-1's peak kept in the ConfigMap (the extender's create)",
             lambda: kept(cluster, name)[1].get(uid1, {}).get("peak_mib", 0) > 0, 60, 0.5)
    version, pods = kept(cluster, name)
    first = pods[uid1]
    gpu, software = first["gpu_model"], first["software"]
    # 2. someone else writes it meanwhile (another extender, an admin): twelve observed pods of that GPU
    # model, each of its own owner and run long enough to have peaked, on calib-1's node (the only node of
    # that model here: the calibration learns only from nodes that report, and one node may carry it when
    # it is the model's only one), enough for a calibration; the extender's next write meets a conflict
    for i in range(12):
        point = 3_000.0 + 1_500.0 * i
        pods[f"earlier-{i}"] = {**first, "point_mib": point, "upper_mib": point * 1.2,
                                "peak_mib": 300.0 + point * (0.9 + 0.01 * (i % 4)), "order": 0.01 * (i + 1),
                                "regime": "large", "owner": f"{JOBS_NAMESPACE}/Job/earlier-{i}", "settled": True}
    cm = cluster.core.read_namespaced_config_map(name, NAMESPACE)
    assert cm.metadata.resource_version == version
    cm.data = {KEY: json.dumps({**json.loads(cm.data[KEY]), "pods": pods})}
    cluster.core.replace_namespaced_config_map(name, NAMESPACE, cm)
    # 3. a second pod: its write is refused (stale resourceVersion), read again, merged, retried
    create(cluster, workload("calib-2", JOB, usage_mib=7200))
    scheduled(cluster, "calib-2")
    uid2 = cluster.pod("calib-2").metadata.uid
    wait_for("calib-2 kept next to calib-1 and the twelve others (merged after the conflict)",
             lambda: {uid1, uid2, *(f"earlier-{i}" for i in range(12))} <= set(kept(cluster, name)[1]), 60, 0.5)
    key = (gpu, software, "exact")
    expected = sum(1 for p in kept(cluster, name)[1].values() if (p["gpu_model"], p["software"], p["path"]) == key)
    assert expected >= 13  # calib-2 may have landed on a GPU of another model
    # 4. the pods go (nothing left to relearn from), the extender restarts: what was kept is read back
    for pod in ("calib-1", "calib-2"):
        cluster.core.delete_namespaced_pod(pod, JOBS_NAMESPACE, grace_period_seconds=0)
    wait_for("the pods gone", lambda: not [p for p in cluster.core.list_namespaced_pod(JOBS_NAMESPACE).items
                                          if p.metadata.name in ("calib-1", "calib-2")], 60, 0.5)
    cluster.restart_scheduler_pod()
    wait_for("the extender ready", cluster.extender_ready, 120, 0.5)
    wait_for("deepres_calibration_pods_seen read back from the ConfigMap",
             lambda: seen(cluster).get(key) == expected, 60, 0.5)
    try:  # the learner publishes its snapshot off the request path: wait for it, not for a time
        answer = wait_for("the calibration learned from what was read back",
                          lambda: (a := predict(cluster, gpu, software))["calibrated"] and a, 60, 0.5)
        assert answer["pods"] >= 12, answer
    finally:  # the next scenarios size their pods by the shipped predictor: they get an uncalibrated extender
        cluster.core.delete_namespaced_config_map(name, NAMESPACE)
        cluster.restart_scheduler_pod()
        wait_for("the extender ready without the calibration", cluster.extender_ready, 120, 0.5)
        wait_for("nothing calibrated", lambda: not predict(cluster, gpu, software)["calibrated"], 60, 0.5)
