"""The device plugin's rules, pure: what devices the kubelet sees, which pod an `Allocate` is for,
and what the container is handed under each device-list strategy. No gRPC, no API calls, no clock.

Devices. The kubelet counts a resource in whole devices, and several deepres pods may share one GPU,
so each GPU is advertised as `slots` devices `<GPU UUID>::<slot>`. A slot is a token the kubelet
counts, not a GPU: whichever slots the kubelet picks, `Allocate` hands the container the GPUs the
extender wrote in `deepres.io/assigned-gpus`, and never any other (kube-scheduler only checks that
the node has slots left; the extender chose the GPUs).

Which pod. `Allocate` names device IDs, not the pod: the agent asks the extender (the allocation
handshake, extender/policy/allocation.py), sending the pods of this node that request the resource and
whether the kubelet has allocated each (its PodResources API); the extender answers with the one pod
it bound here that awaits its GPUs, or refuses. A pod's own annotations never decide it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.pod_requests import NodePod, requests_of

STRATEGIES = ("volume-mounts", "cdi", "envvar")
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
SLOT_SEPARATOR = "::"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
#: NVIDIA's volume-mounts convention: one mount per device under this folder, the host side /dev/null;
#: the runtime reads the device list from the mount names when `accept-nvidia-visible-devices-as-volume-mounts`
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNT_HOST_PATH = "/dev/null"
DEFAULT_CDI_KIND = "nvidia.com/gpu"
MAX_DEVICE_ID_CHARS = 63  # the kubelet API's limit on Device.ID


@dataclass(frozen=True)
class Device:
    """One device the kubelet counts: a slot of a GPU."""

    id: str
    gpu_uuid: str
    healthy: bool

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


def slot_id(gpu_uuid: str, slot: int) -> str:
    return f"{gpu_uuid}{SLOT_SEPARATOR}{slot}"


def devices_of(gpus: Iterable[tuple[str, bool]], slots: int) -> tuple[Device, ...]:
    """`slots` devices per GPU (uuid, healthy), in GPU order; a GPU whose ID would exceed the kubelet's
    limit is left out (GPU and MIG UUIDs are 40 characters, far below it)."""
    out: list[Device] = []
    for uuid, healthy in gpus:
        if len(slot_id(uuid, slots - 1)) > MAX_DEVICE_ID_CHARS:
            continue
        out.extend(Device(slot_id(uuid, s), uuid, healthy) for s in range(slots))
    return tuple(out)


def node_pods(objects: Iterable[Mapping[str, Any]], resource: str,
              allocated: Collection[tuple[str, str]]) -> list[NodePod]:
    """The pods of this node that request `resource` (any container, init containers included), not
    finished and not being deleted, as the handshake sends them: `allocated` when the kubelet's
    PodResources lists the resource for one of its containers (`allocated`: (namespace, name) pairs)
    or its status shows the kubelet admitted it."""
    out = []
    for obj in objects:
        seen = requests_of(obj, resource)
        if not seen.uid or not seen.sizes or seen.finished or seen.deleting:
            continue
        namespace, _, name = seen.key.partition("/")
        out.append(NodePod(uid=seen.uid, key=seen.key, allocated=seen.admitted or (namespace, name) in allocated))
    return out


def check_gpus(key: str, gpus: Sequence[str], devices: Sequence[Device], node: str) -> str:
    """Why the pod's assigned GPUs cannot be handed out here ('' when they can): at least one, each a
    GPU of this node and healthy."""
    if not gpus:
        return f"pod {key} has no GPUs assigned: refusing"
    by_uuid = {d.gpu_uuid: d for d in devices}
    unknown = [u for u in gpus if u not in by_uuid]
    if unknown:
        return (f"pod {key} is assigned GPUs that node {node} does not have ({','.join(unknown)}): "
                f"refusing (the extender bound it elsewhere)")
    sick = [u for u in gpus if not by_uuid[u].healthy]
    if sick:
        return f"pod {key} is assigned GPUs that are unhealthy on node {node} ({','.join(sick)}): refusing"
    return ""


@dataclass(frozen=True)
class ContainerDevices:
    """What the kubelet is told to give one container (mirrors ContainerAllocateResponse)."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (container path, host path, read-only)
    cdi_devices: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


def container_devices(gpu_uuids: Sequence[str], strategy: str, cdi_kind: str = DEFAULT_CDI_KIND) -> ContainerDevices:
    """The device list for `gpu_uuids` in the form the node's NVIDIA runtime reads:

    - `envvar`: NVIDIA_VISIBLE_DEVICES=<uuids>; honoured in an unprivileged container only when the
      runtime has `accept-nvidia-visible-devices-envvar-when-unprivileged` on (its default);
    - `volume-mounts`: /dev/null mounted at /var/run/nvidia-container-devices/<uuid> per GPU (and the
      variable pointing there, as NVIDIA's plugin does); read when the runtime has
      `accept-nvidia-visible-devices-as-volume-mounts` on; a pod cannot make such mounts itself;
    - `cdi`: CDI device names `<kind>=<uuid>` the kubelet passes to the runtime (containerd/CRI-O with
      CDI, the NVIDIA toolkit's generated CDI spec on the node).
    """
    if strategy == "envvar":
        return ContainerDevices(envs={VISIBLE_DEVICES_ENV: ",".join(gpu_uuids)})
    if strategy == "volume-mounts":
        mounts = tuple((f"{VOLUME_MOUNT_ROOT}/{u}", VOLUME_MOUNT_HOST_PATH, True) for u in gpu_uuids)
        return ContainerDevices(envs={VISIBLE_DEVICES_ENV: VOLUME_MOUNT_ROOT}, mounts=mounts)
    if strategy == "cdi":
        return ContainerDevices(cdi_devices=tuple(f"{cdi_kind}={u}" for u in gpu_uuids))
    raise ValueError(f"device-list strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
