"""The device plugin's I/O: the gRPC service on a Unix socket in the kubelet's plugin folder, the
registration with the kubelet (and again whenever the kubelet restarts: it then deletes every
plugin socket), and the pods on this node from the API server.

The GPUs and their health come from the agent's own sampling rounds (`update_gpus`, NVML in
production): a GPU that NVML reports unhealthy, or that stops being reported, is streamed to the
kubelet as Unhealthy at once, so the kubelet stops counting its slots.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, Protocol

import grpc

from extender.agent.deviceplugin import API_VERSION, KUBELET_SOCKET, RESOURCE_NAME
from extender.agent.deviceplugin import api_pb2 as pb
from extender.agent.deviceplugin import api_pb2_grpc as pb_grpc
from extender.agent.deviceplugin.allocation import (
    BoundPod,
    Device,
    Served,
    bound_pod_from_object,
    check_gpus,
    choose_pod,
    container_devices,
    devices_of,
)
from extender.agent.deviceplugin.settings import PluginSettings
from extender.telemetry import GpuReport

log = logging.getLogger(__name__)


class BoundPods(Protocol):
    """The deepres-bound pods on this node, read now (Allocate must see a pod bound a moment ago)."""

    def bound_pods(self) -> list[BoundPod]:
        ...


class KubeBoundPods:
    """Lists this node's pods from the API server (field selector spec.nodeName) at each Allocate."""

    def __init__(self, api: Any, node: str, resource: str = RESOURCE_NAME, timeout_s: float = 10.0) -> None:
        self.api, self.node, self.resource, self.timeout_s = api, node, resource, timeout_s

    def bound_pods(self) -> list[BoundPod]:
        response = self.api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}",
                                                        _preload_content=False, _request_timeout=self.timeout_s)
        items = json.loads(response.data).get("items") or []
        pods = [bound_pod_from_object(item, self.resource) for item in items if isinstance(item, dict)]
        return [p for p in pods if p is not None]


class DevicePlugin(pb_grpc.DevicePluginServicer):
    """The DevicePlugin service: ListAndWatch streams the slots and their health, Allocate hands a
    container its pod's assigned GPUs."""

    def __init__(self, settings: PluginSettings, pods: BoundPods) -> None:
        self.settings = settings
        self.pods = pods
        self._changed = threading.Condition()
        self._devices: tuple[Device, ...] = ()
        self._known: dict[str, bool] = {}  # GPU uuid -> healthy, every GPU ever seen (in order)
        self._version = 0
        self._served = Served()
        self._allocate_lock = threading.Lock()
        self._stopping = threading.Event()

    # ---- devices ----
    def update_gpus(self, gpus: Sequence[GpuReport]) -> None:
        """A sampling round's GPUs; one that is no longer reported stays listed, as Unhealthy."""
        seen = {g.uuid: g.healthy for g in gpus}
        known = {uuid: seen.get(uuid, False) for uuid in self._known}
        known.update(seen)
        if known == self._known and self._version:
            return
        for uuid, healthy in known.items():
            if self._known.get(uuid, True) and not healthy:
                log.warning("GPU %s is unhealthy: its %d %s slots are reported Unhealthy", uuid,
                            self.settings.slots_per_gpu, self.settings.resource)
        with self._changed:
            self._known = known
            self._devices = devices_of(known.items(), self.settings.slots_per_gpu)
            self._version += 1
            self._changed.notify_all()

    def devices(self) -> tuple[Device, ...]:
        with self._changed:
            return self._devices

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()

    # ---- the service ----
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        sent = -1
        while not self._stopping.is_set() and context.is_active():
            with self._changed:
                if self._version == sent:
                    self._changed.wait(1.0)
                    continue
                sent, devices = self._version, self._devices
            yield pb.ListAndWatchResponse(devices=[pb.Device(ID=d.id, health=d.health) for d in devices])

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return pb.PreferredAllocationResponse()

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()

    def Allocate(self, request: Any, context: Any) -> Any:
        s = self.settings
        responses = []
        with self._allocate_lock:  # one decision at a time: two containers must not both take one pod's turn
            try:
                pods = self.pods.bound_pods()
            except Exception as err:
                log.warning("Allocate refused: cannot list the pods of node %s: %s", s.node, err)
                context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot list the pods of node {s.node}: {err}")
                raise AssertionError("unreachable") from err  # abort raises
            self._served.forget_except(p.uid for p in pods)
            devices = self.devices()
            for container in request.container_requests:
                size = len(container.devices_ids)
                choice = choose_pod(pods, size, self._served, s.node, s.resource)
                pod = choice.pod
                error = choice.error if pod is None else check_gpus(pod, devices, s.node)
                if pod is None or error:
                    _refuse(context, error)
                    raise AssertionError("unreachable")  # abort raises
                self._served.add(pod, size)
                handed = container_devices(pod.assigned_gpus, s.strategy, s.cdi_kind)
                log.info("Allocate pod=%s gpus=%s strategy=%s (kubelet slots %s)", pod.key, ",".join(pod.assigned_gpus),
                         s.strategy, ",".join(container.devices_ids))
                responses.append(pb.ContainerAllocateResponse(
                    envs=dict(handed.envs), annotations=dict(handed.annotations),
                    mounts=[pb.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in handed.mounts],
                    cdi_devices=[pb.CDIDevice(name=n) for n in handed.cdi_devices]))
        return pb.AllocateResponse(container_responses=responses)


class PluginServer:
    """Serves a DevicePlugin on `<plugin_dir>/<socket_name>` and keeps it registered with the kubelet:
    when the socket disappears or the kubelet's socket is new (a kubelet restart), it serves again and
    registers again."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin
        s = plugin.settings
        self.socket = Path(s.plugin_dir) / s.socket_name
        self.kubelet_socket = Path(s.plugin_dir) / KUBELET_SOCKET
        self._server: Any = None
        self._kubelet_id: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registrations = 0

    def serve(self) -> None:
        """(Re)start the gRPC server on the socket."""
        if self._server is not None:
            self._server.stop(0)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="deviceplugin"))
        pb_grpc.add_DevicePluginServicer_to_server(self.plugin, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def register(self, timeout_s: float = 10.0) -> None:
        """Register with the kubelet; raises grpc.RpcError when it refuses or does not answer."""
        s = self.plugin.settings
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            stub.Register(pb.RegisterRequest(version=API_VERSION, endpoint=s.socket_name, resource_name=s.resource,
                                             options=pb.DevicePluginOptions()), timeout=timeout_s)
        self._kubelet_id = _file_id(self.kubelet_socket)
        self.registrations += 1
        log.info("device plugin registered with the kubelet: resource=%s endpoint=%s slots_per_gpu=%d strategy=%s",
                 s.resource, self.socket, s.slots_per_gpu, s.strategy)

    def ensure(self) -> bool:
        """One check: serve and register again if the socket or the kubelet changed; True when registered."""
        if not self.socket.exists() or self._server is None:
            self.serve()
            self._kubelet_id = None
        kubelet = _file_id(self.kubelet_socket)
        if kubelet is None:
            return False
        if kubelet != self._kubelet_id:
            try:
                self.register()
            except grpc.RpcError as err:
                log.warning("device plugin registration failed (%s); trying again", _rpc_text(err))
                return False
        return True

    def start(self) -> PluginServer:
        self.ensure()
        self._thread = threading.Thread(target=self._run, name="deviceplugin-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.plugin.settings.check_interval_s):
            try:
                self.ensure()
            except Exception:  # keep watching: a failed round is retried at the next check
                log.exception("device plugin check failed")

    def stop(self) -> None:
        self._stop.set()
        self.plugin.stop()
        if self._server is not None:
            self._server.stop(1.0).wait(2.0)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        if self._thread is not None:
            self._thread.join(5.0)


def _refuse(context: Any, message: str) -> None:
    log.warning("Allocate refused: %s", message)
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _rpc_text(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    return str(details() if callable(details) else err)
