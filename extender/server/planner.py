"""What the extender decides about one pod: annotations + prediction + observed peaks -> PodRequest (`Plan`),
and the small per-pod memories the verbs share between one another (a filter's plan and shortlist for the
prioritize that follows it, the room the extender's own evictions hold for a pod). The rules are
`extender.policy`'s; the learned state is the ledger's; this is the glue between them."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from extender import annotations as ann
from extender.annotations import JobRequest
from extender.ledger import Ledger
from extender.policy import (
    FilterResult,
    PodRequest,
    PriorityInputs,
    Reservation,
    corrected_admission,
    packs_by_mix,
    priority_of,
    shortlist,
)
from extender.policy.columnar import Lookup, Scores, largest_gpu_rows, score_matrix, score_matrix_fragaware
from extender.policy.duty import admission_duty
from extender.policy.filtering import whole_gpu_for, whole_gpu_request
from extender.policy.fragmentation import DemandMix
from extender.policy.preemption import arrival_kind
from extender.policy.reasons import joined
from extender.policy.usage import is_corrected
from extender.protocol import PodInfo
from extender.server.gpu_demand import ModelDemands, OnModel, gpu_model_of, node_model, node_models, on_request
from extender.server.metrics import ExtenderMetrics
from extender.settings import Settings
from predictor.gpucal import path_of
from predictor.spec import Demand, DemandPredictor

#: A pod's prioritize reuses the plan its filter made this recently (kube-scheduler sends the two
#: back to back); the priority's deadline term moves by a negligible amount meanwhile.
PLAN_REUSE_S = 1.0
FILTER_PLANS_MAX = 1_024
#: A GPU pod the filter passed no node for counts as waiting (the draining rule) this long after its
#: last filter: kube-scheduler retries an unschedulable pod at least every 5 minutes.
WAITING_S = 300.0
#: Pods remembered as waiting, and workloads remembered as evicted, at most (oldest forgotten first).
REMEMBERED_MAX = 10_000
#: A GPU pod's prioritize reserves its best-scored node's GPUs for it ("assumed", as kube-scheduler
#: assumes a pod on its node before the binding cycle) until its bind arrives, its next filter, or
#: this long; at most this many at once (the oldest released first).
ASSUME_S = 15.0
ASSUMED_MAX = 1_000


def _assumed_as(req: PodRequest, node: str) -> tuple[Any, ...]:
    return (node, round(req.admission_mib, 3), req.gpus, req.whole_gpu, round(req.duty, 6))


def workload_of(raw_pod: Any) -> str:
    """What outlives a pod that is evicted and made again (preemption's churn rule): its controller
    (ownerReferences' controller uid: the Job, ReplicaSet...), else its namespace and name."""
    meta = (raw_pod.get("metadata") if isinstance(raw_pod, dict) else None) or {}
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") and ref.get("uid"):
            return f"owner/{ref['uid']}"
    return f"pod/{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
#: filter_nodes_total's reason for nodes that fit but the shortlist left out.
NOT_SHORTLISTED = "not_shortlisted"


class PredictorUnavailable(RuntimeError):
    """The predictor is still loading or failed to load."""


@dataclass(frozen=True, eq=False)
class Shortlist:
    """A filter's shortlist of a pod and the scores it ranked those nodes by, with what the scores
    read: the matrix's arrays, the version of each row, the demand mix (see `kept_shortlist`)."""

    plan: Plan
    names: tuple[str, ...]
    values: npt.NDArray[np.int64]
    lookup: Lookup  # of `names`: their rows, and the answer's JSON template
    arrays: Any
    versions: npt.NDArray[np.int64]
    mix: DemandMix | None


@dataclass(frozen=True)
class Plan:
    """Everything decided about one pod at one time: its request and how it was derived."""

    request: PodRequest
    job: JobRequest
    demand: Demand | None
    inputs: PriorityInputs
    source: str  # model, corrected, override, none


class Planner:
    """Plans pods and keeps the verbs' per-pod memories (bounded, under one small lock; the learned
    state is the ledger's, under its own)."""

    def __init__(self, settings: Settings, ledger: Ledger, metrics: ExtenderMetrics) -> None:
        self.settings = settings
        self.params = settings.policy.params()
        self.ledger = ledger
        self.metrics = metrics
        self.fragmentation_aware = settings.policy.fragmentation_aware_packing
        self.predictor: DemandPredictor | None = None
        self.predictor_error = ""
        self._filter_plans: OrderedDict[str, tuple[float, PodInfo, Plan]] = OrderedDict()  # uid -> (when, pod, plan)
        self._shortlists: OrderedDict[str, Shortlist] = OrderedDict()  # uid -> its filter's shortlist
        self._waits: OrderedDict[str, tuple[float, float]] = OrderedDict()  # uid -> (when (mono), its filter's W)
        # node -> (pod uid, its priority, until (mono)): room the extender's own eviction freed for a pod
        self._holds: dict[str, tuple[str, float, float]] = {}
        self._waiting: OrderedDict[str, tuple[float, float]] = OrderedDict()  # uid -> (priority, until (mono))
        self._evicted_by: OrderedDict[str, str] = OrderedDict()  # workload -> the kind of arrival that evicted it
        # uid -> (until (mono), what it was assumed as: node, admission, GPUs, whole GPU, duty)
        self._assumed: OrderedDict[str, tuple[float, tuple[Any, ...]]] = OrderedDict()
        self._lock = threading.Lock()
        self.models = ModelDemands(ledger, self.params)
        #: node -> pods restored after a restart that wait for the node's report (its GPU model) to be
        #: recorded for the online calibration (`placed(..., later=True)`)
        self._unplaced: dict[str, list[tuple[Plan, Reservation]]] = {}
        #: pod uid -> the controller that owns it (`workload_of` the pod a reservation was made for), for
        #: the online calibration's owner screen at `placed`
        self._owners: OrderedDict[str, str] = OrderedDict()

    @property
    def predictor_version(self) -> str:
        return str(getattr(self.predictor, "version", "") or "")

    def plan(self, pod: PodInfo, now_s: float) -> Plan:
        """Annotations + prediction + observed peaks -> PodRequest. Raises AnnotationError,
        PredictorUnavailable."""
        job = ann.parse_job(
            pod.annotations, created_s=pod.created_s, now_s=now_s, priority_value=pod.priority,
            priority_class=pod.priority_class, criticality_ceiling=self.settings.policy.ceiling(pod.namespace),
        )
        if not job.gpu_job:
            inputs = PriorityInputs(criticality=job.criticality)
            return Plan(PodRequest(pod.uid, pod.namespace, pod.name, gpu_job=False), job, None, inputs, "none")
        demand: Demand | None = None
        if job.spec is not None:
            predictor = self.predictor
            if predictor is None:
                raise PredictorUnavailable(self.predictor_error or "the predictor is still loading")
            try:
                demand = predictor.predict(job.spec)
            except Exception as err:
                raise PredictorUnavailable(f"prediction failed: {type(err).__name__}: {err}") from None
        if job.memory_override_mib is not None:
            admission, source = job.memory_override_mib, "override"
            predicted = demand.memory_mib if demand is not None else job.memory_override_mib
        else:
            assert demand is not None
            correction = self.ledger.correction(job.signature)
            admission = corrected_admission(demand.memory_mib_upper, correction, self.params)
            source = "corrected" if is_corrected(demand.memory_mib_upper, correction, self.params) else "model"
            predicted = demand.memory_mib
        inputs = PriorityInputs(job.criticality, job.deadline_s, demand.gpu_seconds if demand else 0.0, job.gpus)
        req = PodRequest(pod.uid, pod.namespace, pod.name, job.gpus, admission, predicted,
                         priority_of(inputs, now_s, self.params), True, fallback=source != "override",
                         duty=admission_duty(job.gpu_share, self.ledger.learned_duty(job.signature),
                                             self.settings.policy.share_floor(pod.namespace)),
                         predicted_run_s=inputs.gpu_seconds, kind=arrival_kind(job.criticality, job.gpus),
                         slowdown_margin=self.ledger.slowdown_margin(job.signature)
                         if job.signature and self.params.sharing_feedback else 1.0)
        self.metrics.predictions.labels(source).inc()
        self.metrics.predicted_memory.observe(admission)
        return Plan(req, job, demand, inputs, source)

    # ---- the demand on each node's GPU model (extender/server/gpu_demand.py) ----
    def on_model(self, plan: Plan, gpu: str, software: str) -> OnModel | None:
        """The plan's demand on GPU model `gpu` (line + live calibration + the job's observed peaks)."""
        precision = plan.job.spec.precision if plan.job.spec is not None else ""
        batch = plan.job.spec.batch_size if plan.job.spec is not None else 0
        return self.models.on(plan.request, plan.demand, precision, self.ledger.correction(plan.job.signature),
                              gpu, software, batch)

    def on_named_model(self, plan: Plan, gpu: str, software: str | None) -> OnModel | None:
        """`on_model` for /v1/predict: the node software the calibration saw most pods of when none is named."""
        if plan.demand is None:
            return None
        if software is None:
            software = self.ledger.calibration.software_for(gpu, path_of(plan.demand))
        return self.on_model(plan, gpu, software)

    def request_on(self, plan: Plan, node: str) -> PodRequest:
        """The plan's request admitted on `node`'s GPU models (bind's node; the largest demand among
        them on a node mixing models, as the filter admitted it)."""
        key = node_models(self.ledger, node)
        spec = plan.job.spec
        model = self.models.on_node(plan.request, plan.demand, spec.precision if spec is not None else "",
                                    self.ledger.correction(plan.job.signature), *key,
                                    spec.batch_size if spec is not None else 0, node) if key is not None else None
        if model is None or abs(model.admission_mib - plan.request.admission_mib) <= 0.05:
            return plan.request
        return on_request(plan.request, model)

    def placed(self, plan: Plan, res: Reservation, *, later: bool = False) -> None:
        """Record a bound pod's offline point on its node's GPU model for the online calibration; a pod
        restored before its node reported (`later`) is recorded at the node's next report
        (`place_restored`): the agent reports its peak again, so the calibration is learned anew from
        the pods still running, wherever it is not kept in a file."""
        key = (gpu_model_of(self.ledger, res.node, res.gpu_uuids[0]) if res.gpu_uuids else None) or node_model(
            self.ledger, res.node)  # the model of the GPU it got (a node may mix models)
        if key is None and later:
            with self._lock:
                self._unplaced.setdefault(res.node, []).append((plan, res))
            return
        model = self.on_model(plan, *key) if key is not None else None
        if model is not None:
            with self._lock:  # a restored pod's owner is not known: its name stands for it
                owner = self._owners.pop(res.pod_uid, "") or f"pod/{res.namespace}/{res.name}"
            self.ledger.calibration.placed(res.pod_uid, res.node, model.gpu, model.software, model.path,
                                           model.offline_mib, model.offline_upper_mib, model.regime,
                                           tenant=res.namespace, owner=owner)

    def place_restored(self, node: str) -> None:
        """`node` reported: record the pods restored on it before (`placed(..., later=True)`)."""
        if not self._unplaced:
            return
        with self._lock:
            waiting = self._unplaced.pop(node, [])
        for plan, res in waiting:
            self.placed(plan, res)

    def by_model(self, plan: Plan, names: Iterable[str]) -> list[tuple[PodRequest, tuple[str, ...]]] | None:
        """`names` grouped by GPU model, each with the request admitted there (None: one request for all)."""
        precision = plan.job.spec.precision if plan.job.spec is not None else ""
        batch = plan.job.spec.batch_size if plan.job.spec is not None else 0
        return self.models.by_model(plan.request, plan.demand, precision, self.ledger.correction(plan.job.signature),
                                    names, batch)

    # ---- the whole-GPU fallback and the score ----
    def whole_gpu_on(self, req: PodRequest, names: Iterable[str], *, few: bool = False) -> PodRequest:
        """`req`, or its whole-GPU form when the fallback applies over `names`
        (`filtering.whole_gpu_request`): what the filter decided for these nodes, decided again by a
        verb that has no kept filter plan (prioritize, bind, preemption). `few` names (bind's one
        node, preemption's) are read from the NodeViews, a prioritize's list from the matrix."""
        if not req.fallback:
            return req
        if few:
            return whole_gpu_request(req, map(self.ledger.views.get, names), self.params) or req
        return whole_gpu_for(req, largest_gpu_rows(self.ledger.matrix, names, req.gpus), self.params) or req

    def scores(self, req: PodRequest, names: tuple[str, ...]) -> Scores:
        """THE prioritize score of `req` on each of `names` (the filter's shortlist ranks by it too)."""
        return self._scores(req, names, self.packing_mix(req))

    def _scores(self, req: PodRequest, names: tuple[str, ...], mix: DemandMix | None) -> Scores:
        """`scores` with the demand mix already read (`packing_mix`)."""
        if mix is not None:
            # packing pods: the fragmentation-aware score (FGD's idea in memory terms) against the mix of
            # recent admissions; reports/simulation.md measures it at FGD's allocation level
            return score_matrix_fragaware(req, names, self.ledger.matrix, self.params, mix, memo=self.ledger.merits)
        return score_matrix(req, names, self.ledger.matrix, self.ledger.views, self.params)

    def packs(self, req: PodRequest) -> bool:
        """Whether `req` is placed by the fragmentation-aware rule (score and bind alike)."""
        return self.fragmentation_aware and packs_by_mix(req, self.params)

    def packing_mix(self, req: PodRequest) -> DemandMix | None:
        """The demand mix when `req` is placed by the fragmentation-aware rule, else None."""
        if not self.packs(req):
            return None
        mix = self.ledger.demand_mix()
        return mix if len(mix) else None

    # ---- the filter's shortlist, kept for the prioritize that follows ----
    def shortlisted(self, plan: Plan, result: FilterResult) -> FilterResult:
        """The filter's answer when some nodes fit: the `policy.filter_shortlist` best of them by the
        prioritize score (`policy.shortlist`), and no failed nodes. kube-scheduler drops every node not
        named in NodeNames and needs the failures' reasons only when no node is left (its "0/N nodes
        are available" message, its preemption), so it then scores and sends to /prioritize a few
        dozen nodes instead of thousands (docs/values.md, `extender.filterShortlist`).

        The shortlist's scores are kept for the pod's prioritize, which kube-scheduler sends next with
        these names (`kept_shortlist`): over the shortlist the score gives each node the value it had
        among all (`policy.shortlist` says why), so recomputing it there repeated the same numpy work
        on the worker's one Python thread (~0.2 ms per pod in `deepres bench cluster`)."""
        req = plan.request
        keep = self.settings.policy.filter_shortlist
        if len(result.passed) <= keep:
            self.ledger.matrix.keep(result.passed)  # the list its prioritize is sent (if more than one)
            return FilterResult(result.passed, {}, {}, result.kinds)
        matrix = self.ledger.matrix
        arrays, mix = matrix.arrays, self.packing_mix(req)
        looked = matrix.lookup(result.passed)  # the filter's own list: remembered, no lookup work
        versions = arrays.version[looked.known_safe()[1]]  # before the rows are read
        scores = self._scores(req, result.passed, mix)
        chosen = shortlist(scores.values, keep)
        picked = tuple(scores.names[i] for i in chosen.tolist())
        if scores.lookup is not None:  # the rows of the list kube-scheduler sends to prioritize next
            rows = scores.lookup.rows[chosen]
            rows.flags.writeable = False
            picked_lookup = Lookup(list(picked), rows, scores.lookup.layout)
            matrix.remember(picked, picked_lookup)
            # kept when the score read the matrix rows alone (the packing score, or one GPU; the score of
            # several GPUs reads the NodeViews) and these very rows
            if scores.lookup is looked and (mix is not None or req.gpus <= 1):
                values = scores.values[chosen]
                values.flags.writeable = False
                self._keep_shortlist(Shortlist(plan, picked, values, picked_lookup, arrays, versions[chosen], mix))
        return FilterResult(picked, {}, {}, {**result.kinds, NOT_SHORTLISTED: len(result.passed) - len(picked)})

    def _keep_shortlist(self, kept: Shortlist) -> None:
        uid = kept.plan.request.uid
        if not uid:
            return
        with self._lock:
            self._shortlists[uid] = kept
            self._shortlists.move_to_end(uid)
            while len(self._shortlists) > FILTER_PLANS_MAX:
                self._shortlists.popitem(last=False)

    def kept_shortlist(self, plan: Plan, names: tuple[str, ...]) -> Shortlist | None:
        """The scores the pod's filter kept for `names` (`shortlisted`), when they are still what the
        score gives: the same plan (the filter's, reused by this prioritize), the same names in the
        same order, the same demand mix, and every row as it was (a row's version changes with every
        write of it; the arrays object with every growth). Else None: the score is computed anew."""
        with self._lock:  # taken: one prioritize follows a filter (a retried one computes the score)
            kept = self._shortlists.pop(plan.request.uid, None)
        if kept is None or kept.plan is not plan or kept.names != names:
            return None
        if self.ledger.matrix.arrays is not kept.arrays or self.packing_mix(plan.request) is not kept.mix:
            return None
        if not np.array_equal(kept.arrays.version[kept.lookup.rows], kept.versions):
            return None
        return kept

    # ---- the filter's plan, kept for the prioritize that follows ----
    def keep_filter_plan(self, pod: PodInfo, plan: Plan, now: float) -> None:
        if not pod.uid:
            return
        with self._lock:
            self._filter_plans[pod.uid] = (now, pod, plan)
            self._filter_plans.move_to_end(pod.uid)
            while len(self._filter_plans) > FILTER_PLANS_MAX:
                self._filter_plans.popitem(last=False)

    def keep_wait(self, uid: str, wait_s: float, mono: float) -> None:
        """The sharing rule's W the pod's filter found over its nodes (kube-scheduler's node list), for its
        prioritize's assumption and its bind, which see one node: the same W, the same answer."""
        with self._lock:
            self._waits[uid] = (mono, wait_s)
            self._waits.move_to_end(uid)
            while len(self._waits) > FILTER_PLANS_MAX:
                self._waits.popitem(last=False)

    def wait_of(self, uid: str, mono: float) -> float | None:
        """The W `keep_wait` kept for the pod less than ASSUME_S ago (None: no filter of it computed one)."""
        with self._lock:
            kept = self._waits.get(uid)
        return kept[1] if kept is not None and 0.0 <= mono - kept[0] < ASSUME_S else None

    def filter_plan(self, pod: PodInfo, now: float) -> Plan | None:
        """The plan the pod's filter made less than PLAN_REUSE_S ago, if the pod is unchanged: its
        prioritize then skips the annotations and the predictor (~7% of a pod's work)."""
        with self._lock:
            kept = self._filter_plans.get(pod.uid)
        if kept is None or not 0.0 <= now - kept[0] < PLAN_REUSE_S or kept[1] != pod:
            return None
        return kept[2]

    # ---- room held for the pod the extender's own evictions were for ----
    def has_holds(self) -> bool:
        return bool(self._holds)

    def hold(self, node: str, uid: str, priority: float, until_mono: float) -> None:
        """The room just freed on `node` is the pod's until it binds, or `until_mono`."""
        with self._lock:
            self._holds[node] = (uid, priority, until_mono)

    def held_for_another(self, req: PodRequest, node: str, mono: float) -> str:
        """Why `node` is not for `req`: its room was freed by evicting pods for a pod of at least
        `req`'s priority that has not bound yet (kube-scheduler's nominated node, for the
        extender's own evictions); "" when it is free to take. Without this, a lower-priority pod
        waiting in kube-scheduler's queue took the freed GPU before the pod it was freed for."""
        with self._lock:
            held = self._holds.get(node)
            if held is not None and held[2] <= mono:
                del self._holds[node]
                held = None
        if held is None or held[0] == req.uid or req.priority > held[1]:
            return ""
        return f"room held for a pod of priority {held[1]:.1f} that preemption made room for"

    def respect_holds(self, req: PodRequest, result: FilterResult, mono: float) -> FilterResult:
        held = {n: why for n in result.passed if (why := self.held_for_another(req, n, mono))}
        if not held:
            return result
        kinds = dict(result.kinds)
        kinds["held"] = kinds.get("held", 0) + len(held)
        return FilterResult(tuple(n for n in result.passed if n not in held), result.failed,
                            joined(result.unresolvable, held), kinds)

    # ---- GPU pods that fit nowhere (the draining rule) and evicted workloads (preemption's churn rule) ----
    def note_waiting(self, uid: str, priority: float, mono: float) -> None:
        """The filter passed `uid` no node: it waits (for `WAITING_S` after this filter, or until bind)."""
        with self._lock:
            self._waiting[uid] = (priority, mono + WAITING_S)
            self._waiting.move_to_end(uid)
            while len(self._waiting) > REMEMBERED_MAX:
                self._waiting.popitem(last=False)

    def waiting_priority(self, uid: str, mono: float) -> float:
        """The highest priority of the other GPU pods waiting (-inf: none): `sharing.draining`'s input."""
        with self._lock:
            for gone in [u for u, (_, until) in self._waiting.items() if until <= mono]:
                del self._waiting[gone]
            return max((p for u, (p, _) in self._waiting.items() if u != uid), default=-math.inf)

    def note_eviction(self, raw_victim: Any, kind: str) -> None:
        """A pod of `raw_victim`'s workload was evicted by an arrival of `kind`: its next pod's
        reservation carries it (`Reservation.evicted_by`), so the same kind does not evict it again."""
        with self._lock:
            self._evicted_by[workload_of(raw_victim)] = kind
            self._evicted_by.move_to_end(workload_of(raw_victim))
            while len(self._evicted_by) > REMEMBERED_MAX:
                self._evicted_by.popitem(last=False)

    def evicted_by(self, raw_pod: Any) -> str:
        with self._lock:
            return self._evicted_by.get(workload_of(raw_pod), "")

    # ---- the pod kube-scheduler is about to bind: assumed on the node its prioritize scored best ----
    def reservation(self, plan: Plan, req: PodRequest, node: str, mono: float, raw_pod: Any, *,
                    assumed: bool = False) -> Reservation:
        """The reservation `req` is recorded as on `node` (its GPUs left to the ledger's choice)."""
        if req.gpu_job and req.uid:  # its owner, for the online calibration (`placed`)
            with self._lock:
                self._owners[req.uid] = workload_of(raw_pod)
                self._owners.move_to_end(req.uid)
                while len(self._owners) > REMEMBERED_MAX:
                    self._owners.popitem(last=False)
        return Reservation(req.uid, req.namespace, req.name, node, (), req.admission_mib, req.admission_mib,
                           req.predicted_mib, plan.inputs, mono, plan.job.signature, self.predictor_version,
                           duty=req.duty, checkpoint_interval_s=plan.job.checkpoint_interval_s,
                           evicted_by=self.evicted_by(raw_pod), assumed=assumed)

    def bind_request(self, plan: Plan, node: str) -> PodRequest:
        """The request a bind of `plan`'s pod on `node` admits (its GPU model, the whole-GPU fallback)."""
        return self.whole_gpu_on(self.request_on(plan, node), (node,), few=True)

    def assume(self, plan: Plan, node: str, raw_pod: Any, mono: float) -> bool:
        """Reserve the pod's GPUs on `node` (its prioritize's best) until its bind: the pods kube-scheduler
        filters meanwhile see them taken. Without it, a burst of pods scored the same GPU best one after
        another while the first one's bind was on its way, and every later bind was refused (`deepres
        bench cluster`: 232-1,210 refusals per 1,000 pods, each a whole scheduling cycle again). The caller
        (the prioritize) released the pod's earlier one first (`unassume`)."""
        req = self.bind_request(plan, node)
        if not req.gpu_job or not req.uid:
            return False
        outcome = self.ledger.reserve_on(req, self.reservation(plan, req, node, mono, raw_pod, assumed=True), mono,
                                         packing=self.packs(req), wait_s=self.wait_of(req.uid, mono))
        if isinstance(outcome, str) or outcome.existing:
            return False
        with self._lock:
            self._assumed[req.uid] = (mono + ASSUME_S, _assumed_as(req, node))
            over = len(self._assumed) - ASSUMED_MAX
            dropped = [self._assumed.popitem(last=False)[0] for _ in range(max(over, 0))]
        for uid in dropped:
            self.ledger.release_assumed(uid)
        self.metrics.assumptions.labels("made").inc()
        return True

    def unassume(self, uid: str, mono: float) -> None:
        """The pod's assumed reservation, if any, is released (its filter again: it is being placed anew),
        and so are those that outlived `ASSUME_S` with no bind."""
        with self._lock:
            if not self._assumed:
                return
            mine = self._assumed.pop(uid, None)
            expired = []
            while self._assumed:
                first, (until, _) = next(iter(self._assumed.items()))
                if until > mono:
                    break
                self._assumed.popitem(last=False)
                expired.append(first)
        if mine is not None:
            self.ledger.release_assumed(uid)
        for gone in expired:
            if self.ledger.release_assumed(gone):
                self.metrics.assumptions.labels("expired").inc()

    def take_assumed(self, req: PodRequest, node: str, mono: float) -> Reservation | None:
        """The bind of `req` on `node`: the reservation assumed for it there, now its bind's; None when
        there is none or it was assumed otherwise (another node, another admission: the bind's request
        is planned from the API server's copy of the pod), which is then released."""
        with self._lock:
            entry = self._assumed.pop(req.uid, None)
        if entry is None:
            return None
        if entry[1] == _assumed_as(req, node):
            res = self.ledger.confirm(req.uid, node, mono)
            if res is not None:
                self.metrics.assumptions.labels("bound").inc()
                return res
        if self.ledger.release_assumed(req.uid):
            self.metrics.assumptions.labels("moved").inc()
        return None

    def release_holds(self, uid: str) -> None:
        with self._lock:
            self._waiting.pop(uid, None)
            for node in [n for n, held in self._holds.items() if held[0] == uid]:
                del self._holds[node]
