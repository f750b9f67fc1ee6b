"""The chart's mutating webhook in the real kube-apiserver: annotations only, without the MutatingAdmissionPolicy.

Why: on Kubernetes 1.34/1.35 (most managed clusters today) the API server has no MutatingAdmissionPolicy
unless a feature gate is on, and an annotated pod would reach the default scheduler with no GPU request.
The chart then installs a MutatingWebhookConfiguration calling the extender's /v1/mutate on its own TLS
listener. Here the API server (1.36, which serves the policy: the chart's install uses it in the governed
namespaces) gets the chart's own rendered webhook configuration, pointed at a real `deepres serve` with a
webhook listener, and governing only the release namespace, which the policy leaves out: so each change
seen below is the webhook's, made by the API server's own call over TLS, with the chart's matchConditions
and rules. The policy's path is test_admission.py's; the two must agree on the same pods.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.localcluster import free_port
from tests.cluster.conftest import LocalCluster, helm
from tests.cluster.test_admission import create, pod
from tests.e2e.scenarios import NAMESPACE, RELEASE, REPO, wait_for
from tests.fixtures.kube.certs import serving_certificate
from tests.fixtures.kube.server import running_server

UNGOVERNED = NAMESPACE  # the policy's binding leaves the release namespace out: only the webhook acts there
JOB = {"deepres.io/model-type": "cnn", "deepres.io/batch-size": "32"}


def chart_webhook(values: dict[str, Any]) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration as `helm template` renders it for Kubernetes 1.35."""
    out = subprocess.run([helm(), "template", RELEASE, str(REPO / "helm" / "deepres"), "--namespace", NAMESPACE,
                          "--kube-version", "1.35.0", "--set-json", f"admission={json.dumps(values)}"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    (hook,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "MutatingWebhookConfiguration"]
    return dict(hook)


@contextmanager
def chart_webhook_in_the_api_server(cluster: LocalCluster, folder: Path, env: dict[str, str] | None = None,
                                    probe: dict[str, Any] | None = None) -> Iterator[str]:
    """The chart's webhook configuration in the API server, calling a running extender's webhook listener."""
    from kubernetes import client

    cert, key, ca = serving_certificate(folder)
    port = free_port()
    env = {"DEEPRES_WEBHOOK_BIND": f"127.0.0.1:{port}", "DEEPRES_WEBHOOK_TLS_CERT": str(cert),
           "DEEPRES_WEBHOOK_TLS_KEY": str(key), **(env or {})}
    with running_server(folder, env=env):
        config = chart_webhook({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": UNGOVERNED}}})
        name = f"{config['metadata']['name']}-{uuid.uuid4().hex[:6]}"
        config["metadata"] = {"name": name}
        (hook,) = config["webhooks"]
        # the Service the chart names is the extender pod's; here the same listener on loopback
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/v1/mutate",
                                "caBundle": base64.b64encode(ca).decode()}
        api = client.AdmissionregistrationV1Api(cluster.core.api_client)
        api.create_mutating_webhook_configuration(config)
        try:
            # the API server reads new webhook configurations from its informer: wait until it calls ours
            body = probe or pod("probe", annotations=JOB)
            wait_for("the API server to call the webhook",
                     lambda: create(cluster, UNGOVERNED, body).spec.scheduler_name == "deepres-scheduler", 60)
            yield name
        finally:
            api.delete_mutating_webhook_configuration(name)


@pytest.fixture
def webhook(cluster: LocalCluster, tmp_path: Path) -> Iterator[str]:
    with chart_webhook_in_the_api_server(cluster, tmp_path) as name:
        yield name


def test_an_annotated_pod_is_admitted_with_its_wiring_added_by_the_webhook(cluster: LocalCluster,
                                                                            webhook: str) -> None:
    admitted = create(cluster, UNGOVERNED, pod("annotations-only", annotations=JOB))
    assert admitted.spec.scheduler_name == "deepres-scheduler"
    (container,) = admitted.spec.containers
    assert container.resources.limits == {"deepres.io/gpu": "1"}
    assert container.resources.requests == {"deepres.io/gpu": "1"}
    # a container that asked for its own count keeps it; others of the pod get one each
    two = pod("asks-two", annotations={"deepres.io/gpu-memory": "8Gi"})
    two["spec"]["containers"][0]["resources"] = {"limits": {"deepres.io/gpu": "2", "cpu": "1"}}
    two["spec"]["containers"].append({"name": "sidecar", "image": "busybox:1.36",
                                      "resources": {"requests": {"memory": "64Mi"}}})
    first, second = create(cluster, UNGOVERNED, two).spec.containers
    assert first.resources.limits == {"deepres.io/gpu": "2", "cpu": "1"}
    assert second.resources.limits == {"deepres.io/gpu": "1"}
    assert second.resources.requests == {"deepres.io/gpu": "1", "memory": "64Mi"}
    # init containers are left alone, as the policy leaves them
    with_init = pod("with-init", annotations=JOB)
    with_init["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox:1.36"}]
    assert not (create(cluster, UNGOVERNED, with_init).spec.init_containers[0].resources.limits or {})
    # a pod without deepres job annotations never reaches the webhook (matchConditions) and is left alone
    plain = create(cluster, UNGOVERNED, pod("plain", annotations={"team": "vision"}))
    assert plain.spec.scheduler_name == "default-scheduler"
    assert not (plain.spec.containers[0].resources.limits or {})


def test_without_the_device_plugin_the_webhook_adds_the_env_wiring(cluster: LocalCluster, tmp_path: Path) -> None:
    """`devicePlugin.enabled: false`: the chart sets kube.mutation_wiring=env on the extender."""
    body = pod("env-wired", annotations=JOB, env=[{"name": "EPOCHS", "value": "3"}])
    with chart_webhook_in_the_api_server(cluster, tmp_path, {"DEEPRES_MUTATION_WIRING": "env"}, probe=body):
        (container,) = create(cluster, UNGOVERNED, body).spec.containers
        assert [e.name for e in container.env] == ["EPOCHS", "NVIDIA_VISIBLE_DEVICES"]
        assert container.env[1].value_from.field_ref.field_path == "metadata.annotations['deepres.io/assigned-gpus']"
        assert not (container.resources.limits or {})
