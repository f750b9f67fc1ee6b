"""The example pods a data scientist copies (deploy/examples/) and the kind cluster of the e2e suite.

Why: an example that the API server rejects, that forgets `schedulerName`, or whose annotations the
extender refuses teaches the wrong thing on the first try. Each example is validated strictly for
every supported Kubernetes minor and its annotations go through the extender's own parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
KUBE_VERSIONS = ("1.32.0", "1.33.0", "1.34.0", "1.35.0")
#: the annotations the chart's MutatingAdmissionPolicy matches (helm/deepres/templates/admission/mutating-policy.yaml)
MUTATION_KEYS = ("deepres.io/model-type", "deepres.io/model", "deepres.io/gpu-memory")
DEVICE_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def load(path: Path) -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load(path.read_text())
    return pod


def pod_of(path: Path) -> dict[str, Any]:
    """The pod an example runs: a bare Pod, or a Job's pod template (metadata and spec)."""
    doc = load(path)
    if doc["kind"] == "Job":
        template: dict[str, Any] = doc["spec"]["template"]
        return template
    assert doc["kind"] == "Pod", f"{path.name}: kind {doc['kind']}"
    return doc


def test_the_four_kinds_of_job_are_there() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"cnn-small", "transformer-large", "too-large", "deadline-critical"} <= names


def test_beside_the_bare_pods_a_job_with_retries_and_a_sweep() -> None:
    """A bare Pod that fails stays Failed (docs/device-plugin.md): the Job retries, the sweep runs several pods."""
    retries, sweep = load(REPO / "deploy" / "examples" / "job-with-retries.yaml"), \
        load(REPO / "deploy" / "examples" / "sweep-indexed.yaml")
    assert retries["kind"] == sweep["kind"] == "Job"
    assert retries["spec"]["backoffLimit"] >= 1
    assert retries["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert sweep["spec"]["completionMode"] == "Indexed" and sweep["spec"]["completions"] > 1
    assert sweep["spec"]["parallelism"] > 1 and sweep["spec"]["backoffLimitPerIndex"] >= 1


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_a_valid_pod_for_every_supported_version(path: Path) -> None:
    pod = load(path)
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(pod, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{path.name} (Kubernetes {version}): {'.'.join(map(str, err.path))}: {err.message}")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_carries_annotations_only(path: Path) -> None:
    """The chart's MutatingAdmissionPolicy adds schedulerName and the deepres.io/gpu request to pods with a
    job annotation (tests/cluster/test_admission.py shows it in the API server), and its validating
    policy refuses containers that set NVIDIA_VISIBLE_DEVICES themselves: an example needs neither."""
    pod = pod_of(path)
    assert "schedulerName" not in pod["spec"], f"{path.name}: the admission policy sets schedulerName"
    assert set(pod["metadata"]["annotations"]) & set(MUTATION_KEYS), f"{path.name}: the mutation would not match it"
    for c in pod["spec"]["containers"]:
        assert not any(e["name"] in DEVICE_VARIABLES for e in c.get("env", [])), f"{path.name}/{c['name']}"
        assert "gpu" not in str(c.get("resources", {})), (
            "no GPU request: the admission policy adds deepres.io/gpu; an nvidia.com/gpu request would hand out "
            "whole GPUs through NVIDIA's device plugin, not deepres's choice"
        )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_annotations_are_accepted_by_the_extender(path: Path) -> None:
    from extender.annotations import parse_job

    annotations = pod_of(path)["metadata"]["annotations"]
    job = parse_job(annotations, created_s=0.0, now_s=0.0)
    assert job.gpu_job, f"{path.name} would be treated as a non-GPU pod"


def test_kind_cluster_has_one_control_plane_and_three_labelled_workers() -> None:
    config = yaml.safe_load((REPO / "deploy" / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert sorted(roles) == ["control-plane", "worker", "worker", "worker"]
    for node in config["nodes"]:
        if node["role"] == "worker":
            assert node["labels"]["deepres.io/simulated-gpus"] == "true", "the e2e agents select workers by this label"


def test_too_large_example_exceeds_every_gpu_of_the_e2e_cluster() -> None:
    """The e2e scenario 2 and the example's comment rely on it: no simulated GPU (largest 80 GB) can hold it."""
    from predictor.runtime import Predictor
    from predictor.spec import JobSpec

    predictor = Predictor.load()  # the shipped artifact is part of the repository
    annotations = load(REPO / "deploy" / "examples" / "too-large.yaml")["metadata"]["annotations"]
    spec = JobSpec.parse({k.removeprefix("deepres.io/"): v for k, v in annotations.items()})
    values = yaml.safe_load((REPO / "tests" / "e2e" / "values-kind.yaml").read_text())
    largest_gib = max(float(item.rsplit("-", 1)[1].rstrip("GBi"))
                      for spec_text in values["agent"]["simulated"]["nodes"].values()
                      for item in spec_text.split(","))
    assert predictor.predict(spec).memory_mib > largest_gib * 1024
