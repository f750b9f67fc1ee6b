"""deepres on a real (kind) cluster, scenario by scenario, as a user would check it.

The cluster (deploy/kind-config.yaml: 1 control plane, 3 workers) runs the chart with simulated GPUs
(tests/e2e/values-kind.yaml): worker 1xT4-16GB, worker2 1xA100-40GB, worker3 2xA100-80GB. The
scenarios are shared with the local control-plane suite (tests/e2e/scenarios.py, tests/cluster);
this file adds what only kind has: containers (the GPU env var inside one), pods the kubelet
restarts, and `helm uninstall`. Scenarios run in file order; the last one uninstalls the chart.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

import pytest
import yaml

from tests.e2e import scenarios as s
from tests.e2e.conftest import CONTEXT, Cluster, kubectl, run
from tests.e2e.scenarios import JOBS_NAMESPACE, NAMESPACE, RELEASE

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("docker") is None or shutil.which("kind") is None,
                       reason="end-to-end suite needs docker and kind on PATH"),
]


def container_env(name: str) -> str:
    return kubectl("-n", JOBS_NAMESPACE, "exec", name, "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES").strip()


def test_1_annotated_pods_land_where_their_predicted_memory_fits(clean: Cluster) -> None:
    s.annotated_pods_land_where_their_predicted_memory_fits(clean, container_env)


from tests.e2e.shared_scenarios import *  # noqa: E402,F403  (scenarios 2-4, here in file order)


def test_5_killing_the_extender_loses_no_reservation_and_double_books_nothing(clean: Cluster) -> None:
    cluster = clean

    def restart(while_down: Callable[[], None]) -> None:
        extender_pods = cluster.core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component in (extender,scheduler)").items
        for pod in extender_pods:
            cluster.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        while_down()
        kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{RELEASE}-scheduler", "--timeout=300s",
                timeout=320)

    during = s.extender_restart_loses_no_reservation_and_double_books_nothing(cluster, restart)
    deadline = time.monotonic() + s.TTL_S + 30
    placed = [n for n in during if s.node_of(cluster, n)]
    while len(placed) < len(during) - 1 and time.monotonic() < deadline:
        time.sleep(1)
        placed = [n for n in during if s.node_of(cluster, n)]
    assert len(placed) >= len(during) - 1, f"pods submitted during the restart still pending: {during}"


def test_6_agent_restart_resumes_telemetry_without_long_staleness(clean: Cluster) -> None:
    cluster = clean

    def restart_agents() -> None:
        agents = cluster.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=agent").items
        for pod in agents:
            cluster.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)

    s.agent_restart_resumes_telemetry_without_long_staleness(cluster, restart_agents)
    kubectl("-n", NAMESPACE, "rollout", "status", f"daemonset/{RELEASE}-agent", "--timeout=120s")


def test_7_helm_uninstall_removes_everything_the_chart_created(cluster: Cluster) -> None:
    s.delete_workloads(cluster)
    manifest = run("helm", "--kube-context", CONTEXT, "get", "manifest", RELEASE,
                   "--namespace", NAMESPACE).stdout
    objects = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
               for o in yaml.safe_load_all(manifest) if o]
    assert len(objects) > 10, f"the release manifest lists only {objects}"
    run("helm", "--kube-context", CONTEXT, "uninstall", RELEASE, "--namespace", NAMESPACE,
        "--wait", "--timeout", "5m", timeout=360)
    left = []
    for kind, namespace, name in objects:
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
        if namespace:
            args += ["-n", namespace]
        if kubectl(*args).strip():
            left.append(f"{kind}/{namespace or '-'}/{name}")
    assert not left, f"helm uninstall left behind: {left}"
    leftover_pods = kubectl("-n", NAMESPACE, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name")
    assert not leftover_pods.strip(), f"pods still there: {leftover_pods}"
