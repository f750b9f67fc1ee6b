"""Idle connections and a greedy /v1/predict client against a real `deepres serve` (issue 26), under
both engines.

Before: granian admitted 1,024 connections at once and closed none that sent no byte (nor any that
sent an HTTP/2 preface and stopped), so 1,025 idle clients stopped the verbs and the probes; gunicorn
gave each new connection a request thread for up to 5 s before its first byte, so 32 idle clients
held every thread. Now granian serves HTTP/1.1 only and closes a silent connection after
`server.header_timeout_s`, gunicorn waits for a first byte on its poller (extender/server/gunicorn_worker.py)
for as long, and both hold up to `server.max_connections`; /v1/predict is limited per client address."""

from __future__ import annotations

import http.client
import json
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localserver import LocalServer
from tests.adversarial.ledger_support import gpu, report
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, extender_args, pod
from tests.fixtures.kube.server import TOKEN, post

DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}
IDLE = 1_100  # more than granian's old 1,024
PREFACES = 100
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def open_files_at_least(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.skip(f"needs {n} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


@pytest.fixture(params=["granian", "gunicorn"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalServer]:
    env = {**DOUBLE, "DEEPRES_ENGINE": request.param, "DEEPRES_HEADER_TIMEOUT_S": "3",
           "DEEPRES_PREDICT_RATE_PER_S": "1", "DEEPRES_PREDICT_BURST": "5"}
    with LocalServer(tmp_path, token=TOKEN, env=env) as running:
        yield running


def idle(port: int, preface: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if preface:
        sock.sendall(preface)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.0)
    try:
        while True:  # an HTTP/2 server would answer its SETTINGS first: read past anything sent
            if sock.recv(4096) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def healthz_ms(port: int) -> float:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    return (time.perf_counter() - started) * 1000.0


def test_idle_connections_and_http2_prefaces_stop_nothing_and_are_closed(server: LocalServer) -> None:
    open_files_at_least(IDLE + PREFACES + 512)
    assert post(server.url + "/v1/telemetry", report("n1", 1, [gpu("n1-gpu0", 40960.0)]), token=TOKEN)[0] == 200
    held = [idle(server.port) for _ in range(IDLE)]
    held += [idle(server.port, H2_PREFACE) for _ in range(PREFACES)]
    try:
        time.sleep(0.3)
        # while all of them are open, the probes and the verbs answer (before: every one timed out)
        probes = [healthz_ms(server.port) for _ in range(10)]
        assert max(probes) < 1000.0, probes
        status, out = post(server.url + "/filter", extender_args(pod("legit", CNN_ANNOTATIONS), names=["n1"]),
                           timeout=5)
        assert status == 200 and out["NodeNames"] == ["n1"], out
        # an HTTP/2 preface is refused at once (HTTP/1.1 only); a silent connection within the deadline
        assert all(closed_by_server(s) for s in held[IDLE:])
        time.sleep(3.0 + 2.0)
        still_open = sum(not closed_by_server(s) for s in held)
        assert still_open == 0, f"{still_open} of {len(held)} idle connections still open after the deadline"
    finally:
        for sock in held:
            sock.close()


def test_predict_is_rate_limited_per_client(server: LocalServer) -> None:
    body = json.dumps({"annotations": CNN_ANNOTATIONS}).encode()

    def predict(source: str) -> tuple[int, str | None]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10, source_address=(source, 0))
        try:
            conn.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            return response.status, response.getheader("Retry-After")
        finally:
            conn.close()

    greedy = [predict("127.0.0.1") for _ in range(12)]
    assert [s for s, _ in greedy[:5]] == [200] * 5  # the burst
    limited = [(s, after) for s, after in greedy[5:] if s == 429]
    assert len(limited) >= 5 and all(after is not None and int(after) >= 1 for _, after in limited), greedy
    assert predict("127.0.0.2")[0] == 200  # another address has its own bucket
    time.sleep(1.2)
    assert predict("127.0.0.1")[0] == 200  # refilled at 1 a second
