"""`deepres bench transport`: the CPU one request costs each HTTP server stack, with an app that does nothing.

Issue 31: in `deepres bench cluster` half of the extender's CPU per GPU pod was the HTTP transport
(docs/benchmarks.md, "CPU per pod: where it goes"). Here every candidate serves the same trivial app
(read the body, answer a small JSON) on a free loopback port in a process of its own, and this
process posts `--requests` bodies shaped like a /filter's (a Pod and `--names` node names) over
`--connections` kept-alive connections, one request at a time on each (as kube-scheduler and the
agents do), `--rate` a second in all, spread evenly: the server goes idle between requests, as the
extender does between a cluster's verbs and reports (back to back, a server finds several requests
at each wake-up, which hides what a wake-up costs). The figure is the server's CPU (utime+stime of
its process tree: granian's main process and its worker, with its Rust threads) per request; the
candidates run one after the other, `--rounds` times interleaved, and each figure is the median of
its rounds. Candidates:

- `granian-rsgi-bridge`: what the extender serves under granian today: granian's RSGI interface and
  `extender/server/rsgi.py` in front of the WSGI app (bodies read on the event loop, with a deadline);
- `granian-rsgi-bare`: granian's RSGI with an RSGI app that only answers (the floor of that interface);
- `granian-wsgi`: granian's WSGI interface (the app called in one of granian's threads, no asyncio);
- `granian-asgi`: granian's ASGI interface with an ASGI app that only answers;
- `scheduler-listener`: the scheduler's own listener (`extender/server/scheduler_listener.py`,
  asyncio streams on a thread of the worker), plain HTTP as `verbs_access=loopback` serves it;
- `scheduler-listener-mtls`: the same with TLS and a client certificate (`verbs_access=mtls`, the
  chart's default; certificates from `deepres pod-certs`), the client's kept-alive TLS connections;
- `scheduler-listener-mtls-handshake`: the same, each request on a new TLS connection: what kube-scheduler's
  extender client does for every request beyond 2 at once (Go's `http.Transport` keeps at most
  `DefaultMaxIdleConnsPerHost` = 2 idle connections per host, and kube-scheduler's `makeTransport`,
  pkg/scheduler/extender.go, sets no other), as with concurrent binds that wait on the API server.

Writes `reports/bench-transport.json`: `{candidate: {"cpu_ms_per_request", "latency_p50_ms"}}`
and the run's settings.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from devtools.bench_cluster_readings import cpu_s as _cpu_s
from devtools.localcluster import REPO, free_port
from extender.server import podcerts

CANDIDATES = ("granian-rsgi-bridge", "granian-rsgi-bare", "granian-wsgi", "granian-asgi", "scheduler-listener",
              "scheduler-listener-mtls", "scheduler-listener-mtls-handshake")
ANSWER = b'{"NodeNames":["gpu-00000"],"FailedNodes":{},"Error":""}'
HEADERS = [("content-type", "application/json"), ("content-length", str(len(ANSWER)))]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=4000, help="requests per candidate and round (default 4000)")
    parser.add_argument("--connections", type=int, default=4, help="kept-alive client connections (default 4)")
    parser.add_argument("--rate", type=float, default=400.0,
                        help="requests a second in all, spread evenly (default 400; 0: back to back)")
    parser.add_argument("--names", type=int, default=300, help="node names in each body (default 300, ~5 KB)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, candidates interleaved (default 3)")
    parser.add_argument("--candidates", nargs="+", choices=CANDIDATES, default=list(CANDIDATES),
                        help="stacks to measure (default all)")


# ---- the servers' apps (run in the server's process) ----
def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    environ["wsgi.input"].read()
    start_response("200 OK", HEADERS)
    return [ANSWER]


async def rsgi_app(scope: Any, protocol: Any) -> None:
    await protocol()
    protocol.response_bytes(200, HEADERS, ANSWER)


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(k.encode(), v.encode()) for k, v in HEADERS]})
    await send({"type": "http.response.body", "body": ANSWER})


def bridge(target: str = "") -> Any:
    from extender.server.rsgi import RsgiBridge

    return RsgiBridge(wsgi_app, threads=32, body_timeout_s=30.0, max_body_bytes=1 << 20,
                      may_block=lambda environ: False)  # /filter runs on the loop's thread, as in the extender


def serve(kind: str, port: int, certs: str = "") -> None:
    """Serve `kind` on 127.0.0.1:`port` until killed (the server process's entry)."""
    if kind.startswith("scheduler-listener"):
        from extender.server.scheduler_listener import SchedulerListener, server_context

        context = None
        if kind.endswith(("-mtls", "-mtls-handshake")):
            files = Path(certs) / "server"
            context = server_context(str(files / "tls.crt"), str(files / "tls.key"), str(files / "ca.crt"))
        SchedulerListener(wsgi_app, bind=f"127.0.0.1:{port}", ssl_context=context,
                          access="mtls" if context else "loopback",
                          max_connections=64, header_timeout_s=30.0, body_timeout_s=30.0,
                          max_body_bytes=1 << 20).start()
        threading.Event().wait()
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server import Server

    interface, target = {
        "granian-rsgi-bridge": (Interfaces.RSGI, "devtools.bench_transport:bridge"),
        "granian-rsgi-bare": (Interfaces.RSGI, "devtools.bench_transport:rsgi_app"),
        "granian-wsgi": (Interfaces.WSGI, "devtools.bench_transport:wsgi_app"),
        "granian-asgi": (Interfaces.ASGI, "devtools.bench_transport:asgi_app"),
    }[kind]
    options: dict[str, Any] = {
        "address": "127.0.0.1", "port": port, "interface": interface, "workers": 1, "runtime_threads": 1,
        "blocking_threads": 8 if interface == Interfaces.WSGI else 1, "http": HTTPModes.http1,
        "http1_settings": HTTP1Settings(header_read_timeout=30_000, keep_alive=True), "log_access": False,
        "websockets": False,
    }
    server = Server(target, **options)
    if kind == "granian-rsgi-bridge":
        server.serve(target_loader=bridge)
    else:
        server.serve()


# ---- the client (this process) ----
def _body(names: int) -> bytes:
    pod = {"metadata": {"name": "p", "namespace": "bench", "uid": "u" * 36,
                        "annotations": {"deepres.io/gpu-memory": "10Gi"}},
           "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}
    return json.dumps({"Pod": pod, "NodeNames": [f"gpu-{i:05d}" for i in range(names)]}).encode()


def _client_context(certs: str) -> ssl.SSLContext | None:
    if not certs:
        return None
    client = Path(certs) / "client"
    context = ssl.create_default_context(cafile=str(client / "ca.crt"))
    context.load_cert_chain(str(client / "client.crt"), str(client / "client.key"))
    return context


def _post_many(port: int, body: bytes, count: int, errors: list[str], step_s: float = 0.0,
               offset_s: float = 0.0, certs: str = "", latencies: list[float] | None = None,
               fresh: bool = False) -> None:
    """`count` requests on one kept-alive connection, or each on a new one (`fresh`)."""
    head = (f"POST /filter HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    context = _client_context(certs)

    def connect() -> Any:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        return context.wrap_socket(sock, server_hostname="127.0.0.1") if context is not None else sock

    sock = connect()
    pending = b""
    due = time.monotonic() + offset_s
    try:
        for i in range(count):
            if step_s:
                time.sleep(max(0.0, due - time.monotonic()))
                due += step_s
            sent = time.perf_counter()
            if fresh and i:
                sock.close()
                sock, pending = connect(), b""
            sock.sendall(head + body)
            while b"\r\n\r\n" not in pending:
                pending += sock.recv(65536)
            answer, _, pending = pending.partition(b"\r\n\r\n")
            lines = answer.split(b"\r\n")
            if b" 200 " not in lines[0]:
                errors.append(lines[0].decode(errors="replace"))
                return
            length = next(int(v) for k, _, v in (x.partition(b":") for x in lines[1:])
                          if k.strip().lower() == b"content-length")
            while len(pending) < length:
                pending += sock.recv(65536)
            pending = pending[length:]
            if latencies is not None:
                latencies.append(time.perf_counter() - sent)
    finally:
        sock.close()


def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server never listened")


def measure(kind: str, requests: int, connections: int, body: bytes, rate: float, certs: str) -> dict[str, float]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    certs = certs if kind.endswith(("-mtls", "-mtls-handshake")) else ""
    fresh = kind.endswith("-handshake")
    proc = subprocess.Popen([sys.executable, "-m", "devtools.bench_transport", kind, str(port), certs], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_up(port, proc)
        errors: list[str] = []
        _post_many(port, body, 50, errors, certs=certs)  # warm-up: imports, first allocations, the handshake
        time.sleep(0.5)
        latencies: list[float] = []
        cpu0 = _cpu_s(proc.pid)
        per = requests // connections
        step = connections / rate if rate > 0 else 0.0  # each connection's period; they start staggered
        threads = [threading.Thread(target=_post_many,
                                    args=(port, body, per, errors, step, i * step / connections, certs, latencies,
                                          fresh))
                   for i in range(connections)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu = _cpu_s(proc.pid) - cpu0
        if errors:
            raise RuntimeError(f"{kind}: {errors[0]}")
        return {"cpu_ms_per_request": 1000 * cpu / (per * connections),
                "latency_p50_ms": 1000 * statistics.median(latencies)}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(args: argparse.Namespace) -> int:
    body = _body(args.names)
    load = os.getloadavg()[0]
    certs = tempfile.mkdtemp(prefix="deepres-bench-transport-")
    podcerts.make(Path(certs) / "server", Path(certs) / "client")  # for scheduler-listener-mtls
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in args.candidates}
    for r in range(args.rounds):
        for kind in args.candidates:
            rounds[kind].append(measure(kind, args.requests, args.connections, body, args.rate, certs))
            print(f"bench transport: round {r + 1} {kind}: {rounds[kind][-1]}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        kind: {key: round(statistics.median(m[key] for m in got), 3) for key in got[0]}
        for kind, got in rounds.items()}
    result["settings"] = {"requests": args.requests, "connections": args.connections, "rate_per_s": args.rate,
                          "body_bytes": len(body), "rounds": args.rounds, "cpus": os.cpu_count(),
                          "load_average_1m_start_end": [round(load, 2), round(os.getloadavg()[0], 2)]}
    text = json.dumps(result, indent=2)
    print(text if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":  # python -m devtools.bench_transport KIND PORT: one candidate's server
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
