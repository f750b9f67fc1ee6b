"""The agent's /metrics and /healthz, served by a small threaded WSGI server.

Metric names follow dcgm-exporter's spirit with a `deepres_` prefix and units in the name; GPU series
carry `gpu`, `uuid`, `model_name`, `node`; pod series carry `pod`, `namespace` (from the API when the
agent can read pods, else empty), `pod_uid` and `node`. GPU and pod series are rebuilt from the
latest report at every scrape, so a GPU or pod that disappears takes its series with it.
A dedicated registry keeps the process/platform default collectors out.
"""

from __future__ import annotations

import logging
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric

from extender.agent.reporter import RESULTS
from extender.telemetry import NodeReport

log = logging.getLogger(__name__)

MIB_BYTES = 1024 * 1024
GPU_LABELS = ["gpu", "uuid", "model_name", "node"]
POD_LABELS = ["pod", "namespace", "pod_uid", "node"]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _SnapshotCollector:
    """Yields GPU and pod gauges from the last report (swapped atomically by `AgentMetrics.update`)."""

    def __init__(self) -> None:
        self.report: NodeReport | None = None
        self.pod_names: Mapping[str, tuple[str, str]] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        report, names = self.report, self.pod_names
        if report is None:
            return
        families = {
            name: GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for name, doc in (
                ("deepres_gpu_memory_total_bytes", "GPU memory capacity (a MIG instance: its own slice)"),
                ("deepres_gpu_memory_used_bytes", "GPU memory in use: total - free, driver reservation included"),
                ("deepres_gpu_memory_free_bytes", "GPU memory free"),
                ("deepres_gpu_memory_reserved_bytes", "GPU memory the driver reserves (0 where not reported)"),
                ("deepres_gpu_utilization_ratio", "fraction of time a kernel ran over the last sample period"),
                ("deepres_gpu_memory_utilization_ratio", "fraction of time device memory was read or written"),
                ("deepres_gpu_temperature_celsius", "GPU temperature"),
                ("deepres_gpu_power_watts", "GPU power draw"),
                ("deepres_gpu_healthy", "1 when NVML answered every call for this GPU, else 0"),
                ("deepres_gpu_processes", "compute processes on the GPU"),
            )
        }
        for gpu in report.gpus:
            labels = [str(gpu.index), gpu.uuid, gpu.model, report.node]
            values: dict[str, float | None] = {
                "deepres_gpu_memory_total_bytes": gpu.memory_total_mib * MIB_BYTES,
                "deepres_gpu_memory_used_bytes": gpu.memory_used_mib * MIB_BYTES,
                "deepres_gpu_memory_free_bytes": max(gpu.memory_total_mib - gpu.memory_used_mib, 0.0) * MIB_BYTES,
                "deepres_gpu_memory_reserved_bytes": gpu.memory_reserved_mib * MIB_BYTES,
                "deepres_gpu_utilization_ratio": gpu.utilization_gpu,
                "deepres_gpu_memory_utilization_ratio": gpu.utilization_memory,
                "deepres_gpu_temperature_celsius": gpu.temperature_c,
                "deepres_gpu_power_watts": gpu.power_w,
                "deepres_gpu_healthy": 1.0 if gpu.healthy else 0.0,
                "deepres_gpu_processes": float(len(gpu.processes)),
            }
            for name, value in values.items():
                if value is not None:
                    families[name].add_metric(labels, value)
        used = GaugeMetricFamily(
            "deepres_pod_gpu_memory_used_bytes", "a pod's GPU memory now, summed over its GPUs", labels=POD_LABELS
        )
        peak = GaugeMetricFamily(
            "deepres_pod_gpu_memory_peak_bytes",
            "a pod's peak GPU memory (summed over its GPUs) since first seen",
            labels=POD_LABELS,
        )
        for pod in report.pods:
            namespace, name = names.get(pod.pod_uid, ("", ""))
            labels = [name, namespace, pod.pod_uid, report.node]
            used.add_metric(labels, pod.current_memory_mib * MIB_BYTES)
            peak.add_metric(labels, pod.peak_memory_mib * MIB_BYTES)
        yield from families.values()
        yield used
        yield peak


class AgentMetrics:
    """The agent's registry: latest-report gauges plus report and sampling counters."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._snapshot = _SnapshotCollector()
        self.registry.register(self._snapshot)  # type: ignore[arg-type]
        self.reports = Counter(
            "deepres_agent_reports", "reports by delivery result", ["result"], registry=self.registry
        )
        for result in RESULTS:
            self.reports.labels(result=result)
        self.device_plugin_advertising = Gauge(
            "deepres_agent_device_plugin_advertising",
            "1 while the device plugin advertises the resource; 0 while its preflight finds the node's setup "
            "cannot isolate GPUs (the reason is in the log and a Warning Event on the Node)", registry=self.registry)
        self.sample_seconds = Histogram(
            "deepres_agent_sample_seconds",
            "time to sample every GPU and attribute its processes",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )

    def update(self, report: NodeReport, pod_names: Mapping[str, tuple[str, str]] | None = None) -> None:
        """Publish a new report (and namespace/name per pod UID) for the next scrape."""
        self._snapshot.pod_names = dict(pod_names or {})
        self._snapshot.report = report

    def count_report(self, result: str) -> None:
        self.reports.labels(result=result).inc()


@dataclass
class Health:
    """/healthz: 503 when the source stopped answering, sampling stalled (a hung NVML call), or the
    reports have kept failing (not delivered, refused, or not even valid) for `delivery_grace_s`.
    /livez asks only about sampling: the chart's liveness probe, so that an extender outage does
    not restart every agent, while readiness (/healthz) shows the agent is not being heard."""

    max_age_s: float
    last_sample_s: float | None = None  # time.monotonic() of the last completed sample
    responsive: bool = True
    error: str = ""
    delivery_grace_s: float = 60.0
    failing_since: float | None = None  # time.monotonic() of the first failure since the last delivery
    failure: str = ""

    def record(self, responsive: bool, error: str, now_s: float) -> None:
        self.last_sample_s, self.responsive, self.error = now_s, responsive, error

    def record_delivery(self, result: str, detail: str, now_s: float) -> None:
        """One report's outcome (reporter.RESULTS); `superseded` says nothing about delivery."""
        if result == "ok":
            self.failing_since, self.failure = None, ""
        elif result in ("error", "unauthorized", "rejected"):
            if self.failing_since is None:
                self.failing_since = now_s
            self.failure = (f"{result}: {detail}" if detail else result)[:300]

    def check(self, now_s: float, *, deliveries: bool = True) -> tuple[bool, str]:
        if self.last_sample_s is None:
            return False, "no sample yet"
        age = now_s - self.last_sample_s
        if age > self.max_age_s:
            return False, f"last sample {age:.0f}s ago (limit {self.max_age_s:.0f}s): GPU source not answering"
        if not self.responsive:
            return False, self.error or "GPU source not answering"
        if deliveries and self.failing_since is not None and now_s - self.failing_since >= self.delivery_grace_s:
            return False, f"reports failing for {now_s - self.failing_since:.0f}s (last: {self.failure})"
        return True, "ok"


def make_app(metrics: AgentMetrics, health: Health, clock: Callable[[], float] = time.monotonic) -> WsgiApp:
    """WSGI app: GET /metrics (Prometheus text), GET /healthz and /livez (200 ok / 503 with the reason)."""
    metrics_app = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            body: Iterable[bytes] = metrics_app(environ, start_response)
            return body
        if path in ("/healthz", "/livez"):
            ok, message = health.check(clock(), deliveries=path == "/healthz")
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [message.encode() + b"\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /livez\n"]

    return app


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds: no access log
        log.debug("%s " + format, self.address_string(), *args)


def serve(app: WsgiApp, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Start the server in a daemon thread; returns it (port 0 picks a free port: server.server_port)."""
    server = make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="deepres-metrics", daemon=True)
    thread.start()
    return server, thread
