"""The device plugin's I/O: the gRPC service on a Unix socket in the kubelet's plugin folder, the
registration with the kubelet (and again whenever the kubelet restarts: it then deletes every
plugin socket), and at each `Allocate` the allocation handshake: the pods on this node from the API
server, what the kubelet has allocated from its PodResources API, and the extender's answer (which pod,
which GPUs) through POST /v1/allocate.

The GPUs and their health come from the agent's own sampling rounds (`update_gpus`, NVML in
production): a GPU that NVML reports unhealthy, or that stops being reported, is streamed to the
kubelet as Unhealthy at once, so the kubelet stops counting its slots.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from extender.agent.deviceplugin import API_VERSION, KUBELET_SOCKET, preflight
from extender.agent.deviceplugin import api_pb2 as pb
from extender.agent.deviceplugin import api_pb2_grpc as pb_grpc
from extender.agent.deviceplugin import podresources_pb2 as prpb
from extender.agent.deviceplugin import podresources_pb2_grpc as prpb_grpc
from extender.agent.deviceplugin.allocation import (
    Device,
    check_gpus,
    container_devices,
    devices_of,
    node_pods,
)
from extender.agent.deviceplugin.settings import PluginSettings
from extender.agent.reporter import extender_opener
from extender.pod_requests import NodePod
from extender.telemetry import GpuReport

log = logging.getLogger(__name__)

#: the handshake's path on the extender (extender/server/allocate.py)
ALLOCATE_PATH = "/v1/allocate"


class NodePods(Protocol):
    """The pods of this node as the API server has them now (Allocate must see a pod bound a moment ago)."""

    def pods(self) -> list[dict[str, Any]]:
        ...


class KubeNodePods:
    """Lists this node's pods from the API server (field selector spec.nodeName) at each Allocate."""

    def __init__(self, api: Any, node: str, timeout_s: float = 10.0) -> None:
        self.api, self.node, self.timeout_s = api, node, timeout_s

    def pods(self) -> list[dict[str, Any]]:
        response = self.api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}",
                                                        _preload_content=False, _request_timeout=self.timeout_s)
        items = json.loads(response.data).get("items") or []
        return [item for item in items if isinstance(item, dict)]


class Allocated(Protocol):
    """What the kubelet has allocated of a resource: (namespace, name) of the pods holding some."""

    def allocated(self, resource: str) -> set[tuple[str, str]]:
        ...


class PodResourcesClient:
    """The kubelet's PodResources API (v1 List) on its Unix socket: what it allocated, from its own
    checkpoint, so it holds across agent restarts (as NVIDIA's plugin and dcgm-exporter read it)."""

    def __init__(self, socket: str, timeout_s: float = 5.0) -> None:
        self.socket, self.timeout_s = socket, timeout_s

    def allocated(self, resource: str) -> set[tuple[str, str]]:
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = prpb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            answer = stub.List(prpb.ListPodResourcesRequest(), timeout=self.timeout_s)
        return {(p.namespace, p.name) for p in answer.pod_resources
                if any(d.resource_name == resource and d.device_ids for c in p.containers for d in c.devices)}


class HandshakeRefused(Exception):
    """The extender names no pod for this Allocate (its reason), or cannot be asked."""


@dataclass(frozen=True)
class Served:
    key: str
    gpus: tuple[str, ...]


class Handshake(Protocol):
    def ask(self, node: str, resource: str, size: int, pods: list[NodePod]) -> Served:
        ...


class HttpHandshake:
    """POST /v1/allocate on the extender with the agent's token (the one its reports carry)."""

    def __init__(self, base_url: str, token: Any, timeout_s: float = 5.0, ca_file: str | None = None,
                 attempts: int = 3) -> None:
        self.url = base_url.rstrip("/") + ALLOCATE_PATH
        self.token, self.timeout_s, self.attempts = token, timeout_s, attempts
        self._opener = extender_opener(self.url, ca_file)  # the reports' own: no proxy, the extender's CA

    def ask(self, node: str, resource: str, size: int, pods: list[NodePod]) -> Served:
        body = json.dumps({"node": node, "resource": resource, "size": size, "pods": [
            {"uid": p.uid, "namespace": p.key.partition("/")[0], "name": p.key.partition("/")[2],
             "allocated": p.allocated} for p in pods]}).encode()
        last = ""
        for attempt in range(self.attempts):  # the extender restarting: a few tries, then refuse
            headers = {"Content-Type": "application/json"}
            token = self.token.get()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with self._opener.open(request, timeout=self.timeout_s) as response:
                    answer = json.loads(response.read())
                pod = answer.get("pod") or {}
                gpus = tuple(str(u) for u in answer.get("gpus") or [])
                return Served(f"{pod.get('namespace')}/{pod.get('name')}", gpus)
            except urllib.error.HTTPError as err:
                last = _error_text(err)
                if err.code not in (408, 429, 500, 502, 503, 504):
                    raise HandshakeRefused(f"the extender refused: {last}") from None
            except (OSError, ValueError, AttributeError) as err:
                last = str(getattr(err, "reason", err))
            if attempt + 1 < self.attempts:
                time.sleep(0.5 * (attempt + 1))
        raise HandshakeRefused(f"cannot ask the extender which pod this is ({self.url}): {last}")


def _error_text(err: urllib.error.HTTPError) -> str:
    try:
        decoded = json.loads(err.read() or b"{}")
        return str(decoded.get("error") or f"HTTP {err.code}")[:500]
    except (ValueError, AttributeError, OSError):
        return f"HTTP {err.code}"


class DevicePlugin(pb_grpc.DevicePluginServicer):
    """The DevicePlugin service: ListAndWatch streams the slots and their health, Allocate hands a
    container the GPUs the extender names for the pod being admitted (the allocation handshake)."""

    def __init__(self, settings: PluginSettings, pods: NodePods, allocated: Allocated, handshake: Handshake) -> None:
        self.settings = settings
        self.pods = pods
        self.allocated = allocated
        self.handshake = handshake
        self._changed = threading.Condition()
        self._devices: tuple[Device, ...] = ()
        self._known: dict[str, bool] = {}  # GPU uuid -> healthy, every GPU ever seen (in order)
        self._version = 0
        self._allocate_lock = threading.Lock()
        self._stopping = threading.Event()
        self.outcomes: dict[str, int] = {"served": 0, "refused": 0}

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
        with self._allocate_lock:  # the kubelet admits one pod at a time; so does the plugin
            for container in request.container_requests:
                size = len(container.devices_ids)
                try:
                    pods = node_pods(self.pods.pods(), s.resource, self.allocated.allocated(s.resource))
                except Exception as err:
                    self.outcomes["refused"] += 1
                    log.warning("Allocate refused: cannot read the pods of node %s or the kubelet's allocations: %s",
                                s.node, err)
                    context.abort(grpc.StatusCode.UNAVAILABLE,
                                  f"cannot read the pods of node {s.node} or the kubelet's allocations: {err}")
                    raise AssertionError("unreachable") from err  # abort raises
                try:
                    served = self.handshake.ask(s.node, s.resource, size, pods)
                except HandshakeRefused as err:
                    _refuse(context, str(err), self.outcomes)
                    raise AssertionError("unreachable") from err
                error = check_gpus(served.key, served.gpus, self.devices(), s.node)
                if error:
                    _refuse(context, error, self.outcomes)
                    raise AssertionError("unreachable")
                self.outcomes["served"] += 1
                handed = container_devices(served.gpus, s.strategy, s.cdi_kind)
                log.info("Allocate pod=%s gpus=%s strategy=%s (kubelet slots %s)", served.key, ",".join(served.gpus),
                         s.strategy, ",".join(container.devices_ids))
                responses.append(pb.ContainerAllocateResponse(
                    envs=dict(handed.envs), annotations=dict(handed.annotations),
                    mounts=[pb.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in handed.mounts],
                    cdi_devices=[pb.CDIDevice(name=n) for n in handed.cdi_devices]))
        return pb.AllocateResponse(container_responses=responses)


class Preflight:
    """The node-setup check (deviceplugin/preflight.py) with its I/O: the toolkit's config file, the
    CDI spec folders, this node's allocatable resources. Re-read every `every_s` (another plugin may be
    installed later, the toolkit reconfigured); on a change of verdict: a log line, the metric, an Event."""

    def __init__(self, settings: PluginSettings, *, simulated: bool, read_allocatable: Callable[[], dict[str, Any]],
                 toolkit_path: str, cdi_dirs: Sequence[str], on_change: Callable[[list[str]], None],
                 every_s: float = 30.0, mono: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.simulated = settings, simulated
        self.read_allocatable, self.toolkit_path, self.cdi_dirs = read_allocatable, toolkit_path, cdi_dirs
        self.on_change, self.every_s, self.mono = on_change, every_s, mono
        self._checked_s = -math.inf
        self.problems: list[str] | None = None

    def check(self) -> list[str]:
        now = self.mono()
        if self.problems is not None and now - self._checked_s < self.every_s:
            return self.problems
        self._checked_s = now
        try:
            allocatable = self.read_allocatable()
        except Exception as err:  # not a verdict on the node: keep the last one (none yet: wait)
            log.warning("device plugin preflight: cannot read node %s: %s", self.settings.node, err)
            return self.problems if self.problems is not None else [f"cannot read node {self.settings.node}: {err}"]
        found = preflight.problems(self.settings.strategy, simulated=self.simulated, allocatable=allocatable,
                                   toolkit_path=self.toolkit_path, toolkit_config=_read_text(self.toolkit_path),
                                   cdi_kinds=_cdi_kinds(self.cdi_dirs), cdi_kind=self.settings.cdi_kind)
        if found != self.problems:
            for problem in found:
                log.error("device plugin not advertising %s on node %s: %s", self.settings.resource,
                          self.settings.node, problem)
            if not found and self.problems:
                log.info("device plugin preflight passed on node %s: advertising %s", self.settings.node,
                         self.settings.resource)
            self.problems = found
            self.on_change(found)
        return found


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cdi_kinds(folders: Sequence[str]) -> set[str]:
    """The kinds the CDI specs in `folders` declare (YAML or JSON files, `kind: vendor/class`)."""
    import yaml

    kinds = set()
    for folder in folders:
        with contextlib.suppress(OSError):
            for path in sorted(Path(folder).iterdir())[:200]:
                if path.suffix not in (".yaml", ".yml", ".json") or not path.is_file():
                    continue
                try:
                    spec = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace")[:1_000_000])
                except (OSError, yaml.YAMLError):
                    continue
                if isinstance(spec, dict) and isinstance(spec.get("kind"), str):
                    kinds.add(spec["kind"])
    return kinds


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
        self.preflight: Preflight | None = None

    def serve(self) -> None:
        """(Re)start the gRPC server on the socket."""
        if self._server is not None:
            # wait: a gRPC server's shutdown runs on, and removes its socket's path when done, which
            # would be the new server's socket by then (seen: registered, then no socket)
            self._server.stop(0).wait(5.0)
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
        """One check: serve and register again if the socket or the kubelet changed; True when registered.
        While the node's setup cannot isolate GPUs (the preflight), nothing is served: the kubelet then
        stops counting the resource on this node."""
        if self.preflight is not None and self.preflight.check():
            if self._server is not None:
                self._server.stop(0).wait(5.0)
                self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
            self._kubelet_id = None
            return False
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


def _refuse(context: Any, message: str, outcomes: dict[str, int]) -> None:
    outcomes["refused"] += 1
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
