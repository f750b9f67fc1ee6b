"""The extender's Flask application: kube-scheduler's verbs, agent telemetry, predictions, probes.

`Extender` is the glue between a decoded request, the policy calls (annotations -> PodRequest ->
filter/score/choose/preempt), the one ledger of learned state (`extender.ledger`), the API server
(`extender.kube`, the only truth about pods: bind and eviction read them there) and the background
worker that evicts and nudges off the request path (`extender.worker`); the HTTP layers only move bytes and
JSON in and out: `wsgi_verbs.VerbRoutes` for the verbs and telemetry (all of the traffic), the
Flask routes in `create_app` for the rest. Bad input never yields a 5xx or a traceback: the verbs
answer HTTP 200 with `Error` set (what kube-scheduler expects), the other endpoints a 4xx with a
message.
"""

from __future__ import annotations

import gc
import importlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from extender import annotations as ann
from extender.annotations import AnnotationError, JobRequest
from extender.auth import TelemetryAuth
from extender.kube import (
    TERMINAL_PHASES,
    Cluster,
    ClusterError,
    ClusterHandlers,
    InMemoryCluster,
    KubeCluster,
    pod_meta,
)
from extender.ledger import ACCEPTED, NODES_MAX, TOO_MANY_NODES, UNKNOWN_NODE, Ledger
from extender.metrics import ExtenderMetrics
from extender.openapi import openapi_document
from extender.policy import (
    FilterResult,
    PodRequest,
    PriorityInputs,
    Reservation,
    choose_preemption,
    corrected_admission,
    packs_by_mix,
    plan_victims,
    priority_of,
    shortlist,
)
from extender.policy.columnar import (
    Lookup,
    Scores,
    filter_matrix,
    largest_gpu_rows,
    score_matrix,
    score_matrix_fragaware,
)
from extender.policy.duty import admission_duty
from extender.policy.filtering import NO_REPORT, STALE, gib, is_fresh, whole_gpu_for, whole_gpu_request
from extender.policy.fragmentation import DemandMix
from extender.policy.sharing import apply_sharing
from extender.policy.usage import is_corrected
from extender.protocol import (
    ExtenderArgs,
    PodInfo,
    ProtocolError,
    binding_result,
    filter_all_unresolvable,
    filter_error,
    filter_result,
    host_priority_json,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
    parse_pod,
    parse_preemption_args,
    preemption_result,
    soft_preferences,
)
from extender.settings import Settings, describe, load_settings
from extender.telemetry import NodeReport, ReportError, parse_report
from extender.worker import Worker
from extender.wsgi_verbs import BadRequest, BodyTooLarge, VerbRoutes, decode_json, encode_json, read_body
from predictor.spec import Demand, DemandPredictor

log = logging.getLogger(__name__)

WARNED_MAX = 10_000
#: A relist does not release reservations made this recently: the list may predate their bind (a
#: pod deleted meanwhile is still released by its watch event).
RELIST_GRACE_S = 60.0
#: A pod's prioritize reuses the plan its filter made this recently (kube-scheduler sends the two
#: back to back); the priority's deadline term moves by a negligible amount meanwhile.
PLAN_REUSE_S = 1.0
FILTER_PLANS_MAX = 1_024
#: Telemetry arriving this soon after a filter failed nodes for the lack of it nudges the node.
NUDGE_WINDOW_S = 600.0
#: The Node annotation the extender sets to nudge kube-scheduler (a Node update is a cluster event).
TELEMETRY_ANNOTATION = "deepres.io/telemetry-since"
#: filter_nodes_total's reason for nodes that fit but the shortlist left out.
NOT_SHORTLISTED = "not_shortlisted"
#: Events waiting to be sent at most; more are dropped (events are best effort).
EVENTS_QUEUED_MAX = 4_096
#: Local mode checks for silent nodes and unseen reservations at most this often.
EXPIRY_EVERY_S = 10.0


def settle_heap() -> None:
    """Keep the cyclic garbage collector off the request path.

    A nodes-mode request parses ~0.4 MB of JSON into ~20,000 objects that live until the answer is
    sent, so with CPython's default thresholds (700, 10, 10) they are scanned and promoted several
    times per request, and full collections walk everything loaded at start (torch, the predictor):
    measured, the median nodes-mode pod took 11.7 ms in-process, 4.9 ms with the start-up heap
    frozen and 4.2 ms with higher thresholds as well (4.1 ms with no collector at all). The
    extender makes little cyclic garbage, so collecting it less often costs little memory."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class PredictorUnavailable(RuntimeError):
    """The predictor is still loading or failed to load."""


@dataclass(frozen=True, eq=False)
class Shortlist:
    """A filter's shortlist of a pod and the scores it ranked those nodes by, with what the scores
    read: the matrix's arrays, the version of each row, the demand mix (see `_kept_shortlist`)."""

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


class Extender:
    """The verbs' logic: decoded requests in, policy calls over the ledger, API calls out.

    Two clocks: `clock` (wall, Unix seconds) for deadlines and priorities, `mono` (monotonic) for
    everything measured between two moments of this process (telemetry age, warm-ups, grace periods),
    so a wall clock step never makes a silent node look fresh.
    """

    def __init__(
        self,
        settings: Settings,
        predictor: DemandPredictor | None,
        cluster: Cluster,
        clock: Callable[[], float],
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        self.params = settings.policy.params()
        self.ledger = Ledger(self.params, settings.policy.peak_store_size)
        self.state = self.ledger  # the name older callers use
        self.cluster = cluster
        self.clock = clock
        # an injected wall clock (tests) drives both, so tests move time with one hand
        self.mono = monotonic or (time.monotonic if clock is time.time else clock)
        self.merits = self.ledger.merits
        self.metrics = ExtenderMetrics(self.ledger, self.mono, self.merits)
        self.local = settings.kube.no_kube
        self.token = settings.telemetry_token_value()
        k = settings.kube
        self.auth = TelemetryAuth(local=self.local, shared_token=self.token, reviewer=cluster,
                                  audience=k.token_audience, allowed_accounts=k.agent_service_accounts,
                                  cache_s=k.token_cache_s)
        self.worker = Worker()
        # Events are best effort and off the request path: a bind answers without waiting for one
        self.events = Worker("deepres-events", limit=EVENTS_QUEUED_MAX)
        self._predictor = predictor
        self._predictor_error = ""
        self._warned: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._preempting: OrderedDict[str, float] = OrderedDict()  # pod uid -> wait until (mono)
        # node -> (pod uid, its priority, until (mono)): room the extender's own eviction freed for a pod
        self._holds: dict[str, tuple[str, float, float]] = {}
        self._filter_plans: OrderedDict[str, tuple[float, PodInfo, Plan]] = OrderedDict()  # uid -> (when, pod, plan)
        self._shortlists: OrderedDict[str, Shortlist] = OrderedDict()  # uid -> its filter's shortlist
        self._lock = threading.Lock()  # the small request caches above; learned state is the ledger's
        self._synced_s: float | None = None  # mono time of the first pod list applied
        self._ready = False  # latched once the predictor, the first sync and the telemetry quorum are in
        self._expected_nodes: frozenset[str] = frozenset()  # nodes holding reservations at the first sync
        self._telemetry_wanted_s = -math.inf  # mono time a filter last failed nodes for missing telemetry
        self._last_expiry_s = -math.inf
        self.fragmentation_aware = settings.policy.fragmentation_aware_packing
        if self.local and not self.token:
            log.warning("no telemetry token configured: /v1/telemetry refuses every report "
                        "(set --telemetry-token-file or DEEPRES_TELEMETRY_TOKEN)")

    # ---- start-up ----
    def start(self) -> None:
        """Load the predictor (in the background unless given), then start the cluster watches: the
        first sync rebuilds reservations with the pods' priorities, which need the predictor."""
        if self._predictor is not None:
            self.start_cluster()
        else:
            threading.Thread(target=self._load_predictor, name="deepres-predictor-load", daemon=True).start()

    def _load_predictor(self) -> None:
        try:
            factory = self.settings.predictor_factory
            if factory:
                module_name, _, attr = factory.partition(":")
                loaded = getattr(importlib.import_module(module_name), attr)()
            else:
                runtime: Any = importlib.import_module("predictor.runtime")
                loaded = runtime.Predictor.load(self.settings.predictor_path or None)
        except Exception as err:  # shown by /readyz; the verbs answer with Error meanwhile
            self._predictor_error = f"{type(err).__name__}: {err}"
            log.error("predictor failed to load: %s", self._predictor_error)
            return
        self._predictor = loaded
        log.info("predictor loaded version=%s", getattr(loaded, "version", "?"))
        settle_heap()
        self.start_cluster()

    def start_cluster(self) -> None:
        self.cluster.start(ClusterHandlers(
            pod_changed=self.on_pod_changed, pods_listed=self.on_pods_listed,
            node_deleted=self.ledger.forget_node, nodes_listed=self.on_nodes_listed,
            node_added=self.ledger.node_added,
        ))

    def readiness(self) -> list[str]:
        """What the verbs still wait for after a (re)start: the predictor, the first pod list (the
        reservations rebuilt from annotations) and a telemetry quorum: `kube.telemetry_quorum` of
        the nodes holding reservations at that list reported since, or `kube.telemetry_grace_s`
        passed. Latched once met: later per-node silence is the filter's staleness rule."""
        if self._ready:
            return []
        waiting = []
        if self._predictor is None:
            waiting.append(f"predictor ({self._predictor_error})" if self._predictor_error else "predictor")
        if not self.cluster.synced() or self._synced_s is None:
            waiting.append("first cluster sync")
        else:
            missing = self._quorum_missing()
            if missing:
                waiting.append(missing)
        if not waiting:
            self._ready = True
        return waiting

    def _quorum_missing(self) -> str:
        expected = self._expected_nodes
        assert self._synced_s is not None
        if not expected or self.mono() - self._synced_s >= self.settings.kube.telemetry_grace_s:
            return ""
        reported = sum(1 for n in expected if (t := self.ledger.telemetry(n)) is not None
                       and t.received_s >= self._synced_s)
        if reported >= self.settings.kube.telemetry_quorum * len(expected):
            return ""
        return f"telemetry quorum ({reported} of {len(expected)} nodes with reservations reported)"

    def _not_ready(self) -> str:
        waiting = self.readiness()
        return f"extender not ready: waiting for {', '.join(waiting)}" if waiting else ""

    @property
    def predictor_version(self) -> str:
        return str(getattr(self._predictor, "version", "") or "")

    # ---- planning ----
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
            predictor = self._predictor
            if predictor is None:
                raise PredictorUnavailable(self._predictor_error or "the predictor is still loading")
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
                         duty=admission_duty(job.gpu_share, self.ledger.learned_duty(job.signature)),
                         predicted_run_s=inputs.gpu_seconds)
        self.metrics.predictions.labels(source).inc()
        self.metrics.predicted_memory.observe(admission)
        return Plan(req, job, demand, inputs, source)

    def record_event(self, raw_pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the pod, sent by the events worker (dropped when EVENTS_QUEUED_MAX are waiting)."""
        meta = {k: v for k, v in (raw_pod.get("metadata") or {}).items() if k in ("namespace", "name", "uid")}
        target = {"metadata": meta}

        def send() -> None:
            self.cluster.event(target, reason, message, warning=warning)

        self.events.submit(f"{meta.get('uid') or meta.get('name')}/{reason}/{message}", send)

    def warn_once(self, raw_pod: Mapping[str, Any], uid: str, reason: str, message: str) -> None:
        """A Warning event on the pod, once per pod and message (kube-scheduler retries often)."""
        key = (uid, message)
        with self._lock:
            if key in self._warned:
                return
            self._warned[key] = None
            while len(self._warned) > WARNED_MAX:
                self._warned.popitem(last=False)
        self.record_event(raw_pod, reason, message, warning=True)

    # ---- trust ----
    def confirmed_pod(self, namespace: str, name: str, uid: str, *, pending_from_watch: bool = False,
                      ) -> tuple[dict[str, Any], PodInfo] | str:
        """The pod as the API server has it, when it is one this extender may act on: ours
        (schedulerName), the same pod (uid), not finished; else why not. What a request claimed
        about the pod never enters: a filter body is not the pod.

        `pending_from_watch` (bind): the pod watch's copy (the API server's, as of a moment ago)
        is enough when it shows that very pod pending and unbound: uid and schedulerName never
        change, and the Binding that follows carries the uid as a precondition, so the API server
        itself refuses a pod that was bound, deleted or replaced meanwhile. Anything else (not
        seen yet, another uid, bound, deleting) asks the API server, as every other caller does.
        This saves one API round trip per bind (about a fifth of the extender's CPU per pod)."""
        key = f"{namespace}/{name}"
        if pending_from_watch:
            watched = self.cluster.watched_pod(namespace, name)
            if watched is not None and not (watched.get("metadata") or {}).get("deletionTimestamp"):
                checked = self._check_pod(key, watched, uid)
                if not isinstance(checked, str) and not checked[1].node_name:
                    return checked
        try:
            raw = self.cluster.read_pod(namespace, name)
        except ClusterError as err:
            return f"pod {key} could not be read: {err}"
        if raw is None:
            return f"pod {key} does not exist"
        return self._check_pod(key, raw, uid)

    def _check_pod(self, key: str, raw: dict[str, Any], uid: str) -> tuple[dict[str, Any], PodInfo] | str:
        try:
            pod = parse_pod(raw)
        except ProtocolError as err:
            return f"pod {key}: {err}"
        if not uid or pod.uid != uid:
            return f"pod {key} has uid {pod.uid or '(none)'}, not {uid or '(none)'}"
        if pod.scheduler_name != self.settings.kube.scheduler_name:
            return f"pod {key} is scheduled by {pod.scheduler_name or 'default-scheduler'}, not by " \
                   f"{self.settings.kube.scheduler_name}"
        if pod.phase in TERMINAL_PHASES:
            return f"pod {key} is {pod.phase}"
        return raw, pod

    # ---- verbs ----
    def filter(self, body: Any) -> dict[str, Any]:
        """`body`: the decoded JSON, or ExtenderArgs already read from the bytes (`decode_extender_args`)."""
        try:
            args = body if isinstance(body, ExtenderArgs) else parse_extender_args(body)
        except ProtocolError as err:
            return filter_error(f"bad ExtenderArgs: {err}")
        not_ready = self._not_ready()
        if not_ready:
            self._telemetry_wanted_s = self.mono()  # telemetry arriving next nudges its node (a retry)
            return filter_error(not_ready, args)
        now, mono = self.clock(), self.mono()
        self.cluster.learn_pod(args.raw_pod)  # local mode only: the first request naming a pod defines it
        try:
            plan = self.plan(args.pod, now)
        except AnnotationError as err:
            self.metrics.filter_nodes.labels("bad_annotation").inc(len(args.node_names))
            self.warn_once(args.raw_pod, args.pod.uid, "InvalidAnnotation", str(err))
            return filter_all_unresolvable(args, str(err))
        except PredictorUnavailable as err:
            return filter_error(f"predictor unavailable: {err}", args)
        result = filter_matrix(plan.request, args.node_names, self.ledger.matrix, self.ledger.views, mono,
                               self.params)
        if plan.request.gpu_job and self.params.sharing and result.passed:  # compute: policy/sharing.py
            wait = self.ledger.wait_for_empty_s(plan.request.gpus, mono)  # over every node, as bind's
            result = apply_sharing(plan.request, result, self.ledger.views, self.params, wait)
        if result.request is not None:  # the whole-GPU fallback: prioritize and bind place that request
            plan = replace(plan, request=result.request)
        self._keep_filter_plan(args.pod, plan, now)
        if self._holds and plan.request.gpu_job:
            result = self._respect_holds(plan.request, result, mono)
        if not result.passed and result.failed and plan.request.gpu_job and self.settings.kube.self_preemption:
            self.request_preemption(args.pod, list(result.failed), mono)
        if (result.passed and plan.request.gpu_job and self.settings.policy.filter_shortlist > 0
                and not soft_preferences(args.raw_pod)):
            result = self._shortlisted(plan, result)
        for kind, count in result.kinds.items():
            self.metrics.filter_nodes.labels(kind).inc(count)
        if result.kinds.get(NO_REPORT) or result.kinds.get(STALE):
            self._telemetry_wanted_s = mono
        if log.isEnabledFor(logging.DEBUG):
            log.debug("filter pod=%s admission_mib=%.0f gpus=%d passed=%d failed=%d unresolvable=%d",
                      args.pod.key, plan.request.admission_mib, plan.request.gpus, len(result.passed),
                      len(result.failed), len(result.unresolvable))
        return filter_result(result, args)

    def prioritize(self, body: Any) -> list[dict[str, Any]] | orjson.Fragment:
        """Scores (the HostPriorityList's JSON, already encoded); on any problem an empty list
        (kube-scheduler ignores prioritize errors anyway)."""
        try:
            args = body if isinstance(body, ExtenderArgs) else parse_extender_args(body)
        except ProtocolError as err:
            log.info("prioritize: bad ExtenderArgs: %s", err)
            return []
        now = self.clock()
        kept_plan = self._filter_plan(args.pod, now)
        if kept_plan is not None and kept_plan.request.whole_gpu:  # the filter's fallback held for its names:
            kept_plan = None  # decided again over these (rare pods: the plan is cheap to redo)
        kept = self._kept_shortlist(kept_plan, args.node_names) if kept_plan is not None else None
        if kept is not None:  # the very scores the filter ranked these nodes by, nothing they read changed since
            return orjson.Fragment(host_priority_json(kept.lookup.names, kept.values, kept.lookup.derived))
        try:
            plan = kept_plan or self.plan(args.pod, now)
        except (AnnotationError, PredictorUnavailable):
            return host_priority_list((name, 0) for name in dict.fromkeys(args.node_names))
        req = plan.request if kept_plan is not None else self._whole_gpu_on(plan.request, args.node_names)
        scores = self.scores(req, args.node_names)
        return orjson.Fragment(host_priority_json(scores.names, scores.values,
                                                  scores.lookup.derived if scores.lookup else None))

    def _whole_gpu_on(self, req: PodRequest, names: Iterable[str], *, few: bool = False) -> PodRequest:
        """`req`, or its whole-GPU form when the fallback applies over `names`
        (`filtering.whole_gpu_request`): what the filter decided for these nodes, decided again by a
        verb that has no kept filter plan (prioritize, bind, preemption). `few` names (bind's one
        node, preemption's) are read from the NodeViews, a prioritize's list from the matrix."""
        if not req.fallback:
            return req
        if few:
            return whole_gpu_request(req, map(self.ledger.views.get, names)) or req
        return whole_gpu_for(req, largest_gpu_rows(self.ledger.matrix, names, req.gpus)) or req

    def scores(self, req: PodRequest, names: tuple[str, ...]) -> Scores:
        """THE prioritize score of `req` on each of `names` (the filter's shortlist ranks by it too)."""
        return self._scores(req, names, self._packing_mix(req))

    def _scores(self, req: PodRequest, names: tuple[str, ...], mix: DemandMix | None) -> Scores:
        """`scores` with the demand mix already read (`_packing_mix`)."""
        if mix is not None:
            # packing pods: the fragmentation-aware score (FGD's idea in memory terms) against the mix of
            # recent admissions; reports/simulation.md measures it at FGD's allocation level
            return score_matrix_fragaware(req, names, self.ledger.matrix, self.params, mix, memo=self.merits)
        return score_matrix(req, names, self.ledger.matrix, self.ledger.views, self.params)

    def _shortlisted(self, plan: Plan, result: FilterResult) -> FilterResult:
        """The filter's answer when some nodes fit: the `policy.filter_shortlist` best of them by the
        prioritize score (`policy.shortlist`), and no failed nodes. kube-scheduler drops every node not
        named in NodeNames and needs the failures' reasons only when no node is left (its "0/N nodes
        are available" message, its preemption), so it then scores and sends to /prioritize a few
        dozen nodes instead of thousands (README: "Filter shortlist").

        The shortlist's scores are kept for the pod's prioritize, which kube-scheduler sends next with
        these names (`_kept_shortlist`): over the shortlist the score gives each node the value it had
        among all (`policy.shortlist` says why), so recomputing it there repeated the same numpy work
        on the worker's one Python thread (~0.2 ms per pod in `deepres bench cluster`)."""
        req = plan.request
        keep = self.settings.policy.filter_shortlist
        if len(result.passed) <= keep:
            return FilterResult(result.passed, {}, {}, result.kinds)
        matrix = self.ledger.matrix
        arrays, mix = matrix.arrays, self._packing_mix(req)
        looked = matrix.lookup(result.passed)  # the filter's own list: remembered, no lookup work
        versions = arrays.version[np.where(looked.rows >= 0, looked.rows, 0)]  # before the rows are read
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

    def _kept_shortlist(self, plan: Plan, names: tuple[str, ...]) -> Shortlist | None:
        """The scores the pod's filter kept for `names` (`_shortlisted`), when they are still what the
        score gives: the same plan (the filter's, reused by this prioritize), the same names in the
        same order, the same demand mix, and every row as it was (a row's version changes with every
        write of it; the arrays object with every growth). Else None: the score is computed anew."""
        with self._lock:  # taken: one prioritize follows a filter (a retried one computes the score)
            kept = self._shortlists.pop(plan.request.uid, None)
        if kept is None or kept.plan is not plan or kept.names != names:
            return None
        if self.ledger.matrix.arrays is not kept.arrays or self._packing_mix(plan.request) is not kept.mix:
            return None
        if not np.array_equal(kept.arrays.version[kept.lookup.rows], kept.versions):
            return None
        return kept

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

    def _respect_holds(self, req: PodRequest, result: FilterResult, mono: float) -> FilterResult:
        held = {n: why for n in result.passed if (why := self.held_for_another(req, n, mono))}
        if not held:
            return result
        kinds = dict(result.kinds)
        kinds["held"] = kinds.get("held", 0) + len(held)
        return FilterResult(tuple(n for n in result.passed if n not in held), result.failed,
                            {**result.unresolvable, **held}, kinds)

    def _release_holds(self, uid: str) -> None:
        with self._lock:
            for node in [n for n, held in self._holds.items() if held[0] == uid]:
                del self._holds[node]

    def _keep_filter_plan(self, pod: PodInfo, plan: Plan, now: float) -> None:
        if not pod.uid:
            return
        with self._lock:
            self._filter_plans[pod.uid] = (now, pod, plan)
            self._filter_plans.move_to_end(pod.uid)
            while len(self._filter_plans) > FILTER_PLANS_MAX:
                self._filter_plans.popitem(last=False)

    def _filter_plan(self, pod: PodInfo, now: float) -> Plan | None:
        """The plan the pod's filter made less than PLAN_REUSE_S ago, if the pod is unchanged: its
        prioritize then skips the annotations and the predictor (~7% of a pod's work)."""
        with self._lock:
            kept = self._filter_plans.get(pod.uid)
        if kept is None or not 0.0 <= now - kept[0] < PLAN_REUSE_S or kept[1] != pod:
            return None
        return kept[2]

    def _packs(self, req: PodRequest) -> bool:
        """Whether `req` is placed by the fragmentation-aware rule (score and bind alike)."""
        return self.fragmentation_aware and packs_by_mix(req, self.params)

    def _packing_mix(self, req: PodRequest) -> DemandMix | None:
        """The demand mix when `req` is placed by the fragmentation-aware rule, else None."""
        if not self._packs(req):
            return None
        mix = self.ledger.demand_mix()
        return mix if len(mix) else None

    def bind(self, body: Any) -> dict[str, str]:
        """Reserve GPUs on the node, annotate the pod, create its Binding.

        The pod is read from the API server, never taken from an earlier filter request: only a pod
        of this scheduler, with the uid asked for, still pending, is bound. A retried bind of a pod
        this extender already bound to the same node succeeds with no side effect; to another node
        it fails and leaves the first in place."""
        try:
            args = parse_binding_args(body)
        except ProtocolError as err:
            return binding_result(f"bad ExtenderBindingArgs: {err}")
        key = f"{args.pod_namespace}/{args.pod_name}"
        not_ready = self._not_ready()
        if not_ready:
            self.metrics.binds.labels("failed").inc()
            return binding_result(not_ready)
        confirmed = self.confirmed_pod(args.pod_namespace, args.pod_name, args.pod_uid, pending_from_watch=True)
        if isinstance(confirmed, str):
            self.metrics.binds.labels("failed").inc()
            log.info("bind refused pod=%s: %s", key, confirmed)
            return binding_result(f"cannot bind {key}: {confirmed}")
        raw, pod = confirmed
        if pod.node_name:
            if pod.node_name == args.node and self.ledger.bound_node(pod.uid) == args.node:
                log.info("bind pod=%s node=%s: already bound there (retried bind)", key, args.node)
                return binding_result("")
            self.metrics.binds.labels("failed").inc()
            return binding_result(f"cannot bind {key} to {args.node}: already bound to {pod.node_name}")
        now, mono = self.clock(), self.mono()
        try:
            plan = self.plan(pod, now)
        except (AnnotationError, PredictorUnavailable) as err:
            self.metrics.binds.labels("failed").inc()
            return binding_result(f"pod {key}: {err}")
        if not plan.request.gpu_job:
            return self._bind_plain(raw, key, args.node)
        version = self.predictor_version
        req = self._whole_gpu_on(plan.request, (args.node,), few=True)
        if req is not plan.request:
            plan = replace(plan, request=req)
        held = self.held_for_another(req, args.node, mono)
        if held:
            self.metrics.binds.labels("refused").inc()
            return binding_result(f"cannot bind {key} to {args.node}: {held}")

        template = Reservation(req.uid, req.namespace, req.name, args.node, (), req.admission_mib, req.admission_mib,
                               req.predicted_mib, plan.inputs, mono, plan.job.signature, version, duty=req.duty,
                               checkpoint_interval_s=plan.job.checkpoint_interval_s)
        outcome = self.ledger.reserve_on(req, template, mono, packing=self._packs(req))
        if isinstance(outcome, str):
            self.metrics.overcommit_refused.inc()
            self.metrics.binds.labels("refused").inc()
            log.info("bind refused pod=%s node=%s reason=%r", key, args.node, outcome)
            return binding_result(f"cannot bind {key} to {args.node}: {outcome}")
        if outcome.existing:  # the pod holds GPUs here already: another bind of it is in flight
            if self.ledger.bound_node(pod.uid) == args.node:
                return binding_result("")
            self.metrics.binds.labels("failed").inc()
            return binding_result(f"cannot bind {key} to {args.node}: a bind of this pod is in progress")
        res = outcome.reservation
        if req.whole_gpu:
            self.metrics.whole_gpu_binds.inc()
        view = self.ledger.node_view(args.node)
        indexes = [str(g.index) for u in res.gpu_uuids if view and (g := view.gpu(u)) is not None]
        placement = self._placed_message(plan, args.node, indexes)
        written = {
            ann.PREFIX + ann.ASSIGNED_GPUS: ",".join(res.gpu_uuids),
            ann.PREFIX + ann.PREDICTED_MEMORY: f"{res.predicted_mib:.0f}",
            ann.PREFIX + ann.ADMISSION_MEMORY: f"{res.admission_mib:.0f}",
            ann.PREFIX + ann.PREDICTOR_VERSION: version or "none",
            ann.PREFIX + ann.ASSIGNED_NODE: args.node,
            ann.PREFIX + ann.PLACEMENT: placement,
        }
        try:  # one API call: the Binding writes the annotations with spec.nodeName, all or nothing
            self.cluster.bind(raw, args.node, written)
        except ClusterError as err:
            # a Binding that timed out may still have landed: the watch then shows the pod bound
            # with these annotations and `_restore` takes the reservation back
            self.ledger.release(res.pod_uid, forget_bound=False)
            self.metrics.binds.labels("failed").inc()
            log.warning("bind failed pod=%s node=%s: %s (reservation released)", key, args.node, err)
            return binding_result(str(err))
        self.metrics.binds.labels("bound").inc()
        self.ledger.mark_bound(res.pod_uid, args.node, res)
        self._release_holds(req.uid)
        if self.settings.kube.placed_events:
            self.record_event(raw, "Placed", placement)
        log.info("bound pod=%s node=%s gpus=%s admission_mib=%.0f", key, args.node, ",".join(res.gpu_uuids),
                 res.admission_mib)
        return binding_result("")

    def _bind_plain(self, raw: Mapping[str, Any], key: str, node: str) -> dict[str, str]:
        try:
            self.cluster.bind(raw, node)
        except ClusterError as err:
            self.metrics.binds.labels("failed").inc()
            return binding_result(str(err))
        self.metrics.binds.labels("bound").inc()
        self.ledger.mark_bound(pod_meta(raw)[2], node)
        log.info("bound pod=%s node=%s (not a GPU job)", key, node)
        return binding_result("")

    @staticmethod
    def _placed_message(plan: Plan, node: str, indexes: list[str]) -> str:
        where = f"placed on {node} gpu {','.join(indexes) or '?'}"
        if plan.source == "override":
            return f"gpu-memory override {gib(plan.request.admission_mib)}; {where}"
        demand = plan.demand
        assert demand is not None
        what = f"predicted {gib(demand.memory_mib)} (upper {gib(demand.memory_mib_upper)})"
        if plan.source == "corrected":
            what += ", admitted from observed peaks" if plan.request.whole_gpu else \
                f", admitted {gib(plan.request.admission_mib)} from observed peaks"
        if plan.request.whole_gpu:
            what += "; whole GPU: the upper bound exceeds every GPU it could be given, the prediction fits"
        return f"{what}, {demand.gflops_per_iteration:.0f} GFLOP/iter; {where}"

    def preempt(self, body: Any) -> dict[str, Any]:
        """Victims per node, only strictly lower DeepRes priority; nodes without victims are dropped.
        An answer only: kube-scheduler does the evicting."""
        try:
            args = parse_preemption_args(body)
        except ProtocolError as err:
            log.info("preempt: bad ExtenderPreemptionArgs: %s", err)
            return preemption_result({}, {})
        if self._not_ready():  # the ledger may not hold the victims' reservations yet
            return preemption_result({}, {})
        now, mono = self.clock(), self.mono()
        try:
            plan = self.plan(args.pod, now)
        except (AnnotationError, PredictorUnavailable) as err:
            log.info("preempt pod=%s: %s", args.pod.key, err)
            return preemption_result({}, {})
        req = self._whole_gpu_on(plan.request, args.victims, few=True)
        out: dict[str, tuple[str, ...]] = {}
        for node, proposed in args.victims.items():
            ledger = {r.pod_uid: r for r in self.ledger.reservations_on(node)}
            known = [ledger[uid] for uid in proposed if uid in ledger]
            if any(priority_of(r.priority_inputs, now, self.params) >= req.priority for r in known):
                continue  # kube-scheduler's plan would evict a pod we rank at least as high
            extra: tuple[str, ...] = ()
            if req.gpu_job:
                view = self.ledger.node_view(node)
                if view is None or mono - view.received_s > self.params.telemetry_ttl_s:
                    continue
                planned = plan_victims(req, view, list(ledger.values()), now, self.params, evicted=known,
                                       service_now_s=mono)
                if planned is None:
                    continue
                extra = planned
            victims = tuple(dict.fromkeys((*proposed, *extra)))
            if victims:
                out[node] = victims
        self.metrics.preemptions.inc(sum(len(v) for v in out.values()))
        return preemption_result(out, args.pdb_violations)

    def request_preemption(self, pod: PodInfo, nodes: list[str], mono: float) -> bool:
        """Ask the worker to preempt for `pod` (at most once per `preemption_grace_s`): the filter
        answers at once and never evicts in the request."""
        with self._lock:
            if self._preempting.get(pod.uid, -math.inf) > mono:
                return False
            self._preempting[pod.uid] = mono + self.settings.kube.preemption_grace_s
            self._preempting.move_to_end(pod.uid)
            while len(self._preempting) > WARNED_MAX:
                self._preempting.popitem(last=False)
        ns, name, uid = pod.namespace, pod.name, pod.uid

        def task() -> None:
            self.self_preempt(ns, name, uid, nodes)

        return self.worker.submit(f"preempt/{uid}", task)

    def self_preempt(self, namespace: str, name: str, uid: str, nodes: list[str]) -> list[str]:
        """Evict the fewest strictly-lower-priority pods on the best of `nodes` so the pod fits there
        (runs on the worker).

        kube-scheduler's preemption dry run runs only its in-tree filters, which cannot see GPU
        memory: it finds no victims and never calls /preempt. So the extender evicts itself, with
        the same rule as the verb (`plan_victims`), for a pod the API server confirms (ours, that
        uid, pending, not bound), planned from the API's copy (its real PriorityClass, not what a
        request claimed), and only victims the API server still has with the uid the ledger holds.
        Best node: the lowest highest-victim priority, then the fewest victims, then the least
        memory evicted.
        """
        confirmed = self.confirmed_pod(namespace, name, uid)
        if isinstance(confirmed, str):
            log.info("no preemption for pod=%s/%s: %s", namespace, name, confirmed)
            return []
        raw_pod, pod = confirmed
        if pod.node_name:
            return []
        now, mono = self.clock(), self.mono()
        try:
            req = self._whole_gpu_on(self.plan(pod, now).request, nodes, few=True)
        except (AnnotationError, PredictorUnavailable) as err:
            log.info("no preemption for pod=%s: %s", pod.key, err)
            return []
        found = choose_preemption(req, ((view, self.ledger.reservations_on(node)) for node in nodes
                                        if (view := self.ledger.node_view(node)) is not None
                                        and is_fresh(view.received_s, mono, self.params)), now, self.params,
                                 service_now_s=mono)
        if found is None:
            with self._lock:
                self._preempting.pop(req.uid, None)
            return []
        node, chosen = found
        evicted: list[str] = []
        for res in chosen:
            try:
                victim = self.cluster.read_pod(res.namespace, res.name)
            except ClusterError as err:
                log.warning("preemption for pod=%s stopped: %s", req.key, err)
                break
            if victim is None or pod_meta(victim)[2] != res.pod_uid or self.ledger.reservation(res.pod_uid) is None:
                log.info("preemption for pod=%s stopped: victim %s changed", req.key, res.key)
                break
            try:
                self.cluster.evict(res.namespace, res.name, res.pod_uid)
            except ClusterError as err:
                log.warning("preemption for pod=%s stopped: %s", req.key, err)
                break
            evicted.append(res.key)
            victim_priority = priority_of(res.priority_inputs, now, self.params)
            self.cluster.event({"metadata": {"namespace": res.namespace, "name": res.name, "uid": res.pod_uid}},
                               "Preempted", f"evicted by deepres for {req.key} on {node}: priority "
                               f"{victim_priority:.1f} < {req.priority:.1f}", warning=True)
        if evicted:
            with self._lock:  # the room is this pod's until it binds, or the grace runs out
                self._holds[node] = (req.uid, req.priority, mono + self.settings.kube.preemption_grace_s)
            self.metrics.preemptions.inc(len(evicted))
            self.cluster.event(raw_pod, "Preempting", f"evicting {', '.join(evicted)} (lower priority) on {node} "
                               f"to make room for {gib(req.admission_mib)} per GPU")
            log.info("preempting for pod=%s node=%s victims=%s", req.key, node, ",".join(evicted))
        return evicted

    # ---- telemetry ----
    def telemetry(self, body: Any, bound_node: str) -> tuple[int, dict[str, Any]]:
        """`body`: the decoded JSON, or a NodeReport already read from the bytes (`decode_report`)."""
        try:
            report = body if isinstance(body, NodeReport) else parse_report(body)
        except ReportError as err:
            self.metrics.telemetry_reports.labels("invalid").inc()
            return 400, {"error": str(err)}
        if bound_node and report.node != bound_node:
            self.metrics.telemetry_reports.labels("unauthorized").inc()
            return 401, {"error": f"token is bound to node {bound_node}, report is for {report.node}"}
        mono = self.mono()
        if self.local:
            self._expire_local(mono)
        before = self.ledger.telemetry(report.node)
        outcome = self.ledger.apply_report(report, mono)
        if outcome in (UNKNOWN_NODE, TOO_MANY_NODES):
            self.metrics.telemetry_reports.labels("unknown_node").inc()
            why = "is not a node of the cluster" if outcome == UNKNOWN_NODE else \
                f"would be one more than the {NODES_MAX} nodes with telemetry"
            return 400, {"error": f"node {report.node} {why}"}
        label = "accepted" if outcome == ACCEPTED else "old_sequence"
        self.metrics.telemetry_reports.labels(label).inc()
        if outcome == ACCEPTED and (before is None or mono - before.received_s > self.params.telemetry_ttl_s):
            self._nudge(report.node, mono)
        return 200, {"accepted": outcome == ACCEPTED, "outcome": outcome}

    def _nudge(self, node: str, mono: float) -> None:
        """Telemetry of a node arrived (again) after filters failed nodes for the lack of it: touch
        the Node (a cluster event) so kube-scheduler retries the pods it set aside, as the agent
        does when GPU memory frees; fresh telemetry alone is no event kube-scheduler sees."""
        if mono - self._telemetry_wanted_s > NUDGE_WINDOW_S:
            return

        def patch() -> None:
            try:
                self.cluster.patch_node_annotations(node, {TELEMETRY_ANNOTATION: f"{self.clock():.0f}"})
            except ClusterError as err:
                log.info("node=%s not nudged: %s", node, err)

        self.worker.submit(f"nudge/{node}", patch)

    def _expire_local(self, mono: float) -> None:
        """Local mode has no node list and no pod deletions: nodes silent for `kube.local_expiry_s`
        are forgotten, and reservations whose pod no report mentioned that long are released."""
        if mono - self._last_expiry_s < EXPIRY_EVERY_S:
            return
        self._last_expiry_s = mono
        ttl = self.settings.kube.local_expiry_s
        for node in self.ledger.expire_nodes(mono, ttl):
            log.info("forgot node=%s (no report for %.0f s)", node, ttl)
        for res in self.ledger.expire_unseen(mono, ttl):
            log.info("released pod=%s (no report mentioned it for %.0f s)", res.key, ttl)
            if isinstance(self.cluster, InMemoryCluster):
                self.cluster.forget_pod(res.namespace, res.name)

    def predict(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict):
            return 400, {"error": "body must be a JSON object: a Pod, {\"annotations\": {...}} or JobSpec keys"}
        is_pod = isinstance(body.get("metadata"), dict)
        if is_pod:
            raw_annotations = body["metadata"].get("annotations") or {}
        elif "annotations" in body:
            raw_annotations = body["annotations"]
        else:
            raw_annotations = body
        if not isinstance(raw_annotations, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in raw_annotations.items()):
            return 400, {"error": "annotations must be an object of strings"}
        # a Pod is read as the extender reads it (other tools' annotations ignored); JobSpec keys may omit the prefix
        annotations = raw_annotations if is_pod else {
            k if k.startswith(ann.PREFIX) else ann.PREFIX + k: v for k, v in raw_annotations.items()}
        now = self.clock()
        pod = PodInfo(name="predict", namespace="default", uid="", annotations=annotations)
        try:
            plan = self.plan(pod, now)
        except AnnotationError as err:
            return 400, {"error": str(err)}
        except PredictorUnavailable as err:
            return 409, {"error": f"predictor unavailable: {err}"}
        return 200, {
            "gpu_job": plan.request.gpu_job,
            "gpus": plan.request.gpus,
            "demand": plan.demand.to_dict() if plan.demand else None,
            "admission_memory_mib": plan.request.admission_mib,
            "admission_source": plan.source,
            "priority": plan.request.priority,
            "criticality": plan.job.criticality,
            "predictor_version": self.predictor_version,
        }

    # ---- cluster events ----
    def on_pod_changed(self, raw: dict[str, Any], deleted: bool) -> None:
        try:
            pod = parse_pod(raw)
        except ProtocolError as err:
            log.debug("ignoring unparsable pod from the watch: %s", err)
            return
        if deleted or pod.phase in TERMINAL_PHASES:
            if self._holds:
                self._release_holds(pod.uid)
            if self.ledger.release(pod.uid) is not None:
                log.info("released pod=%s (%s)", pod.key, "deleted" if deleted else pod.phase)
            return
        self._restore(pod)

    def on_pods_listed(self, pods: list[dict[str, Any]]) -> None:
        alive: set[str] = set()
        for raw in pods:
            try:
                pod = parse_pod(raw)
            except ProtocolError:
                continue
            if pod.phase in TERMINAL_PHASES:
                continue
            alive.add(pod.uid)
            self._restore(pod)
        recent = self.mono() - RELIST_GRACE_S
        for res in self.ledger.reservations():
            if res.pod_uid not in alive and res.bound_s < recent:  # a younger one may postdate the list
                self.ledger.release(res.pod_uid)
                log.info("released pod=%s (gone at relist)", res.key)
        if self._synced_s is None:
            self._expected_nodes = frozenset(self.ledger.nodes_with_reservations())
            self._synced_s = self.mono()

    def on_nodes_listed(self, names: list[str]) -> None:
        for node in self.ledger.set_known_nodes(names):
            log.info("forgot node=%s (not in the cluster's node list)", node)

    def _restore(self, pod: PodInfo) -> None:
        """Rebuild a bound pod's reservation from the annotations written at bind."""
        gpus = pod.annotations.get(ann.PREFIX + ann.ASSIGNED_GPUS, "")
        if not gpus or not pod.node_name or self.ledger.reservation(pod.uid) is not None:
            return
        try:
            admission = float(pod.annotations[ann.PREFIX + ann.ADMISSION_MEMORY])
            predicted = float(pod.annotations.get(ann.PREFIX + ann.PREDICTED_MEMORY, admission))
        except (KeyError, ValueError):
            log.warning("pod=%s has %s but no usable %s: not restored", pod.key, ann.ASSIGNED_GPUS,
                        ann.ADMISSION_MEMORY)
            return
        if not (math.isfinite(admission) and admission >= 0 and math.isfinite(predicted)):
            log.warning("pod=%s: %s=%r is not a memory figure: not restored", pod.key, ann.ADMISSION_MEMORY,
                        admission)
            return
        now, mono = self.clock(), self.mono()
        inputs = PriorityInputs()
        signature = ""
        try:
            plan = self.plan(pod, now)
            inputs, signature = plan.inputs, plan.job.signature
        except (AnnotationError, PredictorUnavailable) as err:
            log.info("pod=%s restored with default priority: %s", pod.key, err)
        res = Reservation(pod.uid, pod.namespace, pod.name, pod.node_name, tuple(gpus.split(",")), admission,
                          admission, predicted, inputs, mono, signature,
                          pod.annotations.get(ann.PREFIX + ann.PREDICTOR_VERSION, ""))
        if self.ledger.restore(res):
            log.info("restored reservation pod=%s node=%s gpus=%s admission_mib=%.0f", pod.key, pod.node_name,
                     gpus, admission)


# ---------------------------------------------------------------------------------------------
# HTTP

def create_app(
    settings: Settings | None = None,
    predictor: DemandPredictor | None = None,
    clock: Callable[[], float] = time.time,
    cluster: Cluster | None = None,
    monotonic: Callable[[], float] | None = None,
) -> Flask:
    """The WSGI app. `settings` default to defaults + `DEEPRES_*` env; `predictor` defaults to the
    shipped `predictor.runtime.Predictor.load()` (loaded in the background; /readyz waits for it);
    `cluster` to the real API server, or an in-memory one in local mode (`kube.no_kube`)."""
    settings = settings if settings is not None else load_settings()
    problems = settings.validate()
    if problems:
        from extender.settings import SettingsError

        raise SettingsError(problems)
    if cluster is None and settings.kube.no_kube:
        cluster = InMemoryCluster(state_file=settings.kube.state_file, learned_max=settings.recent_pods)
    elif cluster is None:
        cluster = KubeCluster(settings.kube.scheduler_name, settings.kube.resync_s, settings.kube.token_cache_s,
                              api_timeout_s=settings.kube.api_timeout_s, callers=settings.server.threads)
    ext = Extender(settings, predictor, cluster, clock, monotonic)
    log.info("deepres extender settings: %s", describe(settings))
    ext.start()

    app = Flask("deepres-extender")
    app.config["MAX_CONTENT_LENGTH"] = settings.server.max_body_bytes
    app.extensions["deepres"] = ext
    metrics = ext.metrics

    def respond(payload: Any, status: int = 200) -> Response:
        return Response(encode_json(payload), status=status, mimetype="application/json")

    @app.post("/v1/predict")
    def predict_route() -> Response:
        started = time.perf_counter()
        try:
            try:
                body = decode_json(read_body(request.environ, settings.server.max_body_bytes))
            except BadRequest as err:
                return respond({"error": str(err)}, 400)
            except BodyTooLarge as err:
                return respond({"error": str(err)}, 413)
            status, payload = ext.predict(body)
            return respond(payload, status)
        finally:
            metrics.latency.labels("predict").observe(time.perf_counter() - started)

    @app.get("/healthz")
    def healthz() -> Response:
        return respond({"ok": True})

    @app.get("/readyz")
    def readyz() -> Response:
        waiting = ext.readiness()
        return respond({"ready": not waiting, "waiting_for": waiting}, 200 if not waiting else 503)

    @app.get("/metrics")
    def metrics_route() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), mimetype=CONTENT_TYPE_LATEST.split(";")[0],
                        headers={"Content-Type": CONTENT_TYPE_LATEST})

    @app.get("/openapi.json")
    def openapi_route() -> Response:
        return respond(openapi_document())

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        code = err.code or 400
        if code == 413:
            return respond({"error": f"request body larger than {settings.server.max_body_bytes} bytes"}, 413)
        answer = respond({"error": f"{err.name}: {err.description}"}, code)
        allowed = getattr(err, "valid_methods", None)  # a 405 names what the route takes (RFC 9110 15.5.6)
        if allowed:
            answer.headers["Allow"] = ", ".join(allowed)
        return answer

    @app.errorhandler(Exception)
    def unexpected(err: Exception) -> Response:  # a bug: log it, never leak a traceback
        log.exception("unexpected error on %s %s", request.method, request.path)
        return respond({"error": f"internal error ({type(err).__name__}); see the extender's log"}, 500)

    # the verbs and telemetry, all of the extender's traffic, skip Flask's per-request machinery
    app.wsgi_app = VerbRoutes(ext, app.wsgi_app)  # type: ignore[method-assign]
    return app


def extender_of(app: Flask) -> Extender:
    """The Extender behind an app made by create_app (tests, the bench)."""
    ext: Extender = app.extensions["deepres"]
    return ext


__all__ = ["Extender", "create_app", "extender_of", "pod_meta"]
