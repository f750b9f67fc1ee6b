"""What the verbs wait for after a (re)start: the predictor, the first pod list (the reservations
rebuilt from annotations) and a telemetry quorum."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from extender.kube.cluster import Cluster
from extender.ledger import Ledger
from extender.server.planner import Planner
from extender.settings import Settings


class Readiness:
    """Latched once met: later per-node silence is the filter's staleness rule."""

    def __init__(self, settings: Settings, planner: Planner, cluster: Cluster, ledger: Ledger,
                 mono: Callable[[], float]) -> None:
        self.settings = settings
        self.planner = planner
        self.cluster = cluster
        self.ledger = ledger
        self.mono = mono
        self.synced_s: float | None = None  # mono time of the first pod list applied
        self._ready = False
        self._expected_nodes: frozenset[str] = frozenset()  # nodes holding reservations at the first sync

    def first_sync(self, nodes_with_reservations: Iterable[str]) -> None:
        """The first pod list is applied: from now the quorum counts reports from these nodes."""
        if self.synced_s is None:
            self._expected_nodes = frozenset(nodes_with_reservations)
            self.synced_s = self.mono()

    def waiting(self) -> list[str]:
        """What the verbs still wait for: the predictor, the first pod list and a telemetry quorum:
        `kube.telemetry_quorum` of the nodes holding reservations at that list reported since, or
        `kube.telemetry_grace_s` passed. A damaged local state file (extender/kube/statefile.py) is never
        latched away: it keeps the verbs waiting."""
        damaged = getattr(self.cluster, "state_problem", "")
        if self._ready:
            return [damaged] if damaged else []
        waiting = [damaged] if damaged else []
        if self.planner.predictor is None:
            error = self.planner.predictor_error
            waiting.append(f"predictor ({error})" if error else "predictor")
        if not self.cluster.synced() or self.synced_s is None:
            waiting.append("first cluster sync")
        else:
            missing = self._quorum_missing(self.synced_s)
            if missing:
                waiting.append(missing)
        if not waiting:
            self._ready = True
        return waiting

    def _quorum_missing(self, synced_s: float) -> str:
        expected = self._expected_nodes
        if not expected or self.mono() - synced_s >= self.settings.kube.telemetry_grace_s:
            return ""
        reported = sum(1 for n in expected if (t := self.ledger.telemetry(n)) is not None
                       and t.received_s >= synced_s)
        if reported >= self.settings.kube.telemetry_quorum * len(expected):
            return ""
        return f"telemetry quorum ({reported} of {len(expected)} nodes with reservations reported)"

    def unheard(self, nodes: Iterable[str]) -> list[str]:
        """Of `nodes`, those that have not reported since the first pod list, while that list is younger
        than `kube.telemetry_grace_s` (after it, a silent node is the filter's staleness rule, not a
        start-up gap). Such a node is unknown, not full: no eviction is planned around it (a pod that found
        no room on the nodes heard so far may find it on one that reports a moment later)."""
        synced_s = self.synced_s
        if synced_s is None:
            return list(nodes)
        if self.mono() - synced_s >= self.settings.kube.telemetry_grace_s:
            return []
        return [n for n in nodes if (t := self.ledger.telemetry(n)) is None or t.received_s < synced_s]

    def not_ready(self) -> str:
        """"" when ready, else the Error a verb answers with."""
        waiting = self.waiting()
        return f"extender not ready: waiting for {', '.join(waiting)}" if waiting else ""
