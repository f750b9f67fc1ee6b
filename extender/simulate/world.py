"""The replay's world: a trace job (`Job`), the simulated cluster (`Cluster`: true use, reservations,
OOM), what a run produces (`ReplayOutcome`, `ReplayExperiment`) and the replay's constants.
`extender/simulate/replay.py` says what the replay models."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from extender.policy import (
    Reservation,
)
from extender.simulate.adapters import GPU_MEMORY_GB
from extender.simulate.traces import Node, Pod

log = logging.getLogger(__name__)

MIB_PER_GB = 1024.0
OOM_AFTER_S = 60.0
BACKOFF_S = (10.0, 300.0)
MAX_RESTARTS = 20
DEADLINE_FACTOR = 2.0
SAMPLE_EVERY_S = 600.0
CRITICALITY = {"LS": 2, "BE": 0}
POLICIES = ("static", "request", "deepres", "deepres-pack", "deepres-nofrag")
#: The compute-aware replay's policies (issue 24): baselines, deepres, and its memory-only ablation.
COMPUTE_POLICIES = ("static", "static-sjf", "request", "deepres", "deepres-memory")

FloatArray = npt.NDArray[np.float64]


@dataclass
class Job:
    """A GPU pod of the trace with its training job; mutable run state below the line."""

    idx: int
    pod: Pod
    spec_key: str
    true_mib: float
    predicted_mib: float
    upper_mib: float
    qos: str
    arrival: float
    duration: float
    deadline: float | None
    # run state
    admission_mib: float = 0.0
    node: int = -1
    gpus: list[int] = field(default_factory=list)
    reserved_mib: float = 0.0  # per GPU
    whole_gpu: bool = False  # placed by the whole-GPU fallback (`whole_gpu_request`)
    start: float = math.nan
    run_id: int = 0
    ooms: int = 0
    preempted: int = 0
    completion: float = math.nan
    failed: bool = False
    reservation: Reservation | None = None
    # compute (issue 24): the true GPU duty alone, what the pod declares, the predicted run time alone
    duty: float = 1.0
    declared_share: float | None = None
    predicted_s: float = 0.0
    admission_duty: float = 1.0
    # progress: work left (seconds at full speed), the current rate (fraction of full speed), since when
    work_left: float = 0.0
    rate: float = 1.0
    since: float = 0.0
    finish_token: int = 0
    shared_s: float = 0.0  # wall time this run spent on a GPU with other jobs
    last_run_s: float = 0.0  # wall time of the final (completed) run
    run_alone_s: float = 0.0  # the work of the current (final) run at full speed (restart included)
    # the capacity world (issue 33, `simulate.capworld`): what the policy never sees
    checkpoint_s: float | None = None  # declared checkpoint interval (wall seconds); None: none declared
    kept_s: float = 0.0  # work (seconds at full speed) saved by its last checkpoint: a restart resumes there
    lost_gpu_s: float = 0.0  # GPU-seconds thrown away by evictions and OOM kills (lost work + restarts)
    waited_s: float = 0.0  # time queued (first placement and every re-queue after an eviction or kill)
    queued_at: float = 0.0  # when it last joined the queue
    base_duty: float = 1.0  # its duty around which the true duty drifts
    drift: float = 0.0  # the drift's state (log factor on base_duty)
    interference_k: float = 1.0  # its true rate fraction is the model's ** this (a held-out residual)
    evicted_by: str = ""  # the kind of arrival that evicted it last (the churn rule reads it)
    restarts: int = 0


@dataclass
class ReplayOutcome:
    policy: str
    metrics: dict[str, float]
    per_qos: dict[str, dict[str, float]]
    jct_s: list[float]
    series_t: list[float]
    series_alloc: list[float]
    series_mem: list[float]


@dataclass
class ReplayExperiment:
    outcomes: dict[str, ReplayOutcome]
    notes: list[str]
    qos_order: list[str]
    stride: int = 1
    nodes: int = 0
    gpus: int = 0


class Cluster:
    """Per-GPU capacity, reservations and true use (MiB), in node-name order (= rank)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.names = [n.name for n in nodes]
        self.models = [n.model for n in nodes]
        width = max(n.gpus for n in nodes)
        self.cap = np.zeros((len(nodes), width))
        for i, n in enumerate(nodes):
            self.cap[i, : n.gpus] = GPU_MEMORY_GB.get(n.model, 16) * MIB_PER_GB
        self.present = self.cap > 0
        self.reserved = np.zeros_like(self.cap)
        self.used = np.zeros_like(self.cap)
        self.jobs_on: list[list[list[int]]] = [[[] for _ in range(width)] for _ in nodes]
        self.cpu_left = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_left = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.version = np.zeros(len(nodes), dtype=np.int64)
        self.total_cap = float(self.cap.sum())
        self.model_index = {m: i for i, m in enumerate(sorted(set(self.models)))}
        self.model_id = np.array([self.model_index[m] for m in self.models])

    def base_mask(self, pod: Pod) -> npt.NDArray[np.bool_]:
        ok = (self.cpu_left >= pod.cpu_milli) & (self.mem_left >= pod.memory_mib)
        if pod.spec:
            allowed = np.zeros(len(self.model_index), dtype=bool)
            for m in pod.spec:
                if m in self.model_index:
                    allowed[self.model_index[m]] = True
            ok &= allowed[self.model_id]
        return ok

    def bind(self, job: Job, node: int, gpus: Sequence[int], reserve_mib: float) -> None:
        if self.cpu_left[node] < job.pod.cpu_milli or self.mem_left[node] < job.pod.memory_mib:
            raise ValueError(f"job {job.idx} does not fit node {self.names[node]} (cpu/memory)")
        self.cpu_left[node] -= job.pod.cpu_milli
        self.mem_left[node] -= job.pod.memory_mib
        for g in gpus:
            if not self.present[node, g]:
                raise ValueError(f"node {self.names[node]} has no GPU {g}")
            self.reserved[node, g] += reserve_mib
            self.used[node, g] += job.true_mib
            self.jobs_on[node][g].append(job.idx)
        job.node, job.gpus, job.reserved_mib = node, list(gpus), reserve_mib
        self.version[node] += 1

    def release(self, job: Job) -> None:
        node = job.node
        self.cpu_left[node] += job.pod.cpu_milli
        self.mem_left[node] += job.pod.memory_mib
        for g in job.gpus:
            self.reserved[node, g] -= job.reserved_mib
            self.used[node, g] -= job.true_mib
            self.jobs_on[node][g].remove(job.idx)
            if not self.jobs_on[node][g]:  # no float residue on an empty GPU
                self.reserved[node, g] = 0.0
                self.used[node, g] = 0.0
        if (self.reserved < -1e-6).any() or (self.cpu_left < 0).any():
            raise AssertionError("negative capacity after release")
        job.node, job.gpus, job.reserved_mib = -1, [], 0.0
        self.version[node] += 1

    def set_reservation(self, job: Job, reserve_mib: float) -> None:
        for g in job.gpus:
            self.reserved[job.node, g] += reserve_mib - job.reserved_mib
        job.reserved_mib = reserve_mib
        self.version[job.node] += 1

    def largest_gpu_mib(self, pod: Pod) -> float:
        """The largest GPU of a node of a model `pod` may use (its CPU and memory aside)."""
        allowed = self.base_mask(replace(pod, cpu_milli=0, memory_mib=0))
        return float(self.cap[allowed].max()) if allowed.any() else 0.0

    def over_committed(self, job: Job) -> bool:
        return any(self.used[job.node, g] > self.cap[job.node, g] + 1e-6 for g in job.gpus)
