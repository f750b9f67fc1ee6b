"""The workload examples a user copies (deploy/examples/job-with-retries.yaml, sweep-indexed.yaml) run
through the local control plane: the real Job controller (kube-controller-manager) makes their pods,
the chart's admission policy wires them to deepres, and the real kube-scheduler places them through
the extender.

Why: the examples are what users copy; a Job's pod template goes through admission and scheduling as
the controller's pods, not as the bare Pods the other scenarios create, and docs/device-plugin.md says
a Job makes a new pod after one fails. As in tests/e2e/scenarios.py, the container is swapped for a
sleep that kwok ends after `deepres-test.io/complete-after`, and the job's true GPU memory use comes
from `simulated.deepres.io/usage-mib` (what the simulated agents report), never from the predictor.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devtools.localchart import DEVICE_RESOURCE
from tests.cluster.conftest import LocalCluster
from tests.e2e import scenarios as s
from tests.e2e.scenarios import COMPLETE_AFTER_ANNOTATION, EXAMPLES, JOBS_NAMESPACE, PREFIX, USAGE_ANNOTATION, wait_for

#: what each example's training really uses (MiB per GPU): the usage model's truth (the same jobs'
#: figures as scenarios.EXAMPLE_USAGE_MIB: a ResNet-50 at batch 128, the small CNN)
USAGE_MIB = {"resnet50-retrain": 9800.0, "cnn-lr-sweep": 2600.0}


def example_job(stem: str, complete_after_s: int) -> dict[str, Any]:
    """The example Job as written, its pods' container swapped for a sleep kwok ends after `complete_after_s`."""
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{stem}.yaml").read_text())
    assert job["kind"] == "Job", f"{stem}.yaml is no Job"
    job = copy.deepcopy(job)
    name = job["metadata"]["name"]
    job["metadata"]["namespace"] = JOBS_NAMESPACE
    template = job["spec"]["template"]
    template["metadata"].setdefault("labels", {})["deepres-e2e"] = "workload"
    annotations = template["metadata"]["annotations"]
    assert "schedulerName" not in template["spec"], "the examples leave schedulerName to the admission policy"
    annotations[f"{PREFIX}gpu-share"] = "0.05"  # a sleep leaves the GPU idle (as scenarios.workload says)
    annotations[USAGE_ANNOTATION] = f"{USAGE_MIB[name]:.0f}"
    annotations[COMPLETE_AFTER_ANNOTATION] = f"{complete_after_s}s"
    for container in template["spec"]["containers"]:
        container.update(image=s.WORKLOAD_IMAGE, imagePullPolicy="IfNotPresent", command=["sh", "-c", "sleep 3600"])
    template["spec"]["terminationGracePeriodSeconds"] = 1
    return job


def job_pods(cluster: LocalCluster, name: str) -> list[Any]:
    pods: list[Any] = cluster.core.list_namespaced_pod(JOBS_NAMESPACE, label_selector=f"job-name={name}").items
    return pods


def placed_by_deepres(pod: Any) -> bool:
    """Bound by deepres: on a node, with the GPUs the extender assigned, and wired by the admission policy."""
    notes = pod.metadata.annotations or {}
    return bool(pod.spec.node_name and notes.get(f"{PREFIX}assigned-gpus")
                and pod.spec.scheduler_name == "deepres-scheduler"
                and all((c.resources.requests or {}).get(DEVICE_RESOURCE) == "1" for c in pod.spec.containers))


def what_happened(cluster: LocalCluster, batch: Any, name: str) -> str:
    """The Job's status and events and each of its pods (phase, node, scheduler, requests, events): what a
    failed wait reports."""
    job = batch.read_namespaced_job(name, JOBS_NAMESPACE)
    lines = [f"job {name}: active {job.status.active} succeeded {job.status.succeeded} failed {job.status.failed} "
             f"conditions {[(c.type, c.status, c.reason) for c in job.status.conditions or []]}"]
    lines += [f"  job event {e.reason}: {e.message}" for e in cluster.events(name)]
    for pod in job_pods(cluster, name):
        notes = pod.metadata.annotations or {}
        lines.append(f"  pod {pod.metadata.name}: {pod.status.phase} on {pod.spec.node_name} scheduler "
                     f"{pod.spec.scheduler_name} requests {[c.resources.requests for c in pod.spec.containers]} "
                     f"assigned {notes.get(f'{PREFIX}assigned-gpus')}")
        lines += [f"    event {e.reason}: {e.message}" for e in cluster.events(pod.metadata.name)]
    return "\n".join(lines)


def waited(cluster: LocalCluster, batch: Any, name: str, what: str, predicate: Any, timeout_s: float) -> Any:
    """wait_for, failing with what happened to the Job and its pods."""
    try:
        return wait_for(what, predicate, timeout_s, 0.5)
    except pytest.fail.Exception as err:
        pytest.fail(f"{err}\n{what_happened(cluster, batch, name)}")


def condition(job: Any, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in (job.status.conditions or []))


@pytest.fixture
def batch(clean: LocalCluster) -> Iterator[Any]:
    """The Jobs API; every Job (and its pods) gone afterwards."""
    from kubernetes import client

    api: Any = client.BatchV1Api(clean.core.api_client)
    yield api
    for job in api.list_namespaced_job(JOBS_NAMESPACE).items:
        api.delete_namespaced_job(job.metadata.name, JOBS_NAMESPACE, propagation_policy="Background",
                                  grace_period_seconds=0)
    wait_for("the Jobs to be gone", lambda: not api.list_namespaced_job(JOBS_NAMESPACE).items, 120)
    s.delete_workloads(clean)


def test_the_job_example_runs_through_deepres_and_replaces_a_failed_pod(clean: LocalCluster, batch: Any) -> None:
    cluster = clean
    # long enough that the first pod is still running when the test fails it below
    job = example_job("job-with-retries", complete_after_s=60)
    name = job["metadata"]["name"]
    assert job["spec"]["backoffLimit"] >= 1
    batch.create_namespaced_job(JOBS_NAMESPACE, job)
    first = waited(cluster, batch, name, "the Job's first pod placed by deepres",
                   lambda: next((p for p in job_pods(cluster, name) if placed_by_deepres(p)), None), 120)
    wait_for(f"{first.metadata.name} running", lambda: cluster.pod(first.metadata.name).status.phase == "Running",
             60, 0.5)
    # the pod fails as the kubelet fails a pod it refused at admission (a refused Allocate)
    cluster.core.patch_namespaced_pod_status(first.metadata.name, JOBS_NAMESPACE, {"status": {
        "phase": "Failed", "reason": "UnexpectedAdmissionError",
        "message": "Allocate failed due to the device plugin's refusal (test)"}})

    def replacement() -> Any:
        return next((p for p in job_pods(cluster, name)
                     if p.metadata.name != first.metadata.name and placed_by_deepres(p)), None)

    second = waited(cluster, batch, name, "the Job controller's new pod, placed by deepres", replacement, 180)
    assert second.metadata.annotations[f"{PREFIX}assigned-gpus"]
    done = wait_for("the Job to complete", lambda: (lambda j: j if condition(j, "Complete") else None)(
        batch.read_namespaced_job(name, JOBS_NAMESPACE)), 240, 1.0)
    # one failure counted (the pod failed above), one success (the new pod ran to its end). (kwok may later
    # apply the first pod's scheduled completion to it as well: the Job has counted it as failed by then)
    assert (done.status.succeeded, done.status.failed) == (1, 1)


def test_the_sweep_example_places_every_index_and_completes(clean: LocalCluster, batch: Any) -> None:
    cluster = clean
    job = example_job("sweep-indexed", complete_after_s=20)
    name, completions = job["metadata"]["name"], job["spec"]["completions"]
    assert completions >= 2 and job["spec"]["completionMode"] == "Indexed"
    batch.create_namespaced_job(JOBS_NAMESPACE, job)

    def all_placed() -> list[Any] | None:
        pods = [p for p in job_pods(cluster, name) if placed_by_deepres(p)]
        return pods if len(pods) == completions else None

    pods = waited(cluster, batch, name, f"all {completions} pods of the sweep placed by deepres", all_placed, 180)
    indexes = sorted(int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]) for p in pods)
    assert indexes == list(range(completions))
    s.assert_no_gpu_overcommitted(cluster)
    done = wait_for("the sweep to complete", lambda: (lambda j: j if condition(j, "Complete") else None)(
        batch.read_namespaced_job(name, JOBS_NAMESPACE)), 240, 1.0)
    assert done.status.succeeded == completions and not done.status.failed


def test_helm_install_refuses_images_published_nowhere_and_takes_the_admins_registry(cluster: LocalCluster) -> None:
    """At a live install (helm talks to the API server), the chart's default images, published nowhere,
    fail it with the fix; with imageRegistry the pods name the images under that registry."""
    import os
    import subprocess

    from tests.cluster.conftest import helm

    env = {**os.environ, "KUBECONFIG": str(cluster.plane.admin_kubeconfig)}
    # a second release beside the suite's, in its namespace (a dry run creates no namespace); nothing is made
    argv = [helm(), "install", "probe", str(s.REPO / "helm" / "deepres"), "--namespace", s.NAMESPACE,
            "--dry-run=server"]
    defaults = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert defaults.returncode != 0, "a live install of the default images went through"
    assert "published in no registry" in defaults.stderr and "make push-images" in defaults.stderr, defaults.stderr
    registry = "registry.example.com/ml"
    named = subprocess.run([*argv, "--set", f"imageRegistry={registry}"], capture_output=True, text=True, env=env,
                           timeout=120)
    assert named.returncode == 0, named.stderr
    pulled = {line.split("image:", 1)[1].strip().strip('"') for line in named.stdout.splitlines()
              if line.strip().startswith("image:")}
    version = yaml.safe_load((s.REPO / "helm" / "deepres" / "Chart.yaml").read_text())["appVersion"]
    assert {f"{registry}/deepres/extender:{version}", f"{registry}/deepres/agent:{version}"} <= pulled, pulled
