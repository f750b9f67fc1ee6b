"""What the kubelet will ask a device plugin for, read off a pod, and how the node's pods are described
in the allocation handshake: pure, standard library only (the agent's image has no numpy, so this is
not under policy/, whose package imports it). extender/policy/allocation.py holds the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class NodePod:
    """A pod of the node that requests the resource, as the agent sees it at `Allocate`."""

    uid: str
    key: str
    #: the kubelet has allocated it already: the resource appears in PodResources for one of its
    #: containers, or the kubelet has written container statuses (it admitted the pod)
    allocated: bool



def _quantity(value: Any) -> int:
    """An extended resource's count ("2", 2); 0 when missing or not a whole number."""
    try:
        number = int(str(value))
    except ValueError:
        return 0
    return max(number, 0)


def container_request(container: Mapping[str, Any], resource: str) -> int:
    """Devices of `resource` a container asks for (extended resources are asked for in limits; requests,
    when given, must equal them)."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    return _quantity(limits.get(resource, requests.get(resource, 0)))


def allocation_sizes(spec: Mapping[str, Any], resource: str) -> tuple[int, ...]:
    """The devices each `Allocate` of this pod will ask for, in the kubelet's order: init containers,
    then containers, those requesting `resource`."""
    out: list[int] = []
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            if isinstance(container, Mapping):
                n = container_request(container, resource)
                if n > 0:
                    out.append(n)
    return tuple(out)


def kubelet_admitted(status: Mapping[str, Any]) -> bool:
    """The kubelet has admitted the pod (or refused it): it wrote container statuses, or a phase past
    Pending. Before admission a bound pod's status holds only the scheduler's condition."""
    if str(status.get("phase") or "Pending") != "Pending":
        return True
    return bool(status.get("containerStatuses") or status.get("initContainerStatuses"))


@dataclass(frozen=True)
class Requests:
    """A parsed view of a pod for the handshake."""

    uid: str
    key: str
    sizes: tuple[int, ...] = ()
    admitted: bool = False
    finished: bool = False
    deleting: bool = False


def requests_of(obj: Mapping[str, Any], resource: str) -> Requests:
    """The handshake's view of a Pod as JSON (Kubernetes casing)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return Requests(uid=str(meta.get("uid") or ""),
                    key=f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}",
                    sizes=allocation_sizes(spec, resource),
                    admitted=kubelet_admitted(status),
                    finished=str(status.get("phase") or "") in FINISHED_PHASES,
                    deleting=bool(meta.get("deletionTimestamp")))
