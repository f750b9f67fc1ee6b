"""The test harness's server (devtools/localserver.py) beside other servers on the machine: a port another
process took between the harness's pick and the child's bind costs a retry on fresh ports, never a
failed test, and an answer from that other process is never taken for the server's own (issue 49:
`make test` beside other servers failed with "Address already in use")."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import localserver
from devtools.localserver import LocalServer, holds_port
from tests.fixtures.kube.server import TOKEN, get

DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}


class Impostor(http.server.BaseHTTPRequestHandler):
    """Another server on the machine: 200 to anything, so a probe of the wrong port looks ready."""

    def do_GET(self) -> None:
        body = b'{"impostor": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def impostor() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def first_picks(monkeypatch: pytest.MonkeyPatch, *taken: int) -> None:
    """The harness's first port picks are `taken` (what another process grabbed meanwhile), then the kernel's."""
    queue = list(taken)
    real = localserver.free_port

    def pick(host: str = "127.0.0.1") -> int:
        return queue.pop(0) if queue else real(host)

    monkeypatch.setattr(localserver, "free_port", pick)


@pytest.mark.parametrize("engine", ["granian", "gunicorn"])
def test_a_port_another_server_took_is_not_mistaken_for_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             impostor: int, engine: str) -> None:
    first_picks(monkeypatch, impostor)
    env = {**DOUBLE, "DEEPRES_ENGINE": engine}
    with LocalServer(tmp_path, token=TOKEN, env=env, bind_host="0.0.0.0") as server:
        assert server.port != impostor and server.proc is not None
        assert holds_port(server.proc.pid, server.port) and not holds_port(server.proc.pid, impostor)
        status, out = get(server.url + "/healthz", timeout=5)
        assert status == 200 and "impostor" not in str(out)


def test_a_taken_scheduler_port_is_retried_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        main = localserver.free_port()
        first_picks(monkeypatch, main, taken)  # the main port is free, the scheduler's was taken
        env = {**DOUBLE, "DEEPRES_ENGINE": "granian",
               "DEEPRES_SCHEDULER_BIND": f"127.0.0.1:{LocalServer.port_ref('scheduler')}"}
        with LocalServer(tmp_path, token=TOKEN, env=env) as server:
            assert server.proc is not None and server.ports["scheduler"] != taken
            assert holds_port(server.proc.pid, server.ports["scheduler"])
            with socket.create_connection(("127.0.0.1", server.ports["scheduler"]), timeout=5) as conn:
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert conn.recv(100).startswith(b"HTTP/1.1 200")


def test_holds_port_tells_ours_from_anothers() -> None:
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs /proc/net/tcp (Linux)")
    other = subprocess.Popen(["sleep", "30"])
    try:
        with socket.socket() as mine:
            mine.bind(("127.0.0.1", 0))
            mine.listen()
            port = mine.getsockname()[1]
            assert holds_port(os.getpid(), port)  # this process (and its children: the sleep) holds it
            assert not holds_port(other.pid, port)
    finally:
        other.kill()
        other.wait()
