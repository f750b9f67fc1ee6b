"""The agent's device plugin against the kubelet's side of the protocol, over real gRPC on Unix sockets.

Why: the kubelet only ever sees the plugin through api.proto (v1beta1): it must register, list its
devices with their health, and answer Allocate with exactly the GPUs the extender assigned to the
pod, under each device-list strategy, and refuse when it cannot tell the pod. Here a fake kubelet
(its Registration service, built from the vendored proto) takes the registration, and the test is
the kubelet's client of ListAndWatch and Allocate. The GPUs come from the agent's NVML source over a
pynvml-shaped fake (the production code path), the pods as the API server returns them (JSON).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc", reason="grpcio is a serving dependency: `pip install -e .`")

from extender.agent.deviceplugin import api_pb2 as pb  # noqa: E402
from extender.agent.deviceplugin import api_pb2_grpc as pb_grpc  # noqa: E402
from extender.agent.deviceplugin.allocation import bound_pod_from_object  # noqa: E402
from extender.agent.deviceplugin.plugin import DevicePlugin, PluginServer  # noqa: E402
from extender.agent.deviceplugin.settings import PluginSettings  # noqa: E402
from extender.agent.fakenvml import FakeGpu, FakeNvml  # noqa: E402
from extender.agent.nvml import NvmlSource  # noqa: E402

GPU_A = "GPU-0a1b2c3d-0000-4000-8000-00000000000a"
GPU_B = "GPU-0a1b2c3d-0000-4000-8000-00000000000b"
NODE = "gpu-node-1"
RESOURCE = "deepres.io/gpu"
SLOTS = 4


@dataclass
class FakeKubelet(pb_grpc.RegistrationServicer):
    """The kubelet's Registration service: records each RegisterRequest."""

    requests: list[Any] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def Register(self, request: Any, context: Any) -> Any:
        with self.arrived:
            self.requests.append(request)
            self.arrived.notify_all()
        return pb.Empty()

    def wait_for(self, count: int, timeout_s: float = 20.0) -> Any:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.requests) >= count, timeout_s), \
                f"the plugin did not register {count} time(s) within {timeout_s:.0f} s"
            return self.requests[count - 1]


def start_kubelet(folder: Path) -> tuple[Any, FakeKubelet]:
    kubelet = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{folder / 'kubelet.sock'}")
    server.start()
    return server, kubelet


def pod(name: str, gpus: str | None, *, requests: tuple[int, ...] = (1,), phase: str = "Pending",
        running: bool = False, scheduled: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    """A pod as the API server returns it (JSON, Kubernetes casing)."""
    annotations = {"deepres.io/model-type": "cnn"}
    if gpus is not None:
        annotations["deepres.io/assigned-gpus"] = gpus
    containers = [{"name": f"c{i}", "image": "train", "resources": {"limits": {RESOURCE: str(n)}} if n else {}}
                  for i, n in enumerate(requests)]
    status: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]}
    if running:
        status["containerStatuses"] = [{"name": "c0", "state": {"running": {"startedAt": scheduled}}}]
    return {"metadata": {"name": name, "namespace": "jobs", "uid": f"uid-{name}", "annotations": annotations,
                         "creationTimestamp": scheduled},
            "spec": {"nodeName": NODE, "containers": containers}, "status": status}


@dataclass
class ApiPods:
    """The pod lookup fed by the test: pods as JSON, parsed by the plugin's own reader."""

    objects: list[dict[str, Any]] = field(default_factory=list)

    def bound_pods(self) -> list[Any]:
        parsed = [bound_pod_from_object(o, RESOURCE) for o in self.objects]
        return [p for p in parsed if p is not None]


@dataclass
class Harness:
    folder: Path
    kubelet: FakeKubelet
    plugin: DevicePlugin
    server: PluginServer
    pods: ApiPods
    nvml: FakeNvml
    source: NvmlSource
    channel: Any

    @property
    def stub(self) -> Any:
        return pb_grpc.DevicePluginStub(self.channel)

    def sample(self) -> None:
        """One agent round: NVML sampled, the plugin told."""
        self.plugin.update_gpus(self.source.sample().gpus)

    def allocate(self, *sizes: int) -> Any:
        request = pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[f"{GPU_A}::{i}" for i in range(n)]) for n in sizes])
        return self.stub.Allocate(request, timeout=10)


def make_harness(strategy: str) -> Iterator[Harness]:
    folder = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # Unix socket paths must stay short
    kubelet_server, kubelet = start_kubelet(folder)
    nvml = FakeNvml([FakeGpu(uuid=GPU_A), FakeGpu(uuid=GPU_B)])
    source = NvmlSource.open(nvml)
    pods = ApiPods()
    plugin = DevicePlugin(PluginSettings(node=NODE, plugin_dir=str(folder), slots_per_gpu=SLOTS, strategy=strategy,
                                         check_interval_s=0.1), pods)
    plugin.update_gpus(source.sample().gpus)
    server = PluginServer(plugin).start()
    channel = grpc.insecure_channel(f"unix://{server.socket}")
    try:
        yield Harness(folder, kubelet, plugin, server, pods, nvml, source, channel)
    finally:
        channel.close()
        server.stop()
        kubelet_server.stop(0)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["volume-mounts", "cdi", "envvar"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from make_harness(request.param)


@pytest.fixture
def volume_harness() -> Iterator[Harness]:
    yield from make_harness("volume-mounts")


def handed_gpus(response: Any, strategy: str) -> set[str]:
    """The GPUs one container response names, read the way the NVIDIA runtime reads each strategy."""
    if strategy == "envvar":
        assert not response.mounts and not response.cdi_devices
        return set(response.envs["NVIDIA_VISIBLE_DEVICES"].split(","))
    if strategy == "volume-mounts":
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
        assert all(m.host_path == "/dev/null" for m in response.mounts)
        return {m.container_path.removeprefix("/var/run/nvidia-container-devices/") for m in response.mounts}
    assert not response.mounts and "NVIDIA_VISIBLE_DEVICES" not in response.envs
    assert all(d.name.startswith("nvidia.com/gpu=") for d in response.cdi_devices)
    return {d.name.removeprefix("nvidia.com/gpu=") for d in response.cdi_devices}


def first_list(h: Harness) -> tuple[Any, Any]:
    stream = h.stub.ListAndWatch(pb.Empty(), timeout=20)
    return stream, next(stream)


def test_registers_and_lists_slots_of_every_gpu(harness: Harness) -> None:
    request = harness.kubelet.wait_for(1)
    assert request.version == "v1beta1"
    assert request.resource_name == RESOURCE
    assert (harness.folder / request.endpoint) == harness.server.socket and harness.server.socket.exists()
    stream, listed = first_list(harness)
    stream.cancel()
    ids = [d.ID for d in listed.devices]
    assert len(ids) == len(set(ids)) == 2 * SLOTS
    assert {i.split("::")[0] for i in ids} == {GPU_A, GPU_B}
    assert {d.health for d in listed.devices} == {"Healthy"}
    assert all(len(i) <= 63 for i in ids)


def test_allocate_hands_exactly_the_assigned_gpus(harness: Harness) -> None:
    """The kubelet picked slots of GPU A; the pod was assigned GPU B: B, and only B, is handed."""
    strategy = harness.plugin.settings.strategy
    harness.pods.objects = [pod("runs", GPU_A, phase="Running", running=True), pod("job", GPU_B)]
    response = harness.allocate(1)
    assert len(response.container_responses) == 1
    assert handed_gpus(response.container_responses[0], strategy) == {GPU_B}
    # a two-GPU pod gets both
    harness.pods.objects.append(pod("pair", f"{GPU_A},{GPU_B}", requests=(2,)))
    assert handed_gpus(harness.allocate(2).container_responses[0], strategy) == {GPU_A, GPU_B}


def test_unknown_and_ambiguous_requests_are_refused(volume_harness: Harness) -> None:
    h = volume_harness
    with pytest.raises(grpc.RpcError) as unknown:  # no deepres-bound pod on the node
        h.allocate(1)
    assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod on node" in unknown.value.details()

    h.pods.objects = [pod("plain", None), pod("started", GPU_A, running=True, phase="Running")]
    with pytest.raises(grpc.RpcError):  # a pod without assigned GPUs, one already running: neither
        h.allocate(1)

    h.pods.objects = [pod("one", GPU_A), pod("two", GPU_B)]
    with pytest.raises(grpc.RpcError) as ambiguous:
        h.allocate(1)
    assert ambiguous.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "jobs/one" in ambiguous.value.details() and "jobs/two" in ambiguous.value.details()

    h.pods.objects = [pod("big", GPU_A, requests=(2,))]
    with pytest.raises(grpc.RpcError):  # the only pod asks for 2 devices, the container for 1
        h.allocate(1)

    h.pods.objects = [pod("elsewhere", "GPU-ffffffff-0000-4000-8000-000000000000")]
    with pytest.raises(grpc.RpcError) as foreign:  # assigned a GPU this node does not have
        h.allocate(1)
    assert "does not have" in foreign.value.details()


def test_each_container_of_a_pod_is_served_once(volume_harness: Harness) -> None:
    """Two containers of one pod: two Allocates succeed; a third finds no container left to serve."""
    h = volume_harness
    h.pods.objects = [pod("two-containers", GPU_A, requests=(1, 1))]
    assert handed_gpus(h.allocate(1).container_responses[0], "volume-mounts") == {GPU_A}
    assert handed_gpus(h.allocate(1).container_responses[0], "volume-mounts") == {GPU_A}
    with pytest.raises(grpc.RpcError):
        h.allocate(1)


def test_a_gpu_that_goes_unhealthy_in_nvml_is_reported_unhealthy(volume_harness: Harness) -> None:
    h = volume_harness
    stream, listed = first_list(h)
    assert {d.health for d in listed.devices} == {"Healthy"}
    h.nvml.gpus[0].failures["nvmlDeviceGetMemoryInfo"] = "GPU_IS_LOST"
    h.sample()
    update = next(stream)
    health = {d.ID.split("::")[0]: set() for d in update.devices}
    for d in update.devices:
        health[d.ID.split("::")[0]].add(d.health)
    stream.cancel()
    assert health == {GPU_A: {"Unhealthy"}, GPU_B: {"Healthy"}}
    h.pods.objects = [pod("on-lost-gpu", GPU_A)]
    with pytest.raises(grpc.RpcError) as refused:  # never hand a GPU NVML lost
        h.allocate(1)
    assert "unhealthy" in refused.value.details()


def test_registers_again_after_a_kubelet_restart(volume_harness: Harness) -> None:
    """A restarting kubelet removes every plugin socket and opens a new kubelet.sock."""
    h = volume_harness
    h.kubelet.wait_for(1)
    h.server.socket.unlink()
    (h.folder / "kubelet.sock").unlink()
    server, kubelet = start_kubelet(h.folder)
    try:
        request = kubelet.wait_for(1)
        assert request.resource_name == RESOURCE
        assert h.server.socket.exists()
        with grpc.insecure_channel(f"unix://{h.server.socket}") as channel:  # as the kubelet: a new connection
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=20)
            listed = next(stream)
            stream.cancel()
        assert len(listed.devices) == 2 * SLOTS
    finally:
        server.stop(0)
