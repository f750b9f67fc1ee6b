"""The kind cluster the end-to-end suite runs against, and small user-level helpers.

Why: the scenarios must be checked the way an admin and a data scientist meet deepres: a real
API server, the upstream kube-scheduler, the chart installed with Helm, pods created and watched
through the Kubernetes API. The suite runs only when asked (`make e2e`, i.e. `pytest -m e2e`) and
only where docker and kind exist; `make test` skips it in a few milliseconds.

Environment: DEEPRES_E2E_KEEP=1 keeps the cluster afterwards (reused on the next run);
DEEPRES_E2E_SKIP_BUILD=1 reuses images already loaded into kind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.scenarios import (  # noqa: F401  (clean, priority_classes: the scenarios' fixtures, used here)
    JOBS_NAMESPACE,
    NAMESPACE,
    RELEASE,
    REPO,
    WORKLOAD_IMAGE,
    PodReads,
    clean,
    priority_classes,
)

CLUSTER = "deepres-e2e"
CONTEXT = f"kind-{CLUSTER}"
VALUES = Path(__file__).with_name("values-kind.yaml")
IMAGES = {"extender": "deepres/extender:e2e", "agent": "deepres/agent:e2e"}


def skip_reason(config: pytest.Config) -> str | None:
    """Why the suite cannot run here (None: it can). Cheap checks first: `make test` pays nothing."""
    if "e2e" not in (config.getoption("markexpr") or "") and os.environ.get("DEEPRES_E2E") != "1":
        return "end-to-end suite: run it with `make e2e` (pytest -m e2e tests/e2e)"
    missing = [tool for tool in ("docker", "kind", "helm", "kubectl") if shutil.which(tool) is None]
    if missing:
        return f"end-to-end suite needs {', '.join(missing)} on PATH (make tools installs helm and kubectl)"
    try:
        subprocess.run(["docker", "info"], capture_output=True, check=True, timeout=20)
    except (subprocess.SubprocessError, OSError):
        return "end-to-end suite needs a running Docker daemon (`docker info` failed)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e_items = [item for item in items if item.path.is_relative_to(Path(__file__).parent)]
    if not e2e_items:
        return
    reason = skip_reason(config)
    if reason:
        for item in e2e_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def run(*cmd: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command from the repository root; its output goes into the failure message."""
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def kubectl(*args: str, check: bool = True, timeout: float = 120) -> str:
    return run("kubectl", "--context", CONTEXT, *args, check=check, timeout=timeout).stdout


@dataclass
class Cluster(PodReads):
    """Handles on the running cluster: the core API and the helpers the scenarios share."""

    core: Any  # kubernetes.client.CoreV1Api
    scheduling: Any  # kubernetes.client.SchedulingV1Api
    simulated_gpus: dict[str, str]  # node -> simulated GPU spec (from values-kind.yaml)

    def extender_metrics(self) -> str:
        """The extender's /metrics through the API server's service proxy (no port-forward needed)."""
        text: str = self.core.connect_get_namespaced_service_proxy_with_path(
            f"{RELEASE}-extender:8888", NAMESPACE, "metrics")
        return text

    def agent_metrics(self, node: str) -> str:
        pods = self.core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=agent", field_selector=f"spec.nodeName={node}")
        (agent,) = pods.items
        text: str = self.core.connect_get_namespaced_pod_proxy_with_path(
            f"{agent.metadata.name}:9400", NAMESPACE, "metrics")
        return text


def load_simulated_gpus() -> dict[str, str]:
    import yaml

    values = yaml.safe_load(VALUES.read_text())
    nodes: dict[str, str] = values["agent"]["simulated"]["nodes"]
    return nodes


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """kind cluster + images + chart, created once per session (and deleted unless DEEPRES_E2E_KEEP=1)."""
    existing = run("kind", "get", "clusters", check=False).stdout.split()
    created = CLUSTER not in existing
    if created:
        run("kind", "create", "cluster", "--name", CLUSTER, "--config", "deploy/kind-config.yaml", "--wait", "180s",
            timeout=900)
    try:
        if os.environ.get("DEEPRES_E2E_SKIP_BUILD") != "1":
            for component, tag in IMAGES.items():
                run("docker", "build", "-f", f"deploy/Dockerfile.{component}", "-t", tag, ".", timeout=1800)
            run("docker", "pull", WORKLOAD_IMAGE, timeout=300)
            for tag in (*IMAGES.values(), WORKLOAD_IMAGE):
                run("kind", "load", "docker-image", tag, "--name", CLUSTER, timeout=600)
        run("helm", "--kube-context", CONTEXT, "upgrade", "--install", RELEASE, "helm/deepres",
            "--namespace", NAMESPACE, "--create-namespace", "-f", str(VALUES), "--wait", "--timeout", "10m",
            timeout=900)
        kubectl("create", "namespace", JOBS_NAMESPACE, check=False)

        from kubernetes import client, config

        config.load_kube_config(context=CONTEXT)  # type: ignore[no-untyped-call]
        yield Cluster(client.CoreV1Api(), client.SchedulingV1Api(), load_simulated_gpus())
    finally:
        if created and os.environ.get("DEEPRES_E2E_KEEP") != "1":
            run("kind", "delete", "cluster", "--name", CLUSTER, check=False, timeout=300)
