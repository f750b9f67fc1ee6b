"""The allocation handshake's rule and gate, and the device plugin's pure parts: which pod an Allocate
is for, and what each strategy hands over.

Why: the kubelet names device IDs, never the pod; a wrong guess hands one pod's GPUs to another.
Table-driven; pods as the API server returns them (JSON).
"""

from __future__ import annotations

import argparse
import importlib.util
import threading
from typing import Any

import pytest

from extender.agent.deviceplugin.allocation import (
    check_gpus,
    container_devices,
    devices_of,
    node_pods,
)
from extender.allocations import AllocationGate
from extender.pod_requests import NodePod, allocation_sizes
from extender.policy.allocation import Pending, decide

RES = "deepres.io/gpu"
A, B = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"


def api_pod(name: str, requests: tuple[int, ...] = (1,), *, init: tuple[int, ...] = (), phase: str = "Pending",
            started: bool = False, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if started:
        status["containerStatuses"] = [{"name": "c0", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    def containers(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
        return [{"name": f"c{i}", "resources": {"limits": {RES: str(n)}} if n else {}} for i, n in enumerate(sizes)]
    return {"metadata": meta, "spec": {"containers": containers(requests), "initContainers": containers(init)},
            "status": status}


def pending(uid: str, sizes: tuple[int, ...] = (1,), served: int = 0, gpus: tuple[str, ...] = (A,)) -> Pending:
    return Pending(uid, f"ns/{uid}", gpus, sizes, served)


def node_pod(uid: str, allocated: bool = False) -> NodePod:
    return NodePod(uid, f"ns/{uid}", allocated)


def who(size: int, gate: list[Pending], pods: list[NodePod], done: tuple[str, ...] = ()) -> str:
    d = decide("n", RES, size, gate, pods, done)
    return d.pod.uid if d.pod else "REFUSED: " + d.error


@pytest.mark.parametrize(("size", "gate", "pods", "expected"), [
    (1, [pending("p")], [node_pod("p")], "p"),
    (2, [pending("p", (2,))], [node_pod("p")], "p"),
    (1, [pending("p", (2,))], [node_pod("p")], "REFUSED: Allocate asks for 1"),  # not what its container asks
    (1, [], [node_pod("p")], "REFUSED: pods on node n request"),  # a pod deepres did not bind
    (1, [], [], "REFUSED: no pod that deepres bound"),
    (1, [pending("p")], [node_pod("p"), node_pod("foreign")], "REFUSED: pods on node n request"),  # never guessed
    (1, [pending("p")], [node_pod("p"), node_pod("foreign", allocated=True)], "p"),  # an admitted pod is no rival
    (1, [pending("p")], [node_pod("p", allocated=True)], "REFUSED: no pod"),  # allocated already (restart)
    (1, [pending("p", (1, 1), served=1)], [node_pod("p", allocated=True)], "p"),  # its second container
    (1, [pending("p"), pending("q")], [node_pod("p"), node_pod("q")], "REFUSED: 2 pods"),  # after a restart
    (1, [pending("p"), pending("q")], [node_pod("p", allocated=True), node_pod("q")], "q"),  # PodResources tells
])
def test_which_pod_an_allocate_is_for(size: int, gate: list[Pending], pods: list[NodePod], expected: str) -> None:
    assert who(size, gate, pods).startswith(expected)


def test_a_pod_served_a_moment_ago_is_no_rival_while_its_status_lags() -> None:
    """PodResources does not list plain init containers: a pod whose only request is one looks unallocated
    until its status comes; the gate remembers it served it."""
    assert who(1, [pending("p")], [node_pod("p"), node_pod("init-only")], done=("init-only",)) == "p"


def test_the_kubelets_order_of_containers_is_read_off_the_spec() -> None:
    spec = api_pod("p", (1, 0, 2), init=(1,))["spec"]
    assert allocation_sizes(spec, RES) == (1, 1, 2)
    assert allocation_sizes(api_pod("p", (0,))["spec"], RES) == ()


def test_the_node_pods_sent_are_those_requesting_the_resource_and_alive() -> None:
    objects = [api_pod("asks"), api_pod("plain", (0,)), api_pod("done", phase="Succeeded"),
               api_pod("going", deleting=True), api_pod("admitted", started=True), api_pod("in-podresources"),
               api_pod("init-only", (0,), init=(1,))]
    sent = {p.uid: p.allocated for p in node_pods(objects, RES, {("ns", "in-podresources")})}
    assert sent == {"asks": False, "admitted": True, "in-podresources": True, "init-only": False}


def test_the_gate_holds_one_pod_per_node_until_its_containers_are_served() -> None:
    now = [0.0]
    gate = AllocationGate(lambda: now[0])
    assert gate.acquire("n", pending("p", (1, 1)), timeout_s=0) == ""
    assert gate.acquire("n", pending("p", (1, 1)), timeout_s=0) == ""  # a retried bind of the same pod
    assert gate.acquire("m", pending("other-node"), timeout_s=0) == ""  # other nodes are not held
    held = gate.acquire("n", pending("q"), timeout_s=0)
    assert "still admitting ns/p" in held
    assert gate.acquire("n", pending("no-request", ()), timeout_s=0) == ""  # asks for no device: no gate
    assert gate.allocate("n", RES, 1, [node_pod("p")]).pod == pending("p", (1, 1), served=1)
    assert "still admitting" in gate.acquire("n", pending("q"), timeout_s=0)  # one container left
    assert gate.allocate("n", RES, 1, [node_pod("p", allocated=True)]).served
    assert gate.acquire("n", pending("q"), timeout_s=0) == ""
    # p is done: an Allocate while q awaits serves q, never p again
    assert gate.allocate("n", RES, 1, [node_pod("p", allocated=True), node_pod("q")]).pod == pending("q", served=1)


def test_a_waiting_bind_goes_on_when_the_kubelet_admits_the_previous_pod() -> None:
    gate = AllocationGate()
    assert gate.acquire("n", pending("p"), timeout_s=0) == ""
    result: list[str] = []
    waiter = threading.Thread(target=lambda: result.append(gate.acquire("n", pending("q"), timeout_s=30)))
    waiter.start()
    assert gate.stats().pending == 1
    assert gate.settle("p")  # the watch saw the pod's container statuses
    waiter.join(30)
    assert result == [""] and gate.pending("n") == [pending("q")]


def test_the_gate_is_rebuilt_from_the_pods_after_a_restart() -> None:
    gate = AllocationGate()
    gate.restore("n", pending("p"))
    gate.restore("n", pending("q"))
    assert "still admitting" in gate.acquire("n", pending("r"), timeout_s=0)
    # the kubelet's PodResources shows p allocated: the Allocate is q's
    assert gate.allocate("n", RES, 1, [node_pod("p", allocated=True), node_pod("q")]).pod == pending("q", served=1)


def test_gpus_must_be_this_nodes_and_healthy() -> None:
    assert check_gpus("ns/p", (A, B), devices_of([(A, True), (B, True)], 2), "n") == ""
    assert "does not have" in check_gpus("ns/p", (A, B), devices_of([(A, True)], 2), "n")
    assert "unhealthy" in check_gpus("ns/p", (A, B), devices_of([(A, True), (B, False)], 2), "n")
    assert "no GPUs" in check_gpus("ns/p", (), devices_of([(A, True)], 2), "n")


def test_each_strategy_names_only_the_given_gpus() -> None:
    env = container_devices([A, B], "envvar")
    assert env.envs == {"NVIDIA_VISIBLE_DEVICES": f"{A},{B}"} and not env.mounts and not env.cdi_devices
    mounts = container_devices([B], "volume-mounts")
    assert mounts.mounts == ((f"/var/run/nvidia-container-devices/{B}", "/dev/null", True),)
    assert mounts.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    cdi = container_devices([A], "cdi", "example.com/gpu")
    assert cdi.cdi_devices == (f"example.com/gpu={A}",) and not cdi.envs
    with pytest.raises(ValueError, match="strategy"):
        container_devices([A], "magic")


def test_slots_are_unique_per_gpu_and_within_the_kubelets_limit() -> None:
    devices = devices_of([(A, True), (B, False)], 16)
    assert len({d.id for d in devices}) == 32
    assert {d.health for d in devices if d.gpu_uuid == B} == {"Unhealthy"}
    assert all(len(d.id) <= 63 for d in devices)
    assert devices_of([("X" * 70, True)], 4) == ()


def test_the_agent_refuses_bad_device_plugin_flags() -> None:
    from extender.agent.main import add_arguments, settings_from_args
    from extender.cli import UsageError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--node-name", "n", "--device-plugin", "--device-plugin-slots", "0", "--no-kube",
                              "--device-plugin-resource", "gpu"])
    with pytest.raises(UsageError) as err:
        settings_from_args(args)
    text = str(err.value)
    assert "--device-plugin-slots" in text and "--device-plugin-resource" in text and "API server" in text


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (dev extra) not installed")
def test_the_generated_modules_match_the_vendored_proto() -> None:
    from devtools.protos import main

    assert main(["--check"]) == 0, "regenerate with `python -m devtools.protos`"


# ---- the preflight: whether this node's setup lets the plugin isolate GPUs ----
from extender.agent.deviceplugin.preflight import problems as preflight_problems  # noqa: E402

HARDENED = """
accept-nvidia-visible-devices-envvar-when-unprivileged = false
accept-nvidia-visible-devices-as-volume-mounts = true
[nvidia-container-runtime]
mode = "auto"
"""
DEFAULT_TOOLKIT = "[nvidia-container-cli]\nldconfig = \"@/sbin/ldconfig.real\"\n"


def preflight_of(strategy: str, toolkit: str | None = HARDENED, allocatable: dict[str, str] | None = None,
                 simulated: bool = False, cdi: tuple[str, ...] = ()) -> list[str]:
    return preflight_problems(strategy, simulated=simulated, allocatable=allocatable or {"cpu": "8"},
                              toolkit_path="/etc/nvidia-container-runtime/config.toml", toolkit_config=toolkit,
                              cdi_kinds=cdi, cdi_kind="nvidia.com/gpu")


@pytest.mark.parametrize(("strategy", "kwargs", "expected"), [
    ("volume-mounts", {}, ""),
    ("volume-mounts", {"toolkit": DEFAULT_TOOLKIT}, "needs accept-nvidia-visible-devices-as-volume-mounts = true"),
    ("volume-mounts", {"toolkit": None}, "cannot read the NVIDIA container toolkit"),
    ("volume-mounts", {"toolkit": "accept-nvidia-visible-devices-as-volume-mounts = \"yes\""}, "not a boolean"),
    ("volume-mounts", {"toolkit": "= broken"}, "not valid TOML"),
    ("envvar", {"toolkit": DEFAULT_TOOLKIT}, ""),  # the env var is honoured by default
    ("envvar", {}, "needs accept-nvidia-visible-devices-envvar-when-unprivileged = true"),  # hardened: ignored
    ("cdi", {"toolkit": None}, "no CDI spec"),
    ("cdi", {"toolkit": None, "cdi": ("nvidia.com/gpu",)}, ""),
    ("volume-mounts", {"allocatable": {"nvidia.com/gpu": "8"}}, "another device plugin"),
    ("volume-mounts", {"allocatable": {"nvidia.com/mig-1g.10gb": "7"}}, "another device plugin"),
    ("volume-mounts", {"allocatable": {"nvidia.com/gpu": "0"}}, ""),  # present, nothing advertised
    ("volume-mounts", {"toolkit": None, "simulated": True}, ""),  # no devices to isolate
    ("volume-mounts", {"simulated": True, "allocatable": {"nvidia.com/gpu": "1"}}, "another device plugin"),
])
def test_the_preflight_names_what_stops_isolation(strategy: str, kwargs: dict[str, Any], expected: str) -> None:
    found = preflight_of(strategy, **kwargs)
    if expected:
        assert len(found) == 1 and expected in found[0], found
    else:
        assert found == []
