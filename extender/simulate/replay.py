"""Experiment 2, replay: the default trace with its arrivals and departures, three ways of sharing GPUs.

Every GPU pod of the trace arrives at its creation time and needs its trace run time (deletion -
scheduled, or - creation if it never ran) of GPU time; it gets a training job drawn (seeded) from the
predictor's dataset, whose traced-and-calibrated memory is its true peak per GPU (drawn among jobs
that fit the smallest GPU the pod may use). Policies:

- static: whole GPUs per pod, FIFO (what `nvidia.com/gpu` gives without sharing);
- request: the trace's gpu_milli as the declared share of GPU memory, binpack, FIFO (HAMi-style);
- deepres (and its ablations deepres-pack, deepres-nofrag): the live `extender.policy` functions with
  the live defaults (`PolicySettings().params()`): admission = the predictor's upper bound (or a job
  signature's observed peak x margin, `corrected_admission`), the filter (`filter_nodes`, with its
  whole-GPU fallback: a bound above every GPU the pod may use, its point estimate fitting, asks for an
  empty GPU of the largest such size and reserves it whole, `whole_gpu_request`), the score
  and GPU choice (`packs_by_mix`, `score_nodes_fragaware` / `score_nodes`, `choose_gpus_for`),
  priority order (LS = high criticality, BE = low, others normal; LS jobs have a deadline of arrival
  + 2 x run time), the usage rule (`observe_usage`: the reservation follows the observed peak and the
  signature's peak is recorded once the warm-up has passed), and the extender's self-preemption
  (`choose_preemption` over the nodes the filter failed for memory, strictly lower priority victims
  only, at most once per pod per `preemption_grace_s`).

What the live extender does that the replay does not model: kube-scheduler's own preemption for CPU
and host memory (by PriorityClass; the trace has none), and eviction taking time (victims leave at
once). A job's true use is its peak from the start, so the usage rule applied at every report gives
the same reservation as applied at the first report after the warm-up: the replay applies it then.

Compute (issue 24; `extender.simulate.compute` runs it): with `simulate(..., interference=True)` jobs
sharing a GPU run at the rate the interference model predicts from their true duties, and a job's
finish moves whenever its GPUs' jobs change; DeepRes places through the sharing rule
(`sharing_view`: busy GPUs it may not join shown full; its duties the reservation's, the prior until
the usage rule observes them) and its priority gets the predicted run time (`Job.predicted_s`), never
the true one. Without it (the default here, and the memory replay of `--report`) jobs run at full
speed whatever shares their GPU.

Memory actually used is the sum of the running jobs' true peaks (from their start). A placement
that makes a GPU's true use exceed its capacity kills the job that allocated last (the newcomer):
it holds its GPUs for `OOM_AFTER_S`, then restarts after a back-off (10 s doubling to 300 s);
after `MAX_RESTARTS` kills it fails. Preempted and killed jobs lose their progress.
"""

from __future__ import annotations

import heapq
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from extender.policy import (
    DemandWindow,
    GpuView,
    NodeView,
    PeakStore,
    PodRequest,
    PolicyParams,
    PriorityInputs,
    Reservation,
    choose_gpus_for,
    choose_preemption,
    corrected_admission,
    filter_nodes,
    observe_usage,
    packs_by_mix,
    priority_of,
    score_nodes,
    score_nodes_fragaware,
)
from extender.policy.duty import DutyStore, admission_duty, follow_duty
from extender.policy.filtering import reserved_per_gpu
from extender.policy.interference import busy_shares, step_rate_fractions
from extender.policy.sharing import sharing_view, wait_for_empty_s
from extender.settings import KubeSettings, PolicySettings
from extender.simulate.adapters import GPU_MEMORY_GB
from extender.simulate.jobs import JobPool, load_job_pool, load_predictor
from extender.simulate.traces import MILLI, Node, Pod, node_list_path, pod_list_path, read_nodes, read_pods

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


class Strategy:
    """How one policy orders the queue, finds a place, and reacts (hooks are no-ops by default)."""

    name = ""
    follows_usage = False
    """Whether the policy applies the usage rule (a usage event after the warm-up of every run)."""

    def __init__(self, cluster: Cluster, jobs: list[Job], params: PolicyParams) -> None:
        self.c = cluster
        self.jobs = jobs
        self.params = params
        self.preemptions = 0
        self.whole_gpu_binds = 0  # placements by the whole-GPU fallback (DeepRes)
        self.whole_gpu_jobs: set[int] = set()  # the jobs placed so at least once
        self.usage_followed = 0  # reservations the usage rule moved (the report checks every ablation's)

    def admission(self, job: Job) -> float:
        return 0.0

    def order_key(self, job: Job, now: float) -> tuple[float, ...]:
        return (job.arrival, job.idx)

    def place(self, job: Job, now: float) -> tuple[int, list[int], float] | None:
        raise NotImplementedError

    def preempt(self, job: Job, now: float) -> list[int] | None:
        return None

    def on_bind(self, job: Job, now: float) -> None:
        return None

    def on_usage(self, job: Job, now: float) -> bool:
        return False

    def hardness(self, job: Job, now: float) -> tuple[float, ...]:
        """What besides the shape makes the job harder to place (none for memory-only policies)."""
        return ()


class Static(Strategy):
    name = "static"

    def place(self, job: Job, now: float) -> tuple[int, list[int], float] | None:
        k = job.pod.num_gpu
        free = self.c.present & (self.c.reserved <= 0)
        ok = self.c.base_mask(job.pod) & (free.sum(axis=1) >= k)
        hits = np.flatnonzero(ok)
        if not len(hits):
            return None
        i = int(hits[0])
        gpus = [int(g) for g in np.flatnonzero(free[i])[:k]]
        return i, gpus, float(self.c.cap[i, gpus[0]])


class StaticSjf(Static):
    """Static whole GPUs, the queue ordered by the predicted run time (shortest first): separates the
    gain of ordering from the gain of sharing."""

    name = "static-sjf"

    def order_key(self, job: Job, now: float) -> tuple[float, ...]:
        return (job.predicted_s, job.arrival, job.idx)


class Request(Strategy):
    name = "request"

    def place(self, job: Job, now: float) -> tuple[int, list[int], float] | None:
        k = job.pod.num_gpu
        share = job.pod.gpu_milli / MILLI
        need = self.c.cap[:, :1] * share  # per node (one model per node)
        free = np.where(self.c.present, self.c.cap - self.c.reserved, -1.0)
        fits = free >= need - 1e-6
        ok = self.c.base_mask(job.pod) & (fits.sum(axis=1) >= k)
        hits = np.flatnonzero(ok)
        if not len(hits):
            return None
        left = np.where(self.c.present[hits], free[hits], 0.0).sum(axis=1)
        i = int(hits[int(np.argmin(left))])  # binpack: the node with the least declared memory left
        row = np.where(fits[i], free[i], np.inf)
        gpus = [int(g) for g in np.argsort(row, kind="stable")[:k]]  # best fit GPUs
        return i, gpus, float(need[i, 0])


class DeepRes(Strategy):
    """DeepRes: predicted admission, priority order, spread rule for high priority, the
    fragmentation-aware score for the others (packing), usage following and preemption."""

    name = "deepres"
    frag_aware = True
    follows_usage = True

    def __init__(self, cluster: Cluster, jobs: list[Job], params: PolicyParams) -> None:
        super().__init__(cluster, jobs, params)
        self.demand = DemandWindow()
        self.peaks = PeakStore(PolicySettings().peak_store_size)
        self.grace_s = KubeSettings().preemption_grace_s
        self._preempting: dict[int, float] = {}  # job -> no self-preemption for it before this time
        self._views: dict[int, tuple[int, NodeView]] = {}
        self._priority: dict[int, tuple[float, float]] = {}  # job -> (computed at, value)
        self.duties = DutyStore(PolicySettings().peak_store_size)
        self._wait: tuple[tuple[Any, ...], float] | None = None  # wait_s's last answer, by its inputs
        self._filtered: tuple[tuple[Any, ...], Any] | None = None  # filtered's last answer, by its inputs

    def admission(self, job: Job) -> float:
        job.admission_duty = admission_duty(job.declared_share, self.duties.get(job.spec_key))
        return corrected_admission(job.upper_mib, self.peaks.get(job.spec_key), self.params)

    def priority(self, job: Job, now: float) -> float:
        cached = self._priority.get(job.idx)
        if cached is not None and now - cached[0] < SAMPLE_EVERY_S:
            return cached[1]
        value = priority_of(self.inputs(job), now, self.params)
        self._priority[job.idx] = (now, value)
        return value

    def order_key(self, job: Job, now: float) -> tuple[float, ...]:
        return (-self.priority(job, now), job.arrival, job.idx)

    def inputs(self, job: Job) -> PriorityInputs:
        # the predictor's run time estimate, never the true one (no oracle)
        return PriorityInputs(criticality=CRITICALITY.get(job.qos, 1), deadline_s=job.deadline,
                              gpu_seconds=job.predicted_s, gpus=job.pod.num_gpu)

    def request(self, job: Job, now: float) -> PodRequest:
        """The pod as the extender's filter sees it at `now` (its priority evaluated then, as live)."""
        return PodRequest(uid=str(job.idx), namespace="openb", name=job.pod.name, gpus=job.pod.num_gpu,
                          admission_mib=job.admission_mib, predicted_mib=job.predicted_mib,
                          priority=priority_of(self.inputs(job), now, self.params), fallback=True,
                          duty=job.admission_duty, predicted_run_s=job.predicted_s)

    def view(self, i: int, now: float) -> NodeView:
        cached = self._views.get(i)
        if cached is not None and cached[0] == self.c.version[i]:
            return cached[1]
        cap, used, res = self.c.cap[i], self.c.used[i], self.c.reserved[i]
        gpus = tuple(GpuView(uuid=f"{self.c.names[i]}-gpu{g}", index=g, capacity_mib=float(cap[g]),
                             used_mib=float(used[g]), reserved_mib=float(res[g]),
                             utilization=min(1.0, len(self.c.jobs_on[i][g]) / 2.0),
                             duties=tuple(sorted(self._duty_of(j) for j in self.c.jobs_on[i][g])),
                             strict=any(CRITICALITY.get(self.jobs[j].qos, 1) >= 2 for j in self.c.jobs_on[i][g]))
                     for g in range(len(cap)) if self.c.present[i, g])
        nv = NodeView(name=self.c.names[i], gpus=gpus, received_s=0.0)
        self._views[i] = (int(self.c.version[i]), nv)
        return nv

    def hardness(self, job: Job, now: float) -> tuple[float, ...]:
        if not self.params.sharing:
            return ()
        high = float(self.priority(job, now) >= self.params.spread_priority)
        return (job.admission_duty, job.predicted_s, high)

    def _duty_of(self, j: int) -> float:
        """A placed job's duty as the extender knows it: its reservation's (prior, then observed)."""
        res = self.jobs[j].reservation
        return res.duty if res is not None else self.jobs[j].admission_duty

    def wait_s(self, job: Job, rows: Sequence[int], now: float) -> float:
        """The predicted wait until `job.pod.num_gpu` GPUs of one of `rows` are empty, from the
        predicted run times of the jobs on them (`sharing.wait_for_empty_s` per GPU)."""
        k = max(job.pod.num_gpu, 1)
        key = (now, k, tuple(rows), int(self.c.version.sum()))
        if self._wait is not None and self._wait[0] == key:
            return self._wait[1]
        best = math.inf
        for i in rows:
            waits = sorted(wait_for_empty_s(now, [[(self.jobs[j].start, self.jobs[j].predicted_s)
                                                   for j in self.c.jobs_on[i][g]]])
                           for g in range(self.c.cap.shape[1]) if self.c.present[i, g])
            if len(waits) >= k:
                best = min(best, waits[k - 1])
        self._wait = (key, best)
        return best

    def filtered(self, job: Job, now: float) -> tuple[PodRequest, dict[str, NodeView], list[str], list[str]]:
        """(the pod, the views of the nodes kube-scheduler would send: CPU, memory and GPU model fit,
        the names the live filter passes, the names it fails for memory: where preemption may help).
        The pod is the whole-GPU request when the filter's fallback applied (`whole_gpu_request`).
        The views are those the sharing rule leaves the pod (`sharing_view`: busy GPUs it may not join
        shown full)."""
        key = (job.idx, now, int(self.c.version.sum()), job.admission_mib, job.admission_duty)
        if self._filtered is not None and self._filtered[0] == key:  # preempt right after place
            cached: tuple[PodRequest, dict[str, NodeView], list[str], list[str]] = self._filtered[1]
            return cached
        pod = self.request(job, now)
        rows = np.flatnonzero(self.c.base_mask(job.pod)).tolist()
        views = {self.c.names[i]: self.view(i, now) for i in rows}
        if self.params.sharing:
            wait = self.wait_s(job, rows, now)
            views = {name: sharing_view(pod, v, self.params, wait) for name, v in views.items()}
        result = filter_nodes(pod, list(views), views, 0.0, self.params)
        answer = (result.request or pod, views, list(result.passed), list(result.failed))
        self._filtered = (key, answer)
        return answer

    def place(self, job: Job, now: float) -> tuple[int, list[int], float] | None:
        pod, views, passed, _ = self.filtered(job, now)
        if not passed:
            return None
        mix = self.demand.mix() if self.frag_aware and packs_by_mix(pod, self.params) else None
        if mix is not None and len(mix):
            reps = self.representatives(passed)
            cpu = {name: float(self.c.cpu_left[self._index[name]]) for name in reps}
            pod_cpu = float(job.pod.cpu_milli)
            scores = score_nodes_fragaware(pod, reps, views, self.params, mix, cpu, pod_cpu)
            best = max(scores, key=lambda ns: ns[1])[0]  # the node given 10: first top merit by name
            chosen = choose_gpus_for(pod, views[best], self.params, mix, cpu[best], pod_cpu)
        else:
            scores = score_nodes(pod, passed, views, self.params)
            best = max(scores, key=lambda ns: ns[1])[0]  # first of the highest: ties to the lowest rank
            chosen = choose_gpus_for(pod, views[best], self.params)
        if not chosen:
            return None
        job.whole_gpu = pod.whole_gpu
        return self._index[best], [g.index for g in chosen], reserved_per_gpu(pod, (g.capacity_mib for g in chosen))

    def representatives(self, passed: Sequence[str]) -> list[str]:
        """The first-named node of each distinct node state (GPU capacity, use, reservations and jobs,
        CPU left) among `passed`. Every node in a state gets the same merit, so the node
        `score_nodes_fragaware` gives 10 over all of `passed` is the one it gives 10 over these:
        the same decision, without scoring a thousand identical idle nodes one by one."""
        rows = np.array([self._index[n] for n in sorted(passed)], dtype=np.int64)  # name order
        jobs = np.array([[len(g) for g in self.c.jobs_on[i]] for i in rows.tolist()], dtype=float)
        # the sharing rule reads the residents' duties and strictness: nodes differing there differ
        duties = np.array([[sum(self._duty_of(j) + 10.0 * (CRITICALITY.get(self.jobs[j].qos, 1) >= 2) for j in g)
                            for g in self.c.jobs_on[i]] for i in rows.tolist()], dtype=float)
        state = np.hstack([self.c.cap[rows], self.c.used[rows], self.c.reserved[rows], jobs, duties,
                           self.c.cpu_left[rows, None].astype(float)])
        _, first = np.unique(state, axis=0, return_index=True)
        names = [self.c.names[int(i)] for i in rows[np.sort(first)]]
        return sorted(names)

    @property
    def _index(self) -> dict[str, int]:
        if not hasattr(self, "_name_index"):
            self._name_index = {n: i for i, n in enumerate(self.c.names)}
        return self._name_index

    def preempt(self, job: Job, now: float) -> list[int] | None:
        """The extender's self-preemption (`app.Extender.self_preempt`): when no node passes the filter,
        `choose_preemption` over the nodes it failed for memory (strictly lower priority victims only),
        at most once per pod per `preemption_grace_s`."""
        if self._preempting.get(job.idx, -math.inf) > now:
            return None
        pod, views, passed, failed = self.filtered(job, now)
        if passed or not failed:
            return None
        self._preempting[job.idx] = now + self.grace_s
        candidates = []
        for name in failed:
            i = self._index[name]
            residents = sorted({j for g in range(self.c.cap.shape[1]) for j in self.c.jobs_on[i][g]})
            candidates.append((views[name], [r for j in residents if (r := self.jobs[j].reservation) is not None]))
        found = choose_preemption(pod, candidates, now, self.params)
        if found is None:
            self._preempting.pop(job.idx, None)
            return None
        return [int(r.pod_uid) for r in found[1]]

    def on_bind(self, job: Job, now: float) -> None:
        admitted = job.reserved_mib if job.whole_gpu else job.admission_mib  # as the extender's reserve_on
        if job.whole_gpu:
            self.whole_gpu_binds += 1
            self.whole_gpu_jobs.add(job.idx)
        self.demand.admit(admitted, job.pod.num_gpu, job.pod.cpu_milli)
        node = self.c.names[job.node]
        inputs = self.inputs(job)
        job.reservation = Reservation(pod_uid=str(job.idx), namespace="openb", name=job.pod.name, node=node,
                                      gpu_uuids=tuple(f"{node}-gpu{g}" for g in job.gpus),
                                      memory_mib=job.reserved_mib, admission_mib=admitted,
                                      predicted_mib=job.predicted_mib, priority_inputs=inputs, bound_s=now,
                                      signature=job.spec_key, duty=job.admission_duty)

    def on_usage(self, job: Job, now: float) -> bool:
        if job.reservation is None:
            return False
        # compute: the agent observes the job's busy share; corrected for sharing it is the job's duty
        # alone (the model's inverse is exact in the replay's world), learned per signature
        with_duty = follow_duty(job.reservation, job.duty, now, self.params)
        self.duties.record(job.spec_key, job.duty, str(job.idx))
        if with_duty is not job.reservation:
            job.reservation = with_duty
            self.c.version[job.node] += 1
        updated = observe_usage(job.reservation, job.true_mib, now, self.params, self.peaks)
        if updated is job.reservation:
            return False
        self.usage_followed += 1
        freed = updated.memory_mib < job.reservation.memory_mib
        job.reservation = updated
        self.c.set_reservation(job, updated.memory_mib)
        return freed


class DeepResNoFrag(DeepRes):
    """Ablation: DeepRes with the previous packing score (`score_nodes`' best fit) for low-priority pods."""

    name = "deepres-nofrag"
    frag_aware = False


class DeepResMemory(DeepRes):
    """Ablation: DeepRes by memory alone (the sharing rule off: today's DeepRes before issue 24)."""

    name = "deepres-memory"

    def __init__(self, cluster: Cluster, jobs: list[Job], params: PolicyParams) -> None:
        super().__init__(cluster, jobs, replace(params, sharing=False))


class DeepResPack(DeepRes):
    """Ablation: DeepRes with the spread rule off (every pod packs); everything else unchanged."""

    name = "deepres-pack"

    def __init__(self, cluster: Cluster, jobs: list[Job], params: PolicyParams) -> None:
        super().__init__(cluster, jobs, replace(params, spread_priority=math.inf))


def build_jobs(pods: Sequence[Pod], pool: JobPool, predictor: Any, seed: int, min_cap_mib: Callable[[Pod], float],
               limit: int = 0) -> list[Job]:
    """One Job per GPU pod (in creation order), with a training job drawn uniformly (numpy seed)."""
    rng = np.random.default_rng(seed)
    gpu_pods = sorted((p for p in pods if p.num_gpu > 0), key=lambda p: (p.creation_s, p.name))
    if limit:
        gpu_pods = gpu_pods[:limit]
    by_true = sorted(pool.jobs, key=lambda j: j.true_mib)
    trues = np.array([j.true_mib for j in by_true])
    jobs = []
    for idx, pod in enumerate(gpu_pods):
        fitting = int(np.searchsorted(trues, min_cap_mib(pod), side="right"))
        if fitting == 0:
            raise ValueError(f"no job in the pool fits the GPUs pod {pod.name} may use")
        pick = by_true[int(rng.integers(fitting))]
        demand = predictor.predict(pick.spec)
        end = pod.deletion_s if pod.deletion_s >= 0 else pod.creation_s + 1
        duration = float(max(end - max(pod.creation_s, 0), 1))
        deadline = pod.creation_s + DEADLINE_FACTOR * duration if pod.qos == "LS" else None
        key = repr(sorted(pick.spec.to_annotations().items()))
        jobs.append(Job(idx, pod, key, pick.true_mib, float(demand.memory_mib), float(demand.memory_mib_upper),
                        pod.qos, float(pod.creation_s), duration, deadline))
    return jobs


def simulate(strategy_cls: type[Strategy], jobs_template: Sequence[Job], nodes: Sequence[Node],
             params: PolicyParams, progress: Callable[[str], None] | None = None,
             interference: bool = False) -> ReplayOutcome:
    """Event-driven replay of one policy; returns its metrics and time series.

    With `interference`, jobs sharing a GPU run at the rate the interference model predicts from
    their true duties (`interference.step_rate_fractions`; a multi-GPU job at its slowest GPU's), and
    their finish times move whenever a GPU's jobs change; without it (the "no slowdown" ablation and
    the memory replay of before) every job runs at full speed."""
    import copy

    jobs = [copy.copy(t) for t in jobs_template]
    for fresh in jobs:
        fresh.gpus = []
    cluster = Cluster(nodes)
    strat = strategy_cls(cluster, jobs, params)
    events: list[tuple[float, int, str, int, int]] = []
    seq = 0

    def push(t: float, kind: str, j: int, run: int = 0) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, j, run))
        seq += 1

    for each in jobs:
        push(each.arrival, "arrive", each.idx)
    pending: list[int] = []
    ooms = 0
    series_busy: list[float] = []
    series_held: list[float] = []
    n_gpus = max(int(cluster.present.sum()), 1)

    def gpu_busy() -> float:
        """Mean over GPUs of the share of time they are busy (the jobs' busy shares by the model)."""
        total = 0.0
        for row in cluster.jobs_on:
            for on in row:
                if on:
                    duties = [jobs[j].duty for j in on]
                    total += min(1.0, sum(busy_shares(duties) if interference else duties))
        return total / n_gpus

    series_t: list[float] = []
    series_alloc: list[float] = []
    series_mem: list[float] = []
    arrivals = sorted(j.arrival for j in jobs)
    # the trace's first pods were created long before the bulk: sample from the 5th percentile arrival
    next_sample = arrivals[len(arrivals) // 20] if arrivals else 0.0
    last_arrival = arrivals[-1] if arrivals else 0.0
    finished = 0
    steps = 0

    doomed: set[int] = set()  # jobs placed over memory: OOM-killed soon, never finishing this run
    shared_now: set[int] = set()  # running jobs with another job on one of their GPUs

    def residents(node: int, gpus: Sequence[int]) -> set[int]:
        return {j for g in gpus for j in cluster.jobs_on[node][g]}

    def settle(j: int, now: float) -> None:
        """Progress of job j up to `now` at its current rate."""
        job = jobs[j]
        elapsed = now - job.since
        if elapsed > 0.0:
            job.work_left -= job.rate * elapsed
            if j in shared_now:
                job.shared_s += elapsed
        job.since = now

    def refresh(node: int, gpus: Sequence[int], now: float) -> None:
        """New rates (and finish events) for the jobs on these GPUs after their set changed."""
        fractions: dict[int, dict[int, float]] = {}
        for g in {g for j in residents(node, gpus) for g in jobs[j].gpus} | set(gpus):
            on = cluster.jobs_on[node][g]
            values = step_rate_fractions([jobs[j].duty for j in on]) if interference else (1.0,) * len(on)
            fractions[g] = dict(zip(on, values, strict=True))
        for j in residents(node, gpus):
            job = jobs[j]
            settle(j, now)
            if any(len(cluster.jobs_on[node][g]) > 1 for g in job.gpus):
                shared_now.add(j)
            else:
                shared_now.discard(j)
            job.rate = min(fractions[g][j] for g in job.gpus)
            job.finish_token += 1
            if j not in doomed:
                push(now + max(job.work_left, 0.0) / max(job.rate, 1e-9), "finish", j, job.finish_token)

    def start(job: Job, node: int, gpus: list[int], reserve: float, now: float) -> None:
        nonlocal ooms
        for j in residents(node, gpus):
            settle(j, now)
        cluster.bind(job, node, gpus, reserve)
        job.run_id += 1
        job.start = now
        job.work_left, job.since, job.shared_s = job.duration, now, 0.0  # a (re)start begins from scratch
        strat.on_bind(job, now)
        if cluster.over_committed(job):  # the newcomer allocated last: OOM-killed after OOM_AFTER_S
            ooms += 1
            job.ooms += 1
            doomed.add(job.idx)
            push(now + OOM_AFTER_S, "oom", job.idx, job.run_id)
        elif strat.follows_usage:  # the first report after the warm-up (see the module docstring)
            push(now + strat.params.usage_warmup_s, "usage", job.idx, job.run_id)
        refresh(node, gpus, now)

    def stop(job: Job, now: float) -> None:
        node, gpus = job.node, list(job.gpus)
        for j in residents(node, gpus):
            settle(j, now)
        cluster.release(job)
        doomed.discard(job.idx)
        shared_now.discard(job.idx)
        job.run_id += 1
        job.finish_token += 1
        job.reservation = None
        refresh(node, gpus, now)

    while events:
        now = events[0][0]
        while next_sample <= now and next_sample <= last_arrival:
            series_t.append(next_sample)
            series_alloc.append(float(cluster.reserved.sum()) / cluster.total_cap)
            series_mem.append(float(cluster.used.sum()) / cluster.total_cap)
            series_busy.append(gpu_busy())
            series_held.append(float(sum(1 for i, row in enumerate(cluster.jobs_on) for g, on in enumerate(row)
                                         if on and cluster.present[i, g])) / n_gpus)
            next_sample += SAMPLE_EVERY_S
        freed = False
        arrived: list[int] = []
        while events and events[0][0] == now:
            _, _, kind, j, run = heapq.heappop(events)
            job = jobs[j]
            if kind == "arrive":
                job.admission_mib = strat.admission(job)
                arrived.append(j)
            elif kind == "finish":
                if run != job.finish_token or job.node < 0:
                    continue  # the job's rate changed since (a newer finish event) or it was stopped
                job.last_run_s = now - job.start
                stop(job, now)
                job.completion = now
                finished += 1
                freed = True
            elif run != job.run_id:
                continue  # stale event of an earlier run (preempted or killed)
            elif kind == "usage":
                freed |= strat.on_usage(job, now)
            elif kind == "oom":
                stop(job, now)
                freed = True
                if job.ooms >= MAX_RESTARTS:
                    job.failed = True
                    finished += 1
                else:
                    backoff = min(BACKOFF_S[0] * 2 ** (job.ooms - 1), BACKOFF_S[1])
                    push(now + backoff, "arrive", j)
        candidates = pending + arrived if freed else arrived
        pending = [j for j in pending if j not in set(arrived)] if not freed else []
        waiting = set(pending)
        order = sorted(candidates, key=lambda j: strat.order_key(jobs[j], now))
        failed_shapes: list[tuple[Any, ...]] = []
        for j in order:
            job = jobs[j]
            # a job no easier to place than one that just failed fails too (the sharing rule: a larger
            # duty, a longer predicted run or a high priority make joining a busy GPU no easier)
            extra = strat.hardness(job, now)
            shape = (job.pod.num_gpu, job.admission_mib, job.pod.cpu_milli, job.pod.memory_mib, job.pod.spec,
                     job.pod.gpu_milli, *extra)
            if any(s[0] == shape[0] and s[4] == shape[4] and shape[1] >= s[1] and shape[2] >= s[2]
                   and shape[3] >= s[3] and shape[5] >= s[5] and all(a >= b for a, b in zip(shape[6:], s[6:],
                                                                                          strict=True))
                   for s in failed_shapes):
                if j not in waiting:
                    pending.append(j)
                    waiting.add(j)
                continue
            choice = strat.place(job, now)
            if choice is None:
                victims = strat.preempt(job, now)
                if victims:
                    for v in victims:
                        victim = jobs[v]
                        stop(victim, now)
                        victim.preempted += 1
                        strat.preemptions += 1
                        push(now, "arrive", v)  # back to the queue, progress lost
                    choice = strat.place(job, now)
            if choice is None:
                failed_shapes.append(shape)
                if j not in waiting:
                    pending.append(j)
                    waiting.add(j)
                continue
            if j in waiting:
                waiting.discard(j)
                pending.remove(j)
            start(job, *choice, now)
        steps += 1
        if progress is not None and steps % 2000 == 0:
            progress(f"    {strat.name}: t={now:,.0f} s, finished {finished}/{len(jobs)}, pending {len(pending)}")
    out = _outcome(strat, jobs, ooms, series_t, series_alloc, series_mem)
    shared = [j.last_run_s / j.duration for j in jobs if not j.failed and not math.isnan(j.completion)
              and j.shared_s > 0.0]
    done = [j for j in jobs if not j.failed and not math.isnan(j.completion)]
    jct = sorted(j.completion - j.arrival for j in done)
    out.metrics.update({
        "median_jct_s": round(float(np.median(jct)), 1) if jct else math.nan,
        "shared_jobs": float(len(shared)),
        "shared_slowdown_p95": round(float(np.percentile(shared, 95)), 4) if shared else 1.0,
        "shared_slowdown_max": round(max(shared), 4) if shared else 1.0,
        "gpu_busy": round(statistics.fmean(series_busy), 4) if series_busy else math.nan,
        "gpu_held": round(statistics.fmean(series_held), 4) if series_held else math.nan,
        "interference": float(interference),
    })
    for q, members in out.per_qos.items():
        times = sorted(j.completion - j.arrival for j in done if j.qos == q)
        members["median_jct_s"] = float(np.median(times)) if times else math.nan
        members["p95_jct_s"] = _p95(times)
    return out


def _p95(values: Sequence[float]) -> float:
    return float(np.percentile(values, 95)) if values else math.nan


def _outcome(strat: Strategy, jobs: Sequence[Job], ooms: int, series_t: list[float], series_alloc: list[float],
             series_mem: list[float]) -> ReplayOutcome:
    done = [j for j in jobs if not j.failed and not math.isnan(j.completion)]
    jct = [j.completion - j.arrival for j in done]
    queue = [max(j.completion - j.arrival - j.duration, 0.0) for j in done]
    speed = [j.duration / max(j.completion - j.arrival, 1e-9) for j in done]
    jain = (sum(speed) ** 2 / (len(speed) * sum(s * s for s in speed))) if speed else math.nan
    ls = [j for j in jobs if j.deadline is not None]
    misses = sum(1 for j in ls if j.failed or math.isnan(j.completion) or j.completion > (j.deadline or 0))
    metrics = {
        "jobs": float(len(jobs)), "completed": float(len(done)), "failed": float(sum(j.failed for j in jobs)),
        "never_placed": float(sum(1 for j in jobs if not j.failed and math.isnan(j.completion))),
        "mean_jct_s": round(statistics.fmean(jct), 1) if jct else math.nan, "p95_jct_s": round(_p95(jct), 1),
        "mean_queue_s": round(statistics.fmean(queue), 1) if queue else math.nan,
        "p95_queue_s": round(_p95(queue), 1),
        "oom_kills": float(ooms), "oom_rate": round(ooms / max(len(jobs), 1), 5),
        "preemptions": float(strat.preemptions), "usage_followed": float(strat.usage_followed),
        "whole_gpu_binds": float(strat.whole_gpu_binds), "whole_gpu_jobs": float(len(strat.whole_gpu_jobs)),
        # of those, jobs whose bound fits a GPU they may use: the nodes holding one were not candidates
        # (CPU or memory short) when the fallback took a whole smaller GPU
        "whole_gpu_jobs_bound_fits": float(sum(1 for i in strat.whole_gpu_jobs
                                              if jobs[i].upper_mib <= strat.c.largest_gpu_mib(jobs[i].pod))),
        "deadline_miss_rate": round(misses / max(len(ls), 1), 4), "jain": round(jain, 4),
        "mean_alloc": round(statistics.fmean(series_alloc), 4) if series_alloc else math.nan,
        "mean_mem_use": round(statistics.fmean(series_mem), 4) if series_mem else math.nan,
    }
    per_qos: dict[str, dict[str, float]] = {}
    for q in sorted({j.qos for j in jobs}):
        members = [j for j in done if j.qos == q]
        if members:
            per_qos[q] = {"jobs": float(len(members)),
                          "mean_jct_s": statistics.fmean(j.completion - j.arrival for j in members),
                          "mean_queue_s": statistics.fmean(max(j.completion - j.arrival - j.duration, 0.0)
                                                           for j in members)}
    return ReplayOutcome(strat.name, metrics, per_qos, jct, series_t, series_alloc, series_mem)


def run_replay_experiment(data: Path, seed: int = 42, limit: int = 0, policies: Sequence[str] = POLICIES,
                          progress: Callable[[str], None] | None = None, node_stride: int = 1) -> ReplayExperiment:
    """The three policies on the default trace with the same jobs, on every `node_stride`-th node."""
    all_nodes = read_nodes(node_list_path(data))
    nodes = all_nodes[::max(node_stride, 1)]
    pods = read_pods(pod_list_path(data, "default"))
    pool = load_job_pool()
    predictor, predictor_note = load_predictor(pool, seed)
    caps = {n.model: GPU_MEMORY_GB.get(n.model, 16) * MIB_PER_GB for n in nodes}

    def min_cap(pod: Pod) -> float:
        models = [m for m in caps if not pod.spec or m in pod.spec] or list(caps)
        return min(caps[m] for m in models)

    jobs = build_jobs(pods, pool, predictor, seed, min_cap, limit)
    params = PolicySettings().params()  # the live extender's defaults
    classes: dict[str, type[Strategy]] = {"static": Static, "request": Request, "deepres": DeepRes,
                                          "deepres-pack": DeepResPack, "deepres-nofrag": DeepResNoFrag}
    outcomes = {}
    for name in policies:
        if progress is not None:
            progress(f"replay: {name} ({len(jobs)} GPU jobs)")
        outcomes[name] = simulate(classes[name], jobs, nodes, params, progress)
    under = sum(1 for j in jobs if j.upper_mib < j.true_mib)
    gpus = sum(n.gpus for n in nodes)
    notes = [f"cluster: every {node_stride}th of the {len(all_nodes)} name-sorted openb nodes: {len(nodes)} nodes, "
             f"{gpus} GPUs" if node_stride > 1 else f"cluster: all {len(nodes)} openb nodes, {gpus} GPUs",
             f"jobs: {len(jobs)} GPU pods of openb_pod_list_default (CPU-only pods left out), "
             f"training jobs from {pool.source}, drawn with numpy seed {seed} among jobs whose true peak fits "
             "the smallest GPU the pod may use",
             f"predictor: {predictor_note}; its upper bound is below the true peak for {under} jobs "
             f"({100 * under / max(len(jobs), 1):.1f} %)",
             f"GPU memory per model (GB): {GPU_MEMORY_GB} (G2, G3 undisclosed: assumed)",
             "DeepRes and its ablations run the extender's rules with its default settings "
             "(`PolicySettings().params()`): the usage rule (`observe_usage`) at the first report after the "
             f"{params.usage_warmup_s:.0f} s warm-up (a job's true use is its peak from the start, so later reports "
             "change nothing), admission corrected by observed peaks only after "
             f"{params.correction_min_pods} pods on {params.correction_min_nodes} nodes (`corrected_admission`), "
             "and the extender's self-preemption (`choose_preemption`: any pod, strictly lower-priority victims, "
             "on the nodes the filter failed for memory); kube-scheduler's own preemption for CPU and memory "
             "(by PriorityClass) is not modelled",
             f"OOM: the newcomer is killed after {OOM_AFTER_S:.0f} s and restarts after a back-off; "
             f"LS deadline = arrival + {DEADLINE_FACTOR:g} x run time; queue time = JCT - run time "
             "(waiting plus work lost to OOM kills and preemptions)"]
    deepres = outcomes.get("deepres")
    if deepres is not None:
        def max_cap(pod: Pod) -> float:
            return max(caps[m] for m in ([m for m in caps if not pod.spec or m in pod.spec] or list(caps)))

        above = [j for j in jobs if j.upper_mib > max_cap(j.pod)]
        whole = sum(1 for j in above if j.predicted_mib <= max_cap(j.pod))
        notes.append(f"whole-GPU fallback (`whole_gpu_request`, the extender's filter): {len(above)} jobs have an "
                     f"upper bound above the largest GPU they may use ({sum(1 for j in above if not j.pod.spec)} of "
                     f"them may use any GPU, the largest being {max(caps.values()) / MIB_PER_GB:.0f} GB); for the "
                     f"{whole} whose point estimate fits that GPU, DeepRes asks for an empty GPU of that size and "
                     "reserves it whole until the usage rule follows the observed peak (the others are refused); "
                     f"DeepRes placed {deepres.metrics['whole_gpu_binds']:.0f} runs of "
                     f"{deepres.metrics['whole_gpu_jobs']:.0f} jobs so. The fallback looks at the nodes the pod fits "
                     "by CPU and memory at that moment (as the live filter sees only the nodes kube-scheduler "
                     f"sends), so {deepres.metrics['whole_gpu_jobs_bound_fits']:.0f} of those jobs have a bound "
                     "that fits a larger GPU they may use, whose nodes were short of CPU or memory then; the "
                     "replay cannot show the risk this takes (an OOM kill on the smaller GPU), since every job's "
                     "true peak fits the smallest GPU it may use")
    qos_order = [q for q in ("LS", "BE", "Burstable", "Guaranteed") if any(j.qos == q for j in jobs)]
    return ReplayExperiment(outcomes, notes, qos_order, node_stride, len(nodes), gpus)
