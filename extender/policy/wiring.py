"""What a deepres job pod gets at creation so that a data scientist writes only annotations.

One rule, two homes that must agree: the chart's MutatingAdmissionPolicy (CEL in the API server,
Kubernetes 1.36, or 1.34-1.35 with its feature gate) and the extender's mutating webhook
(`POST /v1/mutate`, extender/server/mutate.py) for the clusters without that policy. Both:

- match a pod carrying one of the job annotations the extender reads (`deepres.io/model-type`,
  `deepres.io/model`, `deepres.io/gpu-memory`); any other pod is left as it is;
- set `spec.schedulerName` to deepres' scheduler;
- give every app container that neither requests nor limits the device plugin's resource a request
  and a limit of one (the kubelet then asks the node's plugin, `Allocate`, for its GPUs); a container
  that names the resource itself keeps what it wrote, and init containers are left alone;
- without the device plugin (`resource` empty): give every container that has no
  `NVIDIA_VISIBLE_DEVICES` the downward-API wiring to the `deepres.io/assigned-gpus` annotation.

The answer is an RFC 6902 JSON Patch over the pod the API server sent (what an AdmissionReview
response carries), built from that pod alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: The annotations that make a pod a deepres GPU job (extender/annotations.py parse_job reads them).
JOB_ANNOTATIONS = ("deepres.io/model-type", "deepres.io/model", "deepres.io/gpu-memory")
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ASSIGNED_FIELD = "metadata.annotations['deepres.io/assigned-gpus']"

Patch = list[dict[str, Any]]


def is_job(pod: Mapping[str, Any]) -> bool:
    """True when the pod carries one of the job annotations."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and any(key in annotations for key in JOB_ANNOTATIONS)


def _pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _names(resources: Mapping[str, Any], part: str, resource: str) -> bool:
    quantities = resources.get(part)
    return isinstance(quantities, Mapping) and resource in quantities


def _resource_ops(index: int, container: Mapping[str, Any], resource: str) -> Patch:
    base = f"/spec/containers/{index}/resources"
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return [{"op": "add", "path": base, "value": {"limits": {resource: "1"}, "requests": {resource: "1"}}}]
    if _names(resources, "limits", resource) or _names(resources, "requests", resource):
        return []
    ops: Patch = []
    for part in ("limits", "requests"):
        if isinstance(resources.get(part), Mapping):
            ops.append({"op": "add", "path": f"{base}/{part}/{_pointer(resource)}", "value": "1"})
        else:
            ops.append({"op": "add", "path": f"{base}/{part}", "value": {resource: "1"}})
    return ops


def _env_ops(index: int, container: Mapping[str, Any]) -> Patch:
    env = container.get("env")
    wiring = {"name": VISIBLE_DEVICES, "valueFrom": {"fieldRef": {"fieldPath": ASSIGNED_FIELD}}}
    if not isinstance(env, Sequence) or isinstance(env, (str, bytes)):
        return [{"op": "add", "path": f"/spec/containers/{index}/env", "value": [wiring]}]
    if any(isinstance(e, Mapping) and e.get("name") == VISIBLE_DEVICES for e in env):
        return []
    return [{"op": "add", "path": f"/spec/containers/{index}/env/-", "value": wiring}]


def wiring_patch(pod: Mapping[str, Any], *, scheduler_name: str, resource: str) -> Patch:
    """The JSON Patch that gives a deepres job pod its scheduler and its GPU wiring; [] for any other pod.

    `resource`: the device plugin's extended resource (e.g. `deepres.io/gpu`); empty: no device plugin,
    the NVIDIA_VISIBLE_DEVICES wiring instead.
    """
    if not is_job(pod):
        return []
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    ops: Patch = []
    if spec.get("schedulerName") != scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    containers = spec.get("containers")
    if isinstance(containers, Sequence) and not isinstance(containers, (str, bytes)):
        for index, container in enumerate(containers):
            if isinstance(container, Mapping):
                ops += _resource_ops(index, container, resource) if resource else _env_ops(index, container)
    return ops
