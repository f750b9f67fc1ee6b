"""`deepres bench cluster --api-accounting`: audit records of kube-apiserver (real ones, trimmed) are
attributed to the process that sent them, each request once, within its window."""

from __future__ import annotations

import json
from pathlib import Path

from devtools.bench_api import audit_counts, client_of, counters, request_of

SCHEDULER_EVENT = {
    "auditID": "8e1da492", "stage": "ResponseComplete", "verb": "create",
    "requestURI": "/apis/events.k8s.io/v1/namespaces/deepres-bench/events",
    "user": {"username": "system:kube-scheduler"},
    "userAgent": "kube-scheduler/v0.0.0 (linux/amd64) kubernetes/$Format/scheduler",
    "objectRef": {"resource": "events", "namespace": "deepres-bench", "apiGroup": "events.k8s.io"},
    "requestReceivedTimestamp": "2026-11-24T20:24:44.096993Z"}
CONTROLLER = {
    "auditID": "cfdbbc09", "stage": "ResponseComplete", "verb": "create",
    "requestURI": "/api/v1/namespaces/deepres-bench/serviceaccounts",
    "user": {"username": "system:serviceaccount:kube-system:service-account-controller"},
    "userAgent": "kube-controller-manager/v0.0.0 (linux/amd64) kubernetes/$Format/system:serviceaccount:kube-system:"
                 "service-account-controller",
    "objectRef": {"resource": "serviceaccounts", "namespace": "deepres-bench", "name": "default"},
    "requestReceivedTimestamp": "2026-11-24T20:24:37.588195Z"}
EXTENDER_BIND = {
    "auditID": "a1", "stage": "ResponseComplete", "verb": "create",
    "requestURI": "/api/v1/namespaces/deepres-bench/pods/gpu-500-00001/binding",
    "user": {"username": "deepres-admin"}, "userAgent": "deepres-extender/0.1.0",
    "objectRef": {"resource": "pods", "namespace": "deepres-bench", "name": "gpu-500-00001",
                  "subresource": "binding"},
    "requestReceivedTimestamp": "2026-11-24T20:24:44.200000Z"}
WATCH_STARTED = {
    "auditID": "w1", "stage": "ResponseStarted", "verb": "watch",
    "requestURI": "/api/v1/pods?fieldSelector=spec.schedulerName%3Ddeepres-scheduler&watch=true",
    "user": {"username": "deepres-admin"}, "userAgent": "deepres-extender/0.1.0",
    "objectRef": {"resource": "pods"}, "requestReceivedTimestamp": "2026-11-24T20:24:44.300000Z"}


def test_each_record_is_attributed_to_its_process() -> None:
    assert client_of(SCHEDULER_EVENT) == "kube-scheduler"
    assert client_of(CONTROLLER) == "kube-controller-manager"
    assert client_of(EXTENDER_BIND) == "extender"
    assert client_of({**EXTENDER_BIND, "userAgent": "deepres-bench"}) == "bench"
    assert request_of(EXTENDER_BIND) == "create pods/binding"
    assert request_of(WATCH_STARTED) == "watch pods (field selector)"


def test_a_window_counts_each_request_once(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    completed = {**WATCH_STARTED, "stage": "ResponseComplete"}
    log.write_text("\n".join(json.dumps(r) for r in (CONTROLLER, SCHEDULER_EVENT, EXTENDER_BIND, WATCH_STARTED,
                                                      completed)) + "\nnot json\n")
    start = 1795551884.0  # 2026-11-24T20:24:44Z
    counts = audit_counts(log, start, start + 1)
    assert counts == {"kube-scheduler": {"create events": 1},
                      "extender": {"create pods/binding": 1, "watch pods (field selector)": 1}}


def test_counters_keep_the_labels_that_tell_requests_apart() -> None:
    text = (
        "# HELP apiserver_watch_events_total [STABLE] Number of events sent in watch clients\n"
        "# TYPE apiserver_watch_events_total counter\n"
        'apiserver_watch_events_total{group="",resource="pods",version="v1"} 17000\n'
        "# HELP apiserver_watch_events_sizes Watch event size distribution in bytes\n"
        "# TYPE apiserver_watch_events_sizes histogram\n"
        'apiserver_watch_events_sizes_bucket{group="",resource="nodes",version="v1",le="1024"} 3\n'
        'apiserver_watch_events_sizes_sum{group="",resource="nodes",version="v1"} 2500\n'
        'apiserver_watch_events_sizes_count{group="",resource="nodes",version="v1"} 4\n'
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total 12.5\n")
    assert counters(text) == {"apiserver_watch_events_total{resource=pods}": 17000.0,
                              "apiserver_watch_events_sizes_sum{resource=nodes}": 2500.0,
                              "apiserver_watch_events_sizes_count{resource=nodes}": 4.0}
