"""Preemption: the /preempt verb's answer, and the extender's own evictions for a pod that fits
nowhere (kube-scheduler's dry run cannot see GPU memory, so it never calls /preempt for one)."""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from typing import Any

from extender.annotations import AnnotationError
from extender.kube.cluster import ClusterError, pod_meta
from extender.policy import PodRequest, choose_preemption, plan_victims, priority_of
from extender.policy.filtering import gib, is_fresh
from extender.policy.preemption import preemption_pays
from extender.protocol import PodInfo, ProtocolError, parse_preemption_args, preemption_result
from extender.server.parts import Part, Parts
from extender.server.planner import PredictorUnavailable
from extender.server.trust import confirmed_pod

log = logging.getLogger(__name__)

#: Pods with a preemption asked for, remembered at most (oldest forgotten first).
PREEMPTING_MAX = 10_000


class Preemptor(Part):
    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        self.preempting: OrderedDict[str, float] = OrderedDict()  # pod uid -> wait until (mono)
        self._lock = threading.Lock()

    def preempt(self, body: Any) -> dict[str, Any]:
        """Victims per node, only strictly lower DeepRes priority; nodes without victims are dropped.
        An answer only: kube-scheduler does the evicting."""
        try:
            args = parse_preemption_args(body)
        except ProtocolError as err:
            log.info("preempt: bad ExtenderPreemptionArgs: %s", err)
            return preemption_result({}, {})
        if self.readiness.not_ready():  # the ledger may not hold the victims' reservations yet
            return preemption_result({}, {})
        now, mono = self.clock(), self.mono()
        try:
            plan = self.planner.plan(args.pod, now)
        except (AnnotationError, PredictorUnavailable) as err:
            log.info("preempt pod=%s: %s", args.pod.key, err)
            return preemption_result({}, {})
        req = self.planner.whole_gpu_on(plan.request, args.victims, few=True)
        out: dict[str, tuple[str, ...]] = {}
        wait = self._wait(req, mono) if req.gpu_job else None  # once for every node
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
                if not preemption_pays(req, [*known, *(ledger[uid] for uid in planned)], mono, wait):
                    continue  # evicting throws away more than waiting would cost (the rule's own estimate)
                extra = planned
            victims = tuple(dict.fromkeys((*proposed, *extra)))
            if victims:
                out[node] = victims
        self.metrics.preemptions.inc(sum(len(v) for v in out.values()))
        return preemption_result(out, args.pdb_violations)

    def _wait(self, req: PodRequest, mono: float) -> float | None:
        """The pod's predicted wait for empty GPUs without preempting (`sharing.wait_for_empty_s`, as the
        filter's sharing rule and the replay): what preempting must gain (`preemption_pays`); None
        (not judged) without the sharing rule."""
        if not self.params.sharing:
            return None
        kept = self.planner.wait_of(req.uid, mono)  # its filter's, over its nodes; else every node's GPUs that hold it
        return kept if kept is not None else self.ledger.wait_for_empty_s(req.gpus, mono, None, req.admission_mib)

    def request_preemption(self, pod: PodInfo, nodes: list[str], mono: float) -> bool:
        """Ask the worker to preempt for `pod` (at most once per `preemption_grace_s`): the filter
        answers at once and never evicts in the request."""
        with self._lock:
            if self.preempting.get(pod.uid, -math.inf) > mono:
                return False
            self.preempting[pod.uid] = mono + self.settings.kube.preemption_grace_s
            self.preempting.move_to_end(pod.uid)
            while len(self.preempting) > PREEMPTING_MAX:
                self.preempting.popitem(last=False)
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
        confirmed = confirmed_pod(self.cluster, self.settings.kube.scheduler_name, namespace, name, uid)
        if isinstance(confirmed, str):
            log.info("no preemption for pod=%s/%s: %s", namespace, name, confirmed)
            return []
        raw_pod, pod = confirmed
        if pod.node_name:
            return []
        now, mono = self.clock(), self.mono()
        try:
            req = self.planner.whole_gpu_on(self.planner.plan(pod, now).request, nodes, few=True)
        except (AnnotationError, PredictorUnavailable) as err:
            log.info("no preemption for pod=%s: %s", pod.key, err)
            return []
        found = choose_preemption(req, ((view, self.ledger.reservations_on(node)) for node in nodes
                                        if (view := self.ledger.node_view(node)) is not None
                                        and is_fresh(view.received_s, mono, self.params)), now, self.params,
                                 service_now_s=mono, wait_s=self._wait(req, mono))
        if found is None:
            with self._lock:
                self.preempting.pop(req.uid, None)
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
            self.planner.note_eviction(victim, req.kind)  # its next pod is not evicted again by this kind
            victim_priority = priority_of(res.priority_inputs, now, self.params)
            self.cluster.event({"metadata": {"namespace": res.namespace, "name": res.name, "uid": res.pod_uid}},
                               "Preempted", f"evicted by deepres for {req.key} on {node}: priority "
                               f"{victim_priority:.1f} < {req.priority:.1f}", warning=True)
        if evicted:  # the room is this pod's until it binds, or the grace runs out
            self.planner.hold(node, req.uid, req.priority, mono + self.settings.kube.preemption_grace_s)
            self.metrics.preemptions.inc(len(evicted))
            self.cluster.event(raw_pod, "Preempting", f"evicting {', '.join(evicted)} (lower priority) on {node} "
                               f"to make room for {gib(req.admission_mib)} per GPU")
            log.info("preempting for pod=%s node=%s victims=%s", req.key, node, ",".join(evicted))
        return evicted
