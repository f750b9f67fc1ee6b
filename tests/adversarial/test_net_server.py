"""Attacks on the network edge of a real `deepres serve` process (issue 13, items 1, 2, 9, 11 and the
405 `Allow`), under both engines. The attacker either shares the loopback interface (a caller the
verbs admit) or comes from this machine's own network address (as a pod on the cluster network
would: the verbs must refuse it before reading anything it sends)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localserver import LocalServer
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, extender_args, pod, report
from tests.fixtures.kube.server import TOKEN, get, post

ENGINES = ["granian", "gunicorn"]
DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}


def network_address() -> str:
    """This machine's address on its default route (no packet is sent); skips without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
        except OSError:
            pytest.skip("needs a non-loopback network address (none here)")
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("needs a non-loopback network address (only loopback here)")
    return address


def stalled_body(host: str, port: int, path: str, token: str = "") -> socket.socket:
    """A request whose headers promise 4,096 bytes of body and whose body stops after 8."""
    sock = socket.create_connection((host, port), timeout=30)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
                 "Content-Length: 4096\r\n\r\n{\"Pod\": ".encode())
    return sock


def first_line(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(200).split(b"\r\n", 1)[0]
    except OSError:
        return b""


@pytest.fixture(params=ENGINES)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalServer]:
    env = {**DOUBLE, "DEEPRES_ENGINE": request.param, "DEEPRES_BODY_TIMEOUT_S": "3"}
    with LocalServer(tmp_path, token=TOKEN, env=env, bind_host="0.0.0.0") as running:
        yield running


def filter_n1(url: str) -> tuple[int, dict[str, object]]:
    status, out = post(url + "/filter", extender_args(pod("legit", CNN_ANNOTATIONS), names=["n1", "n2"]),
                       timeout=8)
    return status, out


def test_stalled_bodies_hold_neither_the_verbs_nor_the_probes(server: LocalServer) -> None:
    assert post(server.url + "/v1/telemetry", report("n1", 1, time.time(), [(40960.0, 0.0)]), token=TOKEN)[0] == 200
    engine = server.env["DEEPRES_ENGINE"]
    # granian reads bodies on its event loop: even callers the verbs admit (loopback) cannot stall it;
    # gunicorn reads them in its request threads: callers off loopback are refused before their body
    host = "127.0.0.1" if engine == "granian" else network_address()
    stalled = [stalled_body(host, server.port, "/filter") for _ in range(64)]
    stalled += [stalled_body(host, server.port, "/v1/telemetry") for _ in range(8)]
    try:
        time.sleep(0.5)
        for _ in range(10):
            started = time.monotonic()
            status, out = filter_n1(server.url)
            assert status == 200 and out["NodeNames"] == ["n1"], out
            assert time.monotonic() - started < 5.0  # kube-scheduler's httpTimeout; the benchmark measures p99
        assert get(server.url + "/healthz", timeout=5)[0] == 200
        expected = b"HTTP/1.1 408" if engine == "granian" else b"HTTP/1.1 403"
        assert first_line(stalled[0], 10.0).startswith(expected)
        assert first_line(stalled[-1], 10.0).startswith(b"HTTP/1.1 408" if engine == "granian" else b"HTTP/1.1 401")
    finally:
        for sock in stalled:
            sock.close()


def test_gunicorn_gives_up_on_a_stalled_body_from_an_admitted_caller(tmp_path: Path) -> None:
    env = {**DOUBLE, "DEEPRES_ENGINE": "gunicorn", "DEEPRES_BODY_TIMEOUT_S": "2"}
    with LocalServer(tmp_path, token=TOKEN, env=env) as server:
        sock = stalled_body("127.0.0.1", server.port, "/filter")
        try:
            assert first_line(sock, 10.0).startswith(b"HTTP/1.1 408")
        finally:
            sock.close()
        assert filter_n1(server.url)[0] == 200


def test_the_verbs_refuse_callers_off_loopback_and_telemetry_does_not(server: LocalServer) -> None:
    outside = f"http://{network_address()}:{server.port}"
    for verb in ("/filter", "/prioritize", "/bind", "/preempt"):
        status, out = post(outside + verb, {"PodName": "p", "PodNamespace": "kube-system", "PodUID": "u", "Node": "n"})
        assert status == 403 and "loopback" in out["error"], (verb, status, out)
    assert post(outside + "/v1/telemetry", report("n9", 1, time.time(), [(1000.0, 0.0)]), token=TOKEN)[0] == 200
    assert get(outside + "/healthz")[0] == 200
    assert filter_n1(server.url)[0] == 200  # the scheduler, on loopback, is served


def test_invalid_utf8_is_a_clear_400_or_error(server: LocalServer) -> None:
    body = json.dumps(report("n1", 1, time.time(), [(1000.0, 0.0)])).encode()
    for bad in (body.replace(b'"n1"', b'"n\xff1"'), body.replace(b'"n1"', b'"\\ud800"')):
        status, out = post(server.url + "/v1/telemetry", None, raw=bad, token=TOKEN)
        assert status == 400 and ("UTF-8" in out["error"] or "surrogate" in out["error"]), (status, out)
    raw = json.dumps(extender_args(pod("p", CNN_ANNOTATIONS), names=["n1"])).encode().replace(b'"p"', b'"p\xfe"')
    status, out = post(server.url + "/filter", None, raw=raw)
    assert status == 200 and "UTF-8" in out["Error"] and "internal error" not in out["Error"], out


def test_405_names_the_allowed_methods(server: LocalServer) -> None:
    for path, allowed in (("/v1/predict", "POST"), ("/filter", "POST"), ("/healthz", "GET")):
        request = urllib.request.Request(server.url + path, method="PUT", data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)
        assert info.value.code == 405 and allowed in (info.value.headers.get("Allow") or ""), path


def test_kill_9_of_the_main_process_takes_the_worker_with_it(server: LocalServer) -> None:
    assert server.proc is not None
    workers = server.worker_pids()
    assert workers, "the engine runs its app in a worker process"
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=0.5).close()
        except OSError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"port {server.port} still answers 5 s after kill -9 of the main process")
    for pid in workers:
        for _ in range(50):
            if not alive(pid):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"worker {pid} outlived its main process")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_granian_bounds_the_bytes_of_bodies_it_holds(tmp_path: Path) -> None:
    """Many senders of large bodies take at most `body_buffer_bytes` between them (503 beyond), a
    caller the verbs refuse is answered before it sends anything, and small requests go on."""
    env = {**DOUBLE, "DEEPRES_ENGINE": "granian", "DEEPRES_BODY_TIMEOUT_S": "4",
           "DEEPRES_MAX_BODY_BYTES": str(1 << 20), "DEEPRES_BODY_BUFFER_BYTES": str(2 << 20),
           "DEEPRES_PREDICT_MAX_BYTES": str(1 << 20)}  # /v1/predict's own 64 KiB limit would refuse them first
    with LocalServer(tmp_path, token=TOKEN, env=env, bind_host="0.0.0.0") as server:
        assert post(server.url + "/v1/telemetry", report("n1", 1, time.time(), [(40960.0, 0.0)]), token=TOKEN)[0] == 200
        senders = []
        for sent in (1_000_000, 1_000_000, 200_000):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1048000\r\n\r\n" + b" " * sent)
            senders.append(sock)
            time.sleep(0.3)
        try:
            assert first_line(senders[2], 5.0).startswith(b"HTTP/1.1 503")
            assert filter_n1(server.url)[0] == 200  # a few hundred bytes still fit
            refused = stalled_body(network_address(), server.port, "/filter")
            started = time.monotonic()
            assert first_line(refused, 5.0).startswith(b"HTTP/1.1 403")
            assert time.monotonic() - started < 2.0  # not after the body timeout: nothing was read
            refused.close()
            assert first_line(senders[0], 10.0).startswith(b"HTTP/1.1 408")
        finally:
            for sock in senders:
                sock.close()
