"""The agent's reporter against a real HTTP server on loopback.

Until the extender's /v1/telemetry is used directly (test_agent_extender.py), this stub stands in:
it checks the bearer token, validates every body with `extender.telemetry.parse_report` (the same
parser the extender uses) and refuses sequence numbers that are not above the last one (409).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from extender.agent.reporter import HttpPoster, Reporter, TokenFile
from extender.telemetry import GpuReport, NodeReport, ReportError, parse_report


class StubExtender:
    """A minimal /v1/telemetry: token check, schema check, sequence order per node."""

    def __init__(self, port: int = 0, token: str = "s3cret") -> None:
        self.token = token
        self.accepted: list[NodeReport] = []
        self.statuses: list[int] = []
        self.hold = threading.Event()
        self.hold.set()  # clear() to make the handler wait (a slow extender)
        self.in_flight = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stub.in_flight.set()
                stub.hold.wait(10)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, answer = stub.handle(self.path, self.headers.get("Authorization", ""), body)
                stub.statuses.append(status)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(self, path: str, auth: str, body: bytes) -> tuple[int, dict[str, str]]:
        if path != "/v1/telemetry":
            return 404, {"error": "no such path"}
        if auth != f"Bearer {self.token}":
            return 401, {"error": "bad token"}
        try:
            report = parse_report(json.loads(body))
        except (ValueError, ReportError) as err:
            return 400, {"error": str(err)}
        if self.accepted and report.sequence <= self.accepted[-1].sequence:
            return 409, {"error": f"sequence {report.sequence} is not above {self.accepted[-1].sequence}"}
        self.accepted.append(report)
        return 200, {"status": "accepted"}

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


def report(sequence: int, used: float = 0.0) -> NodeReport:
    gpu = GpuReport(uuid="GPU-0", index=0, model="A100", memory_total_mib=40960, memory_used_mib=used)
    return NodeReport(node="n1", sequence=sequence, timestamp_s=1000.0 + sequence, agent_version="t",
                      source="simulated", gpus=(gpu,))


@pytest.fixture()
def stub() -> Iterator[StubExtender]:
    server = StubExtender()
    yield server
    server.close()


@pytest.fixture()
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    return path


def make_reporter(url: str, token_file: Path, results: list[str]) -> Reporter:
    return Reporter(HttpPoster(url, timeout_s=2.0), TokenFile(token_file), queue_size=4, backoff_initial_s=0.02,
                    backoff_max_s=0.1, on_result=results.append, rng=random.Random(0)).start()


def wait_for(condition: object, timeout_s: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():  # type: ignore[operator]
            return
        done.wait(0.01)
    raise AssertionError("condition not met in time")


def test_delivers_a_valid_report_with_the_token(stub: StubExtender, token_file: Path) -> None:
    results: list[str] = []
    reporter = make_reporter(stub.url, token_file, results)
    reporter.submit(report(1, used=123))
    wait_for(lambda: stub.accepted)
    reporter.stop()
    assert stub.accepted[0].gpus[0].memory_used_mib == 123
    assert results == ["ok"] and reporter.delivered_sequence == 1


def test_unauthorized_then_the_rotated_token_is_picked_up(
    stub: StubExtender, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token_file.write_text("old-token-value")
    results: list[str] = []
    reporter = make_reporter(stub.url, token_file, results)
    reporter.submit(report(1))
    wait_for(lambda: results.count("unauthorized") >= 2)  # retried, not dropped
    assert not stub.accepted
    token_file.write_text("s3cret")  # the kubelet rotated the projected token
    wait_for(lambda: stub.accepted)
    reporter.stop()
    assert stub.accepted[0].sequence == 1 and results[-1] == "ok"
    assert "old-token-value" not in caplog.text and "s3cret" not in caplog.text
    assert "401" in caplog.text


def test_extender_down_then_back_sends_the_newest_in_order(token_file: Path) -> None:
    down = StubExtender()
    port = down.port
    down.close()  # nothing listens: connection refused
    results: list[str] = []
    reporter = make_reporter(f"http://127.0.0.1:{port}", token_file, results)
    for sequence in range(1, 11):
        reporter.submit(report(sequence, used=sequence))
    wait_for(lambda: results.count("error") >= 3)
    assert reporter.pending() <= 4  # bounded while the extender is away
    back = StubExtender(port=port)
    try:
        reporter.submit(report(11, used=11))
        wait_for(lambda: back.accepted and back.accepted[-1].sequence == 11)
        reporter.stop()
    finally:
        back.close()
    sequences = [r.sequence for r in back.accepted]
    assert sequences == sorted(set(sequences))  # strictly increasing: nothing stale after something newer
    assert back.statuses.count(409) == 0
    assert "superseded" in results  # older snapshots were dropped, newest won


def test_stale_sequence_is_refused_and_not_retried(stub: StubExtender, token_file: Path) -> None:
    results: list[str] = []
    reporter = make_reporter(stub.url, token_file, results)
    reporter.submit(report(5))
    wait_for(lambda: len(stub.statuses) == 1)
    reporter.submit(report(3))  # e.g. replayed by a confused agent: the extender refuses it
    wait_for(lambda: len(stub.statuses) == 2)
    reporter.submit(report(6))
    wait_for(lambda: len(stub.statuses) == 3)
    reporter.stop()
    assert stub.statuses == [200, 409, 200]
    assert results == ["ok", "rejected", "ok"]
    assert [r.sequence for r in stub.accepted] == [5, 6]


def test_submit_never_waits_for_a_slow_extender(stub: StubExtender, token_file: Path) -> None:
    results: list[str] = []
    stub.hold.clear()
    reporter = make_reporter(stub.url, token_file, results)
    reporter.submit(report(1))
    assert stub.in_flight.wait(5)  # the sender is stuck in a POST...
    for sequence in range(2, 12):
        reporter.submit(report(sequence))  # ...and submitting still returns at once
    assert reporter.pending() == 4
    stub.hold.set()
    wait_for(lambda: stub.accepted and stub.accepted[-1].sequence == 11)
    reporter.stop()
    assert [r.sequence for r in stub.accepted] == [1, 11]
    assert results.count("superseded") == 9


def test_bad_url_is_an_error_not_a_crash(token_file: Path) -> None:
    results: list[str] = []
    reporter = make_reporter("http://127.0.0.1:1", token_file, results)
    reporter.submit(report(1))
    wait_for(lambda: "error" in results)
    reporter.stop()
    assert reporter.last_delivery is not None and reporter.last_delivery.result == "error"
