"""What every part of the verbs' glue reads (`Parts`), given once by `Extender`, and the base class
that holds it: planner, placing, binding, preemption and intake differ in what they do, not in this."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from extender.allocations import AllocationGate
from extender.kube.cluster import Cluster
from extender.ledger import Ledger
from extender.server.events import PodEvents
from extender.server.metrics import ExtenderMetrics
from extender.server.planner import Planner
from extender.server.readiness import Readiness
from extender.server.worker import Worker
from extender.settings import Settings


@dataclass(frozen=True)
class Parts:
    settings: Settings
    planner: Planner
    ledger: Ledger
    cluster: Cluster
    metrics: ExtenderMetrics
    readiness: Readiness
    events: PodEvents
    worker: Worker
    clock: Callable[[], float]  # wall (deadlines, priorities)
    mono: Callable[[], float]  # monotonic (ages, warm-ups, grace periods)
    gate: AllocationGate  # the allocation handshake: one pod per node awaiting its kubelet's Allocate


class Part:
    """A part of the glue: the shared pieces as attributes."""

    def __init__(self, parts: Parts) -> None:
        self.settings, self.planner, self.ledger = parts.settings, parts.planner, parts.ledger
        self.cluster, self.metrics, self.readiness = parts.cluster, parts.metrics, parts.readiness
        self.events, self.worker, self.clock, self.mono = parts.events, parts.worker, parts.clock, parts.mono
        self.params = parts.planner.params
        self.gate = parts.gate
