"""The bind verb: reserve GPUs on the node, annotate the pod, create its Binding."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from extender import annotations as ann
from extender.annotations import AnnotationError
from extender.kube.cluster import ClusterError, pod_meta
from extender.ledger import Reserved
from extender.pod_requests import allocation_sizes
from extender.policy.allocation import Pending
from extender.policy.filtering import gib
from extender.protocol import ProtocolError, binding_result, parse_binding_args
from extender.server.parts import Part
from extender.server.planner import Plan, PredictorUnavailable
from extender.server.trust import confirmed_pod

log = logging.getLogger(__name__)


class Binder(Part):
    """/bind (`Part`: the shared pieces)."""

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
        not_ready = self.readiness.not_ready()
        if not_ready:
            self.metrics.binds.labels("failed").inc()
            return binding_result(not_ready)
        confirmed = confirmed_pod(self.cluster, self.settings.kube.scheduler_name, args.pod_namespace, args.pod_name,
                                  args.pod_uid, pending_from_watch=True)
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
            plan = self.planner.plan(pod, now)
        except (AnnotationError, PredictorUnavailable) as err:
            self.metrics.binds.labels("failed").inc()
            return binding_result(f"pod {key}: {err}")
        if not plan.request.gpu_job:
            return self._bind_plain(raw, key, args.node)
        version = self.planner.predictor_version
        req = self.planner.bind_request(plan, args.node)
        if req is not plan.request:
            plan = replace(plan, request=req)
        held = self.planner.held_for_another(req, args.node, mono)
        if held:
            self.planner.unassume(req.uid, mono)
            self.metrics.binds.labels("refused").inc()
            return binding_result(f"cannot bind {key} to {args.node}: {held}")
        assumed = self.planner.take_assumed(req, args.node, mono)  # its prioritize reserved these GPUs
        outcome = Reserved(assumed, False) if assumed is not None else self.ledger.reserve_on(
            req, self.planner.reservation(plan, req, args.node, mono, raw), mono, packing=self.planner.packs(req),
            wait_s=self.planner.wait_of(req.uid, mono))
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
        placement = placed_message(plan, args.node, indexes)
        written = {
            ann.PREFIX + ann.ASSIGNED_GPUS: ",".join(res.gpu_uuids),
            ann.PREFIX + ann.PREDICTED_MEMORY: f"{res.predicted_mib:.0f}",
            ann.PREFIX + ann.ADMISSION_MEMORY: f"{res.admission_mib:.0f}",
            ann.PREFIX + ann.PREDICTOR_VERSION: version or "none",
            ann.PREFIX + ann.ASSIGNED_NODE: args.node,
            ann.PREFIX + ann.PLACEMENT: placement,
            # wall time: a restart turns it back into attained service on its own monotonic clock
            ann.PREFIX + ann.BOUND_AT: ann.format_time(now),
            # always written (a value a user put on the pod at its creation is replaced): the churn rule
            # survives a restart (`Intake._restore`)
            ann.PREFIX + ann.EVICTED_BY: res.evicted_by or "none",
        }
        # The allocation handshake: one pod per node awaits its kubelet's Allocate at a time, so the
        # node's device plugin can tell which pod an Allocate is for (extender/policy/allocation.py).
        spec = raw.get("spec")
        sizes = allocation_sizes(spec if isinstance(spec, dict) else {}, self.settings.kube.device_resource)
        blocked = self.gate.acquire(args.node, Pending(pod.uid, key, tuple(res.gpu_uuids), sizes),
                                    self.settings.kube.allocation_wait_s)
        if blocked:
            self.ledger.release(res.pod_uid, forget_bound=False)
            self.metrics.binds.labels("refused").inc()
            log.info("bind deferred pod=%s node=%s: %s", key, args.node, blocked)
            return binding_result(f"cannot bind {key} to {args.node} yet: {blocked}")
        try:  # one API call: the Binding writes the annotations with spec.nodeName, all or nothing
            self.cluster.bind(raw, args.node, written)
        except ClusterError as err:
            # a Binding that timed out may still have landed: the watch then shows the pod bound
            # with these annotations and the intake's restore takes the reservation back (and the gate)
            self.gate.cancel(pod.uid)
            self.ledger.release(res.pod_uid, forget_bound=False)
            self.metrics.binds.labels("failed").inc()
            log.warning("bind failed pod=%s node=%s: %s (reservation released)", key, args.node, err)
            return binding_result(str(err))
        self.metrics.binds.labels("bound").inc()
        self.ledger.mark_bound(res.pod_uid, args.node, res)
        self.planner.release_holds(req.uid)
        self.planner.placed(plan, res)  # the online calibration learns from its peaks
        if self.settings.kube.placed_events:
            self.events.record(raw, "Placed", placement)
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


def placed_message(plan: Plan, node: str, indexes: list[str]) -> str:
    """The Placed event's text: where the pod went and what it was admitted by."""
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
