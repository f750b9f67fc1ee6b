"""The device plugin's rules, pure: what devices the kubelet sees, which pod an `Allocate` is for,
and what the container is handed under each device-list strategy. No gRPC, no API calls, no clock.

Devices. The kubelet counts a resource in whole devices, and several deepres pods may share one GPU,
so each GPU is advertised as `slots` devices `<GPU UUID>::<slot>`. A slot is a token the kubelet
counts, not a GPU: whichever slots the kubelet picks, `Allocate` hands the container the GPUs the
extender wrote in `deepres.io/assigned-gpus`, and never any other (kube-scheduler only checks that
the node has slots left; the extender chose the GPUs).

Which pod. `Allocate` names device IDs, not the pod. As HAMi's plugin does, the pod is found among the
pods on this node: bound (they carry `deepres.io/assigned-gpus`, which only the extender may write:
the chart's admission policy), not finished, no container started yet, and with a container whose
request of the resource equals the number of devices asked for that this plugin has not served yet.
One such pod: its GPUs. Several that hold the same GPUs: those GPUs (whichever pod it is, the
container gets the right devices; the oldest-bound is counted as served, the kubelet admits pods in
that order). Several with different GPUs: refused, rather than guessing (the kubelet fails the pod's
admission and its controller makes a new one). None: refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = ("volume-mounts", "cdi", "envvar")
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
SLOT_SEPARATOR = "::"
ASSIGNED_GPUS_ANNOTATION = "deepres.io/assigned-gpus"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
#: NVIDIA's volume-mounts convention: one mount per device under this folder, the host side /dev/null;
#: the runtime reads the device list from the mount names when `accept-nvidia-visible-devices-as-volume-mounts`
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNT_HOST_PATH = "/dev/null"
DEFAULT_CDI_KIND = "nvidia.com/gpu"
MAX_DEVICE_ID_CHARS = 63  # the kubelet API's limit on Device.ID
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


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


@dataclass(frozen=True)
class BoundPod:
    """What `Allocate` needs of a pod on this node."""

    uid: str
    namespace: str
    name: str
    assigned_gpus: tuple[str, ...]
    #: per regular container, how many devices of the resource it requests (0: none)
    requests: tuple[int, ...]
    #: a container started or the pod finished: the kubelet has admitted it already
    started: bool
    #: when it was bound (PodScheduled), else created: RFC 3339, for ordering only
    bound_at: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _quantity(value: Any) -> int:
    """An extended resource's count ("2", 2); 0 when missing or not a whole number."""
    try:
        number = int(str(value))
    except ValueError:
        return 0
    return max(number, 0)


def container_request(container: Mapping[str, Any], resource: str) -> int:
    """Extended resources are asked for in limits (requests, when given, must equal them)."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    return _quantity(limits.get(resource, requests.get(resource, 0)))


def bound_pod_from_object(obj: Mapping[str, Any], resource: str) -> BoundPod | None:
    """A BoundPod from a Pod as JSON (Kubernetes casing); None when it is not a deepres-bound pod."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    uid = str(meta.get("uid") or "")
    assigned = str(annotations.get(ASSIGNED_GPUS_ANNOTATION) or "")
    if not uid or not assigned.strip() or meta.get("deletionTimestamp"):
        return None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    started = str(status.get("phase") or "") in FINISHED_PHASES or any(
        "running" in (s.get("state") or {}) or "terminated" in (s.get("state") or {})
        or "terminated" in (s.get("lastState") or {})
        for s in status.get("containerStatuses") or [])
    scheduled = next((str(c.get("lastTransitionTime") or "") for c in status.get("conditions") or []
                      if c.get("type") == "PodScheduled" and c.get("status") == "True"), "")
    return BoundPod(
        uid=uid,
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        assigned_gpus=tuple(u.strip() for u in assigned.split(",") if u.strip()),
        requests=tuple(container_request(c, resource) for c in spec.get("containers") or []),
        started=started,
        bound_at=scheduled or str(meta.get("creationTimestamp") or ""),
    )


@dataclass
class Served:
    """Containers this plugin has answered, per pod uid (the sizes asked for). In memory: after a
    restart, pods with a started container are known to be served from their status."""

    sizes: dict[str, list[int]] = field(default_factory=dict)

    def remaining(self, pod: BoundPod) -> Counter[int]:
        left = Counter(r for r in pod.requests if r > 0)
        left.subtract(Counter(self.sizes.get(pod.uid, [])))
        return +left

    def add(self, pod: BoundPod, size: int) -> None:
        self.sizes.setdefault(pod.uid, []).append(size)

    def forget_except(self, uids: Iterable[str]) -> None:
        keep = set(uids)
        for uid in [u for u in self.sizes if u not in keep]:
            del self.sizes[uid]


@dataclass(frozen=True)
class Choice:
    """The pod an Allocate is for, or why there is none (`error` names the pods and the request)."""

    pod: BoundPod | None = None
    error: str = ""


def choose_pod(pods: Sequence[BoundPod], size: int, served: Served, node: str, resource: str) -> Choice:
    """The pod a container asking for `size` devices of `resource` belongs to (see the module doc)."""
    waiting = [p for p in pods if not p.started and served.remaining(p)[size] > 0]
    if not waiting:
        return Choice(error=f"no pod on node {node} that deepres bound awaits a container requesting {size} "
                            f"{resource}: refusing to hand out GPUs to an unknown pod")
    gpu_sets = {p.assigned_gpus for p in waiting}
    if len(gpu_sets) > 1:
        listed = "; ".join(f"{p.key}: {','.join(p.assigned_gpus)}" for p in sorted(waiting, key=lambda p: p.key))
        return Choice(error=f"{len(waiting)} pods on node {node} await a container requesting {size} {resource} "
                            f"with different GPUs ({listed}): refusing rather than guessing which one this is")
    return Choice(pod=min(waiting, key=lambda p: (p.bound_at, p.key)))


def check_gpus(pod: BoundPod, devices: Sequence[Device], node: str) -> str:
    """Why the pod's assigned GPUs cannot be handed out here ('' when they can): each must be a GPU
    of this node and healthy."""
    by_uuid = {d.gpu_uuid: d for d in devices}
    unknown = [u for u in pod.assigned_gpus if u not in by_uuid]
    if unknown:
        return (f"pod {pod.key} is assigned GPUs that node {node} does not have ({','.join(unknown)}): "
                f"refusing (the extender bound it elsewhere, or the annotation was not written by it)")
    sick = [u for u in pod.assigned_gpus if not by_uuid[u].healthy]
    if sick:
        return f"pod {pod.key} is assigned GPUs that are unhealthy on node {node} ({','.join(sick)}): refusing"
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
