"""The agent's device plugin between the kubelet's side of the protocol and the real extender.

Why: the kubelet sees the plugin only through api.proto (v1beta1): it must register, list its devices
with their health, and answer Allocate with exactly the GPUs the extender assigned to the pod being
admitted. `Allocate` names slots, never the pod, so the plugin asks the extender (the allocation
handshake, POST /v1/allocate) with what the kubelet's PodResources API says it allocated. Here:

- the extender is the real app (`create_app`, the production verbs and /v1/allocate) over real HTTP on
  loopback, its cluster an in-memory API server whose Bindings leave pods Pending as the real one does;
- a fake kubelet on Unix sockets: its Registration and PodResources services from the vendored protos,
  and the test plays its admission loop (one pod at a time, in an order the test picks: the kubelet's
  order is not the bind order), recording in PodResources what each Allocate handed out;
- the GPUs come from the agent's NVML source over a pynvml-shaped fake (the production code path).
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

grpc = pytest.importorskip("grpc", reason="grpcio is a serving dependency: `pip install -e .`")

from extender.agent.deviceplugin import api_pb2 as pb  # noqa: E402
from extender.agent.deviceplugin import api_pb2_grpc as pb_grpc  # noqa: E402
from extender.agent.deviceplugin import podresources_pb2 as prpb  # noqa: E402
from extender.agent.deviceplugin import podresources_pb2_grpc as prpb_grpc  # noqa: E402
from extender.agent.deviceplugin.plugin import (  # noqa: E402
    DevicePlugin,
    HttpHandshake,
    PluginServer,
    PodResourcesClient,
)
from extender.agent.deviceplugin.settings import PluginSettings  # noqa: E402
from extender.agent.fakenvml import FakeGpu, FakeNvml  # noqa: E402
from extender.agent.nvml import NvmlSource  # noqa: E402
from extender.kube.local import InMemoryCluster  # noqa: E402
from extender.server.app import create_app, extender_of  # noqa: E402
from extender.settings import Settings  # noqa: E402
from tests.fixtures.kube.doubles import FormulaPredictor  # noqa: E402
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, report  # noqa: E402

NODE = "gpu-node-1"
GPUS = [f"{NODE}-gpu{i}" for i in range(8)]  # the report fixture's UUIDs
GPU_A, GPU_B = GPUS[0], GPUS[1]
RESOURCE = "deepres.io/gpu"
SLOTS = 16
TOKEN = "shared-agent-token"
NOW = 1_800_000_000.0


class StaticToken:
    def get(self) -> str:
        return TOKEN


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


class FakePodResources(prpb_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources List: what its device manager handed each admitted pod's containers."""

    def __init__(self) -> None:
        self.allocations: dict[tuple[str, str], dict[str, list[str]]] = {}  # (ns, name) -> container -> ids
        self.lock = threading.Lock()

    def record(self, namespace: str, name: str, container: str, ids: list[str]) -> None:
        with self.lock:
            self.allocations.setdefault((namespace, name), {})[container] = ids

    def List(self, request: Any, context: Any) -> Any:
        with self.lock:
            return prpb.ListPodResourcesResponse(pod_resources=[
                prpb.PodResources(namespace=ns, name=name, containers=[
                    prpb.ContainerResources(name=c, devices=[prpb.ContainerDevices(resource_name=RESOURCE,
                                                                                   device_ids=ids)])
                    for c, ids in containers.items()])
                for (ns, name), containers in self.allocations.items()])


def start_kubelet(folder: Path, podresources: FakePodResources | None = None) -> tuple[Any, FakeKubelet]:
    kubelet = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{folder / 'kubelet.sock'}")
    server.start()
    if podresources is not None:
        pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prpb_grpc.add_PodResourcesListerServicer_to_server(podresources, pr_server)
        pr_server.add_insecure_port(f"unix://{folder / 'pod-resources.sock'}")
        pr_server.start()
        server.pr_server = pr_server  # kept alive with the kubelet's
    return server, kubelet


def gpu_pod(name: str, *, requests: tuple[int, ...] = (1,), init: tuple[int, ...] = (),
            annotations: dict[str, str] | None = None, namespace: str = "jobs") -> dict[str, Any]:
    """A pod as the chart's mutation leaves it: the job's annotations, the deepres scheduler, a request
    of the resource on each container (and init container) that asks for one."""
    def containers(prefix: str, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
        return [{"name": f"{prefix}{i}", "image": "train",
                 "resources": {"limits": {RESOURCE: str(n)}, "requests": {RESOURCE: str(n)}} if n else {}}
                for i, n in enumerate(sizes)]
    spec: dict[str, Any] = {"schedulerName": "deepres-scheduler", "containers": containers("c", requests)}
    if init:
        spec["initContainers"] = containers("init", init)
    gpus = max(requests + init)
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1",
            "creationTimestamp": "2027-01-15T08:00:00Z",
            "annotations": {**CNN_ANNOTATIONS, "deepres.io/gpus": str(gpus), **(annotations or {})}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


class ApiServer(InMemoryCluster):
    """The extender's cluster and the plugin's pod list in one: a Binding leaves the pod Pending (the
    kubelet, not the Binding, moves it), as the real API server does."""

    def __init__(self) -> None:
        super().__init__(learn_pods=False)
        self.bound_phase = "Pending"

    def node_pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(p) for p in self.pods.values() if (p.get("spec") or {}).get("nodeName") == NODE]

    def set_status(self, namespace: str, name: str, **status: Any) -> None:
        with self._lock:
            self.pods[(namespace, name)].setdefault("status", {}).update(status)
        if self._handlers is not None:
            self._handlers.pod_changed(self.get_pod(namespace, name) or {}, False)


class NodePodsOf:
    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def pods(self) -> list[dict[str, Any]]:
        return self.api.node_pods()


@dataclass
class Harness:
    folder: Path
    kubelet: FakeKubelet
    podresources: FakePodResources
    plugin: DevicePlugin
    server: PluginServer
    api: ApiServer
    nvml: FakeNvml
    source: NvmlSource
    channel: Any
    url: str
    strategy: str
    ext: Any = None
    bind_errors: list[str] = field(default_factory=list)

    @property
    def stub(self) -> Any:
        return pb_grpc.DevicePluginStub(self.channel)

    def sample(self) -> None:
        """One agent round: NVML sampled, the plugin told."""
        self.plugin.update_gpus(self.source.sample().gpus)

    def schedule(self, body: dict[str, Any]) -> str:
        """kube-scheduler's cycle for one pod, over HTTP: filter, then bind to the node ('' or the error)."""
        def post(path: str, payload: Any) -> Any:
            req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=30) as answer:
                return json.loads(answer.read())
        self.api.add_pod(body)
        filtered = post("/filter", extender_args(body, names=[NODE]))
        if NODE not in (filtered.get("NodeNames") or []):
            return f"filtered out: {filtered}"
        return str(post("/bind", binding_args(body, NODE)).get("Error") or "")

    def admit(self, body: dict[str, Any]) -> list[set[str]]:
        """The kubelet admits one pod: one Allocate per container requesting the resource (init containers
        first), slots of its own choosing; records what it handed in PodResources; then writes the pod's
        status. Returns the GPUs each container was handed; raises grpc.RpcError when one is refused (the
        kubelet then fails the pod: UnexpectedAdmissionError)."""
        meta, spec = body["metadata"], body["spec"]
        handed = []
        for group in ("initContainers", "containers"):
            for c in spec.get(group) or []:
                n = int((c.get("resources") or {}).get("limits", {}).get(RESOURCE, 0))
                if not n:
                    continue
                ids = [f"{GPU_A}::{i}" for i in range(n)]
                try:
                    response = self.stub.Allocate(pb.AllocateRequest(container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=30)
                except grpc.RpcError:
                    self.api.set_status(meta["namespace"], meta["name"], phase="Failed",
                                        reason="UnexpectedAdmissionError")
                    raise
                self.podresources.record(meta["namespace"], meta["name"], c["name"], ids)
                handed.append(handed_gpus(response.container_responses[0], self.strategy))
        self.api.set_status(meta["namespace"], meta["name"], containerStatuses=[
            {"name": c["name"], "state": {"waiting": {"reason": "ContainerCreating"}}} for c in spec["containers"]])
        return handed

    def assigned(self, body: dict[str, Any]) -> set[str]:
        """What the extender's Binding wrote on the pod."""
        stored = self.api.get_pod(body["metadata"]["namespace"], body["metadata"]["name"]) or {}
        value = (stored["metadata"].get("annotations") or {}).get("deepres.io/assigned-gpus", "")
        return {u for u in value.split(",") if u}

    def bound(self, body: dict[str, Any]) -> bool:
        stored = self.api.get_pod(body["metadata"]["namespace"], body["metadata"]["name"]) or {}
        return bool((stored.get("spec") or {}).get("nodeName"))

    def restart_plugin(self) -> None:
        """The agent restarts (rollout, OOM kill): a new plugin with nothing in memory."""
        self.server.stop()
        self.plugin = new_plugin(self.folder, self.url, self.api, self.strategy)
        self.plugin.update_gpus(self.source.sample().gpus)
        self.server = PluginServer(self.plugin).start()
        self.channel.close()
        self.channel = grpc.insecure_channel(f"unix://{self.server.socket}")


def new_plugin(folder: Path, url: str, api: ApiServer, strategy: str) -> DevicePlugin:
    return DevicePlugin(PluginSettings(node=NODE, plugin_dir=str(folder), slots_per_gpu=SLOTS, strategy=strategy,
                                       check_interval_s=0.1),
                        NodePodsOf(api), PodResourcesClient(str(folder / "pod-resources.sock")),
                        HttpHandshake(url, StaticToken(), timeout_s=30))


def make_harness(strategy: str) -> Iterator[Harness]:
    folder = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # Unix socket paths must stay short
    podresources = FakePodResources()
    kubelet_server, kubelet = start_kubelet(folder, podresources)
    settings = Settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = TOKEN
    settings.policy.sharing = False
    settings.kube.allocation_wait_s = 20.0
    api = ApiServer()
    app = create_app(settings, predictor=FormulaPredictor(), clock=lambda: NOW, cluster=api)
    http = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{http.server_port}"
    status, _ = extender_of(app).telemetry(report(NODE, 1, NOW, [(81920.0, 0.0)] * len(GPUS)), "")
    assert status == 200
    nvml = FakeNvml([FakeGpu(uuid=u) for u in GPUS])
    source = NvmlSource.open(nvml)
    plugin = new_plugin(folder, url, api, strategy)
    plugin.update_gpus(source.sample().gpus)
    server = PluginServer(plugin).start()
    channel = grpc.insecure_channel(f"unix://{server.socket}")
    h = Harness(folder, kubelet, podresources, plugin, server, api, nvml, source, channel, url, strategy,
                extender_of(app))
    try:
        yield h
    finally:
        h.channel.close()
        h.server.stop()
        http.shutdown()
        kubelet_server.stop(0)
        kubelet_server.pr_server.stop(0)
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
    assert len(ids) == len(set(ids)) == len(GPUS) * SLOTS
    assert {i.split("::")[0] for i in ids} == set(GPUS)
    assert {d.health for d in listed.devices} == {"Healthy"}
    assert all(len(i) <= 63 for i in ids)


def burst(h: Harness, bodies: list[dict[str, Any]], seed: int, restart_after: int = -1) -> dict[str, list[set[str]]]:
    """kube-scheduler binds every pod at once (one thread each, as its binding goroutines); the kubelet
    admits the bound pods one at a time, picking among those bound and not admitted at random."""
    errors: dict[str, str] = {}

    def bind(body: dict[str, Any]) -> None:
        errors[body["metadata"]["name"]] = h.schedule(body)

    threads = [threading.Thread(target=bind, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    rng = random.Random(seed)
    handed: dict[str, list[set[str]]] = {}
    deadline = time.monotonic() + 120
    while len(handed) < len(bodies) and time.monotonic() < deadline:
        ready = [b for b in bodies if b["metadata"]["name"] not in handed and h.bound(b)]
        if not ready:
            if all(not t.is_alive() for t in threads) and len(handed) + sum(1 for e in errors.values() if e) \
                    >= len(bodies):
                break
            time.sleep(0.01)  # polling the in-memory API server, as a kubelet's watch would deliver
            continue
        body = rng.choice(ready)
        handed[body["metadata"]["name"]] = h.admit(body)
        if len(handed) == restart_after:
            h.restart_plugin()
    for t in threads:
        t.join(60)
    assert not any(errors.values()), errors
    return handed


@pytest.mark.parametrize("seed", [0, 1])
def test_a_burst_to_one_node_gets_every_pod_exactly_its_gpus(harness: Harness, seed: int) -> None:
    """8 one-GPU pods and 2 two-GPU pods bound to one node at once, admitted in another order than
    bound: every container gets exactly its pod's assigned GPUs (before the handshake, pods bound to
    one node before the first Allocate could not be told apart: 7 of 8 refused)."""
    bodies = [gpu_pod(f"one-{i}") for i in range(8)] + [gpu_pod(f"two-{i}", requests=(2,)) for i in range(2)]
    handed = burst(harness, bodies, seed)
    assert len(handed) == len(bodies)
    for body in bodies:
        name = body["metadata"]["name"]
        assigned = harness.assigned(body)
        assert len(assigned) == (2 if name.startswith("two") else 1)
        assert handed[name] == [assigned], name
    assert harness.plugin.outcomes == {"served": len(bodies), "refused": 0}


def test_an_init_container_requesting_the_gpu_gets_it_and_so_does_the_app_container(volume_harness: Harness) -> None:
    h = volume_harness
    body = gpu_pod("with-init", init=(1,))
    assert h.schedule(body) == ""
    handed = h.admit(body)
    assert handed == [h.assigned(body), h.assigned(body)]


def test_an_agent_restart_mid_burst_serves_no_pod_twice(volume_harness: Harness) -> None:
    """The plugin restarts after 3 of 6 pods were admitted: the rest are served, each exactly its GPUs,
    and an Allocate no pod awaits (the kubelet repeating an admitted pod's) is refused, not served
    with another pod's GPUs."""
    h = volume_harness
    bodies = [gpu_pod(f"p{i}") for i in range(6)]
    handed = burst(h, bodies, seed=3, restart_after=3)
    for body in bodies:
        assert handed[body["metadata"]["name"]] == [h.assigned(body)]
    with pytest.raises(grpc.RpcError) as again:
        h.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[f"{GPU_A}::0"])]), timeout=30)
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod that deepres bound" in again.value.details()


@pytest.mark.parametrize("how", ["default-scheduler", "own-annotation"])
def test_a_pod_deepres_did_not_bind_gets_no_gpu_and_deepres_pods_keep_theirs(volume_harness: Harness,
                                                                              how: str) -> None:
    """A pod placed on the node without deepres (the default scheduler with a nodeSelector, or one that
    writes its own `assigned-gpus`) is refused at Allocate, even while a deepres pod awaits its GPUs;
    a deepres pod admitted after it is served its own."""
    h = volume_harness
    running = gpu_pod("running")
    assert h.schedule(running) == ""
    assert h.admit(running) == [h.assigned(running)]
    foreign = gpu_pod("foreign", namespace="other",
                      annotations={"deepres.io/assigned-gpus": ",".join(h.assigned(running))}
                      if how == "own-annotation" else None)
    foreign["spec"]["schedulerName"] = "default-scheduler"
    foreign["spec"]["nodeName"] = NODE
    h.api.add_pod(foreign)
    with pytest.raises(grpc.RpcError) as refused:
        h.admit(foreign)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "did not bind" in refused.value.details() or "no pod that deepres bound" in refused.value.details()
    later = gpu_pod("later")
    assert h.schedule(later) == ""
    assert h.admit(later) == [h.assigned(later)]


def test_while_a_foreign_pod_waits_no_allocate_is_guessed(volume_harness: Harness) -> None:
    """A foreign pod not yet admitted beside a deepres pod awaiting its GPUs: the Allocate could be for
    either, so it is refused (never served to the foreign pod); once the foreign pod is gone, the deepres
    pod is served."""
    h = volume_harness
    foreign = gpu_pod("foreign", namespace="other")
    foreign["spec"]["schedulerName"] = "default-scheduler"
    foreign["spec"]["nodeName"] = NODE
    h.api.add_pod(foreign)
    waiting = gpu_pod("waiting")
    assert h.schedule(waiting) == ""
    with pytest.raises(grpc.RpcError) as refused:
        h.admit(foreign)
    assert "did not bind" in refused.value.details()
    h.api.delete_pod("other", "foreign")
    assert h.admit(waiting) == [h.assigned(waiting)]


def test_a_gpu_the_node_does_not_have_or_a_wrong_size_is_refused(volume_harness: Harness) -> None:
    h = volume_harness
    body = gpu_pod("pair", requests=(2,))
    assert h.schedule(body) == ""
    with pytest.raises(grpc.RpcError) as wrong:  # the kubelet asks for 1 slot; the pod's container asks for 2
        h.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[f"{GPU_A}::0"])]), timeout=30)
    assert "requests 2" in wrong.value.details()


def test_a_gpu_that_goes_unhealthy_in_nvml_is_reported_unhealthy(volume_harness: Harness) -> None:
    h = volume_harness
    body = gpu_pod("on-lost-gpu")
    assert h.schedule(body) == ""
    (lost,) = h.assigned(body)
    stream, listed = first_list(h)
    assert {d.health for d in listed.devices} == {"Healthy"}
    h.nvml.gpus[GPUS.index(lost)].failures["nvmlDeviceGetMemoryInfo"] = "GPU_IS_LOST"
    h.sample()
    update = next(stream)
    health: dict[str, set[str]] = {d.ID.split("::")[0]: set() for d in update.devices}
    for d in update.devices:
        health[d.ID.split("::")[0]].add(d.health)
    stream.cancel()
    assert health == {u: {"Unhealthy"} if u == lost else {"Healthy"} for u in GPUS}
    with pytest.raises(grpc.RpcError) as refused:  # never hand a GPU NVML lost
        h.admit(body)
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
        assert len(listed.devices) == len(GPUS) * SLOTS
    finally:
        server.stop(0)


def test_a_pod_bound_before_a_kubelet_restart_is_served_after_it(volume_harness: Harness) -> None:
    """The kubelet restarts between a pod's Binding and its admission (it deletes every plugin socket;
    the plugin serves and registers again): the pod is then admitted with exactly its GPUs."""
    h = volume_harness
    h.kubelet.wait_for(1)
    body = gpu_pod("across-restart")
    assert h.schedule(body) == ""
    h.server.socket.unlink()
    (h.folder / "kubelet.sock").unlink()
    server, kubelet = start_kubelet(h.folder)
    try:
        kubelet.wait_for(1)
        h.channel.close()
        h.channel = grpc.insecure_channel(f"unix://{h.server.socket}")
        assert h.admit(body) == [h.assigned(body)]
    finally:
        server.stop(0)


def wait_until(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.05)


def test_the_plugin_does_not_advertise_while_the_node_cannot_isolate(volume_harness: Harness) -> None:
    """NVIDIA's plugin advertises the same GPUs on the node, then the toolkit setting is off: the plugin
    stops serving (the kubelet sees its endpoint go), says why; once the setup is right it registers again."""
    from extender.agent.deviceplugin.plugin import Preflight

    h = volume_harness
    h.kubelet.wait_for(1)
    toolkit = h.folder / "config.toml"
    toolkit.write_text("accept-nvidia-visible-devices-as-volume-mounts = true\n")
    allocatable = {"cpu": "8", "nvidia.com/gpu": "8"}
    verdicts: list[list[str]] = []
    h.server.preflight = Preflight(h.plugin.settings, simulated=False, read_allocatable=lambda: dict(allocatable),
                                   toolkit_path=str(toolkit), cdi_dirs=[], on_change=verdicts.append, every_s=0)
    wait_until(lambda: not h.server.socket.exists(), "the plugin to stop serving")
    assert "another device plugin" in verdicts[-1][0] and "nvidia.com/gpu (8)" in verdicts[-1][0]
    del allocatable["nvidia.com/gpu"]
    toolkit.write_text("accept-nvidia-visible-devices-as-volume-mounts = false\n")
    wait_until(lambda: verdicts[-1] and "needs accept-nvidia-visible-devices-as-volume-mounts" in verdicts[-1][0],
               "the toolkit setting to be named")
    assert not h.server.socket.exists()
    toolkit.write_text("accept-nvidia-visible-devices-as-volume-mounts = true\n")
    h.kubelet.wait_for(2)  # registered again
    assert verdicts[-1] == [] and h.server.socket.exists()


def test_a_late_event_of_an_earlier_attempt_does_not_open_the_gate(volume_harness: Harness) -> None:
    """kube-scheduler's status update after a failed bind (no nodeName, PodScheduled False) may reach the
    watch after the pod's next bind took the gate: the gate stays held, so the next pod's bind to that node
    waits, and the kubelet is never left with two pods to tell apart (seen in a 64-pod burst on the real
    node before the fix: both refused)."""
    h = volume_harness
    first = gpu_pod("first")
    assert h.schedule(first) == ""
    assert [p.key for p in h.ext.gate.pending(NODE)] == ["jobs/first"]
    stale = copy.deepcopy(first)
    stale["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                           "reason": "SchedulerError"}]}
    h.ext.on_pod_changed(stale, False)
    assert [p.key for p in h.ext.gate.pending(NODE)] == ["jobs/first"]
    assert h.admit(first) == [h.assigned(first)]
    assert h.ext.gate.pending(NODE) == []
