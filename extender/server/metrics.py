"""The extender's Prometheus metrics, on a registry of its own (several apps can live in one test
process, and /metrics shows only ours).

Per-node telemetry age and the reservation figures are computed at scrape time from the cluster
state by a collector, so a telemetry report costs no metric update at all.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.ledger import Ledger as ClusterState
from extender.policy.columnar import FragmentationMemo

VERBS = ("filter", "prioritize", "bind", "preempt", "telemetry", "predict", "mutate")
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MEMORY_BUCKETS_MIB = (512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768, 49152, 81920, 163840)


class ExtenderMetrics:
    """Every metric the extender exports (names below, all prefixed `deepres_extender_`)."""

    def __init__(self, state: ClusterState, clock: Callable[[], float] = time.time,
                 merits: FragmentationMemo | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("deepres_extender_requests_total", "Requests per verb and outcome (ok, error).",
                                ["verb", "outcome"], registry=r)
        self.latency = Histogram("deepres_extender_request_seconds", "Request latency per verb.", ["verb"],
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.filter_nodes = Counter("deepres_extender_filter_nodes_total",
                                    "Filter outcomes per node by reason (passed, memory, stale, no_report, "
                                    "too_few_gpus, too_large, bad_annotation, held; not_shortlisted: passed but left "
                                    "out of the answer by the filter shortlist).", ["reason"], registry=r)
        self.predictions = Counter("deepres_extender_predictions_total",
                                   "Predictions made, by source (model, override, corrected).", ["source"],
                                   registry=r)
        self.predicted_memory = Histogram("deepres_extender_predicted_memory_mib",
                                          "Admission memory per GPU of predicted pods (MiB).",
                                          buckets=MEMORY_BUCKETS_MIB, registry=r)
        self.overcommit_refused = Counter("deepres_extender_overcommit_refused_total",
                                          "Binds refused because the GPUs no longer had room.", registry=r)
        self.assumptions = Counter("deepres_extender_assumptions_total",
                                   "GPUs reserved for a pod on its prioritize's best node until its bind, by "
                                   "outcome (made; bound: its bind took them; moved: it was bound elsewhere or "
                                   "admitted otherwise; expired: no bind came).", ["outcome"], registry=r)
        self.telemetry_reports = Counter("deepres_extender_telemetry_reports_total",
                                         "Telemetry reports by outcome (accepted, old_sequence, invalid, "
                                         "unauthorized, unknown_node, gpu_conflict, full_report_needed: a "
                                         "delta that did not apply).", ["outcome"], registry=r)
        self.binds = Counter("deepres_extender_binds_total", "Binds by outcome (bound, refused, failed).",
                             ["outcome"], registry=r)
        self.allocations = Counter("deepres_extender_allocations_total",
                                   "Device plugin Allocate calls answered through /v1/allocate, by outcome "
                                   "(served, refused): the allocation handshake.", ["outcome"], registry=r)
        self.whole_gpu_binds = Counter("deepres_extender_whole_gpu_binds_total",
                                       "Pods bound to whole GPUs by the whole-GPU fallback (their upper bound "
                                       "exceeded every GPU they could be given, their point estimate fit).",
                                       registry=r)
        self.sharing_moves = Counter("deepres_extender_sharing_moves_total",
                                     "Pods sharing's feedback asked to move (the newest joiner of a GPU whose shared "
                                     "jobs ran slower than their bound for sharing.moveAfterSeconds), by outcome "
                                     "(moved: evicted; skipped: no longer ours or on that node; failed: the "
                                     "eviction was refused, e.g. by a PodDisruptionBudget).", ["outcome"], registry=r)
        self.preemptions = Counter("deepres_extender_preemption_victims_total",
                                   "Victims returned by preempt.", registry=r)
        self.restore_unparsable = Counter(
            "deepres_extender_restore_unparsable_pods_total",
            "Bound pods rebuilt after a restart whose annotations no longer parse, by what did not (annotations: "
            "the job, restored at default priority; memory: the recorded figures, the GPUs booked whole; bound_at: "
            "the bind time, attained service counted from the restart; evicted_by: the kind that evicted its workload, "
            "which may then evict it again). Their GPUs stay booked.", ["part"],
            registry=r)
        self.restore_invalid = Counter(
            "deepres_extender_restore_invalid_pods_total",
            "Bound pods rebuilt after a restart whose deepres.io/assigned-gpus the checks refused in part, by "
            "reason (gpu_list: not a list of GPU uuids; unknown_gpu: names a GPU the node does not report; "
            "gpu_count: more or fewer GPUs than the pod asks for; overbooked: with the earlier pods on a GPU, "
            "more than its memory). Extra names are dropped; GPUs its processes use are kept.", ["reason"],
            registry=r)
        r.register(_StateCollector(state, clock))
        if merits is not None:
            r.register(_MeritsCollector(merits))
        for verb in VERBS:  # export zeros from the start, so rates work from the first scrape
            self.latency.labels(verb)


class _StateCollector(Collector):
    def __init__(self, state: ClusterState, clock: Callable[[], float]) -> None:
        self.state = state
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        ages = GaugeMetricFamily("deepres_extender_telemetry_age_seconds",
                                 "Seconds since the node's last accepted telemetry report.", labels=["node"])
        for node, age in sorted(self.state.telemetry_ages(self.clock()).items()):
            ages.add_metric([node], age)
        yield ages
        reservations = self.state.reservations()
        yield GaugeMetricFamily("deepres_extender_reservations", "Pods holding a GPU reservation.",
                                value=len(reservations))
        reserved = GaugeMetricFamily("deepres_extender_reserved_memory_mib",
                                     "Memory reserved per node (sum over its GPUs, MiB).", labels=["node"])
        per_node: dict[str, float] = {}
        for res in reservations:
            per_node[res.node] = per_node.get(res.node, 0.0) + res.memory_mib * len(res.gpu_uuids)
        for node, mib in sorted(per_node.items()):
            reserved.add_metric([node], mib)
        yield reserved
        yield GaugeMetricFamily("deepres_extender_nodes_reporting", "Nodes with telemetry.",
                                value=len(self.state.views))
        yield CounterMetricFamily("deepres_extender_telemetry_gpus_refused",
                                  "GPUs left out of a node's report because another node owns their UUID.",
                                  value=self.state.gpus_refused)
        yield CounterMetricFamily("deepres_extender_telemetry_uuid_conflicts",
                                  "Reports that listed a GPU UUID another node owns (answered 409, those GPUs "
                                  "left out; the owner keeps them).", value=self.state.uuid_conflicts)
        yield CounterMetricFamily("deepres_extender_nodes_dropped",
                                  "Local mode: nodes forgotten at the node cap to make room for a new one (the "
                                  "one silent longest that held no reservation).", value=self.state.nodes_dropped)

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return iter(())


class _MeritsCollector(Collector):
    """How often the packing score reused a memoised merit instead of computing it (a low share means
    nodes change faster than pods of one shape arrive, or the demand mix keeps changing)."""

    def __init__(self, merits: FragmentationMemo) -> None:
        self.merits = merits

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("deepres_extender_packing_merits",
                                     "Node merits of the fragmentation-aware packing score, by source "
                                     "(computed, reused from the memo).", labels=["source"])
        family.add_metric(["computed"], self.merits.computed)
        family.add_metric(["reused"], self.merits.reused)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())


class StateFileCollector(Collector):
    """Failed writes of the local-mode state file (`deepres_extender_state_write_failures_total`; 0
    in a cluster, where the API server keeps the Bindings). Each failed the bind that caused it."""

    def __init__(self, cluster: object) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("deepres_extender_state_write_failures",
                                  "Writes of the local-mode state file that failed (full disk, I/O error); "
                                  "the bind that wrote it failed too.",
                                  value=int(getattr(self.cluster, "state_write_failures", 0)))

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())


#: Window over which /metrics rendering time is budgeted (seconds).
EXPOSITION_WINDOW_S = 1.0


class CachedExposition:
    """The registry's text exposition, rendered anew only while rendering has taken less than
    `share` of each second; past that, the page last rendered (at most a second old) is served
    again. A scrape walks every node's and GPU's figures, and one scraper in a loop took 86% of a
    core at the node cap (issue 34); now a loop of scrapes costs the worker at most `share` of a core
    in rendering (10% by default: a 50 ms page twice a second), while a small cluster, or a test,
    still gets a fresh page each time (a page of a few nodes renders in about a millisecond)."""

    def __init__(self, registry: CollectorRegistry, share: float = 0.1, window_s: float = EXPOSITION_WINDOW_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.registry = registry
        self.budget_s = share * window_s
        self.window_s = window_s
        self.clock = clock
        self._lock = threading.Lock()
        self._page = b""
        self._window_start = -math.inf
        self._spent_s = 0.0
        self.renders = 0

    def render(self) -> bytes:
        with self._lock:  # concurrent scrapes wait for one rendering instead of each making their own
            now = self.clock()
            if now - self._window_start >= self.window_s:
                self._window_start, self._spent_s = now, 0.0
            if self._spent_s < self.budget_s or not self._page:
                self._page = generate_latest(self.registry)
                self._spent_s += self.clock() - now
                self.renders += 1
            return self._page
