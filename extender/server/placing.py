"""The filter and prioritize verbs: decode, one policy call over the ledger's matrix, encode."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import orjson

from extender.annotations import AnnotationError
from extender.policy.columnar import filter_matrix, sharing_matrix
from extender.policy.filtering import NO_REPORT, STALE
from extender.protocol import (
    ExtenderArgs,
    ProtocolError,
    filter_all_unresolvable,
    filter_error,
    filter_result,
    host_priority_json,
    host_priority_list,
    parse_extender_args,
    soft_preferences,
)
from extender.server.gpu_demand import merged
from extender.server.intake import Intake
from extender.server.parts import Part, Parts
from extender.server.planner import Plan, PredictorUnavailable
from extender.server.preemption import Preemptor

log = logging.getLogger(__name__)


class Placer(Part):
    def __init__(self, parts: Parts, preemptor: Preemptor, intake: Intake) -> None:
        super().__init__(parts)
        self.preemptor, self.intake = preemptor, intake

    def filter(self, body: Any) -> dict[str, Any]:
        """`body`: the decoded JSON, or ExtenderArgs already read from the bytes (`decode_extender_args`)."""
        try:
            args = body if isinstance(body, ExtenderArgs) else parse_extender_args(body)
        except ProtocolError as err:
            return filter_error(f"bad ExtenderArgs: {err}")
        not_ready = self.readiness.not_ready()
        if not_ready:
            self.intake.telemetry_wanted_s = self.mono()  # telemetry arriving next nudges its node (a retry)
            return filter_error(not_ready, args)
        now, mono = self.clock(), self.mono()
        self.cluster.learn_pod(args.raw_pod)  # local mode only: the first request naming a pod defines it
        planner = self.planner
        planner.unassume(args.pod.uid, mono)  # placed anew: what its last prioritize assumed is not in its way
        try:
            plan = planner.plan(args.pod, now)
        except AnnotationError as err:
            self.metrics.filter_nodes.labels("bad_annotation").inc(len(args.node_names))
            self.events.warn_once(args.raw_pod, args.pod.uid, "InvalidAnnotation", str(err))
            return filter_all_unresolvable(args, str(err))
        except PredictorUnavailable as err:
            return filter_error(f"predictor unavailable: {err}", args)
        groups = planner.by_model(plan, args.node_names)  # admission per GPU model (server/gpu_demand.py)
        if groups is None:
            result = filter_matrix(plan.request, args.node_names, self.ledger.matrix, self.ledger.views, mono,
                                   self.params)
        else:
            result = merged([filter_matrix(req, names, self.ledger.matrix, self.ledger.views, mono, self.params)
                             for req, names in groups], args.node_names, self.ledger.matrix)
        if plan.request.gpu_job and self.params.sharing and result.passed:  # compute: policy/sharing.py
            need = (result.request or plan.request).admission_mib  # W over the GPUs that hold it, on its nodes
            wait = self.ledger.wait_for_empty_s(plan.request.gpus, mono, self._or_all(args.node_names), need)
            planner.keep_wait(plan.request.uid, wait, mono)  # its prioritize's assumption and bind judge with it
            waiting = planner.waiting_priority(plan.request.uid, mono) if self.params.drain else -math.inf
            result = sharing_matrix(plan.request, result, self.ledger.matrix, self.ledger.views, self.params, wait,
                                    waiting)
        if result.request is not None:  # the whole-GPU fallback: prioritize and bind place that request
            plan = replace(plan, request=result.request)
        planner.keep_filter_plan(args.pod, plan, now)
        if planner.has_holds() and plan.request.gpu_job:
            result = planner.respect_holds(plan.request, result, mono)
        if not result.passed and plan.request.gpu_job:  # it waits: busy GPUs drain for it (sharing.draining)
            planner.note_waiting(plan.request.uid, plan.request.priority, mono)
        if not result.passed and result.failed and plan.request.gpu_job and self.settings.kube.self_preemption:
            unheard = self.readiness.unheard(args.node_names)
            if unheard:  # just (re)started: a node not heard from yet may have room, evicting could be for nothing
                log.debug("filter pod=%s: no preemption yet, %d node(s) not heard from since the start",
                          args.pod.key, len(unheard))
            else:
                self.preemptor.request_preemption(args.pod, list(result.failed), mono)
        if (result.passed and plan.request.gpu_job and self.settings.policy.filter_shortlist > 0
                and not soft_preferences(args.raw_pod)):
            result = planner.shortlisted(plan, result)  # (which remembers its list for the prioritize)
        elif len(result.passed) > 1:  # the list kube-scheduler sends to prioritize next: its rows kept
            self.ledger.matrix.keep(result.passed)
        if len(result.passed) == 1 and plan.request.gpu_job:
            # one node left: kube-scheduler binds there without a prioritize ("only one node after predicate,
            # just use it"), so the filter makes the assumption the prioritize would have made
            self._assume(plan, result.passed, (1,), args.raw_pod)
        for kind, count in result.kinds.items():
            self.metrics.filter_nodes.labels(kind).inc(count)
        if result.kinds.get(NO_REPORT) or result.kinds.get(STALE):
            self.intake.telemetry_wanted_s = mono
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
        planner = self.planner
        planner.unassume(args.pod.uid, self.mono())  # a prioritize again: what the last one assumed is not in its way
        kept_plan = planner.filter_plan(args.pod, now)
        if kept_plan is not None and kept_plan.request.whole_gpu:  # the filter's fallback held for its names:
            kept_plan = None  # decided again over these (rare pods: the plan is cheap to redo)
        kept = planner.kept_shortlist(kept_plan, args.node_names) if kept_plan is not None else None
        if kept is not None:  # the very scores the filter ranked these nodes by, nothing they read changed since
            self._assume(kept.plan, kept.lookup.names, kept.values, args.raw_pod)
            return orjson.Fragment(host_priority_json(kept.lookup.names, kept.values, kept.lookup.derived))
        try:
            plan = kept_plan or planner.plan(args.pod, now)
        except (AnnotationError, PredictorUnavailable):
            return host_priority_list((name, 0) for name in dict.fromkeys(args.node_names))
        req = plan.request if kept_plan is not None else planner.whole_gpu_on(plan.request, args.node_names)
        scores = planner.scores(req, args.node_names)
        self._assume(plan, scores.names, scores.values, args.raw_pod)
        return orjson.Fragment(host_priority_json(scores.names, scores.values,
                                                  scores.lookup.derived if scores.lookup else None))

    def _or_all(self, names: tuple[str, ...]) -> tuple[str, ...] | None:
        """`names`, or None when they are every node the ledger knows (with `percentageOfNodesToScore:
        100`, kube-scheduler's usual list): the ledger then reads its own nodes, not a set of thousands of
        names made per pod (~0.1 ms at 5,000). Told by the list's rows (one per node), not name by name."""
        matrix = self.ledger.matrix
        looked = matrix.lookup(names)  # the filter's own list: found as itself
        if len(looked.names) == len(matrix.index) and looked.known_safe()[1] is looked.rows:  # every name has a row
            return None
        return names

    def _assume(self, plan: Plan, names: Sequence[str], values: Any, raw_pod: Any) -> None:
        """kube-scheduler binds the pod where its score is highest, the extender's weighing most: the
        best-scored node's GPUs are the pod's until its bind (`Planner.assume`), so that the pods it
        filters meanwhile do not all count on the same free GPU. Made by the prioritize, or by the
        filter when it leaves one node (kube-scheduler then sends no prioritize)."""
        if not plan.request.gpu_job or not len(names) or not self.settings.kube.assume_on_prioritize:
            return
        self.planner.assume(plan, names[int(np.argmax(values))], raw_pod, self.mono())
