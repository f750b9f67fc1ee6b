"""`deepres bench cluster --api-accounting FILE`: what each client asks of kube-apiserver, per pod.

Why: the API server's CPU per GPU pod is well above its CPU per plain pod, and CPU times on a
shared 2-core machine are noisy; counts are not. The API server writes an audit log (level
Metadata: who, user agent, verb, resource; no bodies) and its /metrics are read before and after
every phase and an idle window; the requests of each window are attributed to their client
(kube-scheduler, the extender, kwok, kube-controller-manager, the bench itself) by the audit
record's user and user agent (the extender and the bench share the admin's certificate here and
say who they are in User-Agent), and the counters (watch events and their bytes by kind, requests
by verb and resource, etcd requests) are taken as differences. The audit log costs the API server
CPU: the timings of such a run are not the benchmark's figures, its counts are.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata"}]}
#: counters read from kube-apiserver's /metrics, as differences over each window
COUNTERS = ("apiserver_request_total", "apiserver_watch_events_total", "apiserver_watch_events_sizes",
            "etcd_requests_total", "apiserver_watch_cache_events_dispatched_total",
            "apiserver_watch_cache_events_received_total")
BENCH_AGENT = "deepres-bench"


def apiserver_args(root: Path) -> list[str]:
    """kube-apiserver flags for an audit log of every request under `root`, and its CPU profiles."""
    policy = root / "audit-policy.json"
    root.mkdir(parents=True, exist_ok=True)
    policy.write_text(json.dumps(AUDIT_POLICY))
    return ["--profiling=true", f"--audit-policy-file={policy}", f"--audit-log-path={root / 'audit.log'}",
            "--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s",
            "--audit-log-maxsize=0"]


def client_of(event: dict[str, Any]) -> str:
    """Which process made an audited request."""
    user = (event.get("user") or {}).get("username", "")
    agent = str(event.get("userAgent") or "")
    if agent.startswith("deepres-extender"):
        return "extender"
    if agent.startswith(BENCH_AGENT):
        return "bench"
    if user == "system:kube-scheduler" or agent.startswith("kube-scheduler"):
        return "kube-scheduler"
    if user.startswith("system:serviceaccount:kube-system:") or user == "system:kube-controller-manager":
        return "kube-controller-manager"
    if user == "kwok-controller" or agent.startswith("kwok"):
        return "kwok"
    if user == "system:apiserver":
        return "kube-apiserver"
    return f"{user} ({agent.split(' ')[0]})"


def request_of(event: dict[str, Any]) -> str:
    """`verb resource[/subresource]`, with a watch's or list's selectors (what the server filters on)."""
    ref = event.get("objectRef") or {}
    what = str(ref.get("resource") or event.get("requestURI", "?").split("?")[0])
    if ref.get("subresource"):
        what += "/" + str(ref["subresource"])
    verb = str(event.get("verb"))
    if verb in ("watch", "list"):
        uri = str(event.get("requestURI") or "")
        if "fieldSelector=" in uri:
            what += " (field selector)"
        if "labelSelector=" in uri:
            what += " (label selector)"
        if "resourceVersionMatch" in uri or "sendInitialEvents" in uri:
            what += " (streaming)"
    return f"{verb} {what}"


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def audit_counts(log: Path, start: float, end: float) -> dict[str, Counter[str]]:
    """Requests received in [start, end) (wall clock), by client and request; each request once."""
    seen: set[str] = set()
    out: dict[str, Counter[str]] = {}
    if not log.exists():
        return out
    with log.open() as lines:
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            audit_id = event.get("auditID", "")
            if audit_id in seen:
                continue
            received = _timestamp(str(event.get("requestReceivedTimestamp", "1970-01-01T00:00:00Z")))
            if not start <= received < end:
                continue
            seen.add(audit_id)
            out.setdefault(client_of(event), Counter())[request_of(event)] += 1
    return out


def counters(text: str) -> dict[str, float]:
    """The COUNTERS samples of a /metrics text (histograms: their _sum and _count), by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in COUNTERS and f"{family.name}_total" not in COUNTERS:  # the parser drops _total
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            labels = {k: v for k, v in sample.labels.items() if k not in ("le", "component", "group", "version",
                                                                           "dry_run", "scope")}
            key = sample.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


class Accounting:
    """Windows (a phase or an idle spell) of audit counts and counter differences, written as JSON."""

    def __init__(self, out: Path, audit_log: Path, scrape: Any, cpu: Any, get: Any) -> None:
        self.out, self.audit_log, self.scrape, self.cpu, self.get = out, audit_log, scrape, cpu, get
        self.profiles: list[threading.Thread] = []
        self.windows: dict[str, dict[str, Any]] = {}
        self._open: dict[str, tuple[float, dict[str, float]]] = {}

    def begin(self, label: str) -> None:
        self._open[label] = (time.time(), self._counters())

    def end(self, label: str, pods: int, cpu_ms_per_pod: dict[str, float] | None = None) -> None:
        start, before = self._open.pop(label)
        end = time.time()
        after = self._counters()
        delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
        self.windows[label] = {"pods": pods, "seconds": round(end - start, 2), "start": start, "end": end,
                               "counters": delta}
        if cpu_ms_per_pod is not None:
            self.windows[label]["cpu_ms_per_pod"] = cpu_ms_per_pod

    def idle(self, label: str, seconds: float) -> None:
        """`seconds` without pods: the background, as CPU ms per second by process besides the counts."""
        cpu0 = self.cpu()
        self.begin(label)
        self.profile(label, seconds)
        time.sleep(seconds)
        cpu1 = self.cpu()
        self.end(label, 0, {k: round(1000 * (cpu1[k] - cpu0[k]) / seconds, 2) for k in cpu1})

    def profile(self, label: str, seconds: float) -> None:
        """kube-apiserver's CPU profile (pprof) over the next `seconds`, to FILE.LABEL.pprof (in the background)."""

        def fetch() -> None:
            status, body = self.get(f"/debug/pprof/profile?seconds={max(1, round(seconds))}", seconds + 30)
            if status == 200:
                self.out.with_suffix(f".{label}.pprof").write_bytes(body)

        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        self.profiles.append(thread)

    def _counters(self) -> dict[str, float]:
        status, text = self.scrape()
        return counters(text.decode()) if status == 200 else {}

    def write(self) -> dict[str, Any]:
        """Audit counts per window (the log is complete once the API server has flushed it), then the file."""
        time.sleep(2.5)  # the audit batch waits up to 1 s
        for thread in self.profiles:
            thread.join()
        for window in self.windows.values():
            counts = audit_counts(self.audit_log, window["start"], window["end"])
            window["requests"] = {client: dict(sorted(c.items())) for client, c in sorted(counts.items())}
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.windows, indent=1) + "\n")
        return self.windows


def table(windows: dict[str, dict[str, Any]]) -> str:
    """Requests and watch events per pod (phases) or per second (idle windows), one row per key."""
    lines = []
    for label, window in windows.items():
        pods, seconds = window["pods"], window["seconds"]
        unit = "per node" if label.startswith("node") else "per pod"
        unit, scale = (unit, 1.0 / pods) if pods else ("per s", 1.0 / max(seconds, 1e-9))
        lines.append(f"== {label}: {pods} pods in {seconds} s ({unit})")
        if "cpu_ms_per_pod" in window:
            lines.append(f"  CPU ms {unit}: {window['cpu_ms_per_pod']}")
        for client, counts in window.get("requests", {}).items():
            total = sum(counts.values())
            lines.append(f"  {client:<24} {total * scale:8.3f}  " + ", ".join(
                f"{k} {v * scale:.3f}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
        for key, value in sorted(window["counters"].items()):
            if key.startswith(("apiserver_watch_events", "etcd_requests_total", "apiserver_watch_cache")) or (
                    key.startswith("apiserver_request_total") and "WATCH" not in key):
                lines.append(f"  {key:<70} {value * scale:10.3f}")
    return "\n".join(lines)
