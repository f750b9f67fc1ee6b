"""What comes in besides the verbs: agents' telemetry reports, and the cluster's pod and node events
(reservations released when pods end, rebuilt from annotations after a restart)."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from extender import annotations as ann
from extender.annotations import AnnotationError
from extender.kube.cluster import TERMINAL_PHASES, ClusterError
from extender.kube.local import InMemoryCluster
from extender.ledger import ACCEPTED, GPU_CONFLICT, NODES_MAX, TOO_MANY_NODES, UNKNOWN_NODE
from extender.pod_requests import allocation_sizes, kubelet_admitted
from extender.policy import PriorityInputs, Reservation
from extender.policy.allocation import Pending
from extender.policy.preemption import is_arrival_kind
from extender.policy.restoring import OVERBOOKED, claimed_gpus, overbooked, settle_restored
from extender.protocol import PodInfo, ProtocolError, parse_pod
from extender.server.parts import Part, Parts
from extender.server.planner import PredictorUnavailable
from extender.server.trust import confirmed_pod
from extender.sharing_watch import Move
from extender.telemetry import FULL_REPORT_NEEDED, NodeReport, ReportError, apply_delta, parse_report
from predictor.parsing import read_number

log = logging.getLogger(__name__)

#: A relist does not release reservations made this recently: the list may predate their bind (a
#: pod deleted meanwhile is still released by its watch event).
RELIST_GRACE_S = 60.0
#: Telemetry arriving this soon after a filter failed nodes for the lack of it nudges the node.
NUDGE_WINDOW_S = 600.0
#: The Node annotation the extender sets to nudge kube-scheduler (a Node update is a cluster event).
TELEMETRY_ANNOTATION = "deepres.io/telemetry-since"
#: Local mode checks for silent nodes and unseen reservations at most this often.
EXPIRY_EVERY_S = 10.0
#: A restored pod whose recorded memory figures do not parse holds its GPUs whole: more than any GPU has
#: (the largest `gpu-memory` accepted), so nothing else is admitted there until the usage rule follows it.
UNREADABLE_BOOKING_MIB = ann.GPU_MEMORY_RANGE_MIB[1]
#: Pods whose `assigned-gpus` left them nothing to book, remembered (at most this many) so that their
#: later watch events and relists do not restore, refuse and warn again.
REFUSED_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Unsettled:
    """A restored reservation whose GPUs wait for its node's report to be checked (`Intake._settle`)."""

    wanted: int | None  # the pod's GPU request (None: its annotations did not parse)


class Intake(Part):
    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        self.local = self.settings.kube.no_kube
        self.telemetry_wanted_s = -math.inf  # mono time a filter last failed nodes for missing telemetry
        self._last_expiry_s = -math.inf
        self._unsettled: dict[str, dict[str, Unsettled]] = {}  # node -> pod uid -> restored, not yet checked
        self._unsettled_lock = threading.Lock()
        self._refused: OrderedDict[str, None] = OrderedDict()  # pod uids left with no GPU to book (REFUSED_MAX)
        #: restored pods: (bind wall time, creation, uid), who wins a GPU two pods name (`_bind_wall`)
        self._ranks: dict[str, tuple[float, float, str]] = {}

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
        if report.base_sequence is not None:  # a delta: over the node's last report (O(its GPUs))
            try:
                report = apply_delta(report, before.report if before is not None else None)
            except ReportError as err:
                self.metrics.telemetry_reports.labels(FULL_REPORT_NEEDED).inc()
                return 409, {"error": str(err), "accepted": False, "outcome": FULL_REPORT_NEEDED}
        outcome = self.ledger.apply_report(report, mono)
        if outcome in (ACCEPTED, GPU_CONFLICT) and self._unsettled:  # restored pods of the node: checked now
            self._settle(report.node)
        if outcome == GPU_CONFLICT:  # the owners keep their GPUs: asked after, the same answer
            return self._conflict(report, self.ledger.gpu_conflicts(report))
        if outcome in (UNKNOWN_NODE, TOO_MANY_NODES):
            self.metrics.telemetry_reports.labels("unknown_node").inc()
            why = "is not a node of the cluster" if outcome == UNKNOWN_NODE else \
                f"would be one more than the {NODES_MAX} nodes with telemetry"
            return 400, {"error": f"node {report.node} {why}"}
        if outcome == ACCEPTED:
            self.planner.place_restored(report.node)
            self._move_sharers()
        label = "accepted" if outcome == ACCEPTED else "old_sequence"
        self.metrics.telemetry_reports.labels(label).inc()
        if outcome == ACCEPTED and (before is None or mono - before.received_s > self.params.telemetry_ttl_s):
            self._nudge(report.node, mono)
        if outcome != ACCEPTED:
            return 200, {"accepted": False, "outcome": outcome}
        return 200, {"accepted": True, "outcome": outcome, "deltas": True}  # the agent may send deltas next

    def _move_sharers(self) -> None:
        """Sharing's feedback asked to move the newest joiner of GPUs that stayed over their slowdown bound
        (`policy.feedback`): each is evicted on the worker, off the request, once the API server confirms it
        (ours, that uid, still on that node); its controller makes it again and it is placed anew."""
        for move in self.ledger.take_moves():
            self.worker.submit(f"move/{move.uid}", functools.partial(self._move, move))

    def _move(self, move: Move) -> None:
        key = f"{move.namespace}/{move.name}"
        confirmed = confirmed_pod(self.cluster, self.settings.kube.scheduler_name, move.namespace, move.name,
                                  move.uid)
        if isinstance(confirmed, str) or confirmed[1].node_name != move.node:
            self.metrics.sharing_moves.labels("skipped").inc()
            log.info("sharing move of pod=%s skipped: %s", key, confirmed if isinstance(confirmed, str) else
                     "no longer on node " + move.node)
            return
        try:
            self.cluster.evict(move.namespace, move.name, move.uid)
        except ClusterError as err:
            self.metrics.sharing_moves.labels("failed").inc()
            log.warning("sharing move of pod=%s failed: %s", key, err)
            return
        self.metrics.sharing_moves.labels("moved").inc()
        message = (f"moved by deepres: its GPU {move.gpu} on {move.node} ran its shared jobs {move.worst:.2f}x slower "
                   f"than alone, beyond the bound (sharing.maxSlowdown), and it joined last")
        self.cluster.event(confirmed[0], "SharingMoved", message, warning=True)
        log.warning("sharing move: pod=%s %s", key, message)

    def _conflict(self, report: NodeReport, contested: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """409 to an agent that listed GPUs another node owns (issue 34 row 3): accepted without them,
        never taken over; the agent logs the error, the metric counts it."""
        self.metrics.telemetry_reports.labels("gpu_conflict").inc()
        owners = ", ".join(f"{uuid} (node {owner})" for uuid, owner in sorted(contested.items())) or "some GPUs"
        return 409, {"error": f"node {report.node} reported GPUs another node owns: {owners}; a GPU UUID belongs "
                              "to the node that reported it first, so these were left out of this report (the "
                              "rest was accepted): check which node's agent lists them",
                     "accepted": True, "outcome": GPU_CONFLICT, "refused_gpus": sorted(contested)}

    def _nudge(self, node: str, mono: float) -> None:
        """Telemetry of a node arrived (again) after filters failed nodes for the lack of it: touch
        the Node (a cluster event) so kube-scheduler retries the pods it set aside, as the agent
        does when GPU memory frees; fresh telemetry alone is no event kube-scheduler sees."""
        if mono - self.telemetry_wanted_s > NUDGE_WINDOW_S:
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

    # ---- cluster events ----
    def on_pod_changed(self, raw: dict[str, Any], deleted: bool) -> None:
        self.gate_watch(raw, deleted)
        if not deleted and self._nothing_to_restore(raw):
            return
        try:
            pod = parse_pod(raw)
        except ProtocolError as err:
            log.debug("ignoring unparsable pod from the watch: %s", err)
            return
        if deleted or pod.phase in TERMINAL_PHASES:
            if self.planner.has_holds():
                self.planner.release_holds(pod.uid)
            self._ranks.pop(pod.uid, None)
            if self.ledger.release(pod.uid) is not None:
                log.info("released pod=%s (%s)", pod.key, "deleted" if deleted else pod.phase)
            return
        self._restore(pod)

    def _nothing_to_restore(self, raw: dict[str, Any]) -> bool:
        """True for a live pod's event that changes nothing here, read off the watch's dict without
        parsing the pod: not finished, and either without `assigned-gpus` on a node (pending, or not
        placed by a GPU bind) or already holding its reservation. Most events of a GPU pod are such
        (created, bound by this extender, started by the kubelet); the full path would parse each pod
        only for `_restore` to return at its first line."""
        meta, spec, status = raw.get("metadata"), raw.get("spec"), raw.get("status")
        if not isinstance(meta, dict) or (isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES):
            return False
        annotations = meta.get("annotations")
        if not (isinstance(annotations, dict) and annotations.get(ann.PREFIX + ann.ASSIGNED_GPUS)):
            return True
        if not (isinstance(spec, dict) and spec.get("nodeName")):
            return True
        uid = meta.get("uid")
        return isinstance(uid, str) and bool(uid) and self.ledger.reservation(uid) is not None

    def gate_watch(self, raw: dict[str, Any], deleted: bool) -> None:
        """The allocation gate follows the pods: a pod bound by deepres that its kubelet has admitted
        (or refused), that finished or is gone opens its node's gate; one bound and not admitted yet
        holds it (after a restart, or a Binding that landed though its call failed). An event of a pod
        not bound yet never opens a gate: the gate is taken just before the Binding, and a late event of
        an earlier scheduling attempt (kube-scheduler's status update after a failed bind) may arrive
        after it (seen on the real node: two pods then awaited their GPUs on one node)."""
        meta, spec, status = raw.get("metadata"), raw.get("spec"), raw.get("status")
        if not isinstance(meta, dict):
            return
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid or not (deleted or self.gate.holds(uid) or isinstance(spec, dict)):
            return
        status = status if isinstance(status, dict) else {}
        if deleted or meta.get("deletionTimestamp") or status.get("phase") in TERMINAL_PHASES:
            if self.gate.holds(uid):
                self.gate.settle(uid)
            return
        annotations = meta.get("annotations")
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        if (not isinstance(spec, dict) or not isinstance(node, str) or not node
                or not (isinstance(annotations, dict) and annotations.get(ann.PREFIX + ann.ASSIGNED_GPUS))):
            return  # not bound (yet), or not by deepres
        if kubelet_admitted(status):
            if self.gate.holds(uid):
                self.gate.settle(uid)
            return
        if self.gate.holds(uid):
            return
        gpus = tuple(u.strip() for u in str(annotations.get(ann.PREFIX + ann.ASSIGNED_GPUS)).split(",") if u.strip())
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        self.gate.restore(node, Pending(uid, key, gpus, allocation_sizes(spec, self.settings.kube.device_resource)))

    def on_pods_listed(self, pods: list[dict[str, Any]]) -> None:
        alive: set[str] = set()
        for raw in pods:
            self.gate_watch(raw, False)
            try:
                pod = parse_pod(raw)
            except ProtocolError:
                continue
            if pod.phase in TERMINAL_PHASES:
                continue
            alive.add(pod.uid)
            try:
                self._restore(pod, settle=False)
            except Exception:  # one pod never keeps the others from being rebuilt, nor the extender unready
                log.exception("pod=%s: restore failed", pod.key)
        for node in list(self._unsettled):  # all restored first: the earlier bind wins a GPU whatever the order
            self._settle(node)
        recent = self.mono() - RELIST_GRACE_S
        for res in self.ledger.reservations():
            if res.pod_uid not in alive and res.bound_s < recent:  # a younger one may postdate the list
                self.ledger.release(res.pod_uid)
                self._ranks.pop(res.pod_uid, None)
                log.info("released pod=%s (gone at relist)", res.key)
        if self.readiness.synced_s is None:
            self.readiness.first_sync(self.ledger.nodes_with_reservations())

    def on_nodes_listed(self, names: list[str]) -> None:
        for node in self.ledger.set_known_nodes(names):
            log.info("forgot node=%s (not in the cluster's node list)", node)

    def _restore(self, pod: PodInfo, *, settle: bool = True) -> None:
        """Rebuild a bound pod's reservation from the annotations written at bind.

        Never fatal and never frees what the pod holds: the GPUs in `assigned-gpus` are booked whatever
        else the annotations say (a user may have changed them since the bind). Job annotations that no
        longer parse give the default priority; recorded memory figures that do not parse book the GPUs
        whole; an unreadable `bound-at` counts attained service from now. Each is a Warning Event on the
        pod and `deepres_extender_restore_unparsable_pods_total{part}`.

        The GPU list itself is checked (`policy.restoring`): names that cannot be GPUs are left out at
        once; the rest is booked as named until the node reports, then `_settle` keeps only the node's
        GPUs, as many as the pod asks for (those its processes use first), and names a pod whose booking
        takes a GPU past its memory after earlier binds. `settle=False`: the caller settles (a relist
        restores every pod first, so that the earlier bind wins whatever the list's order)."""
        text = pod.annotations.get(ann.PREFIX + ann.ASSIGNED_GPUS, "")
        if not text or not pod.node_name or self.ledger.reservation(pod.uid) is not None or pod.uid in self._refused:
            return
        claimed = claimed_gpus(text)
        gpus = ",".join(claimed.gpu_uuids)
        if claimed.problems:
            self._warn_invalid(pod.namespace, pod.name, pod.uid, text, claimed.problems)
        if not claimed.gpu_uuids:
            self._refuse(pod.uid)
            return
        now, mono = self.clock(), self.mono()
        problems: list[tuple[str, str]] = []  # (metric part, what the Event says)
        admission, predicted = self._recorded_memory(pod, problems)
        bound_s = self._bound_mono(pod, now, mono, problems)
        inputs = PriorityInputs()
        signature, checkpoint = "", None
        plan = None
        try:
            plan = self.planner.plan(pod, now)
            inputs, signature, checkpoint = plan.inputs, plan.job.signature, plan.job.checkpoint_interval_s
        except AnnotationError as err:
            problems.append(("annotations", f"{err}; restored at the default priority"))
        except PredictorUnavailable as err:
            log.info("pod=%s restored with default priority: %s", pod.key, err)
        except Exception:  # never fatal: a restore that raised kept the extender from ever becoming ready
            log.exception("pod=%s: planning at restore failed; restored at the default priority", pod.key)
            problems.append(("annotations", "its annotations could not be read; restored at the default priority"))
        res = Reservation(pod.uid, pod.namespace, pod.name, pod.node_name, claimed.gpu_uuids, admission,
                          admission, predicted, inputs, bound_s, signature,
                          pod.annotations.get(ann.PREFIX + ann.PREDICTOR_VERSION, ""),
                          checkpoint_interval_s=checkpoint, evicted_by=self._evicted_by(pod, problems))
        if self.ledger.restore(res):
            if plan is not None:  # the online calibration learns from its peaks again
                try:
                    self.planner.placed(plan, res, later=True)
                except Exception:  # never fatal at restore: the reservation is kept either way
                    log.exception("pod=%s: the calibration could not follow it after the restart", pod.key)
            log.info("restored reservation pod=%s node=%s gpus=%s admission_mib=%.0f attained_s=%.0f", pod.key,
                     pod.node_name, gpus, admission, mono - bound_s)
            for part, what in problems:
                self.metrics.restore_unparsable.labels(part).inc()
                log.warning("pod=%s restored after a restart, its GPUs %s kept booked: %s", pod.key, gpus, what)
                target = {"metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}}
                self.events.record(target, "RestoredUnparsable",
                                   f"GPUs {ann.shown(gpus, quoted=False)} kept booked after an extender restart: "
                                   f"{what}", warning=True)
            wanted = plan.request.gpus if plan is not None and plan.request.gpu_job else None
            with self._unsettled_lock:
                self._unsettled.setdefault(pod.node_name, {})[pod.uid] = Unsettled(wanted)
                self._ranks[pod.uid] = (self._bind_wall(pod, now), pod.created_s if pod.created_s is not None else now,
                                        pod.uid)
            if settle:
                self._settle(pod.node_name)

    @staticmethod
    def _bind_wall(pod: PodInfo, now: float) -> float:
        """When the pod was bound (wall clock, exact: the timestamps as written), for who wins a GPU: its
        `bound-at`, never before its creation nor its PodScheduled condition (both set by the API server,
        as `_bound_mono` caps it); without a readable `bound-at`, the later of those two; none: now."""
        times = [t for t in (pod.created_s, pod.scheduled_s) if t is not None]
        text = pod.annotations.get(ann.PREFIX + ann.BOUND_AT)
        if text is not None:
            with contextlib.suppress(ValueError, OverflowError, OSError):  # unreadable: as if absent
                times.append(ann.parse_time(text))
        return max(times) if times else now

    def _settle(self, node: str) -> None:
        """Check the GPUs of the pods restored on `node` against its report (`policy.restoring`): keep
        the node's own GPUs, as many as each pod asks for, those its processes use first; then name each
        whose booking takes a GPU past its memory after the pods bound before it. Its booking is kept (it
        may run there: freeing it could over-commit the GPU), so the GPU shows full until the usage rule
        follows the pods. Each finding is a Warning Event and `deepres_extender_restore_invalid_pods_total`."""
        telemetry = self.ledger.telemetry(node)
        if telemetry is None:
            return
        with self._unsettled_lock:
            waiting = self._unsettled.pop(node, {})
        if not waiting:
            return
        report = telemetry.report
        uuids = [g.uuid for g in report.gpus]
        observed: dict[str, list[str]] = {}
        for usage in report.pods:
            observed.setdefault(usage.pod_uid, []).extend(usage.gpu_uuids)
        for g in report.gpus:
            for process in g.processes:
                if process.pod_uid:
                    observed.setdefault(process.pod_uid, []).append(g.uuid)
        for uid, entry in waiting.items():
            res = self.ledger.reservation(uid)
            if res is None or res.node != node:
                continue
            settled = settle_restored(res.gpu_uuids, entry.wanted, node, uuids, observed.get(uid, ()))
            if settled.gpu_uuids != res.gpu_uuids:
                self.ledger.rebook(uid, settled.gpu_uuids)
                if not settled.gpu_uuids:
                    self._refuse(uid)
                log.warning("pod=%s restored on node=%s: GPUs %s booked instead of %s", res.key, node,
                            ",".join(settled.gpu_uuids) or "none", ",".join(res.gpu_uuids))
            if settled.problems:
                self._warn_invalid(res.namespace, res.name, uid, ",".join(res.gpu_uuids), settled.problems,
                                   booked=settled.gpu_uuids)
        held = self.ledger.reservations_on(node)
        now, mono = self.clock(), self.mono()
        ranks = {r.pod_uid: self._ranks.get(r.pod_uid) or (now - (mono - r.bound_s), math.inf, r.pod_uid)
                 for r in held}  # a pod bound since the restart: after every restored one
        capacity = {g.uuid: g.memory_total_mib for g in report.gpus}
        found = overbooked([(ranks[r.pod_uid], r.pod_uid, r.gpu_uuids, r.memory_mib) for r in held], capacity,
                           waiting)
        for res in held:
            if res.pod_uid in found:
                gpu, before, cap = found[res.pod_uid]
                self._warn_invalid(res.namespace, res.name, res.pod_uid, ",".join(res.gpu_uuids), [(
                    OVERBOOKED, f"GPU {gpu} ({cap:.0f} MiB) already holds {before:.0f} MiB of pods bound before "
                                f"this one, which books {res.memory_mib:.0f} MiB more; kept booked, so nothing "
                                "else is admitted on it")], booked=res.gpu_uuids, event="RestoredOverbooked")

    def _refuse(self, uid: str) -> None:
        """`uid` was left nothing to book: not restored again (bounded, oldest forgotten first)."""
        with self._unsettled_lock:
            self._refused[uid] = None
            self._ranks.pop(uid, None)
            while len(self._refused) > REFUSED_MAX:
                self._refused.popitem(last=False)

    def _warn_invalid(self, namespace: str, name: str, uid: str, named: str, problems: Any,
                      booked: tuple[str, ...] | None = None, event: str = "RestoredInvalid") -> None:
        """Say what was wrong with a restored pod's `assigned-gpus`: a Warning Event on the pod, a log
        line and `deepres_extender_restore_invalid_pods_total{reason}`."""
        kept = "" if booked is None else f"; booked: {', '.join(booked) or 'none'}"
        for reason, what in problems:
            self.metrics.restore_invalid.labels(reason).inc()
            message = (f"{ann.PREFIX}{ann.ASSIGNED_GPUS}={ann.shown(named)} after an extender restart: "
                       f"{what}{kept}")
            log.warning("pod=%s/%s: %s", namespace, name, message)
            target = {"metadata": {"namespace": namespace, "name": name, "uid": uid}}
            self.events.warn_once(target, uid, event, message)

    def _recorded_memory(self, pod: PodInfo, problems: list[tuple[str, str]]) -> tuple[float, float]:
        """(admission, predicted) MiB per GPU from the annotations bind wrote. One that does not parse
        takes the other; neither: the GPUs are booked whole (UNREADABLE_BOOKING_MIB)."""
        figures: list[float | None] = []
        for key in (ann.ADMISSION_MEMORY, ann.PREDICTED_MEMORY):
            text = pod.annotations.get(ann.PREFIX + key)
            try:
                mib = read_number(text) if text is not None else None
            except ValueError:
                mib = None
            figures.append(mib if mib is not None and 0.0 <= mib <= ann.GPU_MEMORY_RANGE_MIB[1] else None)
        admission, predicted = figures
        if admission is None:
            admission = predicted
        if admission is None:
            problems.append(("memory", f"{ann.PREFIX}{ann.ADMISSION_MEMORY}="
                                       f"{ann.shown(pod.annotations.get(ann.PREFIX + ann.ADMISSION_MEMORY))} is not a "
                                       "memory figure in MiB; each GPU is booked whole"))
            return UNREADABLE_BOOKING_MIB, UNREADABLE_BOOKING_MIB
        return admission, predicted if predicted is not None else admission

    @staticmethod
    def _evicted_by(pod: PodInfo, problems: list[tuple[str, str]]) -> str:
        """The kind of arrival that evicted the pod's workload (`evicted-by`, written at bind): the churn rule
        keeps protecting it after a restart. Missing or "none": none; not a kind (`c<level>/g<gpus>`): none,
        and a problem."""
        text = pod.annotations.get(ann.PREFIX + ann.EVICTED_BY)
        if text is None or text == "none":
            return ""
        if not is_arrival_kind(text):
            problems.append(("evicted_by", f"{ann.PREFIX}{ann.EVICTED_BY}={ann.shown(text)} is not a kind of arrival "
                                           "(c<criticality>/g<gpus>); the pod may be evicted by any kind"))
            return ""
        return text

    def _bound_mono(self, pod: PodInfo, now: float, mono: float, problems: list[tuple[str, str]]) -> float:
        """The bind time on the monotonic clock: `bound-at` (wall) is turned into an age, never more than
        the pod's age nor the time since its PodScheduled condition (both set by the API server: a user
        who rewrites `bound-at` cannot backdate the bind), nor below 0. Without `bound-at` (bound before it
        was written) or unreadable: now."""
        text = pod.annotations.get(ann.PREFIX + ann.BOUND_AT)
        if text is None:
            return mono
        try:
            age = now - ann.parse_time(text)
        except (ValueError, OverflowError, OSError):
            problems.append(("bound_at", f"{ann.PREFIX}{ann.BOUND_AT}={ann.shown(text)} is not an RFC 3339 time; "
                                         "its attained service counts from the restart"))
            return mono
        for since in (pod.created_s, pod.scheduled_s):
            if since is not None:
                age = min(age, now - since)
        return mono - max(age, 0.0)
