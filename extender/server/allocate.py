"""POST /v1/allocate: the node's device plugin asks, at each kubelet `Allocate`, which pod and GPUs it
serves (the allocation handshake; the rule is extender/policy/allocation.py, the state
extender/allocations.py). The caller is the node's agent with its node-bound token: it may ask only for
its own node.

Request: `{"node": NAME, "resource": NAME, "size": N, "pods": [{"uid", "namespace", "name",
"allocated"}]}`, `pods` being the node's pods that request the resource as the agent sees them (the API
server's list, `allocated` from the kubelet's PodResources and the pods' statuses).
Answer: 200 `{"pod": {"uid", "namespace", "name"}, "gpus": [UUID...]}`, or 409 `{"error": why}` (the
plugin then refuses the `Allocate`), 400 for a malformed body, 403 for another node's name.
"""

from __future__ import annotations

import logging
from typing import Any

from extender.pod_requests import NodePod
from extender.server.parts import Part

log = logging.getLogger(__name__)

MAX_PODS = 1024  # a node's pods (the kubelet's default cap is 110)
MAX_NAME = 253
MAX_SIZE = 4096


class AllocateError(ValueError):
    """A malformed /v1/allocate body."""


def _name(body: dict[str, Any], key: str, limit: int = MAX_NAME) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise AllocateError(f"{key!r} must be a non-empty string of at most {limit} characters")
    return value


def parse_request(body: Any) -> tuple[str, str, int, list[NodePod]]:
    if not isinstance(body, dict):
        raise AllocateError("body must be a JSON object")
    node, resource = _name(body, "node"), _name(body, "resource")
    size = body.get("size")
    if type(size) is not int or not 0 < size <= MAX_SIZE:
        raise AllocateError(f"'size' must be an integer in 1..{MAX_SIZE}")
    raw_pods = body.get("pods")
    if not isinstance(raw_pods, list) or len(raw_pods) > MAX_PODS:
        raise AllocateError(f"'pods' must be a list of at most {MAX_PODS} pods")
    pods = []
    for item in raw_pods:
        if not isinstance(item, dict) or not isinstance(item.get("allocated"), bool):
            raise AllocateError("each pod must be an object with uid, namespace, name and allocated (a boolean)")
        pods.append(NodePod(uid=_name(item, "uid", 128),
                            key=f"{_name(item, 'namespace', 63)}/{_name(item, 'name')}",
                            allocated=item["allocated"]))
    return node, resource, size, pods


class Allocator(Part):
    """/v1/allocate."""

    def allocate(self, body: Any, bound_node: str) -> tuple[int, dict[str, Any]]:
        try:
            node, resource, size, pods = parse_request(body)
        except AllocateError as err:
            return 400, {"error": f"bad /v1/allocate request: {err}"}
        if bound_node and bound_node != node:
            return 403, {"error": f"the caller's token is bound to node {bound_node}, not {node}"}
        if resource != self.settings.kube.device_resource:
            return 409, {"error": f"resource {resource} is not the one deepres binds "
                                  f"({self.settings.kube.device_resource}; kube.device_resource)"}
        decision = self.gate.allocate(node, resource, size, pods)
        outcome = "served" if decision.served else "refused"
        self.metrics.allocations.labels(outcome).inc()
        if decision.pod is None:
            log.warning("allocate refused node=%s size=%d: %s", node, size, decision.error)
            return 409, {"error": decision.error}
        served = decision.pod
        namespace, _, name = served.key.partition("/")
        log.info("allocate node=%s pod=%s gpus=%s container %d of %d", node, served.key, ",".join(served.gpus),
                 served.served, len(served.sizes))
        return 200, {"pod": {"uid": served.uid, "namespace": namespace, "name": name}, "gpus": list(served.gpus)}
