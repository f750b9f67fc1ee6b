"""The device plugin's pure rules: which pod an Allocate is for, and what each strategy hands over.

Why: the kubelet names device IDs, never the pod; a wrong guess hands one pod's GPUs to another.
Table-driven over pods as the API server returns them (JSON).
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

import pytest

from extender.agent.deviceplugin.allocation import (
    Served,
    bound_pod_from_object,
    check_gpus,
    choose_pod,
    container_devices,
    devices_of,
)

RES = "deepres.io/gpu"
A, B = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"


def api_pod(name: str, gpus: str | None, requests: tuple[int, ...] = (1,), *, phase: str = "Pending",
            started: bool = False, deleting: bool = False, scheduled: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": name, "creationTimestamp": scheduled,
                            "annotations": {} if gpus is None else {"deepres.io/assigned-gpus": gpus}}
    if deleting:
        meta["deletionTimestamp"] = scheduled
    status: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]}
    if started:
        status["containerStatuses"] = [{"name": "c0", "state": {"running": {}}}]
    containers = [{"name": f"c{i}", "resources": {"limits": {RES: str(n)}} if n else {}}
                  for i, n in enumerate(requests)]
    return {"metadata": meta, "spec": {"containers": containers}, "status": status}


def chosen(objects: list[dict[str, Any]], size: int, served: Served | None = None) -> str:
    pods = [p for p in (bound_pod_from_object(o, RES) for o in objects) if p is not None]
    choice = choose_pod(pods, size, served or Served(), "node-1", RES)
    return choice.pod.name if choice.pod else "REFUSED: " + choice.error


@pytest.mark.parametrize(("objects", "size", "expected"), [
    ([api_pod("p", A)], 1, "p"),
    ([api_pod("p", A, (2,))], 2, "p"),
    ([api_pod("p", A, (2,))], 1, "REFUSED: no pod"),  # the request does not match
    ([api_pod("p", None)], 1, "REFUSED: no pod"),  # not bound by deepres
    ([api_pod("p", A, started=True, phase="Running")], 1, "REFUSED: no pod"),  # admitted already
    ([api_pod("p", A, phase="Succeeded")], 1, "REFUSED: no pod"),
    ([api_pod("p", A, deleting=True)], 1, "REFUSED: no pod"),
    ([api_pod("p", A), api_pod("q", B)], 1, "REFUSED: 2 pods"),  # ambiguous: different GPUs
    ([api_pod("late", A, scheduled="2026-01-01T00:00:09Z"), api_pod("early", A)], 1, "early"),  # same GPUs
    ([api_pod("p", A, (2,)), api_pod("q", B)], 1, "q"),  # only one asks for 1 device
    ([api_pod("p", A, started=True, phase="Running"), api_pod("q", B)], 1, "q"),
])
def test_which_pod_an_allocate_is_for(objects: list[dict[str, Any]], size: int, expected: str) -> None:
    assert chosen(objects, size).startswith(expected)


def test_a_served_container_is_not_served_twice() -> None:
    served = Served()
    pod = bound_pod_from_object(api_pod("p", A, (1, 1)), RES)
    assert pod is not None
    served.add(pod, 1)
    assert chosen([api_pod("p", A, (1, 1))], 1, served) == "p"
    served.add(pod, 1)
    assert chosen([api_pod("p", A, (1, 1))], 1, served).startswith("REFUSED")
    served.forget_except([])
    assert chosen([api_pod("p", A, (1, 1))], 1, served) == "p"


def test_gpus_must_be_this_nodes_and_healthy() -> None:
    pod = bound_pod_from_object(api_pod("p", f"{A},{B}"), RES)
    assert pod is not None
    assert check_gpus(pod, devices_of([(A, True), (B, True)], 2), "n") == ""
    assert "does not have" in check_gpus(pod, devices_of([(A, True)], 2), "n")
    assert "unhealthy" in check_gpus(pod, devices_of([(A, True), (B, False)], 2), "n")


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
