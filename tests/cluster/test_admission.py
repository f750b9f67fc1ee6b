"""The chart's admission policies in the real kube-apiserver (the local control plane, chart installed).

Why: a pod that names its own GPUs, writes its own assignment, or skips the scheduler would use GPUs
deepres gave to others; only the API server can refuse it before it exists. Each check runs twice:
in a governed namespace (the jobs namespace), where the chart's ValidatingAdmissionPolicy refuses it
(or its MutatingAdmissionPolicy adds the wiring), and the same request in the release namespace, which
the policies' bindings leave out, where the API server admits it unchanged: so each refusal is the
chart's policy, not the API server's own validation. Pod creations are dry runs (admission runs, nothing
is stored), except the pods a Binding or a patch needs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.localchart import CPU_NODE
from extender.agent.deviceplugin.plugin import KubeNodePods
from tests.cluster.conftest import LocalCluster
from tests.e2e.scenarios import JOBS_NAMESPACE, NAMESPACE, RELEASE

GOVERNED, UNGOVERNED = JOBS_NAMESPACE, NAMESPACE
EXTENDER_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-scheduler"  # sidecar mode: the scheduler pod's
ASSIGNED = "deepres.io/assigned-gpus"
WIRING = "metadata.annotations['deepres.io/assigned-gpus']"


def pod(name: str, *, annotations: dict[str, str] | None = None, env: list[dict[str, Any]] | None = None,
        node: str = "", scheduler: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "train", "image": "busybox:1.36", "env": env or []}],
                            "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": spec}


def refusal(call: Any) -> str:
    """The API server's message when `call()` is refused; fails when it is admitted."""
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as err:
        assert err.status in (400, 403, 422), f"refused with {err.status}: {err.body}"
        return str(err.body)
    pytest.fail("admitted, expected a refusal")


def create(cluster: LocalCluster, namespace: str, body: dict[str, Any], dry_run: bool = True) -> Any:
    return cluster.core.create_namespaced_pod(namespace, body, dry_run="All" if dry_run else None)


@pytest.fixture
def as_extender(cluster: LocalCluster) -> Iterator[Any]:
    """A CoreV1Api acting as the extender's ServiceAccount (the admin impersonates it)."""
    from kubernetes import client, config

    api = config.new_client_from_config(str(cluster.plane.admin_kubeconfig))  # type: ignore[no-untyped-call]
    api.set_default_header("Impersonate-User", EXTENDER_USER)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    yield client.CoreV1Api(api)
    api.close()


@pytest.fixture
def pending(cluster: LocalCluster) -> Iterator[list[tuple[str, str]]]:
    """Pods the test stores (namespace, name), deleted afterwards."""
    made: list[tuple[str, str]] = []
    yield made
    for namespace, name in made:
        cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def stored(cluster: LocalCluster, pending: list[tuple[str, str]], namespace: str, prefix: str) -> str:
    """A pod no scheduler takes (it stays Pending): a target for patches and Bindings."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    create(cluster, namespace, pod(name, scheduler="nobody"), dry_run=False)
    pending.append((namespace, name))
    return name


def binding(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": CPU_NODE}}


def test_a_container_that_names_its_own_gpus_is_refused(cluster: LocalCluster) -> None:
    for variable in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"):
        body = pod("all-gpus", env=[{"name": variable, "value": "all"}])
        assert "a container may not choose its GPUs" in refusal(lambda b=body: create(cluster, GOVERNED, b))
        create(cluster, UNGOVERNED, body)  # without the policy: admitted
    # the one form allowed: the downward-API wiring to what the extender wrote
    create(cluster, GOVERNED, pod("wired", env=[{"name": "NVIDIA_VISIBLE_DEVICES",
                                                 "valueFrom": {"fieldRef": {"fieldPath": WIRING}}}]))


def test_only_the_extender_writes_the_assignment(cluster: LocalCluster, as_extender: Any,
                                                  pending: list[tuple[str, str]]) -> None:
    patch = {"metadata": {"annotations": {ASSIGNED: "GPU-someone-elses"}}}
    # a user (here the cluster admin) patches the assignment of a pod: refused
    target = stored(cluster, pending, GOVERNED, "patched")
    message = refusal(lambda: cluster.core.patch_namespaced_pod(target, GOVERNED, patch))
    assert "only the deepres extender" in message
    # ... or creates a pod carrying one, or binds with one: refused
    assert "only the deepres extender" in refusal(lambda: create(cluster, GOVERNED, pod(
        "self-assigned", annotations={ASSIGNED: "GPU-x"}, scheduler="nobody")))
    assert "only the deepres extender" in refusal(lambda: cluster.core.create_namespaced_pod_binding(
        target, GOVERNED, binding(target, {ASSIGNED: "GPU-x"}), _preload_content=False))
    # the extender's bind writes it (a Binding with the annotations, as extender/kube/cluster.py does)
    as_extender.create_namespaced_pod_binding(target, GOVERNED, binding(target, {
        ASSIGNED: "GPU-bound-by-deepres", "deepres.io/assigned-node": CPU_NODE}), _preload_content=False)
    bound = cluster.core.read_namespaced_pod(target, GOVERNED)
    assert bound.metadata.annotations[ASSIGNED] == "GPU-bound-by-deepres" and bound.spec.node_name == CPU_NODE
    # the device plugin's lookup (the pods of its node, by field selector) finds it with its GPUs
    on_node = {p["metadata"]["uid"]: p for p in KubeNodePods(cluster.core, CPU_NODE).pods()}
    assert on_node[bound.metadata.uid]["metadata"]["annotations"][ASSIGNED] == "GPU-bound-by-deepres"
    # and no user may remove it afterwards
    assert "only the deepres extender" in refusal(lambda: cluster.core.patch_namespaced_pod(
        target, GOVERNED, {"metadata": {"annotations": {ASSIGNED: None}}}))
    # without the policy the same patch is admitted
    elsewhere = stored(cluster, pending, UNGOVERNED, "patched")
    cluster.core.patch_namespaced_pod(elsewhere, UNGOVERNED, patch)


def test_only_the_extender_writes_the_bind_time(cluster: LocalCluster, as_extender: Any,
                                                pending: list[tuple[str, str]]) -> None:
    """`deepres.io/bound-at` decides, after a restart, how much progress preemption protects and which pod
    keeps a GPU two pods name (the earlier bind): a user may not set, change or remove it."""
    bound_at = "deepres.io/bound-at"
    backdated = {"metadata": {"annotations": {bound_at: "2020-01-01T00:00:00Z"}}}
    target = stored(cluster, pending, GOVERNED, "backdated")
    assert "only the deepres extender" in refusal(lambda: cluster.core.patch_namespaced_pod(target, GOVERNED,
                                                                                             backdated))
    assert "only the deepres extender" in refusal(lambda: create(cluster, GOVERNED, pod(
        "born-bound", annotations={bound_at: "2020-01-01T00:00:00Z"}, scheduler="nobody")))
    assert "only the deepres extender" in refusal(lambda: cluster.core.create_namespaced_pod_binding(
        target, GOVERNED, binding(target, {bound_at: "2020-01-01T00:00:00Z"}), _preload_content=False))
    # the extender's bind writes it; nobody else may move it afterwards, nor remove it
    as_extender.create_namespaced_pod_binding(target, GOVERNED, binding(target, {
        ASSIGNED: "GPU-bound-at-test", bound_at: "2026-11-28T12:00:00Z"}), _preload_content=False)
    assert cluster.core.read_namespaced_pod(target, GOVERNED).metadata.annotations[bound_at] == "2026-11-28T12:00:00Z"
    for change in ("2020-01-01T00:00:00Z", None):
        assert "only the deepres extender" in refusal(lambda c=change: cluster.core.patch_namespaced_pod(
            target, GOVERNED, {"metadata": {"annotations": {bound_at: c}}}))
    # without the policy the same patch is admitted
    elsewhere = stored(cluster, pending, UNGOVERNED, "backdated")
    cluster.core.patch_namespaced_pod(elsewhere, UNGOVERNED, backdated)


def test_an_annotated_pod_is_admitted_with_its_wiring_added(cluster: LocalCluster) -> None:
    body = pod("annotations-only", annotations={"deepres.io/model-type": "cnn", "deepres.io/batch-size": "32"})
    admitted = create(cluster, GOVERNED, body)
    assert admitted.spec.scheduler_name == "deepres-scheduler"
    (container,) = admitted.spec.containers
    assert container.resources.limits == {"deepres.io/gpu": "1"}
    assert container.resources.requests == {"deepres.io/gpu": "1"}
    # a container that asked for its own count keeps it
    two = pod("asks-two", annotations={"deepres.io/gpu-memory": "8Gi"})
    two["spec"]["containers"][0]["resources"] = {"limits": {"deepres.io/gpu": "2"}}
    assert create(cluster, GOVERNED, two).spec.containers[0].resources.limits == {"deepres.io/gpu": "2"}
    # a pod without deepres job annotations is left alone
    assert create(cluster, GOVERNED, pod("plain")).spec.scheduler_name == "default-scheduler"
    # without the policy the annotated pod is stored as written
    untouched = create(cluster, UNGOVERNED, body)
    assert untouched.spec.scheduler_name == "default-scheduler"
    assert not (untouched.spec.containers[0].resources.limits or {})


def test_a_gpu_pod_created_on_a_node_is_refused(cluster: LocalCluster) -> None:
    body = pod("placed", annotations={"deepres.io/model-type": "cnn"}, node=CPU_NODE)
    assert "spec.nodeName" in refusal(lambda: create(cluster, GOVERNED, body))
    create(cluster, UNGOVERNED, body)  # annotations only, without the policy: admitted
    create(cluster, GOVERNED, pod("cpu-pod-on-a-node", node=CPU_NODE))  # not a GPU pod: admitted


def with_request(body: dict[str, Any], *, init_only: bool = False) -> dict[str, Any]:
    """The pod asking for the deepres resource: on its container, or only on an init container."""
    limits = {"limits": {"deepres.io/gpu": "1"}}
    if init_only:
        body["spec"]["initContainers"] = [{"name": "prepare", "image": "busybox:1.36", "resources": limits}]
    else:
        body["spec"]["containers"][0]["resources"] = limits
    return body


@pytest.mark.parametrize("init_only", [False, True])
def test_a_pod_requesting_the_gpu_resource_is_deepres_scheduled_in_every_namespace(cluster: LocalCluster,
                                                                                   init_only: bool) -> None:
    """The resource on a pod the default scheduler places (with a nodeSelector), or one created on a node
    (the request on its init container only): refused in every namespace, the ungoverned one included
    (the device plugin serves only the pods deepres binds); the same pods without the request are admitted."""
    for namespace in (GOVERNED, UNGOVERNED):
        elsewhere = with_request(pod("default-scheduled", scheduler="default-scheduler"), init_only=init_only)
        elsewhere["spec"]["nodeSelector"] = {"kubernetes.io/hostname": CPU_NODE}
        on_node = with_request(pod("on-a-node", node=CPU_NODE, scheduler="deepres-scheduler"), init_only=init_only)
        for body in (elsewhere, on_node):
            message = refusal(lambda b=body, n=namespace: create(cluster, n, b))
            # the resource guard; in the governed namespace the gpu-guard may answer first for a pod on a node
            assert "must be scheduled by deepres-scheduler" in message or (
                namespace == GOVERNED and body is on_node and "may not be created with spec.nodeName" in message), \
                message
        create(cluster, namespace, pod("default-scheduled-plain", scheduler="default-scheduler"))
        create(cluster, namespace, pod("on-a-node-plain", node=CPU_NODE))
    create(cluster, UNGOVERNED, with_request(pod("deepres-scheduled", scheduler="deepres-scheduler"),
                                             init_only=init_only))


def test_the_assignment_cannot_be_written_through_the_status(cluster: LocalCluster,
                                                            pending: list[tuple[str, str]]) -> None:
    patch = {"metadata": {"annotations": {ASSIGNED: "GPU-someone-elses"}}}
    target = stored(cluster, pending, GOVERNED, "status-patched")
    assert "only the deepres extender" in refusal(lambda: cluster.core.patch_namespaced_pod_status(
        target, GOVERNED, patch))
    assert ASSIGNED not in (cluster.core.read_namespaced_pod(target, GOVERNED).metadata.annotations or {})
    elsewhere = stored(cluster, pending, UNGOVERNED, "status-patched")
    cluster.core.patch_namespaced_pod_status(elsewhere, UNGOVERNED, patch)  # without the policy: admitted


def test_a_privileged_ephemeral_container_on_a_gpu_pod_is_refused(cluster: LocalCluster,
                                                                  pending: list[tuple[str, str]]) -> None:
    debug = {"spec": {"ephemeralContainers": [{"name": "debug", "image": "busybox:1.36",
                                               "securityContext": {"privileged": True}}]}}
    names = {}
    for namespace in (GOVERNED, UNGOVERNED):
        name = f"gpu-debugged-{uuid.uuid4().hex[:6]}"
        create(cluster, namespace, pod(name, annotations={"deepres.io/gpu-memory": "8Gi"}, scheduler="nobody"),
               dry_run=False)
        pending.append((namespace, name))
        names[namespace] = name
    assert "privileged ephemeral container" in refusal(lambda: cluster.core.patch_namespaced_pod_ephemeralcontainers(
        names[GOVERNED], GOVERNED, debug))
    cluster.core.patch_namespaced_pod_ephemeralcontainers(names[UNGOVERNED], UNGOVERNED, debug)


AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-agent"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def as_agent_on(cluster: LocalCluster, node: str | None) -> Any:
    """A CoreV1Api acting as the agent's ServiceAccount with a token bound to a pod on `node` (the admin
    impersonates the user and the node claim the API server's token authenticator adds)."""
    from kubernetes import client, config

    api = config.new_client_from_config(str(cluster.plane.admin_kubeconfig))  # type: ignore[no-untyped-call]
    api.set_default_header("Impersonate-User", AGENT_USER)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    if node is not None:
        api.set_default_header("Impersonate-Extra-" + NODE_CLAIM.replace("/", "%2F"), node)
    return client.CoreV1Api(api)


def test_the_agent_changes_only_deepres_annotations_of_its_own_node(cluster: LocalCluster) -> None:
    own, other = f"agent-own-{uuid.uuid4().hex[:6]}", f"agent-other-{uuid.uuid4().hex[:6]}"
    for name in (own, other):
        cluster.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {"deepres.io/test": "agent-node"}}})
    try:
        agent = as_agent_on(cluster, own)
        publish = {"metadata": {"annotations": {"deepres.io/gpu-free-at": "1"}}}
        agent.patch_node(own, publish)  # what it publishes, on its own Node: admitted
        assert cluster.core.read_node(own).metadata.annotations["deepres.io/gpu-free-at"] == "1"
        assert "only the Node its pod runs on" in refusal(lambda: agent.patch_node(other, publish))
        for change in ({"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}},
                       {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}},
                       {"metadata": {"annotations": {"other.io/x": "1"}}}):
            assert "only the deepres.io/ annotations" in refusal(lambda c=change: agent.patch_node(own, c))
        no_claim = as_agent_on(cluster, None)  # a token not bound to a pod on a node
        assert "only the Node its pod runs on" in refusal(lambda: no_claim.patch_node(own, publish))
        cluster.core.patch_node(other, {"metadata": {"labels": {"admin": "may"}}})  # the admin is not the agent
    finally:
        for name in (own, other):
            cluster.core.delete_node(name)


def test_a_privileged_gpu_container_is_refused(cluster: LocalCluster) -> None:
    body = pod("privileged", annotations={"deepres.io/model-type": "cnn"})
    body["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert "privileged" in refusal(lambda: create(cluster, GOVERNED, body))
    create(cluster, UNGOVERNED, body)
