"""Every deepres pod gets exactly its GPUs on a real node: the real kubelet, containerd and runc, the
chart's agent as a container with its device plugin, the allocation handshake with the extender.

Why: whether a pod really gets the GPUs deepres chose is decided on the node (the kubelet calls the
plugin's `Allocate`, the runtime makes the container). Here the chart's agent DaemonSet (rendered from
helm/deepres with the cluster suite's values; simulated GPUs, `devicePlugin.simulatedGpus`) runs from the
locally built deepres/agent image on the real node (tests/cluster/test_real_node.py checks the node
itself), registers its plugin with the real kubelet, and reports to the extender. Pods are created as a
data scientist writes them (annotations only, in the governed namespace: the chart's mutating policy adds
the scheduler and the `deepres.io/gpu` request), and each container prints the device list the runtime
gave it (the volume-mounts strategy: one mount per GPU under /var/run/nvidia-container-devices): it
must be exactly the `deepres.io/assigned-gpus` the extender wrote. Every wait is on the state asserted.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.localchart import REAL_AGENT_DS, REAL_NODE_GPUS, SLOTS_PER_GPU, render_real_agent
from devtools.nodeimages import BUSYBOX_IMAGE
from devtools.realnode import PLACEMENT, RealNode
from tests.cluster.conftest import REPO, LocalCluster
from tests.e2e.scenarios import JOBS_NAMESPACE, LOW, NAMESPACE, PEER, RELEASE, wait_for

GPUS = int(REAL_NODE_GPUS.split("x")[0])
SLOTS = SLOTS_PER_GPU
RESOURCE = "deepres.io/gpu"
DEVICES = "/var/run/nvidia-container-devices"
AGENT_DS = REAL_AGENT_DS
MARK = "deepres.io/test"  # a label on the test's pods


def agent_pod(cluster: LocalCluster) -> Any:
    pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector="deepres.io/agent-for=real-node").items
    running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
               and all(c.ready for c in p.status.container_statuses or [])]
    return running[0] if len(running) == 1 else None


def advertised(cluster: LocalCluster, node: RealNode) -> int:
    allocatable = cluster.core.read_node(node.name).status.allocatable or {}
    return int(allocatable.get(RESOURCE, "0"))


@pytest.fixture(scope="module")
def real_agent(cluster: LocalCluster, real_node: RealNode, real_node_images: dict[str, str]) -> Iterator[RealNode]:
    from kubernetes import client

    apps = client.AppsV1Api(cluster.core.api_client)
    for obj in render_real_agent(cluster.extender_port, cluster.simulated_gpus, real_node.name,
                                 real_node_images["agent"]):
        if obj["kind"] == "ConfigMap":
            cluster.core.replace_namespaced_config_map(obj["metadata"]["name"], NAMESPACE, obj)
        else:
            apps.create_namespaced_daemon_set(NAMESPACE, obj)
    try:
        wait_for("the agent Running on the real node", lambda: agent_pod(cluster), 240, 1)
        wait_for(f"the real node to advertise {GPUS * SLOTS} {RESOURCE}",
                 lambda: advertised(cluster, real_node) == GPUS * SLOTS, 120, 0.5)
        wait_for("the extender to hold the real node's telemetry", lambda: f'node="{real_node.name}"' in
                 cluster.extender_metrics(), 120, 0.5)
        yield real_node
    finally:
        apps.delete_namespaced_daemon_set(AGENT_DS, NAMESPACE)


@pytest.fixture
def made(cluster: LocalCluster) -> Iterator[list[tuple[str, str]]]:
    """Pods the test made (namespace, name): deleted, and waited gone, afterwards."""
    names: list[tuple[str, str]] = []
    yield names
    for namespace, name in names:
        with contextlib.suppress(Exception):  # already gone
            cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_for("the test's pods to be gone", lambda: not [
        1 for ns, n in names if cluster.core.list_namespaced_pod(ns, field_selector=f"metadata.name={n}").items],
        120, 0.5)


def job_pod(name: str, gpus: int = 1, *, init: bool = False, sleep_s: int = 3600) -> dict[str, Any]:
    """A training pod as a data scientist writes it (annotations only), placed on the real node; each
    container prints the GPUs the runtime gave it."""
    show = f"ls {DEVICES} | sort | tr '\\n' ' '; echo; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"
    main: dict[str, Any] = {"name": "train", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", f"{show}; exec sleep {sleep_s}"]}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 1, "restartPolicy": "Never", "containers": [main],
                            **copy.deepcopy(PLACEMENT)}
    if gpus > 1:
        main["resources"] = {"limits": {RESOURCE: str(gpus)}}
    if init:
        spec["initContainers"] = [{"name": "prepare", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                   "command": ["sh", "-c", show], "resources": {"limits": {RESOURCE: str(gpus)}}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {MARK: "real-node-gpus"},
            "annotations": {"deepres.io/gpu-memory": "4Gi", "deepres.io/gpu-share": "0.05",
                            "deepres.io/gpus": str(gpus)}}, "spec": spec}


def create(cluster: LocalCluster, made: list[tuple[str, str]], body: dict[str, Any],
           namespace: str = JOBS_NAMESPACE) -> str:
    cluster.core.create_namespaced_pod(namespace, body)
    made.append((namespace, body["metadata"]["name"]))
    return str(body["metadata"]["name"])


def running_with_log(cluster: LocalCluster, name: str, container: str = "train") -> Any:
    """The pod once its container is running and has printed its devices; fails at once if it ended."""
    def check() -> Any:
        pod = cluster.core.read_namespaced_pod(name, JOBS_NAMESPACE)
        assert pod.status.phase not in ("Failed", "Succeeded"), \
            f"pod {name} is {pod.status.phase}: {pod.status.reason} {pod.status.message}"
        if pod.status.phase != "Running":
            return None
        log = cluster.core.read_namespaced_pod_log(name, JOBS_NAMESPACE, container=container)
        return (pod, log) if "NVIDIA_VISIBLE_DEVICES=" in log else None
    return wait_for(f"pod {name} running with its devices printed", check, 300, 0.5)


def seen_gpus(log: str) -> set[str]:
    """The GPUs a container's runtime gave it (its first line: the mounts under DEVICES)."""
    return set(log.splitlines()[0].split())


def assigned(pod: Any) -> set[str]:
    return set((pod.metadata.annotations or {})["deepres.io/assigned-gpus"].split(","))


def check_exact(cluster: LocalCluster, names: list[str], node: RealNode) -> None:
    """Each pod runs on the real node, its container sees exactly its assigned GPUs; one-GPU pods are
    spread or packed as the extender decided, never given a GPU they were not assigned."""
    for name in names:
        pod, log = running_with_log(cluster, name)
        assert pod.spec.node_name == node.name
        assert seen_gpus(log) == assigned(pod), f"{name}: saw {seen_gpus(log)}, assigned {assigned(pod)}\n{log}"
        assert f"NVIDIA_VISIBLE_DEVICES={DEVICES}" in log


def test_a_burst_to_one_node_gets_every_pod_exactly_its_gpus(cluster: LocalCluster, real_agent: RealNode,
                                                             made: list[tuple[str, str]]) -> None:
    """16 one-GPU pods and 4 two-GPU pods created at once, all bound to the one 8-GPU node: all Running,
    each container seeing exactly its GPUs (before the allocation handshake, pods bound to one node before
    the kubelet's first Allocate could not be told apart: 7 of 8 refused, UnexpectedAdmissionError)."""
    suffix = uuid.uuid4().hex[:5]
    bodies = [job_pod(f"burst-{suffix}-one-{i}") for i in range(16)]
    bodies += [job_pod(f"burst-{suffix}-two-{i}", gpus=2) for i in range(4)]
    started = time.monotonic()
    names = [create(cluster, made, body) for body in bodies]
    check_exact(cluster, names, real_agent)
    print(f"real node: {len(names)} pods created at once, all running with their GPUs in "
          f"{time.monotonic() - started:.1f} s")
    for name in names:
        pod = cluster.core.read_namespaced_pod(name, JOBS_NAMESPACE)
        assert len(assigned(pod)) == (2 if "-two-" in name else 1)


def test_an_init_container_requesting_the_gpu_gets_it_and_so_does_the_app(cluster: LocalCluster,
                                                                          real_agent: RealNode,
                                                                          made: list[tuple[str, str]]) -> None:
    name = create(cluster, made, job_pod(f"with-init-{uuid.uuid4().hex[:5]}", init=True))
    pod, log = running_with_log(cluster, name)
    init_log = cluster.core.read_namespaced_pod_log(name, JOBS_NAMESPACE, container="prepare")
    assert seen_gpus(init_log) == assigned(pod) == seen_gpus(log)


def test_an_agent_restart_mid_burst_hands_no_gpu_twice(cluster: LocalCluster, real_agent: RealNode,
                                                       made: list[tuple[str, str]]) -> None:
    """The agent pod is deleted (the DaemonSet makes a new one) while a burst is being admitted: every pod
    that starts sees exactly its GPUs; a pod the kubelet could not admit meanwhile (no plugin to ask) fails
    at admission, never runs with another pod's GPUs; once the new agent serves, new pods run."""
    suffix = uuid.uuid4().hex[:5]
    names = [create(cluster, made, job_pod(f"restart-{suffix}-{i}")) for i in range(6)]
    old = agent_pod(cluster)
    assert old is not None
    cluster.core.delete_namespaced_pod(old.metadata.name, NAMESPACE, grace_period_seconds=0)
    names += [create(cluster, made, job_pod(f"restart-{suffix}-{i}")) for i in range(6, 10)]

    def settled() -> dict[str, Any] | None:
        pods = {n: cluster.core.read_namespaced_pod(n, JOBS_NAMESPACE) for n in names}
        if any(p.status.phase not in ("Running", "Failed") for p in pods.values()):
            return None
        return pods
    pods = wait_for("every pod of the burst running or refused at admission", settled, 300, 1)
    for name, pod in pods.items():
        if pod.status.phase == "Running":
            _, log = running_with_log(cluster, name)
            assert seen_gpus(log) == assigned(pod), name
        else:
            assert pod.status.reason == "UnexpectedAdmissionError", (name, pod.status)
            assert not pod.status.container_statuses or not any(
                c.state.running or c.state.terminated for c in pod.status.container_statuses), name
    wait_for("a new agent Running", lambda: (p := agent_pod(cluster)) is not None and
             p.metadata.uid != old.metadata.uid, 240, 1)
    wait_for("the plugin advertising again", lambda: advertised(cluster, real_agent) == GPUS * SLOTS, 120, 0.5)
    after = create(cluster, made, job_pod(f"restart-{suffix}-after"))
    check_exact(cluster, [after], real_agent)


def test_a_kubelet_restart_keeps_running_pods_their_gpus_and_serves_new_ones(
        cluster: LocalCluster, real_agent: RealNode, made: list[tuple[str, str]]) -> None:
    suffix = uuid.uuid4().hex[:5]
    before = create(cluster, made, job_pod(f"kubelet-{suffix}-before"))
    check_exact(cluster, [before], real_agent)
    real_agent.restart_kubelet()
    wait_for("the plugin registered again", lambda: advertised(cluster, real_agent) == GPUS * SLOTS, 180, 0.5)
    pod, log = running_with_log(cluster, before)
    assert seen_gpus(log) == assigned(pod) and pod.status.container_statuses[0].restart_count == 0
    after = create(cluster, made, job_pod(f"kubelet-{suffix}-after"))
    check_exact(cluster, [after], real_agent)


def test_a_pod_deepres_did_not_bind_gets_no_gpu_while_deepres_pods_keep_theirs(
        cluster: LocalCluster, real_agent: RealNode, made: list[tuple[str, str]]) -> None:
    """With the admission policies off (here: the cluster-wide resource guard's binding removed for the
    test, as on a cluster installed with admission.validation.enabled=false), a pod of the default
    scheduler requesting the resource with a nodeSelector for the node is refused by the device plugin at
    the kubelet, and the deepres pod beside it keeps running with its GPUs; a deepres pod created after
    it gets its own."""
    from kubernetes import client

    suffix = uuid.uuid4().hex[:5]
    resident = create(cluster, made, job_pod(f"resident-{suffix}"))
    check_exact(cluster, [resident], real_agent)
    admission = client.AdmissionregistrationV1Api(cluster.core.api_client)
    guard = f"{RELEASE}-gpu-resource-guard"
    saved = admission.read_validating_admission_policy_binding(guard)
    admission.delete_validating_admission_policy_binding(guard)
    try:
        foreign = job_pod(f"foreign-{suffix}")
        foreign["metadata"]["annotations"] = {}
        foreign["spec"]["schedulerName"] = "default-scheduler"
        foreign["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: "1"}}
        name = wait_for("the foreign pod admitted by the API server (the guard's binding gone)",
                        lambda: _try_create(cluster, made, foreign, NAMESPACE), 60, 1)
        pod = wait_for("the foreign pod refused at the kubelet", lambda: (p := cluster.core.read_namespaced_pod(
            name, NAMESPACE)).status.phase == "Failed" and p, 120, 0.5)
        assert pod.status.reason == "UnexpectedAdmissionError", pod.status
        assert "deepres did not bind" in pod.status.message or "no pod that deepres bound" in pod.status.message
    finally:
        saved.metadata.resource_version = None
        admission.create_validating_admission_policy_binding(saved)
    pod, log = running_with_log(cluster, resident)
    assert seen_gpus(log) == assigned(pod)
    later = create(cluster, made, job_pod(f"later-{suffix}"))
    check_exact(cluster, [later], real_agent)


def test_a_preempted_pods_gpus_go_to_the_preemptor_on_the_real_node(
        cluster: LocalCluster, real_agent: RealNode, made: list[tuple[str, str]], priority_classes: None) -> None:
    """A low-priority pod holds all 8 GPUs of the node at 70 GiB each (no GPU holds two such jobs); a critical
    pod of a higher PriorityClass asks for one: the extender evicts the victim, and the preemptor runs on the
    real node seeing exactly the GPU it was assigned, one the victim held; the victim never runs again."""
    from kubernetes.client.exceptions import ApiException

    suffix = uuid.uuid4().hex[:5]
    victim = job_pod(f"victim-{suffix}", gpus=GPUS)
    victim["metadata"]["annotations"] = {"deepres.io/gpu-memory": "70Gi", "deepres.io/gpus": str(GPUS),
                                         "deepres.io/criticality": "low"}
    victim["spec"]["priorityClassName"] = LOW
    victim_name = create(cluster, made, victim)
    check_exact(cluster, [victim_name], real_agent)
    held = assigned(cluster.core.read_namespaced_pod(victim_name, JOBS_NAMESPACE))
    assert len(held) == GPUS
    preemptor = job_pod(f"preemptor-{suffix}")
    preemptor["metadata"]["annotations"] = {"deepres.io/gpu-memory": "70Gi", "deepres.io/criticality": "critical"}
    preemptor["spec"]["priorityClassName"] = PEER
    name = create(cluster, made, preemptor)
    pod, log = running_with_log(cluster, name)
    assert pod.spec.node_name == real_agent.name
    assert seen_gpus(log) == assigned(pod) and len(assigned(pod)) == 1 and assigned(pod) <= held, (log, held)

    def victim_gone() -> bool:
        try:
            gone = cluster.core.read_namespaced_pod(victim_name, JOBS_NAMESPACE)
        except ApiException as err:
            return bool(err.status == 404)
        return gone.metadata.deletion_timestamp is not None or gone.status.phase in ("Failed", "Succeeded")
    assert victim_gone(), "the preemptor runs on a GPU the victim held while the victim still runs"


def _try_create(cluster: LocalCluster, made: list[tuple[str, str]], body: dict[str, Any], namespace: str) -> str:
    from kubernetes.client.exceptions import ApiException

    try:
        return create(cluster, made, body, namespace)
    except ApiException as err:
        if err.status == 403:  # the policy's binding removal not seen by the API server yet
            return ""
        raise


# ---- the benchmark: a burst of pods to one node (opt-in: DEEPRES_BENCH_REAL_NODE=1) ----
BURST = 64
REPORT = REPO / "reports" / "real-node-burst.json"


def _burst(cluster: LocalCluster, made: list[tuple[str, str]], bodies: list[dict[str, Any]],
           namespace: str) -> dict[str, float]:
    """Create every pod at once; seconds until all are bound and until all are Running (read off the
    pods' own conditions and container start times, not the test's polling)."""
    import datetime as dt

    created = dt.datetime.now(dt.UTC)
    names = [create(cluster, made, body, namespace) for body in bodies]

    def all_running() -> list[Any] | None:
        pods = [cluster.core.read_namespaced_pod(n, namespace) for n in names]
        for p in pods:
            assert p.status.phase not in ("Failed", "Succeeded"), (p.metadata.name, p.status.reason, p.status.message)
        return pods if all(p.status.phase == "Running" for p in pods) else None
    pods = wait_for(f"{len(names)} pods running", all_running, 900, 1)
    scheduled = [next(c.last_transition_time for c in p.status.conditions if c.type == "PodScheduled") for p in pods]
    started = [p.status.container_statuses[0].state.running.started_at for p in pods]
    seconds = max(started) - created
    # Kubernetes' times have whole seconds: the figures are whole-second exact, pods/s from them
    return {"pods": len(pods), "seconds_to_all_bound": round((max(scheduled) - created).total_seconds(), 1),
            "seconds_to_all_running": round(seconds.total_seconds(), 1),
            "pods_per_s": round(len(pods) / max(seconds.total_seconds(), 1.0), 2)}


def test_bench_a_burst_of_64_pods_to_one_node(cluster: LocalCluster, real_agent: RealNode,
                                              made: list[tuple[str, str]]) -> None:
    """`DEEPRES_BENCH_REAL_NODE=1 pytest tests/cluster/test_real_node_gpus.py -k bench -s` (writes
    reports/real-node-burst.json): 64 plain pods (the default scheduler, no GPU) to the real node, then 64
    one-GPU deepres pods (annotations only), side by side in one run: what the allocation handshake's one
    pod per node at a time costs against the kubelet's own pace. Every GPU pod is checked to see exactly
    its GPUs."""
    import os
    import platform

    if not os.environ.get("DEEPRES_BENCH_REAL_NODE"):
        pytest.skip("a benchmark: set DEEPRES_BENCH_REAL_NODE=1 to run it (writes reports/real-node-burst.json)")
    suffix = uuid.uuid4().hex[:5]
    plain_bodies = []
    for i in range(BURST):
        body = job_pod(f"bench-{suffix}-plain-{i}")
        body["metadata"]["annotations"] = {}
        body["spec"]["schedulerName"] = "default-scheduler"
        plain_bodies.append(body)
    plain = _burst(cluster, made, plain_bodies, NAMESPACE)
    for namespace, name in list(made):
        cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_for("the plain pods gone", lambda: not cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"{MARK}=real-node-gpus").items, 300, 1)
    made.clear()
    gpu = _burst(cluster, made, [job_pod(f"bench-{suffix}-gpu-{i}") for i in range(BURST)], JOBS_NAMESPACE)
    check_exact(cluster, [n for _, n in made], real_agent)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    report = {
        "generated_by": "DEEPRES_BENCH_REAL_NODE=1 pytest tests/cluster/test_real_node_gpus.py -k bench",
        "commit": commit, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "node": {"kubelet": cluster.core.read_node(real_agent.name).status.node_info.kubelet_version,
                 "runtime": cluster.core.read_node(real_agent.name).status.node_info.container_runtime_version,
                 "gpus": REAL_NODE_GPUS, "slots_per_gpu": SLOTS},
        "plain": plain, "gpu": gpu,
        "gpu_vs_plain_pods_per_s": round(gpu["pods_per_s"] / plain["pods_per_s"], 2),
    }
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
