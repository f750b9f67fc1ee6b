"""The scheduler's own listener (issue 34, rows 4, 13 and 14) against a real `deepres serve`.

Row 4: kept-alive connections that poll filled the one port's `server.max_connections`, and a fresh
/filter waited seconds. Now the verbs have a port of their own (`server.scheduler_bind`) with a cap no
other caller can take (a flood on it closes the flood's own connections first), and on the main port
only the scheduler's verbs and accepted agent reports keep their connection open.
Row 13: in sidecar mode any caller on 127.0.0.1 (kubectl port-forward, a sibling container) could call
/bind and /preempt. With `verbs_access: mtls` on the scheduler's listener the verbs need the
scheduler's client certificate, checked in the TLS handshake, and the main port answers no verb.
Row 14: mTLS needed gunicorn, whose threads stalled clients hold; the listener checks the certificate
under granian too, and stalled clients (silent, trickling, never finishing a handshake) hold neither a
thread nor the scheduler's slots for longer than `server.header_timeout_s`."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localserver import LocalServer
from tests.adversarial.test_net_mtls import context as client
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, extender_args, pod, report
from tests.fixtures.kube.server import TOKEN

DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}
FILTER = json.dumps(extender_args(pod("p", CNN_ANNOTATIONS), names=["n1"])).encode()
REPORT = json.dumps(report("n1", 1, 0.0, [(40960.0, 0.0)]))


def filter_on(port: int, ctx: ssl.SSLContext | None = None, timeout_s: float = 5.0) -> tuple[int, float, object]:
    """One /filter on a fresh connection: (status, seconds, answer)."""
    started = time.perf_counter()
    conn: http.client.HTTPConnection = (http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout_s)
                                        if ctx else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s))
    try:
        conn.request("POST", "/filter", FILTER, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, time.perf_counter() - started, json.loads(response.read() or b"null")
    finally:
        conn.close()


def send_report(server: LocalServer) -> None:
    body = json.loads(REPORT)
    body["timestamp_s"] = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/telemetry", json.dumps(body).encode(),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    assert conn.getresponse().status == 200
    conn.close()


@pytest.fixture(params=["granian", "gunicorn"])
def loopback_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LocalServer, int]]:
    env = {**DOUBLE, "DEEPRES_ENGINE": request.param, "DEEPRES_MAX_CONNECTIONS": "64",
           "DEEPRES_SCHEDULER_BIND": f"127.0.0.1:{LocalServer.port_ref('scheduler')}",
           "DEEPRES_SCHEDULER_MAX_CONNECTIONS": "16", "DEEPRES_HEADER_TIMEOUT_S": "30",
           "DEEPRES_TELEMETRY_TTL_S": "3600"}
    with LocalServer(tmp_path, token=TOKEN, env=env) as running:  # a taken port is retried, the scheduler's too
        send_report(running)
        yield running, running.ports["scheduler"]


def test_polling_connections_cannot_take_the_schedulers_slots(loopback_server: tuple[LocalServer, int]) -> None:
    server, scheduler_port = loopback_server
    # pollers: kept-alive connections on the main port, each polling /healthz; the main port closes each
    # after its answer (before: all stayed open and held server.max_connections)
    pollers = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(40)]
    for sock in pollers:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        deadline = time.monotonic() + 5.0  # well before the idle deadline (30 s) would close them
        open_ = pollers
        while open_ and time.monotonic() < deadline:
            open_ = [s for s in open_ if not closed(s)]
            time.sleep(0.1)
        assert not open_, f"{len(open_)} of {len(pollers)} polling connections kept open after their answer"
    finally:
        for sock in pollers:
            sock.close()
    # a flood on the scheduler's own port: 3x its cap of silent connections, from loopback too (they
    # would hold their slots 30 s: the cap closes the flood's connections, never the scheduler's)
    flood = [socket.create_connection(("127.0.0.1", scheduler_port), timeout=5) for _ in range(48)]
    try:
        latencies = []
        for _ in range(10):
            status, took_s, out = filter_on(scheduler_port)
            assert status == 200 and out["NodeNames"] == ["n1"], out  # type: ignore[index]
            latencies.append(took_s)
        assert max(latencies) < 1.0, latencies
        # a kept-alive scheduler connection serves many filters in a row
        conn = http.client.HTTPConnection("127.0.0.1", scheduler_port, timeout=5)
        for _ in range(5):
            conn.request("POST", "/filter", FILTER, {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200 and json.loads(response.read())["NodeNames"] == ["n1"]
        conn.close()
    finally:
        for sock in flood:
            sock.close()
    # the main port answers no verb once the scheduler has its own; it still takes reports and probes
    status, _, out = filter_on(server.port)
    assert status == 403 and "scheduler_bind" in str(out)
    send_report(server)


@pytest.mark.parametrize("scheduler_host", ["127.0.0.1", "0.0.0.0"], ids=["sidecar", "deployment"])
def test_only_the_schedulers_certificate_reaches_the_verbs_under_granian(pki: Path, tmp_path: Path,
                                                                          scheduler_host: str) -> None:
    env = {**DOUBLE, "DEEPRES_ENGINE": "granian", "DEEPRES_VERBS_ACCESS": "mtls",
           "DEEPRES_SCHEDULER_BIND": f"{scheduler_host}:{LocalServer.port_ref('scheduler')}",
           "DEEPRES_SCHEDULER_TLS_CERT": str(pki / "server.crt"), "DEEPRES_SCHEDULER_TLS_KEY": str(pki / "server.key"),
           "DEEPRES_TLS_CLIENT_CA": str(pki / "scheduler-ca.crt"), "DEEPRES_SCHEDULER_MAX_CONNECTIONS": "16",
           "DEEPRES_HEADER_TIMEOUT_S": "2", "DEEPRES_TELEMETRY_TTL_S": "3600"}
    with LocalServer(tmp_path, token=TOKEN, env=env) as server:
        scheduler_port = server.ports["scheduler"]
        send_report(server)
        # a port-forward or a sibling container: on loopback, without the scheduler's key
        status, _, out = filter_on(server.port)
        assert status == 403, out
        bind = json.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("POST", "/bind", bind, {"Content-Type": "application/json"})
        assert conn.getresponse().status == 403
        conn.close()
        for who in (None, "rogue"):
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, OSError)):
                filter_on(scheduler_port, client(pki, who))
        # stalled clients on both ports: silent, trickling a request line, never finishing a handshake
        stalled = [socket.create_connection(("127.0.0.1", port), timeout=5)
                   for port in (scheduler_port, server.port) for _ in range(40)]
        for i, sock in enumerate(stalled):
            if i % 2:
                sock.sendall(b"\x16\x03\x01" if i < 40 else b"POST /v1/telemetry HTTP/1.1\r\nHost")
        try:
            scheduler = client(pki, "scheduler")
            for _ in range(5):
                status, took_s, out = filter_on(scheduler_port, scheduler)
                assert status == 200 and out["NodeNames"] == ["n1"] and took_s < 1.0, (status, took_s, out)  # type: ignore[index]
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            conn.close()
            # every stalled connection is closed by the server within its deadline (2 s), none held
            deadline = time.monotonic() + 10.0
            open_ = stalled
            while open_ and time.monotonic() < deadline:
                open_ = [s for s in open_ if not closed(s)]
                time.sleep(0.2)
            assert not open_, f"{len(open_)} of {len(stalled)} stalled connections still open"
        finally:
            for sock in stalled:
                sock.close()


def closed(sock: socket.socket) -> bool:
    sock.settimeout(0.0)
    try:
        while True:
            if sock.recv(4096) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
