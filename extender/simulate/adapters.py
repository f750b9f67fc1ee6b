"""Translating the trace's pods and node states into the records the live DeepRes policies read.

The openb trace gives GPU shares in milli (1000 = one GPU); DeepRes admits memory. A share becomes
that fraction of the node's GPU memory: admission_mib = gpu_milli / 1000 x capacity_mib. Capacities
are written in units where one milli is a whole number of MiB (16 GB = 16,000 MiB), so sums of
reservations stay exact; the pack rule only compares memory with memory (need/free = milli/left), so
the scale changes no decision. G2 and G3 are Alibaba's undisclosed models: assumed 16 and 32 GB.
"""

from __future__ import annotations

from extender.policy import GpuView, NodeView, PodRequest
from extender.simulate.traces import MILLI, Pod

#: GPU memory per model in GB (vendor figures; G2/G3 undisclosed, assumed).
GPU_MEMORY_GB: dict[str, int] = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 16, "G3": 32,
                                 "H100": 80}  # H100: the compute replay's GPU-bound cluster (not in openb)
DEFAULT_GPU_MEMORY_GB = 16


def capacity_mib(model: str) -> float:
    """A GPU's memory in the simulator's MiB (GB x 1000, so one milli is GB MiB)."""
    return float(GPU_MEMORY_GB.get(model, DEFAULT_GPU_MEMORY_GB) * MILLI)


def node_view(name: str, model: str, gpu_left_milli: tuple[int, ...], received_s: float = 0.0) -> NodeView:
    """A node whose GPU i has `gpu_left_milli[i]` milli unreserved (nothing else running on it)."""
    cap = capacity_mib(model)
    unit = cap / MILLI
    gpus = tuple(
        GpuView(uuid=f"{name}-gpu{i}", index=i, capacity_mib=cap, reserved_mib=(MILLI - left) * unit,
                utilization=(MILLI - left) / MILLI)
        for i, left in enumerate(gpu_left_milli)
    )
    return NodeView(name=name, gpus=gpus, received_s=received_s)


def pod_request(pod: Pod, model: str, priority: float = 0.0, reference_model: str | None = None) -> PodRequest:
    """The pod as DeepRes sees it on a node of `model`: its share as memory of that model's GPUs, or of
    `reference_model`'s GPUs for every node (one absolute memory request, as a real pod has)."""
    need = pod.gpu_milli * capacity_mib(reference_model or model) / MILLI
    return PodRequest(uid=pod.name, namespace="openb", name=pod.name, gpus=max(pod.num_gpu, 1),
                      admission_mib=need, predicted_mib=need, priority=priority, gpu_job=pod.num_gpu > 0)
