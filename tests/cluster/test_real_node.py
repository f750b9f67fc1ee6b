"""Smoke tests of the real node (devtools/realnode.py) joined to the cluster suite's control plane.

Why: the device plugin and admission tests run pods on this node through the real kubelet and
containerd; these check the node itself first: it registers and turns Ready, a pod's container runs
from a locally built image (no registry) and its log is read through the API server (API server ->
kubelet with the kubelet's serving certificate and webhook authorization), a hostNetwork pod sees
the host's network and loopback, and a kubelet restart keeps the node Ready and its pods as they were.
Every wait is on the state asserted. Skipped with a one-line reason where the machine cannot run
containers (not root, no containerd/runc/CNI plugins: scripts/install-node.sh).
"""

from __future__ import annotations

import ipaddress
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.realnode import KUBERNETES_SERVICE_IP, POD_CIDR, REAL_NODE_LABEL, RealNode, pod_on_node
from tests.cluster.conftest import LocalCluster
from tests.e2e.scenarios import wait_for

NAMESPACE = "default"


@pytest.fixture
def pods(cluster: LocalCluster, real_node: RealNode) -> Iterator[list[str]]:
    """Names of the pods a test made; deleted (and waited gone) afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        cluster.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    wait_for("the test's pods to be gone", lambda: not {
        p.metadata.name for p in cluster.core.list_namespaced_pod(NAMESPACE).items} & set(made), 60, 0.5)


def _create(cluster: LocalCluster, pods: list[str], prefix: str, command: list[str], **kwargs: Any) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespaced_pod(NAMESPACE, pod_on_node(name, command, **kwargs))
    pods.append(name)
    return name


def _phase(cluster: LocalCluster, name: str, want: str) -> Any:
    """The pod once its phase is `want`; fails at once if it ended otherwise."""
    def check() -> Any:
        pod = cluster.core.read_namespaced_pod(name, NAMESPACE)
        ended = {"Succeeded", "Failed"} - {want}
        assert pod.status.phase not in ended, f"pod {name} is {pod.status.phase}: {pod.status}"
        return pod if pod.status.phase == want else None

    return wait_for(f"pod {name} {want}", check, 120, 0.5)


def test_the_node_is_ready_and_real(cluster: LocalCluster, real_node: RealNode) -> None:
    node = cluster.core.read_node(real_node.name)
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True", ready
    assert node.metadata.labels[REAL_NODE_LABEL] == "true"
    assert [(t.key, t.effect) for t in node.spec.taints or []] == [(REAL_NODE_LABEL, "NoSchedule")]
    info = node.status.node_info
    assert info.container_runtime_version.startswith("containerd://"), info
    assert info.kubelet_version == "v1.36.3", info
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {}), "kwok must not manage the real node"
    # where a device plugin DaemonSet's hostPath points: the kubelet's Registration and PodResources sockets
    assert real_node.kubelet_socket.is_socket()
    assert real_node.pod_resources_socket.is_socket()


def test_a_pod_runs_to_completion_and_its_log_is_read_through_the_api_server(
        cluster: LocalCluster, real_node: RealNode, pods: list[str]) -> None:
    name = _create(cluster, pods, "echo", ["sh", "-c", "echo hello from $(hostname) uid $(id -u)"])
    pod = _phase(cluster, name, "Succeeded")
    assert pod.spec.node_name == real_node.name
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(POD_CIDR), pod.status.pod_ip
    (container,) = pod.status.container_statuses
    assert container.state.terminated.exit_code == 0
    assert container.container_id.startswith("containerd://")
    log = cluster.core.read_namespaced_pod_log(name, NAMESPACE)
    assert log == f"hello from {name} uid 0\n"


def test_a_host_network_pod_sees_the_hosts_network_and_loopback(
        cluster: LocalCluster, real_node: RealNode, pods: list[str]) -> None:
    """What a node agent DaemonSet needs: the node's address, the host's loopback (the kubelet's
    healthz there stands for an extender on 127.0.0.1), and the API server at the `kubernetes`
    Service address in-cluster clients use."""
    # busybox's TLS cannot talk to the API server's: plain HTTP to its TLS port, which Go's TLS server answers
    script = (f"ip -o -4 addr; wget -q -O - http://127.0.0.1:{real_node.healthz_port}/healthz; echo; "
              f"printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {KUBERNETES_SERVICE_IP} 443; echo; "
              "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT")
    name = _create(cluster, pods, "hostnet", ["sh", "-c", script], host_network=True)
    pod = _phase(cluster, name, "Succeeded")
    assert pod.status.pod_ip == real_node.node_ip
    log = cluster.core.read_namespaced_pod_log(name, NAMESPACE)
    lines = log.splitlines()
    assert any(f"inet {real_node.node_ip}/" in line for line in lines), log
    assert "ok" in lines, f"the kubelet's healthz on the host's loopback not reached:\n{log}"
    if not real_node.dnat:
        pytest.skip("no iptables here: the kubernetes Service address leads nowhere (api_env() instead)")
    assert "Client sent an HTTP request to an HTTPS server." in log, log
    assert lines[-1] == f"{KUBERNETES_SERVICE_IP}:443", log
    # and from the host's network namespace (the same OUTPUT rule): TLS to the Service address is the API
    # server's, checked against the cluster's CA (its certificate names 10.96.0.1)
    context = ssl.create_default_context(cafile=str(cluster.plane.pki / "ca.crt"))
    with urllib.request.urlopen(f"https://{KUBERNETES_SERVICE_IP}/readyz", context=context, timeout=10) as resp:
        assert resp.read() == b"ok"


def test_a_kubelet_restart_keeps_the_node_ready_and_its_pods(
        cluster: LocalCluster, real_node: RealNode, pods: list[str]) -> None:
    sleeper = _create(cluster, pods, "sleeper", ["sleep", "3600"])
    done = _create(cluster, pods, "done", ["true"])
    before = _phase(cluster, sleeper, "Running").status.container_statuses[0]
    assert before.ready and before.restart_count == 0
    _phase(cluster, done, "Succeeded")

    real_node.restart_kubelet()  # returns once the new kubelet has posted the node Ready

    def same_container() -> bool:
        pod = cluster.core.read_namespaced_pod(sleeper, NAMESPACE)
        (status,) = pod.status.container_statuses
        assert pod.status.phase == "Running", pod.status
        assert status.container_id == before.container_id and status.restart_count == 0, status
        return bool(status.ready)

    wait_for(f"pod {sleeper} Running and ready in the same container", same_container, 60, 0.5)
    assert cluster.core.read_namespaced_pod(done, NAMESPACE).status.phase == "Succeeded"
    wait_for("the kubelet's Registration socket made again", real_node.kubelet_socket.is_socket, 60, 0.5)
    # and the new kubelet runs new pods
    after = _create(cluster, pods, "after", ["true"])
    _phase(cluster, after, "Succeeded")
