"""The pod watch's typed decoding (issue #48): what every reader of a watched pod reads is what the
whole decoding gave, the rest is dropped, and a line the types do not take falls back to the whole."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from devtools.bench_extender import _scheduler_pod
from extender.kube.watched import decode_pod_event, decode_pod_list
from extender.pod_requests import allocation_sizes, kubelet_admitted, requests_of
from extender.protocol import parse_pod
from extender.server.planner import workload_of


def _running_pod() -> dict[str, Any]:
    """A pod as the API server sends it once bound and started: a kube-scheduler pod (managedFields,
    volumes, the container's command and mounts) with the kubelet's status, a GPU request, an owner
    and deepres' annotations."""
    pod = _scheduler_pod("train-1")
    pod["metadata"]["annotations"]["deepres.io/assigned-gpus"] = "GPU-1,GPU-2"
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-1",
                                           "controller": True}]
    pod["metadata"]["deletionTimestamp"] = "2026-11-24T09:00:00Z"
    pod["spec"]["nodeName"] = "gpu-00001"
    pod["spec"]["priorityClassName"] = "high"
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "2"}
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox",
                                      "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    pod["status"] = {
        "phase": "Running", "qosClass": "Burstable", "podIP": "10.1.1.1", "startTime": "2026-11-24T08:00:00Z",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": "2026-11-24T08:00:0"
                        f"{i}Z"} for i, t in enumerate(("Initialized", "Ready", "PodScheduled"))],
        "containerStatuses": [{"name": "c", "state": {"running": {"startedAt": "2026-11-24T08:00:01Z"}}, "ready": True,
                               "restartCount": 0, "image": "busybox:1.36", "imageID": "sha256:" + "a" * 64}]}
    return pod


def _readings(pod: dict[str, Any]) -> tuple[Any, ...]:
    """What the extender's readers make of a watched pod."""
    return (parse_pod(pod), requests_of(pod, "nvidia.com/gpu"), allocation_sizes(pod["spec"], "nvidia.com/gpu"),
            kubelet_admitted(pod["status"]), workload_of(pod), pod["metadata"].get("deletionTimestamp"))


@pytest.mark.parametrize("kind", ["ADDED", "MODIFIED", "DELETED"])
def test_every_reader_reads_what_the_whole_decoding_gave(kind: str) -> None:
    line = orjson.dumps({"type": kind, "object": _running_pod()})
    whole, typed = orjson.loads(line), decode_pod_event(line)
    assert typed is not None and typed["type"] == kind
    assert _readings(typed["object"]) == _readings(whole["object"])
    assert "managedFields" in whole["object"]["metadata"] and "managedFields" not in typed["object"]["metadata"]
    assert "volumes" not in typed["object"]["spec"] and "command" not in typed["object"]["spec"]["containers"][0]
    assert len(orjson.dumps(typed)) < len(line)  # what nobody reads is not built


def test_a_pending_pod_keeps_its_absent_fields_absent() -> None:
    pod = _scheduler_pod("train-2")
    del pod["status"]
    typed = decode_pod_event(orjson.dumps({"type": "ADDED", "object": pod}))
    assert typed is not None and "status" not in typed["object"] and "nodeName" not in typed["object"]["spec"]
    assert parse_pod(typed["object"]) == parse_pod(pod)


def test_a_list_keeps_its_version_and_every_item() -> None:
    pods = [_running_pod(), _scheduler_pod("train-3")]
    data = orjson.dumps({"kind": "PodList", "metadata": {"resourceVersion": "42"}, "items": pods})
    listed = decode_pod_list(data)
    assert listed is not None and listed["metadata"] == {"resourceVersion": "42"}
    assert [_readings(p)[0] for p in listed["items"]] == [parse_pod(p) for p in pods]


@pytest.mark.parametrize("line", [
    orjson.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}),
    orjson.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "p"}, "spec": {"containers": ["not-a-dict"]}}}),
    orjson.dumps({"type": "MODIFIED", "object": "not-an-object"}),
    b'{"type": "MODIFIED", "object": {"metadata": {"name": "p\xff"}}}',  # not UTF-8
    b"not json",
])
def test_what_the_types_do_not_take_is_left_to_the_whole_decoding(line: bytes) -> None:
    assert decode_pod_event(line) is None


def test_the_decoding_does_not_change_its_input() -> None:
    pod = _running_pod()
    before = copy.deepcopy(pod)
    decode_pod_event(orjson.dumps({"type": "ADDED", "object": pod}))
    assert pod == before
