"""Simulated GPUs for kind and local runs (`--source simulated`, never a fallback for NVML).

GPUs come from a spec such as `2xA100-40GB,1xT4-16GB`; their UUIDs are derived from the node name
and position, so they are stable across agent restarts and the extender's `deepres.io/assigned-gpus`
keep pointing at them. Each pod bound to this node with `deepres.io/assigned-gpus` holds, on each of
its GPUs, its true usage times (1 + noise) drawn from a seeded generator, as one process already
attributed to the pod (no /proc behind it). The true usage is the test-only annotation
`simulated.deepres.io/usage-mib` (what the job really uses, set by whoever creates the pod), so a
misprediction shows up as it would on a real GPU; a pod without it uses what the extender predicted
(`deepres.io/predicted-memory-mib`), which is all a demo without a usage model can offer. Usage above
a GPU's memory is capped at the memory (the job would fail with out-of-memory there).
"""

from __future__ import annotations

import logging
import random
import re
import uuid
import zlib
from dataclasses import dataclass

from extender.agent.kube import (
    ASSIGNED_GPUS_ANNOTATION,
    PREDICTED_MEMORY_ANNOTATION,
    PodLister,
)
from extender.agent.sources import Sample
from extender.pod_requests import FINISHED_PHASES
from extender.telemetry import MAX_GPUS_PER_NODE, GpuReport, ProcessReport

log = logging.getLogger(__name__)

#: test-only: the MiB a simulated job really uses on each of its GPUs (the usage model's truth)
SIMULATED_USAGE_ANNOTATION = "simulated.deepres.io/usage-mib"

# [COUNTx]MODEL-SIZEGB: the model may contain dashes (RTX-A6000-48GB); GB means GiB, as on GPU boxes
_ITEM = re.compile(
    r"^(?:(?P<count>\d+)\s*x\s*)?(?P<model>[A-Za-z0-9][A-Za-z0-9._-]*?)-(?P<size>\d+(?:\.\d+)?)(?:GB|GiB|G)$",
    re.IGNORECASE,
)
_UUID_NAMESPACE = uuid.UUID("6f1c3a52-8d4e-4b0e-9a57-2a0c1e3d9b10")
SPEC_EXAMPLE = "2xA100-40GB,1xT4-16GB"


@dataclass(frozen=True)
class SimulatedGpu:
    model: str
    memory_mib: float


def parse_gpu_spec(text: str) -> tuple[SimulatedGpu, ...]:
    """`2xA100-40GB,1xT4-16GB` -> the GPUs in order; ValueError names the bad item and the form."""
    gpus: list[SimulatedGpu] = []
    for raw in text.split(","):
        item = raw.strip()
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(f"bad GPU item {item!r}: expected COUNTxMODEL-MEMORYGB, e.g. {SPEC_EXAMPLE}")
        count = int(match.group("count") or 1)
        size_gib = float(match.group("size"))
        if count < 1 or size_gib <= 0:
            raise ValueError(f"bad GPU item {item!r}: count and memory must be positive")
        gpus.extend([SimulatedGpu(f"NVIDIA {match.group('model')}-{match.group('size')}GB", size_gib * 1024.0)] * count)
        if len(gpus) > MAX_GPUS_PER_NODE:
            raise ValueError(f"{len(gpus)} GPUs: at most {MAX_GPUS_PER_NODE} per node")
    return tuple(gpus)


def simulated_uuid(node: str, index: int) -> str:
    """A stable, GPU-shaped UUID for GPU `index` of `node`."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def _pid(pod_uid: str) -> int:
    return 100_000 + zlib.crc32(pod_uid.encode()) % 900_000


class SimulatedSource:
    """GPUs from config, usage from the pods the extender placed on them, plus seeded noise."""

    name = "simulated"

    def __init__(
        self, node: str, gpus: tuple[SimulatedGpu, ...], pods: PodLister, *, seed: int = 0, noise: float = 0.03
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.uuids = tuple(simulated_uuid(node, i) for i in range(len(gpus)))
        self._pods = pods
        self._rng = random.Random(seed)
        self.noise = noise
        self._warned: set[str] = set()

    def close(self) -> None:
        return None

    def sample(self) -> Sample:
        by_uuid: dict[str, list[ProcessReport]] = {u: [] for u in self.uuids}
        for pod in self._pods.pods():
            if pod.phase in FINISHED_PHASES:
                continue
            assigned = [u.strip() for u in pod.annotations.get(ASSIGNED_GPUS_ANNOTATION, "").split(",") if u.strip()]
            true_usage = pod.annotations.get(SIMULATED_USAGE_ANNOTATION)
            predicted = self._predicted_mib(pod.uid, true_usage if true_usage is not None
                                            else pod.annotations.get(PREDICTED_MEMORY_ANNOTATION))
            if predicted is None:
                continue
            for gpu_uuid in assigned:
                if gpu_uuid in by_uuid:
                    used = max(predicted * (1.0 + self._rng.gauss(0.0, self.noise)), 0.0)
                    by_uuid[gpu_uuid].append(ProcessReport(pid=_pid(pod.uid), used_memory_mib=round(used, 1),
                                                           pod_uid=pod.uid))
        reports = []
        for index, (gpu, gpu_uuid) in enumerate(zip(self.gpus, self.uuids, strict=True)):
            processes = by_uuid[gpu_uuid]
            used = min(sum(p.used_memory_mib for p in processes), gpu.memory_mib)
            busy = min(0.55 + 0.1 * len(processes) + self._rng.uniform(0.0, 0.3), 1.0) if processes else 0.0
            reports.append(
                GpuReport(
                    uuid=gpu_uuid,
                    index=index,
                    model=gpu.model,
                    memory_total_mib=gpu.memory_mib,
                    memory_used_mib=round(used, 1),
                    utilization_gpu=round(busy, 3),
                    utilization_memory=round(busy * 0.5, 3),
                    temperature_c=round(32.0 + 45.0 * busy, 1),
                    power_w=round(40.0 + 210.0 * busy, 1),
                    processes=tuple(processes),
                )
            )
        return Sample(gpus=tuple(reports))

    def _predicted_mib(self, pod_uid: str, raw: str | None) -> float | None:
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not 0.0 <= value < float("inf"):
            if pod_uid not in self._warned:
                self._warned.add(pod_uid)
                log.warning("pod %s: memory annotation %r is not a number of MiB; ignored", pod_uid, raw)
            return None
        return value
