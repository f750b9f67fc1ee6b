"""/metrics and /healthz of the agent, through its WSGI app (no socket needed)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from extender.agent.metrics import AgentMetrics, Health, make_app
from extender.telemetry import GpuReport, NodeReport, PodUsage

UID = "aaaaaaaa-0000-4000-8000-000000000001"


def call(app: Any, path: str) -> tuple[str, bytes]:
    seen: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen["status"] = status

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""}, start_response))
    return seen["status"], body


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def report(*gpus: GpuReport, pods: tuple[PodUsage, ...] = ()) -> NodeReport:
    return NodeReport(node="n1", sequence=1, timestamp_s=1.0, agent_version="t", source="nvml", gpus=gpus, pods=pods)


def test_gpu_and_pod_series_follow_the_latest_report() -> None:
    metrics = AgentMetrics()
    app = make_app(metrics, Health(max_age_s=15), clock=lambda: 0.0)
    g0 = GpuReport(uuid="GPU-0", index=0, model="A100", memory_total_mib=100, memory_used_mib=25,
                   utilization_gpu=0.5, temperature_c=60, power_w=None)
    g1 = GpuReport(uuid="GPU-1", index=1, model="A100", memory_total_mib=100, memory_used_mib=100, healthy=False,
                   error="memory: GPU is lost")
    pod = PodUsage(pod_uid=UID, current_memory_mib=10, peak_memory_mib=20, gpu_uuids=("GPU-0",))
    metrics.update(report(g0, g1, pods=(pod,)), {UID: ("ml", "train-1")})
    metrics.count_report("ok")
    metrics.count_report("ok")
    status, body = call(app, "/metrics")
    assert status.startswith("200")
    got = samples(body)
    labels0 = (("gpu", "0"), ("model_name", "A100"), ("node", "n1"), ("uuid", "GPU-0"))
    mib = 1024 * 1024
    assert got[("deepres_gpu_memory_used_bytes", labels0)] == 25 * mib
    assert got[("deepres_gpu_memory_total_bytes", labels0)] == 100 * mib
    assert got[("deepres_gpu_memory_free_bytes", labels0)] == 75 * mib
    assert got[("deepres_gpu_utilization_ratio", labels0)] == 0.5
    assert got[("deepres_gpu_temperature_celsius", labels0)] == 60
    assert not any(name == "deepres_gpu_power_watts" and dict(lab)["uuid"] == "GPU-0" for name, lab in got)
    assert got[("deepres_gpu_healthy", labels0)] == 1
    assert got[("deepres_gpu_healthy", (("gpu", "1"), ("model_name", "A100"), ("node", "n1"), ("uuid", "GPU-1")))] == 0
    pod_labels = (("namespace", "ml"), ("node", "n1"), ("pod", "train-1"), ("pod_uid", UID))
    assert got[("deepres_pod_gpu_memory_peak_bytes", pod_labels)] == 20 * mib
    assert got[("deepres_pod_gpu_memory_used_bytes", pod_labels)] == 10 * mib
    assert got[("deepres_agent_reports_total", (("result", "ok"),))] == 2
    assert got[("deepres_agent_reports_total", (("result", "error"),))] == 0

    metrics.update(report(g0))  # GPU-1 vanished, the pod is gone: their series go too
    names = {(n, dict(lab).get("uuid"), dict(lab).get("pod_uid")) for n, lab in samples(call(app, "/metrics")[1])}
    assert ("deepres_gpu_healthy", "GPU-1", None) not in names
    assert not any(n.startswith("deepres_pod_") for n, _, _ in names)


def test_pod_without_a_known_name_has_empty_labels() -> None:
    metrics = AgentMetrics()
    metrics.update(report(pods=(PodUsage(pod_uid=UID, current_memory_mib=1, peak_memory_mib=1),)))
    got = samples(call(make_app(metrics, Health(15)), "/metrics")[1])
    labels = (("namespace", ""), ("node", "n1"), ("pod", ""), ("pod_uid", UID))
    assert got[("deepres_pod_gpu_memory_peak_bytes", labels)] == 1024 * 1024


def test_healthz() -> None:
    now = [100.0]
    health = Health(max_age_s=15)
    app = make_app(AgentMetrics(), health, clock=lambda: now[0])
    assert call(app, "/healthz")[0].startswith("503")  # no sample yet
    health.record(True, "", 100.0)
    assert call(app, "/healthz") == ("200 OK", b"ok\n")
    health.record(False, "NVML did not answer: Driver Not Loaded", 101.0)
    status, body = call(app, "/healthz")
    assert status.startswith("503") and b"Driver Not Loaded" in body
    health.record(True, "", 101.0)
    now[0] = 117.0  # the sampling thread is stuck in a hung NVML call
    status, body = call(app, "/healthz")
    assert status.startswith("503") and b"16s ago" in body
    assert call(app, "/nope")[0].startswith("404")


def test_healthz_turns_503_when_reports_keep_failing_and_livez_does_not() -> None:
    """Issue 13 item 13: an agent whose reports do not get through says so (readiness), without
    being restarted for it (liveness)."""
    now = [100.0]
    health = Health(max_age_s=15, delivery_grace_s=60)
    app = make_app(AgentMetrics(), health, clock=lambda: now[0])
    health.record(True, "", 100.0)
    health.record_delivery("error", "connection refused", 100.0)
    health.record_delivery("superseded", "", 101.0)  # says nothing about delivery
    now[0] = 159.0
    health.record(True, "", 159.0)
    assert call(app, "/healthz") == ("200 OK", b"ok\n")  # within the grace
    health.record_delivery("rejected", 'HTTP 400 {"error": "report.node: must not be empty"}', 159.0)
    now[0] = 160.0
    health.record(True, "", 160.0)
    status, body = call(app, "/healthz")
    assert status.startswith("503") and b"reports failing for 60s" in body and b"report.node" in body
    assert call(app, "/livez") == ("200 OK", b"ok\n")
    health.record_delivery("ok", "", 161.0)
    assert call(app, "/healthz") == ("200 OK", b"ok\n")
