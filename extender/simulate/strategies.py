"""The replay's policies (`Strategy` and its kinds): static, static ordered by predicted run time,
request (HAMi-style), DeepRes and its ablations. DeepRes calls the live `extender.policy` functions,
never copies of them; `extender/simulate/replay.py` says what the replay models."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

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
from extender.policy.duty import DutyStore, admission_duty, alone_duties, follow_duty
from extender.policy.feedback import Sharer, SharingFeedback, gpu_bound
from extender.policy.filtering import reserved_per_gpu, whole_gpu_request
from extender.policy.preemption import arrival_kind
from extender.policy.sharing import can_hold, sharing_view, wait_for_empty_s
from extender.settings import KubeSettings, PolicySettings
from extender.simulate.traces import MILLI
from extender.simulate.world import CRITICALITY, SAMPLE_EVERY_S, Cluster, Job

log = logging.getLogger(__name__)


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

    def on_usage(self, job: Job, now: float, busy: dict[str, float] | None = None) -> bool:
        """The first usage report after the warm-up (`busy`: the agent's busy-share samples of the pods
        on the job's GPU, in the capacity world; None: the job's true duty is observed exactly).
        Returns whether memory was freed."""
        return False

    def on_sample(self, job: Job, busy: dict[str, float], now: float) -> bool:
        """A later sample of the pods on the job's GPU (the capacity world's periodic report)."""
        return False

    def take_moves(self) -> list[int]:
        """Jobs the policy asks to move (stopped, their work since the last checkpoint lost, queued again)."""
        return []

    def on_stop(self, job: Job) -> None:
        """`job` left its GPUs (finished, preempted, killed or moved)."""

    def kind(self, job: Job) -> str:
        """The kind of arrival `job` is for preemption's churn rule ("": the policy does not preempt)."""
        return ""

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


class StaticPriority(Static):
    """Static whole GPUs, the queue in DeepRes's priority order (criticality, then deadline urgency,
    then size: `priority_of` with the predictor's run time, as DeepRes orders it): DeepRes without
    sharing, usage following or preemption, so DeepRes against it is what sharing gains under the
    admin's class order (against static-sjf the class order's cost is counted in too)."""

    name = "static-priority"

    def order_key(self, job: Job, now: float) -> tuple[float, ...]:
        inputs = PriorityInputs(criticality=CRITICALITY.get(job.qos, 1), deadline_s=job.deadline,
                                gpu_seconds=job.predicted_s, gpus=job.pod.num_gpu)
        return (-priority_of(inputs, now, self.params), job.arrival, job.idx)


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
    #: The lowest duty a declared gpu-share counts for before its signature is observed
    #: (`PolicySettings.share_floor`): 0 trusts declarations (the compute replay's truthful world).
    share_floor = 0.0

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
        self._blocked: set[int] = set()  # jobs the filter passed no node for, until they bind (draining rule)
        self.feedback = SharingFeedback(PolicySettings().peak_store_size)  # sharing's feedback (`policy.feedback`)
        self.moves: list[int] = []  # jobs the feedback asked to move, taken by the replay (`take_moves`)

    def admission(self, job: Job) -> float:
        job.admission_duty = admission_duty(job.declared_share, self.duties.get(job.spec_key), self.share_floor)
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
                          duty=job.admission_duty, predicted_run_s=job.predicted_s, kind=self.kind(job),
                          slowdown_margin=self.feedback.margin(job.spec_key) if self.params.sharing_feedback else 1.0)

    def kind(self, job: Job) -> str:
        return arrival_kind(CRITICALITY.get(job.qos, 1), job.pod.num_gpu)

    def view(self, i: int, now: float) -> NodeView:
        cached = self._views.get(i)
        if cached is not None and cached[0] == self.c.version[i]:
            return cached[1]
        cap, used, res = self.c.cap[i], self.c.used[i], self.c.reserved[i]
        feedback = self.params.sharing_feedback
        gpus = tuple(GpuView(uuid=f"{self.c.names[i]}-gpu{g}", index=g, capacity_mib=float(cap[g]),
                             used_mib=float(used[g]), reserved_mib=float(res[g]),
                             utilization=min(1.0, len(self.c.jobs_on[i][g]) / 2.0),
                             duties=tuple(sorted(self._duty_of(j) for j in self.c.jobs_on[i][g])),
                             strict=any(CRITICALITY.get(self.jobs[j].qos, 1) >= 2 for j in self.c.jobs_on[i][g]),
                             over_bound=feedback and self.feedback.is_over(f"{self.c.names[i]}-gpu{g}"),
                             resident_margin=max((self.feedback.margin(self.jobs[j].spec_key, "")
                                                  for j in self.c.jobs_on[i][g]), default=1.0) if feedback else 1.0)
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

    def wait_s(self, job: Job, rows: Sequence[int], now: float, need_mib: float = 0.0) -> float:
        """The predicted wait until `job.pod.num_gpu` GPUs of one of `rows` (the nodes the pod may go to)
        that can hold `need_mib` each (`sharing.can_hold`) are empty, from the predicted run times of
        the jobs on them (`sharing.wait_for_empty_s` per GPU), as the live ledger's."""
        k = max(job.pod.num_gpu, 1)
        key = (now, k, tuple(rows), int(self.c.version.sum()), need_mib)
        if self._wait is not None and self._wait[0] == key:
            return self._wait[1]
        best = math.inf
        for i in rows:
            waits = sorted(wait_for_empty_s(now, [[(self.jobs[j].start, self.jobs[j].predicted_s)
                                                   for j in self.c.jobs_on[i][g]]])
                           for g in range(self.c.cap.shape[1])
                           if self.c.present[i, g] and can_hold(float(self.c.cap[i, g]), need_mib))
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
        waiting = self.waiting_priority(job, now)
        key = (job.idx, now, int(self.c.version.sum()), job.admission_mib, job.admission_duty, waiting)
        if self._filtered is not None and self._filtered[0] == key:  # preempt right after place
            cached: tuple[PodRequest, dict[str, NodeView], list[str], list[str]] = self._filtered[1]
            return cached
        pod = self.request(job, now)
        rows = np.flatnonzero(self.c.base_mask(job.pod)).tolist()
        views = {self.c.names[i]: self.view(i, now) for i in rows}
        if self.params.sharing:
            need = (whole_gpu_request(pod, views.values()) or pod).admission_mib  # what the filter will admit
            wait = self.wait_s(job, rows, now, need)
            views = {name: sharing_view(pod, v, self.params, wait, waiting) for name, v in views.items()}
        result = filter_nodes(pod, list(views), views, 0.0, self.params)
        answer = (result.request or pod, views, list(result.passed), list(result.failed))
        self._filtered = (key, answer)
        return answer

    def waiting_priority(self, job: Job, now: float) -> float:
        """The highest priority of the other GPU jobs waiting (the filter passed them no node), as the
        live filter remembers them (`Planner.waiting_priority`): the draining rule's input."""
        if not self.params.drain or not self._blocked:
            return -math.inf
        return max((self.priority(self.jobs[b], now) for b in self._blocked if b != job.idx), default=-math.inf)

    def place(self, job: Job, now: float) -> tuple[int, list[int], float] | None:
        pod, views, passed, _ = self.filtered(job, now)
        if not passed:
            self._blocked.add(job.idx)
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
        if self.params.sharing_feedback:  # and what the feedback says of each GPU (over its bound, margins)
            duties = duties + np.array([[100.0 * self.feedback.is_over(f"{self.c.names[i]}-gpu{k}")
                                         + sum(self.feedback.margin(self.jobs[j].spec_key, "") for j in g)
                                         for k, g in enumerate(self.c.jobs_on[i])] for i in rows.tolist()])
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
        # the rule's own estimate of what preempting gains: the predicted wait for empty GPUs without it
        wait = self.wait_s(job, np.flatnonzero(self.c.base_mask(job.pod)).tolist(), now, pod.admission_mib) \
            if self.params.sharing else None
        found = choose_preemption(pod, candidates, now, self.params, wait_s=wait)
        if found is None:
            self._preempting.pop(job.idx, None)
            return None
        return [int(r.pod_uid) for r in found[1]]

    def on_bind(self, job: Job, now: float) -> None:
        self._blocked.discard(job.idx)
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
                                      signature=job.spec_key, duty=job.admission_duty,
                                      checkpoint_interval_s=job.checkpoint_s, evicted_by=job.evicted_by)

    def on_sample(self, job: Job, busy: dict[str, float], now: float) -> bool:
        self._follow_duty(job, busy, now)
        if self.params.sharing and self.params.sharing_feedback and job.node >= 0 and job.gpus:
            self._feedback(job.node, job.gpus[0], busy, now)
        return False

    def _feedback(self, node: int, gpu: int, busy: dict[str, float], now: float) -> None:
        """Sharing's feedback (`policy.feedback`) on one GPU from the agent's samples, as the live ledger's
        (`sharing_watch.SharingWatch.on_report`): a GPU over its bound shows so to the filter, a move is kept
        for the replay (`take_moves`)."""
        on = list(self.c.jobs_on[node][gpu])
        bound = gpu_bound((CRITICALITY.get(self.jobs[j].qos, 1) for j in on), self.params)
        sharers = [Sharer(uid=str(j), signature=self.jobs[j].spec_key, busy=busy.get(str(j)), duty=self._duty_of(j),
                          bound_s=self.jobs[j].start, bound=bound,
                          warm=now - self.jobs[j].start >= self.params.usage_warmup_s) for j in on]
        uuid = f"{self.c.names[node]}-gpu{gpu}"
        was = self.feedback.is_over(uuid)
        verdict = self.feedback.observe(uuid, "", sharers, False, now, self.params.sharing_move_after_s)
        if verdict.over_bound != was or verdict.move is not None:
            self.c.version[node] += 1
        if verdict.move is not None:
            self.moves.append(int(verdict.move))

    def on_stop(self, job: Job) -> None:
        self.feedback.forget_pod(str(job.idx))

    def take_moves(self) -> list[int]:
        """The jobs the feedback asked to move since the last call (the replay stops and queues them again)."""
        moves, self.moves = self.moves, []
        return moves

    def _follow_duty(self, job: Job, busy: dict[str, float] | None, now: float) -> None:
        """The duty usage rule: the agent's busy shares of the pods on the job's GPU, corrected for
        sharing by the live rule (`alone_duties`), or without samples the job's duty exactly (the
        model's inverse is exact in the compute replay's world); learned per signature."""
        if job.reservation is None:
            return
        alone = job.duty if busy is None else alone_duties(busy).get(str(job.idx))
        if alone is None:
            return
        with_duty = follow_duty(job.reservation, alone, now, self.params)
        self.duties.record(job.spec_key, alone, str(job.idx))
        if with_duty is not job.reservation:
            job.reservation = with_duty
            self.c.version[job.node] += 1

    def on_usage(self, job: Job, now: float, busy: dict[str, float] | None = None) -> bool:
        if job.reservation is None:
            return False
        self._follow_duty(job, busy, now)
        if busy is not None and self.params.sharing and self.params.sharing_feedback and job.gpus:
            self._feedback(job.node, job.gpus[0], busy, now)
        updated = observe_usage(job.reservation, job.true_mib, now, self.params, self.peaks)
        if updated.memory_mib == job.reservation.memory_mib:
            job.reservation = updated  # what the rule saw (`Reservation.track`), the memory as it was
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
