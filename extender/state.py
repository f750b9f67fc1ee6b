"""ClusterState: the extender's live view of the GPU nodes (last telemetry with its receipt time)
and the reservations ledger, with one lock for every write.

Reads take no lock: `views` maps node name -> immutable NodeView, and a writer replaces a node's
entry with one dict assignment (atomic in CPython), so a filter over 500 nodes never waits for a
telemetry report. Writes (reports, reserve, release) hold the lock; `reserve_on` chooses the GPUs
and checks-and-reserves inside it, so concurrent binds can never over-commit a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from extender.policy.columnar import NodeMatrix
from extender.policy.filtering import node_failure
from extender.policy.scoring import choose_gpus
from extender.policy.types import GpuView, NodeView, PodRequest, PolicyParams, Reservation
from extender.policy.usage import Correction, PeakStore, observe_usage
from extender.telemetry import NodeReport

ACCEPTED = "accepted"
OLD_SEQUENCE = "old sequence"


@dataclass(frozen=True, slots=True)
class NodeTelemetry:
    """A node's last accepted report and the extender's clock when it arrived."""

    report: NodeReport
    received_s: float


class ClusterState:
    """Per-node telemetry + reservations; NodeViews rebuilt on every change of a node."""

    def __init__(self, params: PolicyParams, peak_store_size: int = 10_000) -> None:
        self.params = params
        self._lock = threading.Lock()
        self._telemetry: dict[str, NodeTelemetry] = {}
        self._reservations: dict[str, Reservation] = {}
        self._by_node: dict[str, set[str]] = {}
        self._reserved_mib: dict[str, float] = {}  # GPU uuid -> sum of reservations
        self._views: dict[str, NodeView] = {}
        self.matrix = NodeMatrix()  # the same views, columnar, for the verbs' vectorised policy
        self._peaks = PeakStore(peak_store_size)
        self.overcommits_refused = 0
        self.reports_ignored = 0

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

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return list(self._reservations.values())

    def reservations_on(self, node: str) -> list[Reservation]:
        with self._lock:
            return [self._reservations[uid] for uid in self._by_node.get(node, ())]

    def telemetry_ages(self, now_s: float) -> dict[str, float]:
        return {name: now_s - t.received_s for name, t in list(self._telemetry.items())}

    def reserved_mib(self, gpu_uuid: str) -> float:
        return self._reserved_mib.get(gpu_uuid, 0.0)

    def correction(self, signature: str) -> Correction | None:
        with self._lock:
            return self._peaks.get(signature)

    # ---- writes ----
    def apply_report(self, report: NodeReport, now_s: float) -> str:
        """Accept a node's report unless it is older than the last one; apply the usage rule.

        A report with a sequence number not above the last one is ignored, unless its agent
        timestamp is newer (the agent restarted and counts from 0 again); a replayed old report
        has an old timestamp and stays ignored.
        """
        with self._lock:
            last = self._telemetry.get(report.node)
            if last is not None and report.sequence <= last.report.sequence \
                    and report.timestamp_s <= last.report.timestamp_s:
                self.reports_ignored += 1
                return OLD_SEQUENCE
            self._telemetry[report.node] = NodeTelemetry(report, now_s)
            self._follow_usage(report, now_s)
            self._rebuild(report.node)
            return ACCEPTED

    def forget_node(self, name: str) -> None:
        """The node left the cluster: drop its telemetry (its pods' reservations go with the pods)."""
        with self._lock:
            self._telemetry.pop(name, None)
            self._rebuild(name)

    def reserve_on(
        self,
        pod: PodRequest,
        node: str,
        build: Callable[[tuple[str, ...]], Reservation],
        now_s: float,
        choose: Callable[[PodRequest, NodeView], tuple[GpuView, ...] | None] | None = None,
    ) -> Reservation | str:
        """Choose the pod's GPUs on `node` and reserve them atomically: by `choose` (the rule that
        scored the node) or, by default, `choose_gpus`.

        Returns the recorded Reservation (`build(gpu_uuids)`), or the reason it was refused. An
        existing reservation of the same pod on the same node is returned as is (a retried bind).
        """
        with self._lock:
            existing = self._reservations.get(pod.uid)
            if existing is not None:
                if existing.node == node:
                    return existing
                return f"pod {pod.key} already holds GPUs on {existing.node}"
            view = self._views.get(node)
            failure = node_failure(pod, view, now_s, self.params)
            chosen = None
            if view is not None and failure is None:
                chosen = choose(pod, view) if choose is not None else choose_gpus(pod, view, self.params)
            if chosen is None:
                self.overcommits_refused += 1
                return failure[1] if failure is not None else "no GPU left that fits"
            res = build(tuple(g.uuid for g in chosen))
            self._add(res)
            return res

    def restore(self, res: Reservation) -> bool:
        """Record a reservation rebuilt from a running pod's annotations (no admission check: the pod
        already runs there). False when the pod already has one."""
        with self._lock:
            if res.pod_uid in self._reservations:
                return False
            self._add(res)
            return True

    def release(self, pod_uid: str) -> Reservation | None:
        """Drop a pod's reservation (pod ended, deleted, or its bind failed)."""
        with self._lock:
            res = self._reservations.pop(pod_uid, None)
            if res is None:
                return None
            self._by_node.get(res.node, set()).discard(pod_uid)
            self._shift(res, -res.memory_mib)
            self._rebuild(res.node)
            return res

    # ---- internals (lock held) ----
    def _add(self, res: Reservation) -> None:
        self._reservations[res.pod_uid] = res
        self._by_node.setdefault(res.node, set()).add(res.pod_uid)
        self._shift(res, res.memory_mib)
        self._rebuild(res.node)

    def _shift(self, res: Reservation, delta_mib: float) -> None:
        for uuid in res.gpu_uuids:
            total = self._reserved_mib.get(uuid, 0.0) + delta_mib
            if total <= 1e-6:
                self._reserved_mib.pop(uuid, None)
            else:
                self._reserved_mib[uuid] = total

    def _follow_usage(self, report: NodeReport, now_s: float) -> None:
        for usage in report.pods:
            res = self._reservations.get(usage.pod_uid)
            if res is None or res.node != report.node:
                continue
            per_gpu = usage.peak_memory_mib / max(len(usage.gpu_uuids) or len(res.gpu_uuids), 1)
            updated = observe_usage(res, per_gpu, now_s, self.params, self._peaks)
            if updated is not res:
                self._shift(res, updated.memory_mib - res.memory_mib)
                self._reservations[res.pod_uid] = updated

    def _rebuild(self, node: str) -> None:
        telemetry = self._telemetry.get(node)
        if telemetry is None:
            self._views.pop(node, None)
            self.matrix.remove(node)
            return
        view = NodeView(
            name=node,
            gpus=tuple(
                GpuView(
                    uuid=g.uuid,
                    index=g.index,
                    capacity_mib=g.memory_total_mib,
                    used_mib=g.memory_used_mib,
                    reserved_mib=self._reserved_mib.get(g.uuid, 0.0),
                    utilization=g.utilization_gpu,
                    healthy=g.healthy,
                )
                for g in telemetry.report.gpus
            ),
            received_s=telemetry.received_s,
        )
        self._views[node] = view
        self.matrix.put(view)
