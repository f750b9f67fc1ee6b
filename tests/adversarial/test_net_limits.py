"""Bounded work per request (issue 34, row 5) against a real `deepres serve`, under both engines.

Before: a 15 MiB /v1/predict body (a million annotation keys) was read and parsed whole, 21 of them
took the worker to 3.5-4.1 GB (the chart's limit is 640 MiB), and every /metrics scrape walked the
registry anew (one scraper in a loop: 86% of a core). Now /v1/predict takes `server.predict_max_bytes`
(64 KiB) and `server.predict_max_annotations` (256), refused before the body is read or parsed, and
/metrics rendering takes at most `server.metrics_render_share` of a core (past it, the last page, at
most a second old, is served again)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localserver import LocalServer
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS
from tests.fixtures.kube.server import TOKEN

DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}
BIG = 15 * 1024 * 1024
CHART_MEMORY_LIMIT_MIB = 640


@pytest.fixture(params=["granian", "gunicorn"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalServer]:
    env = {**DOUBLE, "DEEPRES_ENGINE": request.param, "DEEPRES_PREDICT_RATE_PER_S": "1000",
           "DEEPRES_PREDICT_BURST": "1000"}
    with LocalServer(tmp_path, token=TOKEN, env=env) as running:
        yield running


def million_keys() -> bytes:
    """A /v1/predict body of 15 MiB: an annotation map of about a million keys."""
    entries: list[str] = []
    size, i = len('{"annotations":{}}'), 0
    while True:
        entry = f'"k{i:07d}":"1"'
        if size + len(entry) + 1 > BIG:
            break
        entries.append(entry)
        size += len(entry) + 1
        i += 1
    return ('{"annotations":{' + ",".join(entries) + "}}").encode()


def rss_mib(server: LocalServer) -> float:
    """Resident memory of the server's processes (main and worker), MiB."""
    total = 0
    pids = [server.proc.pid, *server.worker_pids()] if server.proc is not None else []
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024.0


def post_predict(server: LocalServer, body: bytes) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    except (BrokenPipeError, ConnectionResetError):  # refused before the body was sent: read the answer
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def chunked_predict(server: LocalServer, body: bytes) -> int:
    """The body with no Content-Length (chunked), so only a bounded read can refuse it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            for start in range(0, len(body), 256 * 1024):
                piece = body[start:start + 256 * 1024]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body arrived
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_huge_predict_bodies_are_refused_before_parsing_and_memory_stays_bounded(server: LocalServer) -> None:
    body = million_keys()
    assert len(body) > 14 * 1024 * 1024
    good = json.dumps({"annotations": CNN_ANNOTATIONS}).encode()
    assert post_predict(server, good)[0] == 200
    before = rss_mib(server)
    for _ in range(3):
        status, out = post_predict(server, body)
        assert status == 413, (status, str(out)[:200])
        assert "predict_max_bytes" in str(out["error"]) or "larger than" in str(out["error"])
    assert chunked_predict(server, body) == 413
    after = rss_mib(server)
    assert after < before + 64.0, f"RSS grew from {before:.0f} to {after:.0f} MiB"
    assert after < CHART_MEMORY_LIMIT_MIB
    assert post_predict(server, good)[0] == 200  # still serving


def test_too_many_annotations_are_refused_naming_the_setting(server: LocalServer) -> None:
    many = {f"example.com/k{i}": "1" for i in range(300)}  # ~8 KiB: under the size limit
    status, out = post_predict(server, json.dumps({"annotations": many}).encode())
    assert status == 400 and "predict_max_annotations" in str(out["error"]), out
    long_value = {**CNN_ANNOTATIONS, "deepres.io/job-name": "x" * 10_000}
    status, out = post_predict(server, json.dumps({"annotations": long_value}).encode())
    assert status == 400 and "deepres.io/job-name" in str(out["error"]), out


def test_metrics_rendering_is_bounded(tmp_path: Path) -> None:
    env = {**DOUBLE, "DEEPRES_PREDICT_RATE_PER_S": "1000", "DEEPRES_PREDICT_BURST": "1000",
           "DEEPRES_METRICS_RENDER_SHARE": "0.0001"}  # 0.1 ms a second: one rendering a second, whatever it costs
    with LocalServer(tmp_path, token=TOKEN, env=env) as server:
        scrape_loop(server)


def scrape_loop(server: LocalServer) -> None:
    good = json.dumps({"annotations": CNN_ANNOTATIONS}).encode()
    pages: list[bytes] = []
    started = time.monotonic()
    for _ in range(40):
        assert post_predict(server, good)[0] == 200  # moves the predict counters between two scrapes
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        pages.append(response.read())
        conn.close()
    took_s = time.monotonic() - started
    distinct = len(set(pages))
    # rendered anew each time, every page would differ (40); within the budget, one rendering a second
    assert distinct <= int(took_s) + 2, f"{distinct} distinct pages in {took_s:.1f} s"
    assert b"deepres_extender_requests_total" in pages[-1]
