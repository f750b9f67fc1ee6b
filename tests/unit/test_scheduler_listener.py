"""The scheduler's listener's deadlines, kept by a sweep over the connections (one number per
connection instead of a timer per wait, issue 31): a body that stalls gets its 408 and the
connection closes; an idle kept-alive connection, a silent one and one that never reads its answers
are closed; a connection in use is served request after request."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.localserver import free_port
from extender.server.scheduler_listener import SWEEP_S, SchedulerListener

TIMEOUT_S = 0.5
ANSWER = b'{"NodeNames":["n1"]}'


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [ANSWER if body else b"{}"]


@pytest.fixture
def listener() -> Iterator[SchedulerListener]:
    server = SchedulerListener(app, bind=f"127.0.0.1:{free_port()}", ssl_context=None, access="loopback",
                               max_connections=8, header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S,
                               max_body_bytes=1 << 16).start()
    try:
        yield server
    finally:
        server.stop()


def connect(server: SchedulerListener) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def request(body: bytes, declared: int | None = None) -> bytes:
    length = len(body) if declared is None else declared
    return (f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n").encode() + body


def read_until_closed(sock: socket.socket, within_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start, got = time.monotonic(), b""
    sock.settimeout(within_s)
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return got, time.monotonic() - start
        got += chunk


def test_kept_alive_connection_serves_request_after_request(listener: SchedulerListener) -> None:
    with connect(listener) as sock:
        for _ in range(3):
            sock.sendall(request(b'{"Pod": {}}'))
            head = sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200") and head.endswith(ANSWER), head
            assert b"Connection: keep-alive" in head
            time.sleep(TIMEOUT_S / 3)  # well within the idle deadline between requests


def test_stalled_body_gets_408_then_close(listener: SchedulerListener) -> None:
    with connect(listener) as sock:
        sock.sendall(request(b'{"Pod"', declared=100))  # 6 of the 100 bytes promised, then nothing
        got, took_s = read_until_closed(sock, within_s=5.0)
    assert got.startswith(b"HTTP/1.1 408") and b"not received within" in got, got
    assert TIMEOUT_S - 0.05 <= took_s <= TIMEOUT_S + 2 * SWEEP_S + 1.0, took_s


@pytest.mark.parametrize("first", [b"", b"POST /filter HTTP/1.1\r\nHo"], ids=["silent", "trickling-headers"])
def test_silent_connections_are_closed_at_the_header_deadline(listener: SchedulerListener, first: bytes) -> None:
    with connect(listener) as sock:
        sock.sendall(first)
        got, took_s = read_until_closed(sock, within_s=5.0)
    assert got == b"" and took_s <= TIMEOUT_S + 2 * SWEEP_S + 1.0, (got, took_s)


def test_idle_kept_alive_connection_is_closed(listener: SchedulerListener) -> None:
    with connect(listener) as sock:
        sock.sendall(request(b"{}"))
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200"), head
        got, took_s = read_until_closed(sock, within_s=5.0)
    assert got == b"" and took_s <= TIMEOUT_S + 2 * SWEEP_S + 1.0, took_s
    assert not listener.conns  # nothing left of it


def test_a_client_that_never_reads_its_answers_is_dropped(listener: SchedulerListener) -> None:
    sock = connect(listener)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        burst = request(b'{"Pod": {}}') * 2000  # answers pile up on the server's side: never read here
        sock.setblocking(False)
        sent, deadline = 0, time.monotonic() + 10.0
        while sent < len(burst) and time.monotonic() < deadline:
            try:
                sent += sock.send(burst[sent:sent + 65536])
            except BlockingIOError:
                time.sleep(0.05)
            except OSError:  # the server closed it
                break
        deadline = time.monotonic() + 10.0
        while listener.conns and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not listener.conns, "the connection that never reads was kept"
    finally:
        sock.close()
