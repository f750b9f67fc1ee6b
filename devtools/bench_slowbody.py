"""`deepres bench slowbody`: a legitimate scheduler's filter latency while clients stall mid-body.

For each engine, `deepres serve --no-kube` runs on a free port with one reported node; `--slow`
connections (64) send a verb's headers and the first bytes of a promised body, then nothing. One
client plays kube-scheduler on a kept-alive connection: `--requests` filters first with no stalled
connection (the baseline), then with all of them open (the attack), and /healthz once during it.
Under granian the stalled clients come from loopback (callers the verbs admit: the worst case);
under gunicorn, whose request threads read bodies, from this machine's network address (an
attacker on the cluster network), whom the verbs refuse before reading. The body timeout is set
above the run's length so every stalled connection stays open throughout.
Writes `reports/adversarial-slowbody.json`; the figure the issue asks for is `filter_p99_ms` under
attack (<= 50 ms).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from devtools.localserver import LocalServer

ENGINES = ("granian", "gunicorn")
TARGET_P99_MS = 50.0
TOKEN = "bench-slowbody"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slow", type=int, default=64, help="stalled connections (default 64)")
    parser.add_argument("--requests", type=int, default=300, help="filters per phase (default 300)")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (default granian,gunicorn)")
    parser.add_argument("--predictor-factory", default="",
                        help="module:callable predictor instead of the shipped one (DEEPRES_PREDICTOR_FACTORY)")
    parser.set_defaults(out="reports/adversarial-slowbody.json")


def network_address() -> str:
    """This machine's address on its default route, or "" when it has only loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
        except OSError:
            return ""
        address: str = probe.getsockname()[0]
    return "" if address.startswith("127.") else address


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _filters(port: int, count: int) -> list[float]:
    body = json.dumps({"Pod": {"metadata": {"name": "legit", "namespace": "ml", "uid": "u-legit",
                                            "annotations": {"deepres.io/gpu-memory": "4Gi"}},
                               "spec": {"schedulerName": "deepres-scheduler"}},
                       "NodeNames": ["n1"]}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            latencies.append((time.perf_counter() - started) * 1000.0)
            if response.status != 200 or answer.get("NodeNames") != ["n1"]:
                raise RuntimeError(f"filter answered {response.status}: {answer}")
    finally:
        conn.close()
    return latencies


def _stall(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 4096\r\n\r\n{\"Pod\": ")
    return sock


def measure(engine: str, slow: int, requests: int, workdir: Path, predictor_factory: str = "") -> dict[str, Any]:
    attacker = "127.0.0.1" if engine == "granian" else network_address()
    if not attacker:
        return {"skipped": "needs a non-loopback address for the attackers (gunicorn)"}
    env = {"DEEPRES_ENGINE": engine, "DEEPRES_BODY_TIMEOUT_S": "600", "DEEPRES_TELEMETRY_TTL_S": "3600"}
    if predictor_factory:
        env["DEEPRES_PREDICTOR_FACTORY"] = predictor_factory
    with LocalServer(workdir, token=TOKEN, env=env, bind_host="0.0.0.0") as server:
        report = {"node": "n1", "sequence": 1, "timestamp_s": time.time(), "agent_version": "bench",
                  "source": "simulated", "gpus": [{"uuid": "GPU-n1-0", "index": 0, "model": "A100",
                                                   "memory_total_mib": 40960.0, "memory_used_mib": 0.0}]}
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/v1/telemetry", json.dumps(report).encode(),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
        if conn.getresponse().status != 200:
            raise RuntimeError("the bench's telemetry report was refused")
        conn.close()
        _filters(server.port, 20)  # warm-up
        baseline = _filters(server.port, requests)
        stalled = [_stall(attacker, server.port) for _ in range(slow)]
        try:
            time.sleep(0.5)
            attacked = _filters(server.port, requests)
            started = time.perf_counter()
            health = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            health.request("GET", "/healthz")
            healthz_status = health.getresponse().status
            healthz_ms = (time.perf_counter() - started) * 1000.0
            health.close()
        finally:
            for sock in stalled:
                sock.close()
    return {
        "attackers_from": "loopback" if attacker.startswith("127.") else "network",
        "slow_connections": slow, "requests": requests,
        "baseline_p50_ms": round(statistics.median(baseline), 2),
        "baseline_p99_ms": round(_percentile(baseline, 0.99), 2),
        "filter_p50_ms": round(statistics.median(attacked), 2),
        "filter_p99_ms": round(_percentile(attacked, 0.99), 2),
        "healthz_status": healthz_status, "healthz_ms": round(healthz_ms, 2),
        "meets_target": _percentile(attacked, 0.99) <= TARGET_P99_MS and healthz_status == 200,
    }


def run(args: argparse.Namespace) -> int:
    engines = [e for e in args.engines.split(",") if e]
    results: dict[str, Any] = {"target_filter_p99_ms": TARGET_P99_MS, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="deepres-slowbody-") as tmp:
        for engine in engines:
            figures = measure(engine, args.slow, args.requests, Path(tmp), args.predictor_factory)
            results["engines"][engine] = figures
            if "skipped" in figures:
                print(f"{engine}: skipped ({figures['skipped']})")
            else:
                print(f"{engine}: {args.slow} stalled connections ({figures['attackers_from']}): filter p50 "
                      f"{figures['filter_p50_ms']} ms p99 {figures['filter_p99_ms']} ms (baseline p99 "
                      f"{figures['baseline_p99_ms']} ms); /healthz {figures['healthz_status']} in "
                      f"{figures['healthz_ms']} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"written to {out}")
    return 0
