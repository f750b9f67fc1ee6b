"""The compute side of a node report for the ledger: each pod's duty followed (`policy.duty`), and
sharing's feedback (`policy.feedback`): the report and the reservations on it turned into the rule's
inputs per GPU; the GPUs over their bound and the pods to move kept for the ledger's views and the
server's worker.

Held by the ledger under its lock (no lock of its own); no I/O. The moves are taken by the telemetry
intake (`server.intake`), which evicts them on its worker after checking them with the API server.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from extender.policy.duty import DutyStore, alone_duties, follow_duty, pod_alone_duty
from extender.policy.feedback import Sharer, SharingFeedback, gpu_bound
from extender.policy.types import PolicyParams, Reservation
from extender.telemetry import GpuReport, NodeReport

#: Pods waiting to be moved, at most (the oldest dropped first: the next report over the bound asks again).
MOVES_MAX = 256

@dataclass(frozen=True, slots=True)
class Move:
    """A pod the feedback asks to move: the newest joiner of a GPU that stayed over its bound."""

    uid: str
    namespace: str
    name: str
    node: str
    gpu: str
    worst: float  # the worst observed slowdown on the GPU when it was asked


def follow_duties(report: NodeReport, held: Mapping[str, Reservation], store: DutyStore, now_s: float,
                  params: PolicyParams) -> dict[str, Reservation]:
    """The usage rule for compute (`policy.duty`): the busy shares of the pods seen together on each
    GPU, turned into alone duties; each reserved pod's duty follows the busiest of its GPUs after the
    warm-up, and is recorded for its job signature (in `store`). Pods without a duty are no observation.
    Returns the reservations that changed."""
    on_gpu: dict[str, dict[str, float | None]] = {}
    for usage in report.pods:
        if usage.gpu_duty is None:
            continue
        for uuid in usage.gpu_uuids:
            on_gpu.setdefault(uuid, {})[usage.pod_uid] = usage.gpu_duty
    per_pod: dict[str, list[float]] = {}
    for busy in on_gpu.values():
        for uid, duty in alone_duties(busy).items():
            per_pod.setdefault(uid, []).append(duty)
    changed: dict[str, Reservation] = {}
    for uid, duties in per_pod.items():
        res = held.get(uid)
        alone = pod_alone_duty(duties)
        if res is None or res.node != report.node or alone is None:
            continue
        updated = follow_duty(res, alone, now_s, params)
        if now_s - res.bound_s >= params.usage_warmup_s and res.signature:
            store.record(res.signature, alone, uid)
        if updated is not res:
            changed[uid] = updated
    return changed


class SharingWatch:
    """The feedback's state and the moves it asked for, for the ledger."""

    def __init__(self, capacity: int) -> None:
        self.feedback = SharingFeedback(capacity)
        self._moves: OrderedDict[str, Move] = OrderedDict()

    def on_report(self, report: NodeReport, held: Mapping[str, Reservation], uids: Iterable[str], now_s: float,
                  params: PolicyParams, foreign_mib: Callable[[GpuReport], float]) -> None:
        """Apply the rule to each GPU of `report` (`held`: the ledger's reservations; `uids`: the node's)."""
        usage = {u.pod_uid: u for u in report.pods}
        on_gpu: dict[str, list[Reservation]] = {}
        for uid in uids:
            res = held.get(uid)
            if res is not None and res.node == report.node:
                for gpu in res.gpu_uuids:
                    on_gpu.setdefault(gpu, []).append(res)
        for g in report.gpus:
            pods = on_gpu.get(g.uuid, [])
            if not pods:
                self.feedback.forget_gpu(g.uuid)
                continue
            bound = gpu_bound((r.priority_inputs.criticality for r in pods), params)
            shared = len(pods) > 1
            sharers = []
            for r in pods:
                seen = usage.get(r.pod_uid)
                busy = seen.gpu_duty if seen is not None else None
                if shared and seen is not None and seen.duty_source != "process":
                    busy = None  # the device's utilisation charged whole to each pod says nothing of one
                sharers.append(Sharer(uid=r.pod_uid, signature=r.signature, busy=busy, duty=r.duty,
                                      bound_s=r.bound_s, bound=bound,
                                      warm=now_s - r.bound_s >= params.usage_warmup_s))
            others = bool(g.processes) and foreign_mib(g) > 0.0
            verdict = self.feedback.observe(g.uuid, g.model, sharers, others, now_s, params.sharing_move_after_s)
            if verdict.move is not None:
                res = held[verdict.move]
                self._moves.pop(res.pod_uid, None)
                self._moves[res.pod_uid] = Move(res.pod_uid, res.namespace, res.name, res.node, g.uuid, verdict.worst)
                while len(self._moves) > MOVES_MAX:
                    self._moves.popitem(last=False)

    def resident_margin(self, pods: Iterable[Reservation], model: str) -> float:
        """The largest forecast margin of the signatures on one GPU (`feedback.margin`)."""
        return max((self.feedback.margin(r.signature, model) for r in pods), default=1.0)

    def take_moves(self) -> list[Move]:
        moves = list(self._moves.values())
        self._moves.clear()
        return moves

    def forget(self, uid: str) -> None:
        self.feedback.forget_pod(uid)
        self._moves.pop(uid, None)
