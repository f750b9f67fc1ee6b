"""The ledger: everything the extender learned about the GPUs, under one lock.

One object owns, keyed by (node, GPU UUID): each node's last accepted telemetry (with the extender's
monotonic clock at receipt), the reservations, the observed peaks per job signature, the demand mix of
recent admissions and the packing score's merit memo, plus the pods it bound. Every write holds the one
lock; the verbs' reads take none: `views` maps node -> immutable NodeView, replaced whole by a writer
(atomic in CPython), and `matrix` is their columnar copy. A read racing a write sees the previous
telemetry at worst, never an over-commit: `reserve_on` checks and reserves under the lock. The ledger
calls nothing back: bind hands it the reservation and whether the pod packs; it applies the GPU rule.

What it refuses to learn (issue #13): a report older than the last in its agent's boot (by sequence
within a boot id, never the agent's clock), a report of a node the cluster does not have (cluster
mode), a GPU UUID another node reports (an agent speaks only for its own node), a pod peak of 0 (NVML
without per-process memory). A peak above the GPU's capacity is clamped to it for the usage rule
(`policy.usage.observed_peak`) and is no reading for the calibration.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import islice

from extender.calibration_store import CalibrationStore
from extender.model_keys import ModelKey, ModelKeys, nodes_per_model
from extender.policy.columnar import FragmentationMemo, NodeMatrix
from extender.policy.duty import DutyStore
from extender.policy.filtering import node_failure, reserved_per_gpu
from extender.policy.fragmentation import DemandMix, DemandWindow
from extender.policy.placement import choose_gpus_for
from extender.policy.sharing import can_hold, sharing_view, wait_for_empty_s
from extender.policy.types import EMPTY_SLACK_MIB, GpuView, NodeView, PodRequest, PolicyParams, Reservation
from extender.policy.usage import Correction, PeakStore, observe_usage, observed_peak
from extender.sharing_watch import Move, SharingWatch, follow_duties
from extender.telemetry import GpuReport, NodeReport

log = logging.getLogger(__name__)

ACCEPTED = "accepted"
OLD_SEQUENCE = "old sequence"
UNKNOWN_NODE = "unknown node"
TOO_MANY_NODES = "too many nodes"
#: Accepted without GPUs another node owns (`gpu_conflicts`): the agent is told, the owner untouched.
GPU_CONFLICT = "gpu conflict"
#: Boot ids remembered per node: a replayed report of an earlier boot is not a new boot.
BOOTS_PER_NODE = 8
#: Pods remembered as bound (a retried bind of one of them succeeds without side effects).
BOUND_MAX = 100_000
#: Nodes with telemetry at most (local mode has no node list: invented nodes must not grow memory).
#: Local mode makes room for a new node by forgetting the least useful node (`_make_room`): one
#: nobody has placed on (heard longest ago first), else one whose last pod left longest ago; never
#: one that holds a reservation. In a cluster the node list bounds them and the cap refuses.
NODES_MAX = 20_000
#: Nodes of each spare list (nobody placed on / emptied) `_spare_holds` looks at before going through all.
SPARES_CHECKED = 16


@dataclass(frozen=True, slots=True)
class NodeTelemetry:
    """A node's last accepted report and the extender's monotonic clock when it arrived."""

    report: NodeReport
    received_s: float


@dataclass(frozen=True, slots=True)
class Reserved:
    """`reserve_on`'s answer: the reservation, and whether the pod already held it (a retried bind)."""

    reservation: Reservation
    existing: bool


class Ledger:
    """Telemetry + reservations + learned state of the cluster's GPUs (see the module docstring)."""

    def __init__(self, params: PolicyParams, peak_store_size: int = 10_000,
                 calibration: CalibrationStore | None = None) -> None:
        self.params = params
        #: the online calibration per GPU model (calibration_store.py): the usage rule's peaks, own lock
        self.calibration = calibration if calibration is not None else CalibrationStore()
        self.calibration.nodes = self.calibration_nodes  # its learner learns from pods of these nodes only
        self._lock = threading.Lock()
        self._telemetry: OrderedDict[str, NodeTelemetry] = OrderedDict()  # in order of receipt
        # each node's (GPU models, software) from its last report, and how many nodes have each (the filter)
        self._model_keys = ModelKeys()
        self._boots: dict[str, OrderedDict[str, None]] = {}
        self._reservations: dict[str, Reservation] = {}
        self._by_node: dict[str, set[str]] = {}
        self._reserved_mib: dict[tuple[str, str], float] = {}  # (node, GPU uuid) -> sum of reservations
        self._owner: dict[str, str] = {}  # GPU uuid -> the node it belongs to
        self._owned: dict[str, set[str]] = {}  # node -> the GPU uuids it owns (`_owner` by node)
        # local mode's node cap (`_make_room`), nodes holding no reservation, least useful first:
        self._unplaced: OrderedDict[str, None] = OrderedDict()  # nobody placed on them; heard longest ago first
        self._emptied: OrderedDict[str, None] = OrderedDict()  # placed on before; emptied longest ago first
        self._bound: OrderedDict[str, str] = OrderedDict()  # pod uid -> node, Bindings created
        self._seen: dict[str, float] = {}  # pod uid -> when its reservation was made or a report named it
        self._views: dict[str, NodeView] = {}
        self._known_nodes: frozenset[str] | None = None  # the cluster's nodes; None: not known (local mode)
        self.matrix = NodeMatrix()  # the same views, columnar, for the verbs' vectorised policy
        self._peaks = PeakStore(peak_store_size)
        self._duties = DutyStore(peak_store_size)  # observed GPU duties per job signature (`policy.duty`)
        self.sharing = SharingWatch(peak_store_size)  # sharing's feedback (`policy.feedback`), moves to make
        self._demand = DemandWindow()  # recent admissions: the demand mix of the packing score
        self.merits = FragmentationMemo(self._lock)  # packing merits per node row, reused while rows hold
        self.overcommits_refused = 0
        self.reports_ignored = 0
        self.reports_unknown_node = 0
        self.gpus_refused = 0  # GPUs of a report that another node owns
        self.uuid_conflicts = 0  # reports that listed a GPU UUID another node owns
        self.nodes_dropped = 0  # local mode: nodes forgotten at the node cap to make room for a new one

    # ---- reads (no lock) ----
    @property
    def views(self) -> Mapping[str, NodeView]:
        return self._views

    def node_view(self, name: str) -> NodeView | None:
        return self._views.get(name)

    def telemetry(self, name: str) -> NodeTelemetry | None:
        return self._telemetry.get(name)

    def reservation(self, pod_uid: str) -> Reservation | None:
        return self._reservations.get(pod_uid)

    def bound_node(self, pod_uid: str) -> str | None:
        """The node this extender bound the pod to (None: not bound by it, or forgotten)."""
        return self._bound.get(pod_uid)

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return list(self._reservations.values())

    def reservations_on(self, node: str) -> list[Reservation]:
        with self._lock:
            return [self._reservations[uid] for uid in self._by_node.get(node, ())]

    def telemetry_ages(self, now_s: float) -> dict[str, float]:
        return {name: now_s - t.received_s for name, t in list(self._telemetry.items())}

    def reserved_mib(self, node: str, gpu_uuid: str) -> float:
        return self._reserved_mib.get((node, gpu_uuid), 0.0)

    def correction(self, signature: str) -> Correction | None:
        with self._lock:
            return self._peaks.get(signature)

    def learned_duty(self, signature: str) -> float | None:  # the duty its pods showed alone (largest of the last)
        with self._lock:
            return self._duties.get(signature) if signature else None

    def slowdown_margin(self, signature: str) -> float:  # its forecast's learned error (`feedback.margin`)
        with self._lock:
            return self.sharing.feedback.margin(signature)

    def take_moves(self) -> list[Move]:  # the pods sharing's feedback asks to move (`policy.feedback`)
        with self._lock:
            return self.sharing.take_moves()

    def wait_for_empty_s(self, gpus: int, now_s: float, names: Iterable[str] | None = None, need_mib: float = 0.0
                         ) -> float:
        """The sharing rule's W: the predicted wait until `gpus` GPUs that can hold `need_mib` each
        (`sharing.can_hold`) of one node of `names` (the pod's; default all) are empty (`sharing.wait_for_empty_s`)."""
        with self._lock:
            return self._wait_for_empty_s(gpus, now_s, names, need_mib)

    def _wait_for_empty_s(self, gpus: int, now_s: float, names: Iterable[str] | None, need_mib: float) -> float:
        k, allowed = max(gpus, 1), None if names is None else set(names)
        if self._spare_holds(k, need_mib, allowed):
            return 0.0
        best = float("inf")
        for name in (self._views if allowed is None else allowed):
            view = self._views.get(name)
            if view is None:
                continue
            held: dict[str, list[tuple[float, float]]] = {g.uuid: [] for g in view.healthy}
            for uid in self._by_node.get(name, ()):
                res = self._reservations.get(uid)
                if res is not None:
                    for uuid in res.gpu_uuids:
                        if uuid in held:
                            held[uuid].append((res.bound_s, res.priority_inputs.gpu_seconds))
            # a GPU holding memory deepres did not place empties at no time deepres can predict: never (not 0)
            waits = sorted(math.inf if g.foreign_mib > EMPTY_SLACK_MIB or (not held[g.uuid] and not g.empty)
                           else wait_for_empty_s(now_s, [held[g.uuid]]) for g in view.healthy
                           if can_hold(g.capacity_mib, need_mib))
            if len(waits) >= k:
                best = min(best, waits[k - 1])
                if best <= 0.0:  # no wait is shorter
                    return 0.0
        return best

    def _spare_holds(self, k: int, need_mib: float = 0.0, allowed: set[str] | None = None) -> bool:
        """Whether a node (of `allowed`) without any reservation has `k` empty GPUs of `need_mib` free (lock
        held): then the wait is 0, and no node need be looked at. Asked of a few of the nodes nobody placed
        on or that emptied (candidates only: each is checked), so that the filter and the bind do not go
        through every node's GPUs (O(cluster) per pod: ~40% of the extender's CPU per GPU pod at 300 nodes)."""
        for spare in (self._unplaced, self._emptied):
            for name in islice(reversed(spare), SPARES_CHECKED):
                view = self._views.get(name)
                if view is not None and len(view.empty_free_desc) >= k and not self._by_node.get(name) \
                        and view.empty_free_desc[k - 1] >= need_mib and (allowed is None or name in allowed):
                    return True  # k GPUs empty now (not merely without a reservation of ours)
        return False

    def model_keys(self) -> tuple[Mapping[str, ModelKey], tuple[ModelKey, ...]]:
        """Each node's (GPU models, node software) and the distinct ones in the cluster, nodes of one key
        sharing one object (compare them with `is`): `ModelKeys.snapshot`."""
        with self._lock:
            return self._model_keys.snapshot()

    def calibration_nodes(self) -> tuple[frozenset[str], dict[tuple[str, str], int]]:
        """The nodes reporting GPUs, how many report each (GPU model, software): the calibration's learner."""
        with self._lock:
            of = dict(self._model_keys.snapshot()[0])
        return frozenset(of), nodes_per_model(of)

    def demand_mix(self) -> DemandMix:
        with self._lock:
            return self._demand.mix()

    def nodes_with_reservations(self) -> set[str]:
        with self._lock:
            return {node for node, uids in self._by_node.items() if uids}

    # ---- telemetry ----
    def set_known_nodes(self, names: Iterable[str]) -> list[str]:
        """The cluster's node list (cluster mode): reports of other nodes are refused from now on;
        returns the nodes whose telemetry was dropped because they are gone."""
        known = frozenset(names)
        with self._lock:
            self._known_nodes = known
            gone = [n for n in self._telemetry if n not in known]
            for name in gone:
                self._forget(name)
        return gone

    def node_added(self, name: str) -> None:
        with self._lock:
            if self._known_nodes is not None:
                self._known_nodes = self._known_nodes | {name}

    def apply_report(self, report: NodeReport, now_s: float) -> str:
        """Accept a node's report unless it is older than the last one; apply the usage rule.

        `now_s` is the extender's monotonic clock. Ordering: within one agent boot (`boot_id`) the
        sequence must grow; a boot id not seen before starts a new epoch (the agent restarted); a
        report of an earlier boot is a replay. A report without boot id (older agents) with a
        sequence not above the last is accepted only once the last one is stale. The agent's
        timestamp plays no part.
        """
        with self._lock:
            if self._known_nodes is not None and report.node not in self._known_nodes:
                self.reports_unknown_node += 1
                return UNKNOWN_NODE
            last = self._telemetry.get(report.node)
            if last is None and len(self._telemetry) >= NODES_MAX and not self._make_room():
                self.reports_unknown_node += 1
                return TOO_MANY_NODES
            boots = self._boots.setdefault(report.node, OrderedDict())
            if last is not None and not self._newer(report, last, boots, now_s):
                self.reports_ignored += 1
                return OLD_SEQUENCE
            if report.boot_id:
                boots[report.boot_id] = None
                boots.move_to_end(report.boot_id)
                while len(boots) > BOOTS_PER_NODE:
                    boots.popitem(last=False)
            if last is not None and self._unchanged(report, last):
                self._heartbeat(report, now_s)
                self._telemetry.move_to_end(report.node)  # in order of receipt: first, the node silent longest
                self._heard(report.node, last is None)
                return ACCEPTED
            kept = self._own_gpus(report)
            self._telemetry[report.node] = NodeTelemetry(kept, now_s)
            self._model_keys.set(report.node, kept)
            if last is None:
                self.calibration.nodes_changed()  # a flag and an event: the learner looks again
            self._telemetry.move_to_end(report.node)
            self._heard(report.node, last is None)
            self._follow_usage(report, now_s)
            if self.params.sharing and self.params.sharing_feedback:
                self.sharing.on_report(report, self._reservations, self._by_node.get(report.node, ()), now_s,
                                       self.params, lambda g: self._foreign_mib(report.node, g))
            self._rebuild(report.node)
            if len(kept.gpus) < len(report.gpus):
                self.uuid_conflicts += 1
                return GPU_CONFLICT
            return ACCEPTED

    def _make_room(self) -> bool:
        """Local mode at the node cap (lock held): forget the least useful node, so that a flood of
        invented nodes pushes out invented nodes, not new real ones for up to `kube.local_expiry_s`,
        and re-reports of nodes nobody placed on never push out one that holds or recently held pods:
        first a node nobody has placed on (heard longest ago first), else the node whose last pod left
        longest ago; never one that holds a reservation. O(1) (plus the forgotten node's GPUs). False
        in a cluster (the node list bounds the nodes) or when every node holds a reservation."""
        if self._known_nodes is not None:
            return False
        for spare, why in ((self._unplaced, "nobody placed on it"), (self._emptied, "its last pod left longest ago")):
            if spare:
                name = next(iter(spare))
                self._forget(name)
                self.nodes_dropped += 1
                log.info("node cap %d reached: forgot node=%s (%s, no reservation)", NODES_MAX, name, why)
                return True
        return False

    def _heard(self, node: str, new: bool) -> None:
        """A report of `node` was accepted (lock held): a new node without reservations joins the
        nodes nobody placed on; one of those moves to the back (heard last)."""
        if node in self._unplaced:
            self._unplaced.move_to_end(node)
        elif new and not self._by_node.get(node) and node not in self._emptied:
            self._unplaced[node] = None

    def _placed_on(self, node: str) -> None:
        """`node` holds a reservation (lock held): it is no spare for the node cap."""
        self._unplaced.pop(node, None)
        self._emptied.pop(node, None)

    def _emptied_now(self, node: str) -> None:
        """`node`'s last reservation was released (lock held): the most recently useful spare."""
        if node in self._telemetry and not self._by_node.get(node):
            self._emptied.pop(node, None)
            self._emptied[node] = None

    def _unchanged(self, report: NodeReport, last: NodeTelemetry) -> bool:
        """Whether `report` says what the node's last accepted one said (an idle node's heartbeat):
        the same GPUs with the same readings (so the same owner: the last kept only its own) and no
        pod usage (whose observation moves reservations and their warm-up), with a view built."""
        return (not report.pods and not last.report.pods and report.gpus == last.report.gpus
                and report.node in self._views)

    def _heartbeat(self, report: NodeReport, now_s: float) -> None:
        """An unchanged report refreshes the node's receipt time and nothing else: its view is the
        last one at the new time, its matrix row keeps its version (the packing score's merits of the
        node stay valid). Measured in-process, ~0.035 instead of ~0.06 ms per report."""
        self._telemetry[report.node] = NodeTelemetry(report, now_s)
        self._model_keys.set(report.node, report)  # the same GPUs; the driver may have changed
        view = self._views[report.node]
        if any(g.pending_mib for g in view.gpus):  # a pending reservation may have settled since
            self._rebuild(report.node)
            return
        self._views[report.node] = NodeView(name=view.name, gpus=view.gpus, received_s=now_s)
        self.matrix.touch(report.node, now_s)

    def _newer(self, report: NodeReport, last: NodeTelemetry, boots: OrderedDict[str, None], now_s: float) -> bool:
        if report.boot_id:
            if report.boot_id == last.report.boot_id:
                return report.sequence > last.report.sequence
            return report.boot_id not in boots  # a boot never seen: the agent restarted
        if report.sequence > last.report.sequence and not last.report.boot_id:
            return True
        return now_s - last.received_s > self.params.telemetry_ttl_s

    def _own_gpus(self, report: NodeReport) -> NodeReport:
        """The report without the GPUs another node owns (logged and counted); claims the others."""
        kept = []
        node = report.node
        for gpu in report.gpus:
            owner = self._owner.get(gpu.uuid)
            if owner == node:  # the usual case: the same GPUs as last time
                kept.append(gpu)
                continue
            if owner is not None and self._still_owns(owner, gpu.uuid):
                self.gpus_refused += 1
                log.warning("node=%s reported GPU %s of node %s: GPU ignored", report.node, gpu.uuid, owner)
                continue
            self._claim(gpu.uuid, node)
            kept.append(gpu)
        if len(kept) == len(report.gpus):
            return report
        return replace(report, gpus=tuple(kept))

    def gpu_conflicts(self, report: NodeReport) -> dict[str, str]:
        """The GPUs of `report` another node owns (uuid -> owner): first come, an agent speaks only for
        its own node, so `apply_report` leaves them out (the owner's GPUs stay as they are) and answers
        GPU_CONFLICT; the caller tells the agent which."""
        with self._lock:
            out = {}
            for gpu in report.gpus:
                owner = self._owner.get(gpu.uuid)
                if owner is not None and owner != report.node and self._still_owns(owner, gpu.uuid):
                    out[gpu.uuid] = owner
            return out

    def _claim(self, uuid: str, node: str) -> None:
        """`uuid` belongs to `node` from now on (lock held), in both indexes."""
        previous = self._owner.get(uuid)
        if previous is not None and previous != node:
            owned = self._owned.get(previous)
            if owned is not None:
                owned.discard(uuid)
                if not owned:
                    del self._owned[previous]
        self._owner[uuid] = node
        self._owned.setdefault(node, set()).add(uuid)

    def _still_owns(self, node: str, uuid: str) -> bool:
        telemetry = self._telemetry.get(node)
        listed = telemetry is not None and any(g.uuid == uuid for g in telemetry.report.gpus)
        return listed or (node, uuid) in self._reserved_mib

    def forget_node(self, name: str) -> None:
        """The node left the cluster: drop its telemetry (its pods' reservations go with the pods)."""
        with self._lock:
            self._forget(name)

    def expire_nodes(self, now_s: float, older_than_s: float) -> list[str]:
        """Forget the telemetry of nodes silent for `older_than_s` (local mode: no node list says
        which nodes exist, so a node that stopped reporting, or never existed, goes away)."""
        with self._lock:
            gone = [n for n, t in self._telemetry.items() if now_s - t.received_s > older_than_s]
            for name in gone:
                self._forget(name)
        return gone

    # ---- reservations ----
    def reserve_on(self, pod: PodRequest, template: Reservation, now_s: float, *,
                   packing: bool = False, wait_s: float | None = None) -> Reserved | str:
        """Choose `pod`'s GPUs on `template.node` and reserve them atomically, by the rule that scored the
        node: for a packing pod (`packing`) the fragmentation-aware choice against the demand mix of recent
        admissions (when there is one), else `choose_gpus`; the sharing rule with W `wait_s` (the filter's, over
        the pod's nodes; None: over every node).

        `template` is the reservation to record, its `gpu_uuids` left to this choice. Returns the recorded
        reservation, or the reason it was refused. An existing reservation of the same pod on the same node is
        returned as is, marked existing (a retried bind); one on another node refuses the bind, left untouched."""
        node = template.node
        with self._lock:
            existing = self._reservations.get(pod.uid)
            if existing is not None:
                if existing.node == node:
                    return Reserved(existing, True)
                return f"pod {pod.key} already holds GPUs on {existing.node}"
            bound = self._bound.get(pod.uid)
            if bound is not None and bound != node:
                return f"pod {pod.key} is already bound to {bound}"
            view = self._views.get(node)
            if view is not None and self.params.sharing and pod.gpu_job:  # the sharing rule, as the filter
                wait = self._wait_for_empty_s(pod.gpus, now_s, None, pod.admission_mib) if wait_s is None else wait_s
                view = sharing_view(pod, view, self.params, wait)
            failure = node_failure(pod, view, now_s, self.params)
            chosen = None
            if view is not None and failure is None:
                mix = self._demand.mix() if packing else None
                chosen = choose_gpus_for(pod, view, self.params, mix)
            if chosen is None:
                self.overcommits_refused += 1
                return failure[1] if failure is not None else "no GPU left that fits"
            res = replace(template, gpu_uuids=tuple(g.uuid for g in chosen))
            if pod.whole_gpu:  # the whole-GPU fallback: the GPUs' whole memory, nothing shares them
                whole = reserved_per_gpu(pod, (g.capacity_mib for g in chosen))
                res = replace(res, memory_mib=whole, admission_mib=whole)
            self._add(res)
            return Reserved(res, False)

    def confirm(self, pod_uid: str, node: str, now_s: float) -> Reservation | None:
        """The pod's bind for `node` takes the reservation assumed for it there (`Reservation.assumed`):
        the same GPUs, now its bind's, at `now_s`. None when it holds no assumed reservation on `node`."""
        with self._lock:
            res = self._reservations.get(pod_uid)
            if res is None or not res.assumed or res.node != node:
                return None
            res = replace(res, assumed=False, bound_s=now_s)
            self._reservations[pod_uid] = res  # the same memory on the same GPUs: the node's view stands
            self._seen[pod_uid] = now_s
            return res

    def release_assumed(self, pod_uid: str) -> bool:
        """Release the pod's reservation if it is still only assumed (a bind may have confirmed it
        meanwhile: then it stays). Whether one was released."""
        with self._lock:
            res = self._reservations.get(pod_uid)
            if res is None or not res.assumed:
                return False
            self._drop(self._reservations.pop(pod_uid))
            return True

    def mark_bound(self, pod_uid: str, node: str, admission: Reservation | None = None) -> None:
        """The pod's Binding exists: remember it, and count its admission in the demand mix."""
        with self._lock:
            self._bound[pod_uid] = node
            self._bound.move_to_end(pod_uid)
            while len(self._bound) > BOUND_MAX:
                self._bound.popitem(last=False)
            if admission is not None:
                self._demand.admit(admission.admission_mib, len(admission.gpu_uuids))

    def restore(self, res: Reservation) -> bool:
        """Record a reservation rebuilt from a running pod's annotations (no admission check: the pod
        already runs there). False when the pod already has one."""
        with self._lock:
            if res.pod_uid in self._reservations:
                return False
            self._add(res)
            self._bound[res.pod_uid] = res.node
            # no GPU is claimed for the node here: an annotation is no proof of where a GPU is (a forged
            # one would blind the real owner); the node's own reports claim its GPUs (`_own_gpus`)
            self._demand.admit(res.admission_mib, len(res.gpu_uuids))
            return True

    def rebook(self, pod_uid: str, gpu_uuids: tuple[str, ...]) -> Reservation | None:
        """Move a restored reservation to `gpu_uuids` (its GPUs checked against the node's report:
        `policy.restoring`); none: released. Returns the reservation now held, None if none."""
        with self._lock:
            res = self._reservations.get(pod_uid)
            if res is None or res.gpu_uuids == gpu_uuids:
                return res
            self._shift(res, -res.memory_mib)
            if not gpu_uuids:
                self._reservations.pop(pod_uid, None)
                self._seen.pop(pod_uid, None)
                self._by_node.get(res.node, set()).discard(pod_uid)
                self._emptied_now(res.node)
                self._rebuild(res.node)
                return None
            res = replace(res, gpu_uuids=gpu_uuids)
            self._reservations[pod_uid] = res
            self._shift(res, res.memory_mib)
            self._rebuild(res.node)
            return res

    def expire_unseen(self, now_s: float, older_than_s: float) -> list[Reservation]:
        """Release the reservations no report has named for `older_than_s` since they were made
        (local mode: no pod deletion ever says a pod is gone)."""
        with self._lock:
            stale = [uid for uid in self._reservations if now_s - self._seen.get(uid, now_s) > older_than_s]
        return [res for uid in stale if (res := self.release(uid)) is not None]

    def release(self, pod_uid: str, *, forget_bound: bool = True) -> Reservation | None:
        """Drop a pod's reservation (pod ended, deleted, or its bind failed)."""
        with self._lock:
            if forget_bound:
                self._bound.pop(pod_uid, None)
            res = self._reservations.pop(pod_uid, None)
            if res is not None:
                self._drop(res)
            return res

    def _drop(self, res: Reservation) -> None:
        """The books after `res` left `_reservations` (lock held)."""
        self._seen.pop(res.pod_uid, None)
        self.sharing.forget(res.pod_uid)
        self._by_node.get(res.node, set()).discard(res.pod_uid)
        self._shift(res, -res.memory_mib)
        self._emptied_now(res.node)
        self._rebuild(res.node)

    # ---- internals (lock held) ----
    def _forget(self, name: str) -> None:
        """Drop a node's telemetry and the GPUs it owns but holds no reservation on: O(its GPUs)."""
        self._telemetry.pop(name, None)
        self._model_keys.set(name, None)
        self._boots.pop(name, None)
        self._unplaced.pop(name, None)
        self._emptied.pop(name, None)
        owned = self._owned.get(name, set())
        for uuid in [u for u in owned if (name, u) not in self._reserved_mib]:
            owned.discard(uuid)
            if self._owner.get(uuid) == name:
                del self._owner[uuid]
        if not owned:
            self._owned.pop(name, None)
        self._rebuild(name)

    def _add(self, res: Reservation) -> None:
        self._reservations[res.pod_uid] = res
        self._seen[res.pod_uid] = res.bound_s
        self._by_node.setdefault(res.node, set()).add(res.pod_uid)
        self._placed_on(res.node)
        self._shift(res, res.memory_mib)
        self._rebuild(res.node)

    def _shift(self, res: Reservation, delta_mib: float) -> None:
        for uuid in res.gpu_uuids:
            key = (res.node, uuid)
            total = self._reserved_mib.get(key, 0.0) + delta_mib
            if total <= 1e-6:
                self._reserved_mib.pop(key, None)
            else:
                self._reserved_mib[key] = total

    def _follow_usage(self, report: NodeReport, now_s: float) -> None:
        if not report.pods:
            return
        capacity = {g.uuid: g.memory_total_mib for g in report.gpus}
        for usage in report.pods:
            res = self._reservations.get(usage.pod_uid)
            if res is None or res.node != report.node:
                continue
            self._seen[res.pod_uid] = now_s
            caps = [capacity[u] for u in res.gpu_uuids if u in capacity]
            if not caps:
                continue
            count = max(len(usage.gpu_uuids) or len(res.gpu_uuids), 1)
            per_gpu = observed_peak(usage.peak_memory_mib / count, min(caps))
            if per_gpu is None:
                continue  # no process memory: no observation
            if usage.peak_memory_mib / count <= min(caps):  # above the GPU's capacity: no reading to learn from
                self.calibration.observe(res.pod_uid, per_gpu, now_s - res.bound_s)
            updated = observe_usage(res, per_gpu, now_s, self.params, self._peaks)
            if updated is not res:
                self._shift(res, updated.memory_mib - res.memory_mib)
                self._reservations[res.pod_uid] = updated
        self._follow_duties(report, now_s)

    def _follow_duties(self, report: NodeReport, now_s: float) -> None:
        """The usage rule for compute (`policy.duty`, applied by `sharing_watch.follow_duties`)."""
        self._reservations.update(follow_duties(report, self._reservations, self._duties, now_s, self.params))

    def _foreign_mib(self, node: str, gpu: GpuReport) -> float:
        """Memory of the GPU's processes that belong to no pod holding a reservation on it."""
        total = 0.0
        for process in gpu.processes:
            res = self._reservations.get(process.pod_uid) if process.pod_uid else None
            if res is None or res.node != node or gpu.uuid not in res.gpu_uuids:
                total += process.used_memory_mib
        return total

    def _pending_mib(self, node: str, received_s: float) -> dict[str, float]:
        """Per GPU of `node`, the reservations made less than `usage_warmup_s` before its report
        arrived: their memory may not be in the report's used memory yet (`usage.occupied_mib`)."""
        since = received_s - self.params.usage_warmup_s
        pending: dict[str, float] = {}
        for uid in self._by_node.get(node, ()):
            res = self._reservations.get(uid)
            if res is not None and res.bound_s > since:
                for uuid in res.gpu_uuids:
                    pending[uuid] = pending.get(uuid, 0.0) + res.memory_mib
        return pending

    def _regrown_gpus(self, node: str) -> set[str]:
        """The GPUs of `node` that hold a reservation whose job grew again after the usage rule lowered
        it (`UsageTrack.regrown`): they admit nothing until that job has shown its new peak."""
        blocked: set[str] = set()
        for uid in self._by_node.get(node, ()):
            res = self._reservations.get(uid)
            if res is not None and res.track is not None and res.track.regrown:
                blocked.update(res.gpu_uuids)
        return blocked

    def _shown_reserved_mib(self, node: str, gpu: GpuReport, blocked: set[str]) -> float:
        """The reservations on a GPU as its view shows them: a GPU blocked for a regrown job shows full."""
        reserved = self._reserved_mib.get((node, gpu.uuid), 0.0)
        return max(reserved, gpu.memory_total_mib) if gpu.uuid in blocked else reserved

    def _rebuild(self, node: str) -> None:
        telemetry = self._telemetry.get(node)
        if telemetry is None:
            self._views.pop(node, None)
            self.matrix.remove(node)
            return
        pending = self._pending_mib(node, telemetry.received_s)
        blocked = self._regrown_gpus(node)
        on: dict[str, list[Reservation]] = {}
        for uid in self._by_node.get(node, ()):
            if (held := self._reservations.get(uid)) is not None:
                for uuid in held.gpu_uuids:
                    on.setdefault(uuid, []).append(held)
        old = self._views.get(node)
        previous = {g.uuid: g for g in old.gpus} if old is not None else {}
        gpus = []
        for g in telemetry.report.gpus:
            reserved = self._shown_reserved_mib(node, g, blocked)
            foreign = self._foreign_mib(node, g) if g.processes else 0.0
            waiting = 0.0 if g.processes else pending.get(g.uuid, 0.0)
            shares = tuple(sorted(r.duty for r in on.get(g.uuid, ())))
            feedback = self.params.sharing_feedback  # off: nothing learned to show (no work per GPU)
            over = feedback and self.sharing.feedback.is_over(g.uuid)
            margin = self.sharing.resident_margin(on.get(g.uuid, ()), g.model) if feedback else 1.0
            last = previous.get(g.uuid)
            # a GPU whose inputs did not change keeps its view (frozen): a reservation or a release
            # changes one GPU of the node, and building the other views again was most of the rebuild
            if (last is not None and last.index == g.index and last.capacity_mib == g.memory_total_mib
                    and last.used_mib == g.memory_used_mib and last.reserved_mib == reserved
                    and last.utilization == g.utilization_gpu and last.healthy == g.healthy
                    and last.foreign_mib == foreign and last.pending_mib == waiting and last.duties == shares
                    and last.over_bound == over and last.resident_margin == margin and not last.compute_full):
                gpus.append(last)
                continue
            gpus.append(GpuView(uuid=g.uuid, index=g.index, capacity_mib=g.memory_total_mib, used_mib=g.memory_used_mib,
                                reserved_mib=reserved, utilization=g.utilization_gpu, healthy=g.healthy,
                                foreign_mib=foreign, pending_mib=waiting, duties=shares, over_bound=over,
                                resident_margin=margin))
        view = NodeView(name=node, gpus=tuple(gpus), received_s=telemetry.received_s)
        self._views[node] = view
        self.matrix.put(view)
