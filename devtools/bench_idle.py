"""`deepres bench idle`: a legitimate scheduler's filter latency and the probes while thousands of
idle connections are held open against a real `deepres serve --no-kube` (issue 26).

The server runs on a free port with one reported node. An attacker process holds `--idle` (2,000)
TCP connections that send nothing and `--prefaces` (200) that send the HTTP/2 client preface
(`PRI * HTTP/2.0...`) and nothing more, all from loopback; each one the server closes is opened
again `--reopen-delay-s` later, so the attack keeps its count for the whole phase. Meanwhile one
client plays kube-scheduler (a `/filter` every 1/`--rate` s on a kept-alive connection, as Go's
client keeps it) and another plays the kubelet (a `/healthz` every 0.1 s on a new connection, with
the kubelet's default 1 s timeout for the whole probe). The same is measured first without the
attack. The attacker runs at nice +10 (`--attacker-nice`): here it shares the extender's machine,
a real one would not. The process's
soft open-files limit is raised to what the attacker needs (it fails if the hard limit is lower).
Writes `reports/adversarial-idle.json`; done means `attack.filter_p99_ms` <= 50 and every /healthz
answered (`attack.healthz_answered` == `attack.healthz_sent`).

The keep-alive flood (`--scenarios keepalive`, issue 34): `--flood` (8,000) connections on the main
port, each polling GET /healthz every `--poll-every-s` (8 s) as long as the server keeps it open and
reconnecting at its next poll when the server closed it, while the scheduler calls /filter on the
extender's own listener for it (`server.scheduler_bind`, what the chart configures). Written under
`keepalive_flood`; done means `keepalive_flood.scheduler_filter_p99_ms` <= 100. A scenario not run
keeps its keys from the existing report.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import resource
import selectors
import socket
import statistics
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from devtools.localserver import LocalServer, free_port
from extender.cli import UsageError

TARGET_P99_MS = 50.0
FLOOD_TARGET_P99_MS = 100.0
TOKEN = "bench-idle"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PROBE_EVERY_S = 0.1
PROBE_TIMEOUT_S = 1.0  # the kubelet's default timeoutSeconds
FILTER_TIMEOUT_S = 5.0  # kube-scheduler's default httpTimeout for an extender
FD_SPARE = 256
#: A connect the server's backlog leaves unanswered this long is abandoned and tried again.
CONNECT_TIMEOUT_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--idle", type=int, default=2000, help="idle TCP connections (default 2000)")
    parser.add_argument("--prefaces", type=int, default=200, help="idle HTTP/2 prefaces (default 200)")
    parser.add_argument("--requests", type=int, default=2000, help="filters per phase (default 2000)")
    parser.add_argument("--rate", type=float, default=100.0, help="filters a second (default 100)")
    parser.add_argument("--reopen-delay-s", type=float, default=1.0,
                        help="the attacker reopens a connection the server closed after this long (default 1)")
    parser.add_argument("--engine", choices=("granian", "gunicorn"), default="granian",
                        help="the server's engine (default granian)")
    parser.add_argument("--attacker-nice", type=int, default=10,
                        help="CPU niceness of the attacker process, which shares this machine (default 10)")
    parser.add_argument("--scenarios", default="idle,keepalive",
                        help="comma-separated: idle (idle TCP + HTTP/2 prefaces), keepalive (polling flood)")
    parser.add_argument("--flood", type=int, default=8000, help="polling kept-alive connections (default 8000)")
    parser.add_argument("--poll-every-s", type=float, default=8.0,
                        help="each flood connection polls /healthz this often (default 8)")
    parser.add_argument("--predictor-factory", default="",
                        help="module:callable predictor instead of the shipped one (DEEPRES_PREDICTOR_FACTORY)")
    parser.set_defaults(out="reports/adversarial-idle.json")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def raise_open_files(needed: int) -> int:
    """The soft open-files limit, raised to `needed` if it is lower (RuntimeError if the hard one is)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed if soft == resource.RLIM_INFINITY else soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise RuntimeError(f"the bench holds {needed} files open; the hard open-files limit is {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed


def attack(port: int, idle: int, prefaces: int, reopen_delay_s: float, niceness: int, pipe: Connection) -> None:
    """The attacker (its own process): hold `idle` silent connections and `prefaces` HTTP/2 prefaces,
    reopening each the server closes; report the counts when told to stop. It runs at a lower CPU
    priority (`--attacker-nice`, +10 by default): a real attacker spends its own machine's CPU, not
    the extender's, and here they share one; what the attack holds is measured (`held_mean`,
    `held_min`)."""
    if niceness:
        os.nice(niceness)
    selector = selectors.DefaultSelector()
    due: list[tuple[float, bytes]] = []  # (when, preface) of connections to reopen
    connecting: dict[socket.socket, float] = {}  # non-blocking connects in flight -> when started
    opened = closed = failed = 0
    samples: list[int] = []

    def open_one(preface: bytes) -> None:
        """Start a connect without waiting (a server that stops accepting must not stall the attack)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        connecting[sock] = time.monotonic()
        selector.register(sock, selectors.EVENT_WRITE, preface)

    def drop(sock: socket.socket, preface: bytes) -> None:
        selector.unregister(sock)
        connecting.pop(sock, None)
        sock.close()
        due.append((time.monotonic() + reopen_delay_s, preface))

    for _ in range(idle):
        open_one(b"")
    for _ in range(prefaces):
        open_one(H2_PREFACE)
    announced = False
    last_sample = 0.0
    while not pipe.poll():
        for key, _ in selector.select(timeout=0.05):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock in connecting:  # the connect finished, one way or the other
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    failed += 1
                    drop(sock, key.data)
                    continue
                del connecting[sock]
                opened += 1
                try:
                    if key.data:
                        sock.send(key.data)
                except OSError:
                    drop(sock, key.data)
                    continue
                selector.modify(sock, selectors.EVENT_READ, key.data)
                continue
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data == b"":
                closed += 1
                drop(sock, key.data)
        now = time.monotonic()
        for sock, started in list(connecting.items()):
            if now - started > CONNECT_TIMEOUT_S:
                failed += 1
                drop(sock, selector.get_key(sock).data)
        ready = [d for d in due if d[0] <= now]
        due[:] = [d for d in due if d[0] > now]
        for _, preface in ready:
            open_one(preface)
        if not announced and (not connecting or now - min(connecting.values()) > CONNECT_TIMEOUT_S):
            pipe.send("ready")  # every connection opened, or given its chance
            announced = True
        if now - last_sample >= 0.25:
            samples.append(len(selector.get_map()) - len(connecting))
            last_sample = now
    held = len(selector.get_map()) - len(connecting)
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    pipe.send({"opened": opened, "closed_by_server": closed, "connect_failures": failed,
               "held_at_end": held, "held_min": min(samples, default=held),
               "held_mean": round(statistics.mean(samples), 1) if samples else held})


def flood(port: int, count: int, every_s: float, niceness: int, pipe: Connection) -> None:
    """The keep-alive flood (its own process): `count` connections each sending GET /healthz every
    `every_s` (spread evenly) while the server keeps it open, and reconnecting at the next poll when
    the server closed it; counts when told to stop."""
    if niceness:
        os.nice(niceness)
    selector = selectors.DefaultSelector()
    request = b"GET /healthz HTTP/1.1\r\nHost: extender\r\n\r\n"
    due: list[tuple[float, int]] = []  # (when, slot) of reconnects
    polls: dict[socket.socket, float] = {}  # open connection -> its next poll
    connecting: dict[socket.socket, float] = {}
    sent = answered = closed = failed = 0
    samples: list[int] = []
    start = time.monotonic()

    def open_one() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        connecting[sock] = time.monotonic()
        selector.register(sock, selectors.EVENT_WRITE)

    def drop(sock: socket.socket, reconnect_at: float) -> None:
        selector.unregister(sock)
        connecting.pop(sock, None)
        polls.pop(sock, None)
        sock.close()
        due.append((reconnect_at, 0))

    for i in range(count):  # spread the first connects (and so the polls) over one period
        due.append((start + every_s * i / count, i))
    announced = False
    last_sample = 0.0
    while not pipe.poll():
        now = time.monotonic()
        for key, _ in selector.select(timeout=0.02):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock in connecting:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    failed += 1
                    drop(sock, now + every_s)
                    continue
                del connecting[sock]
                try:
                    sock.send(request)
                    sent += 1
                except OSError:
                    drop(sock, now + every_s)
                    continue
                polls[sock] = now + every_s
                selector.modify(sock, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data == b"":
                closed += 1
                drop(sock, polls.get(sock, now + every_s))
            else:
                answered += data.count(b"HTTP/1.1 ")
        now = time.monotonic()
        for sock, at in list(polls.items()):
            if at <= now:
                try:
                    sock.send(request)
                    sent += 1
                    polls[sock] = at + every_s
                except OSError:
                    drop(sock, at + every_s)
        for sock, started in list(connecting.items()):
            if now - started > CONNECT_TIMEOUT_S:
                failed += 1
                drop(sock, now + every_s)
        ready = [d for d in due if d[0] <= now]
        due[:] = [d for d in due if d[0] > now]
        for _ in ready:
            open_one()
        if not announced and now - start >= every_s:
            pipe.send("ready")  # one period: every connection opened and polling
            announced = True
        if now - last_sample >= 0.25:
            samples.append(len(polls))
            last_sample = now
    for sock in list(polls) + list(connecting):
        sock.close()
    pipe.send({"polls_sent": sent, "polls_answered": answered, "closed_by_server": closed,
               "connect_failures": failed, "open_mean": round(statistics.mean(samples), 1) if samples else 0,
               "open_max": max(samples, default=0)})


def _filter_body() -> bytes:
    return json.dumps({"Pod": {"metadata": {"name": "legit", "namespace": "ml", "uid": "u-legit",
                                            "annotations": {"deepres.io/gpu-memory": "4Gi"}},
                               "spec": {"schedulerName": "deepres-scheduler"}},
                       "NodeNames": ["n1"]}).encode()


def filters(port: int, count: int, rate: float) -> tuple[list[float], int, int]:
    """`count` filters paced at `rate` a second on one kept-alive connection, each with
    kube-scheduler's 5 s httpTimeout: (latencies ms, failures, reconnects). A connection the server
    closed while idle is reopened once, as Go's client does; a filter that fails or times out counts
    as a failure with the time it took. The phase ends early when it runs past twice its length."""
    body = _filter_body()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=FILTER_TIMEOUT_S)
    latencies: list[float] = []
    failures = reconnects = 0
    interval = 1.0 / rate
    next_at = time.perf_counter()
    give_up = next_at + 2.0 * count / rate + 10.0
    try:
        for _ in range(count):
            next_at += interval
            started = time.perf_counter()
            ok = False
            for attempt in range(2):
                try:
                    conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
                    response = conn.getresponse()
                    answer = json.loads(response.read())
                    ok = response.status == 200 and answer.get("NodeNames") == ["n1"]
                    break
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    conn.close()  # the server closed it while idle: once more on a new connection
                    reconnects += 1
                    if attempt:
                        break
                except (OSError, http.client.HTTPException, ValueError):
                    conn.close()
                    break
            latencies.append((time.perf_counter() - started) * 1000.0)
            failures += not ok
            if time.perf_counter() > give_up:
                break
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    finally:
        conn.close()
    return latencies, failures, reconnects


class Prober(threading.Thread):
    """The kubelet: GET /healthz every PROBE_EVERY_S on a new connection, PROBE_TIMEOUT_S to answer."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.sent = self.answered = 0
        self.latencies: list[float] = []

    def run(self) -> None:
        while not self.stop.wait(PROBE_EVERY_S):
            self.sent += 1
            started = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=PROBE_TIMEOUT_S)
            try:
                conn.request("GET", "/healthz")
                ok = conn.getresponse().status == 200
                took_s = time.perf_counter() - started
                if ok and took_s <= PROBE_TIMEOUT_S:  # the kubelet's timeout is for the whole probe
                    self.answered += 1
                self.latencies.append(took_s * 1000.0)
            except OSError:
                pass
            finally:
                conn.close()


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes used so far."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def phase(server: LocalServer, requests: int, rate: float, filter_port: int = 0) -> dict[str, Any]:
    """`requests` filters (on `filter_port`, default the main port) with the kubelet's probes meanwhile."""
    prober = Prober(server.port)
    pids = [server.proc.pid, *server.worker_pids()] if server.proc is not None else []
    started, cpu_before = time.monotonic(), cpu_s(pids)
    prober.start()
    try:
        latencies, failures, reconnects = filters(filter_port or server.port, requests, rate)
    finally:
        prober.stop.set()
        prober.join()
    took_s = time.monotonic() - started
    return {
        "seconds": round(took_s, 1),
        "server_cpu_share": round((cpu_s(pids) - cpu_before) / took_s, 3),  # of one core
        "filters": len(latencies), "filter_failures": failures, "filter_reconnects": reconnects,
        "filter_p50_ms": round(statistics.median(latencies), 2),
        "filter_p99_ms": round(_percentile(latencies, 0.99), 2),
        "filter_max_ms": round(max(latencies), 2),
        "healthz_sent": prober.sent, "healthz_answered": prober.answered,
        "healthz_p99_ms": round(_percentile(prober.latencies, 0.99), 2) if prober.latencies else None,
    }


def report_node(server: LocalServer) -> None:
    report = {"node": "n1", "sequence": 1, "timestamp_s": time.time(), "agent_version": "bench",
              "source": "simulated", "gpus": [{"uuid": "GPU-n1-0", "index": 0, "model": "A100",
                                               "memory_total_mib": 40960.0, "memory_used_mib": 0.0}]}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/telemetry", json.dumps(report).encode(),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    if conn.getresponse().status != 200:
        raise RuntimeError("the bench's telemetry report was refused")
    conn.close()


def server_env(args: argparse.Namespace) -> dict[str, str]:
    env = {"DEEPRES_ENGINE": args.engine, "DEEPRES_TELEMETRY_TTL_S": "3600"}
    if args.predictor_factory:
        env["DEEPRES_PREDICTOR_FACTORY"] = args.predictor_factory
    return env


def measure_flood(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The keep-alive flood on the main port; the scheduler on its own listener (see the module doc)."""
    open_files = raise_open_files(args.flood + FD_SPARE)
    scheduler_port = free_port()
    env = {**server_env(args), "DEEPRES_SCHEDULER_BIND": f"127.0.0.1:{scheduler_port}"}
    with LocalServer(workdir, token=TOKEN, env=env) as server:
        report_node(server)
        filters(scheduler_port, 50, 1000.0)  # warm-up
        baseline = phase(server, args.requests // 4, args.rate, scheduler_port)
        ours, theirs = multiprocessing.Pipe()
        flooder = multiprocessing.get_context("fork").Process(
            target=flood, daemon=True, args=(server.port, args.flood, args.poll_every_s, args.attacker_nice, theirs))
        flooder.start()
        try:
            if not ours.poll(args.poll_every_s + 120) or ours.recv() != "ready":
                raise RuntimeError("the flood did not open its connections in time")
            flooded = phase(server, args.requests, args.rate, scheduler_port)
            ours.send("stop")
            flooded.update(ours.recv() if ours.poll(30) else {})
        finally:
            flooder.join(10)
            if flooder.is_alive():
                flooder.kill()
    p99 = flooded["filter_p99_ms"]
    return {"target_scheduler_filter_p99_ms": FLOOD_TARGET_P99_MS, "engine": args.engine,
            "connections": args.flood, "poll_every_s": args.poll_every_s, "attacker_nice": args.attacker_nice,
            "open_files_limit": open_files, "scheduler_listener": True,
            "baseline": baseline, "flood": flooded, "scheduler_filter_p99_ms": p99,
            "meets_target": p99 <= FLOOD_TARGET_P99_MS and flooded["filter_failures"] == 0}


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    open_files = raise_open_files(args.idle + args.prefaces + FD_SPARE)
    with LocalServer(workdir, token=TOKEN, env=server_env(args)) as server:
        report_node(server)
        filters(server.port, 50, 1000.0)  # warm-up
        baseline = phase(server, args.requests, args.rate)
        ours, theirs = multiprocessing.Pipe()
        attacker = multiprocessing.get_context("fork").Process(
            target=attack, daemon=True,
            args=(server.port, args.idle, args.prefaces, args.reopen_delay_s, args.attacker_nice, theirs))
        attacker.start()
        try:
            if not ours.poll(120) or ours.recv() != "ready":
                raise RuntimeError("the attacker did not open its connections within 120 s")
            time.sleep(0.5)
            attacked = phase(server, args.requests, args.rate)
            ours.send("stop")
            attacked.update(ours.recv() if ours.poll(30) else {})
        finally:
            attacker.join(10)
            if attacker.is_alive():
                attacker.kill()
    target_met = (attacked["filter_p99_ms"] <= TARGET_P99_MS and attacked["filter_failures"] == 0
                  and attacked["healthz_answered"] == attacked["healthz_sent"])
    return {"target_filter_p99_ms": TARGET_P99_MS, "engine": args.engine, "idle_tcp": args.idle,
            "idle_http2_prefaces": args.prefaces, "filter_rate_per_s": args.rate,
            "reopen_delay_s": args.reopen_delay_s, "attacker_nice": args.attacker_nice,
            "open_files_limit": open_files,
            "baseline": baseline, "attack": attacked, "meets_target": target_met}


def run(args: argparse.Namespace) -> int:
    scenarios = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    unknown = scenarios - {"idle", "keepalive"}
    if unknown:
        raise UsageError(f"--scenarios: unknown {', '.join(sorted(unknown))} (known: idle, keepalive)")
    out = Path(args.out)
    try:  # a scenario not run keeps its figures from the existing report
        results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    except ValueError:
        results = {}
    with tempfile.TemporaryDirectory(prefix="deepres-idle-") as tmp:
        if "idle" in scenarios:
            results.update(measure(args, Path(tmp)))
            base, hit = results["baseline"], results["attack"]
            print(f"without the attack: filter p50 {base['filter_p50_ms']} ms p99 {base['filter_p99_ms']} ms; "
                  f"/healthz {base['healthz_answered']}/{base['healthz_sent']}")
            print(f"{args.idle} idle + {args.prefaces} HTTP/2 prefaces held (mean {hit.get('held_mean')}, min "
                  f"{hit.get('held_min')}; {hit.get('closed_by_server')} closed by the server and reopened): filter "
                  f"p50 {hit['filter_p50_ms']} ms p99 {hit['filter_p99_ms']} ms; /healthz {hit['healthz_answered']}/"
                  f"{hit['healthz_sent']}; target met: {results['meets_target']}")
        if "keepalive" in scenarios:
            flooded = measure_flood(args, Path(tmp))
            results["keepalive_flood"] = flooded
            hit = flooded["flood"]
            print(f"{args.flood} kept-alive pollers every {args.poll_every_s:g} s on the main port "
                  f"({hit.get('polls_sent')} polls, {hit.get('closed_by_server')} closed by the server after "
                  f"their answer, open mean {hit.get('open_mean')})")
            print(f"the scheduler's /filter on its own listener: p50 {hit['filter_p50_ms']} ms, "
                  f"p99 {hit['filter_p99_ms']} ms, {hit['filter_failures']} failures; "
                  f"/healthz {hit['healthz_answered']}/{hit['healthz_sent']}; target met: {flooded['meets_target']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"written to {out}")
    return 0
