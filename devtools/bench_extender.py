"""`deepres bench extender`: the production server on a loopback port under kube-scheduler's load.

A simulated 5,000-node cluster reports through `/v1/telemetry`, and 200 pods are filtered and
bound first, so that the packing score works against a demand mix of recent admissions as it does
in a running cluster; then, for each mode, 4 clients play kube-scheduler's cycle: per pod one
`/filter`, then, as kube-scheduler does, a `/prioritize` with what the filter passed only when it
passed more than one node (one node: kube-scheduler binds there without asking), and a `/bind` to
the best-scored node (none when no node passed), so the filter's and the prioritize's assumptions
end in a bind as they do under kube-scheduler; each pod is new (its own name and uid). In
`--repeats` rounds of the three modes (each figure: the median of the rounds; `prioritize_*` are
null when no prioritize was sent). The pods bound stay bound (none ends here), so each mode of each
round has a server of its own, loaded alike (the telemetry, the 200 warm-up binds) before its load.
- names: 500 candidate node names (nodeCacheCapable: true; what kube-scheduler sends at 5,000 nodes)
- nodes: 100 full Node objects (nodeCacheCapable: false)
- under_telemetry: the names mode while agents post 500 reports/s
Latencies are measured at the client (so they include HTTP and JSON on both sides); each client and
the agents run in processes of their own, and with two CPUs or more the server gets the first CPU to
itself (`--no-pin` to share), as it would beside a kube-scheduler running elsewhere. RSS is the
server's (the engine's main process + worker).
Writes `reports/bench-extender.json`.

`--cycle 1000 5000` measures kube-scheduler's serial scheduling cycle instead, per cluster size:
N nodes of 8 empty 80 GB GPUs (as `deepres bench cluster` has them), and per pod what
kube-scheduler sends with `percentageOfNodesToScore: 100`: a `/filter` with every node's name (in
a new order each time: its parallel filters collect them so), a `/prioritize` with the names the
filter passed, in its order, when it passed more than one (the `prioritize_*` figures are null when
none was sent), and a `/bind` to the best; one pod at a time, with the nodes' agents
reporting meanwhile at the chart's heartbeat (`--heartbeat-s`, a report per node per period, from
a process of their own). Per verb the client's latency (p50/p99), and the server's CPU per pod
(every verb, with the telemetry) and per report (agents alone). Writes
`reports/bench-extender-cycle.json` (`nodes_<N>` sections).

`--per-nodes 1000 5000` measures the extender's CPU per cycle against the cluster's size, in process,
the placement code as it is beside `--baseline-ref`'s (devtools/bench_pernodes.py): the report's
`per_nodes` section.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from devtools.localserver import LocalServer
from extender.cli import UsageError
from extender.provenance import stamp
from predictor.progress import progress

GPU_MODELS = (("NVIDIA A100-SXM4-40GB", 40960.0), ("NVIDIA A100-SXM4-80GB", 81920.0), ("Tesla V100-SXM2-32GB", 32768.0),
              ("Tesla T4", 15360.0))
JOBS = (
    {"model-type": "cnn", "params-millions": "15", "batch-size": "64", "precision": "amp", "optimizer": "sgd"},
    {"model-type": "resnet", "params-millions": "25", "batch-size": "128", "precision": "fp32"},
    {"model-type": "bert", "params-millions": "110", "batch-size": "32", "input-dim": "512", "precision": "amp"},
    {"model-type": "gpt", "params-millions": "350", "batch-size": "8", "input-dim": "1024", "optimizer": "adamw"},
    {"model-type": "lstm", "params-millions": "20", "batch-size": "64", "input-dim": "128"},
    {"model-type": "vit", "params-millions": "86", "batch-size": "64", "precision": "bf16"},
    {"model-type": "mlp", "params-millions": "5", "batch-size": "256"},
    {"model-type": "transformer", "params-millions": "60", "batch-size": "32", "criticality": "high",
     "deadline": "6h"},
)
REPORTER_CONNECTIONS = 8
WARM_UP_BINDS = 200
KEYS = ("pods_per_s", "filter_p50_ms", "filter_p99_ms", "prioritize_p50_ms", "prioritize_p99_ms")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=5000, help="simulated GPU nodes (default 5000)")
    parser.add_argument("--candidates", type=int, default=500, help="node names per request (default 500)")
    parser.add_argument("--full-nodes", type=int, default=100, help="Node objects per request (default 100)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent scheduler clients (default 4)")
    parser.add_argument("--duration-s", type=float, default=15.0, help="seconds per mode and round (default 15)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of the three modes; each figure is the median over them (default 3)")
    parser.add_argument("--telemetry-rate", type=float, default=500.0, help="reports/s in the last mode")
    parser.add_argument("--predictor-factory", default="",
                        help="module:callable predictor instead of the shipped one (DEEPRES_PREDICTOR_FACTORY)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-pin", action="store_true",
                        help="let the server and the load share every CPU (default: server on CPU 0, load on the rest)")
    parser.add_argument("--cycle", type=int, nargs="+", default=[], metavar="NODES",
                        help="measure kube-scheduler's serial cycle at these cluster sizes instead (e.g. 1000 5000)")
    parser.add_argument("--cycle-pods", type=int, default=200, help="pods per cycle round (default 200)")
    parser.add_argument("--per-nodes", type=int, nargs="+", default=[], metavar="NODES",
                        help="measure the extender's CPU per cycle at these cluster sizes, in process, the code "
                             "as it is and at --baseline-ref side by side (e.g. 1000 5000): the report's per_nodes")
    parser.add_argument("--baseline-ref", default="HEAD",
                        help="git ref of the placement modules --per-nodes compares with (default HEAD)")
    parser.add_argument("--heartbeat-s", type=float, default=15.0,
                        help="each node's report period during the cycle (default 15: the chart's "
                             "agent.heartbeatSeconds)")


def run(args: argparse.Namespace) -> int:
    if (args.nodes < args.candidates or args.nodes < args.full_nodes or args.clients < 1 or args.duration_s <= 0
            or args.repeats < 1):
        raise UsageError("need --nodes >= --candidates and --full-nodes, --clients >= 1, --duration-s > 0, "
                         "--repeats >= 1")
    if args.cycle:
        return run_cycle(args)
    if args.per_nodes:
        from devtools.bench_pernodes import run_per_nodes

        return run_per_nodes(args)
    rng = random.Random(args.seed)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    args.server_cpus = set(cpus[:1]) if len(cpus) >= 2 and not args.no_pin else set()
    placement = "server, clients and agents share the CPUs"
    if args.server_cpus:
        placement = f"server on CPU {cpus[0]}, clients and agents on CPU {','.join(map(str, cpus[1:]))}"
    _progress(f"{len(cpus) or os.cpu_count()} CPUs ({placement}), load average {os.getloadavg()[0]:.1f}; "
              f"a reference loop of 1M additions takes {_reference_loop_ms():.0f} ms here")
    try:
        if args.server_cpus:  # kube-scheduler and the agents run elsewhere: the load must not take the server's CPU
            os.sched_setaffinity(0, set(cpus[1:]))
        results = _measure(args, rng)
    finally:
        if cpus:
            os.sched_setaffinity(0, set(cpus))
    results["provenance"] = stamp(
        f"deepres bench extender --nodes {args.nodes} --candidates {args.candidates} --full-nodes {args.full_nodes} "
        f"--clients {args.clients} --duration-s {args.duration_s:g} --repeats {args.repeats} "
        f"--telemetry-rate {args.telemetry_rate:g} --seed {args.seed}" + (" --no-pin" if args.no_pin else ""))
    out = Path(args.out)
    kept = json.loads(out.read_text()).get("per_nodes") if out.exists() else None
    if kept is not None:  # `--per-nodes`' section, measured apart: kept as it is
        results["per_nodes"] = kept
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'mode':<16}" + "".join(f"{k:>19}" for k in KEYS))
        for mode in ("names", "nodes", "under_telemetry"):
            print(f"{mode:<16}" + "".join(f"{results[mode][k]!s:>19}" for k in KEYS))
        print(f"server RSS {results['rss_mib']} MiB; written to {out}")
    return 0


def _measure(args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """Per round and mode a server of its own, loaded alike (telemetry, the warm-up binds), then the
    mode's load: the pods a load binds stay bound (no pod ends here), so each load starts from the
    same cluster, not from one its forerunners filled. The figures: medians over rounds."""
    names = [f"gpu-node-{i:05d}" for i in range(args.nodes)]
    cluster = _Cluster(names, rng)
    rounds: dict[str, list[dict[str, float | None]]] = {"names": [], "nodes": [], "under_telemetry": []}
    achieved = []
    rss = 0.0
    for k in progress(range(args.repeats), "rounds", unit="round"):
        for mode in rounds:
            with tempfile.TemporaryDirectory(prefix="deepres-bench-") as tmp, _Server(Path(tmp), args) as server:
                _progress(f"round {k + 1}/{args.repeats}, {mode}: telemetry for {args.nodes} nodes, "
                          f"{WARM_UP_BINDS} pods bound (the packing score's demand mix comes from admissions)")
                _post_many(server, [cluster.report(n) for n in names], threads=4)
                _bind_pods(server, names, args.candidates, rng)
                if mode == "nodes":
                    _progress(f"  {args.full_nodes} full Node objects per request, {args.duration_s:g} s")
                    rounds[mode].append(_scheduler_load(server, _node_bodies(names, args.full_nodes, rng), args,
                                                        f"o{k}"))
                    continue
                reporter = _Reporter(server, cluster, names, args.telemetry_rate) if mode != "names" else None
                _progress(f"  {args.clients} clients, {args.candidates} names per request, {args.duration_s:g} s"
                          + (f", under {args.telemetry_rate:g} telemetry reports/s" if reporter else ""))
                if reporter is not None:
                    reporter.start()
                rounds[mode].append(_scheduler_load(server, _names_bodies(names, args.candidates, rng), args,
                                                    f"{mode[0]}{k}"))
                if reporter is not None:
                    achieved.append(reporter.stop())
                rss = server.rss_mib()  # the last server's, after its load
    results: dict[str, Any] = {mode: {key: _median(r[key] for r in runs) for key in KEYS}
                               for mode, runs in rounds.items()}
    results["rss_mib"] = round(rss, 1)
    results["cluster_nodes"] = args.nodes  # the cluster size the figures (RSS included) were measured at
    _progress(f"telemetry achieved {statistics.median(achieved):.0f} reports/s; load average now "
              f"{os.getloadavg()[0]:.1f}; the reference loop now takes {_reference_loop_ms():.0f} ms")
    return results


def _median(values: Any) -> float | None:
    """The median of the rounds that have the figure (a round that sent no prioritize has none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _reference_loop_ms() -> float:
    """A fixed pure-Python workload, to tell a slow or contended host from a slow extender."""
    started = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i
    return (time.perf_counter() - started) * 1000.0


def _progress(message: str) -> None:
    print(f"[bench extender] {message}", file=sys.stderr, flush=True)


class _Server:
    """`deepres serve --no-kube` in a subprocess on a free loopback port (devtools/localserver.py),
    with the bench's environment, CPU pinning and resource readings."""

    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        self.token = "bench-" + os.urandom(8).hex()
        cpus: set[int] = getattr(args, "server_cpus", set())
        env = {"DEEPRES_TELEMETRY_TTL_S": "3600"}  # one report per node must last the bench
        if args.predictor_factory:
            env["DEEPRES_PREDICTOR_FACTORY"] = args.predictor_factory
        # cwd inherited: the server imports the tree on PYTHONPATH (scripts/bench-extender-ab.py runs two)
        self.local = LocalServer(tmp, token=self.token, env=env, ready_timeout_s=180, cwd=None,
                                 preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self.port = self.local.port
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Server:
        try:
            self.local.start()
        except RuntimeError as err:
            raise UsageError(f"the extender did not become ready (is the predictor artifact there? "
                             f"--predictor-factory picks another): {err}") from None
        self.proc = self.local.proc
        return self

    def __exit__(self, *exc: object) -> None:
        self.local.stop()

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def _pids(self) -> list[int]:
        assert self.proc is not None
        pids = [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        if children.exists():
            pids += [int(p) for p in children.read_text().split()]
        return pids

    def cpu_s(self) -> float:
        """CPU seconds the server's processes have used (user + system)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self._pids():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks

    def rss_mib(self) -> float:
        total_kib = 0
        for pid in self._pids():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        return total_kib / 1024.0


def _post(conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


class _Cluster:
    """Per node: 4 or 8 GPUs of one model, random occupancy; reports with rising sequence numbers."""

    def __init__(self, names: list[str], rng: random.Random) -> None:
        self.rng = rng
        self.shape = {n: (rng.choice(GPU_MODELS), rng.choice((4, 8))) for n in names}
        self.sequence = dict.fromkeys(names, 0)
        self.lock = threading.Lock()

    def report(self, node: str) -> bytes:
        (model, total), count = self.shape[node]
        with self.lock:
            self.sequence[node] += 1
            sequence = self.sequence[node]
            used = [self.rng.choice((0.0, 0.0, 0.25, 0.5, 0.9)) * total for _ in range(count)]
            util = [self.rng.random() for _ in range(count)]
        gpus = [{"uuid": f"GPU-{node}-{i}", "index": i, "model": model, "memory_total_mib": total,
                 "memory_used_mib": used[i], "utilization_gpu": util[i]} for i in range(count)]
        body = {"node": node, "sequence": sequence, "timestamp_s": time.time(), "agent_version": "bench",
                "source": "simulated", "gpus": gpus, "pods": []}
        return json.dumps(body).encode()


def _post_many(server: _Server, bodies: list[bytes], threads: int) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"}
    chunks = [bodies[i::threads] for i in range(threads)]

    def worker(chunk: list[bytes]) -> None:
        conn = server.connection()
        for body in chunk:
            status, text = _post(conn, "/v1/telemetry", body, headers)
            if status != 200:
                raise RuntimeError(f"telemetry refused: {status} {text[:200]!r}")
        conn.close()

    pool = [threading.Thread(target=worker, args=(c,)) for c in chunks]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def _bind_pods(server: _Server, names: list[str], candidates: int, rng: random.Random) -> None:
    """kube-scheduler's full cycle for WARM_UP_BINDS pods: filter, then bind to the first node passed."""
    conn = server.connection()
    headers = {"Content-Type": "application/json"}
    bound = 0
    for i in range(WARM_UP_BINDS):
        pod = _pod(i, rng, prefix="warm")
        status, text = _post(conn, "/filter", json.dumps(
            {"Pod": pod, "Nodes": None, "NodeNames": rng.sample(names, candidates)}).encode(), headers)
        passed = json.loads(text).get("NodeNames") or [] if status == 200 else []
        if not passed:
            continue
        meta = pod["metadata"]
        status, text = _post(conn, "/bind", json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                        "PodUID": meta["uid"], "Node": passed[0]}).encode(), headers)
        bound += status == 200 and json.loads(text).get("Error") == ""
    conn.close()
    if bound < WARM_UP_BINDS // 2:
        raise RuntimeError(f"only {bound} of {WARM_UP_BINDS} warm-up pods could be bound")


#: In the scheduler load's bodies, what each client replaces with a token of its own per pod, so
#: every pod it sends is a new one (name and uid), as kube-scheduler's are.
POD_TOKEN = "@@pod@@"


def _pod(i: int, rng: random.Random, prefix: str = "bench") -> dict[str, Any]:
    job = JOBS[i % len(JOBS)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{prefix}-train-{i}", "namespace": "ml", "uid": f"{prefix}-{i:08d}",
                         "creationTimestamp": "2026-11-21T12:00:00Z",
                         "annotations": {f"deepres.io/{k}": v for k, v in job.items()}},
            "spec": {"schedulerName": "deepres-scheduler", "containers": [{"name": "train", "image": "pytorch"}]}}


def _names_bodies(names: list[str], candidates: int, rng: random.Random) -> list[bytes]:
    return [json.dumps({"Pod": _pod(i, rng, prefix=POD_TOKEN), "Nodes": None,
                        "NodeNames": rng.sample(names, candidates)}).encode() for i in range(128)]


def _node_object(name: str) -> dict[str, Any]:
    """A Node as the API server returns it (labels, conditions, images: ~5 KB)."""
    registry = "registry.example.com/ml"
    images = [{"names": [f"{registry}/image-{k}@sha256:{k:064x}", f"{registry}/image-{k}:v1"],
               "sizeBytes": 1_000_000_000 + k} for k in range(12)]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "123456",
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64",
                                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                                "topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "p4d"},
                     "annotations": {"deepres.io/gpu-free-mib": "40960", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": "10.0.0.0/24", "providerID": f"aws:///zone-a/{name}"},
        "status": {
            "capacity": {"cpu": "96", "memory": "1152Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "95", "memory": "1140Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [{"type": t, "status": "False" if t != "Ready" else "True",
                            "lastHeartbeatTime": "2026-11-21T12:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z",
                            "reason": f"Kubelet{t}", "message": f"kubelet reports {t}"}
                           for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.34.1", "containerRuntimeVersion": "containerd://2.0.0",
                         "osImage": "Ubuntu 24.04", "kernelVersion": "6.8.0", "architecture": "amd64",
                         "operatingSystem": "linux", "machineID": "m", "systemUUID": "s", "bootID": "b",
                         "kubeProxyVersion": "v1.34.1"},
            "images": images,
        },
    }


def _node_bodies(names: list[str], count: int, rng: random.Random) -> list[bytes]:
    bodies = []
    for i in range(32):
        items = [_node_object(n) for n in rng.sample(names, count)]
        bodies.append(json.dumps({"Pod": _pod(i, rng, prefix=POD_TOKEN), "NodeNames": None,
                                  "Nodes": {"metadata": {}, "items": items}}).encode())
    return bodies


def _scheduler_load(server: _Server, bodies: list[bytes], args: argparse.Namespace,
                    tag: str) -> dict[str, float | None]:
    """Each client is a process of its own (as kube-scheduler is not a Python thread): a client
    waiting for its interpreter lock would be counted as the extender's latency. `tag`: this load's
    own, so that its pods are new to the server (no pod is sent twice in a run)."""
    context = multiprocessing.get_context("fork")
    results: Any = context.Queue()
    deadline = time.monotonic() + args.duration_s  # CLOCK_MONOTONIC: the same clock in every process
    started = time.perf_counter()
    cpu_before = server.cpu_s()
    pool = [context.Process(target=_client, args=(server, bodies, k, args.clients, deadline, results, tag))
            for k in range(args.clients)]
    for process in pool:
        process.start()
    filter_ms: list[float] = []
    prioritize_ms: list[float] = []
    bound = 0
    errors: list[str] = []
    for _ in pool:
        mine_f, mine_p, mine_bound, error = results.get(timeout=args.duration_s + 120)
        filter_ms.extend(mine_f)
        prioritize_ms.extend(mine_p)
        bound += mine_bound
        if error:
            errors.append(error)
    for process in pool:
        process.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"the extender answered with an error: {errors[0]}")
    pods = len(filter_ms)
    cpu_ms = (server.cpu_s() - cpu_before) * 1000.0 / max(pods, 1)
    _progress(f"  {pods} pods in {elapsed:.1f} s ({len(prioritize_ms)} prioritized, {bound} bound); server CPU "
              f"{cpu_ms:.2f} ms per pod (~{1000.0 / max(cpu_ms, 1e-9):.0f} pods/s per dedicated core)")
    return {
        "pods_per_s": round(pods / elapsed, 1),
        "filter_p50_ms": _percentile(filter_ms, 50), "filter_p99_ms": _percentile(filter_ms, 99),
        "prioritize_p50_ms": _percentile(prioritize_ms, 50) if prioritize_ms else None,
        "prioritize_p99_ms": _percentile(prioritize_ms, 99) if prioritize_ms else None,
    }


def _passed(answer: bytes) -> tuple[list[str], list[Any] | None]:
    """What a filter passed: the names (nodeCacheCapable) or the Node objects, from its answer."""
    result = json.loads(answer)
    nodes = result.get("Nodes")
    if isinstance(nodes, dict) and nodes.get("items") is not None:
        items = list(nodes["items"])
        return [n["metadata"]["name"] for n in items], items
    return list(result.get("NodeNames") or []), None


def _client(server: _Server, bodies: list[bytes], k: int, clients: int, deadline: float, results: Any,
            tag: str) -> None:
    """One scheduler client, kube-scheduler's cycle per pod until the deadline: a filter; a
    prioritize over what it passed when that is more than one node (kube-scheduler asks no
    extender's prioritize for a single feasible node); a bind to the best-scored node."""
    headers = {"Content-Type": "application/json"}
    conn = server.connection()
    filter_ms: list[float] = []
    prioritize_ms: list[float] = []
    bound = 0
    error = ""
    i = k
    token = POD_TOKEN.encode()
    while time.monotonic() < deadline and not error:
        pod_id = f"{tag}-{i}"
        body = bodies[i % len(bodies)].replace(token, pod_id.encode())
        i += clients
        t0 = time.perf_counter()
        status, text = _post(conn, "/filter", body, headers)
        t1 = time.perf_counter()
        if status != 200 or b'"Error":""' not in text:
            error = f"filter: {status} {text[:200]!r}"
            break
        filter_ms.append((t1 - t0) * 1000.0)
        names, items = _passed(text)
        if not names:  # unschedulable: kube-scheduler neither prioritizes nor binds
            continue
        best = names[0]
        if len(names) > 1:
            request = json.loads(body)
            request.update({"NodeNames": names, "Nodes": None} if items is None else
                           {"NodeNames": None, "Nodes": {"metadata": {}, "items": items}})
            t2 = time.perf_counter()
            status, text = _post(conn, "/prioritize", json.dumps(request).encode(), headers)
            t3 = time.perf_counter()
            if status != 200:
                error = f"prioritize: {status} {text[:200]!r}"
                break
            prioritize_ms.append((t3 - t2) * 1000.0)
            scores = json.loads(text)
            if scores:  # kube-scheduler: the highest score, the first of equals
                best = max(scores, key=lambda entry: entry["Score"])["Host"]
        meta = json.loads(body)["Pod"]["metadata"]
        status, text = _post(conn, "/bind", json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                        "PodUID": meta["uid"], "Node": best}).encode(), headers)
        if status != 200:
            error = f"bind: {status} {text[:200]!r}"
            break
        bound += json.loads(text).get("Error") == ""
    conn.close()
    results.put((filter_ms, prioritize_ms, bound, error))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))], 2)


class _Reporter:
    """Agents posting at a fixed total rate over several connections, each report a fresh sequence, from a
    process of their own (agents run on other machines: not the clients' CPU time or interpreter lock)."""

    def __init__(self, server: _Server, cluster: _Cluster, names: list[str], rate: float) -> None:
        self.server, self.cluster, self.names, self.rate = server, cluster, names, rate
        context = multiprocessing.get_context("fork")
        self.stop_event = context.Event()
        self.ready = context.Event()  # the first report is in: the agents run (a fork can outlast a short cycle)
        self.sent: Any = context.Value("l", 0)
        self.process = context.Process(target=self._run, daemon=True)
        self.started = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        self.process.start()
        self.ready.wait(timeout=60)

    def _run(self) -> None:
        threads = [threading.Thread(target=self._loop, args=(k, REPORTER_CONNECTIONS))
                   for k in range(REPORTER_CONNECTIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _loop(self, k: int, of: int) -> None:
        conn = self.server.connection()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.server.token}"}
        interval = of / self.rate
        next_at = time.perf_counter()
        i = k
        while not self.stop_event.is_set():
            body = self.cluster.report(self.names[i % len(self.names)])
            i += of
            _post(conn, "/v1/telemetry", body, headers)
            with self.sent.get_lock():
                self.sent.value += 1
            self.ready.set()
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                self.stop_event.wait(delay)
        conn.close()

    def stop(self) -> float:
        self.stop_event.set()
        self.process.join(timeout=30)
        return int(self.sent.value) / max(time.perf_counter() - self.started, 1e-9)


# ---- kube-scheduler's serial cycle (--cycle) ----

CYCLE_KEYS = ("filter_p50_ms", "filter_p99_ms", "prioritize_p50_ms", "prioritize_p99_ms", "bind_p50_ms",
              "bind_p99_ms", "server_cpu_ms_per_pod", "server_cpu_ms_per_report", "reports_per_s")
CYCLE_GPU_MIB = 81920.0


def run_cycle(args: argparse.Namespace) -> int:
    """`--cycle`: per cluster size, a server of its own, `--repeats` rounds; each figure the median."""
    if args.cycle_pods < 10 or args.repeats < 1 or min(args.cycle) < 10 or args.heartbeat_s <= 0:
        raise UsageError("--cycle sizes >= 10, --cycle-pods >= 10, --repeats >= 1, --heartbeat-s > 0")
    out = Path(args.out if args.out != "reports/bench-extender.json" else "reports/bench-extender-cycle.json")
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    _progress(f"load average {os.getloadavg()[0]:.1f}; a reference loop of 1M additions takes "
              f"{_reference_loop_ms():.0f} ms here")
    for nodes in args.cycle:
        with tempfile.TemporaryDirectory(prefix="deepres-bench-") as tmp, _Server(Path(tmp), args) as server:
            names = [f"gpu-{i:05d}" for i in range(nodes)]
            fleet = _Fleet(names)
            _post_many(server, [fleet.report(n) for n in names], threads=4)
            rounds = [cycle_round(server, names, fleet, args, k) for k in range(args.repeats)]
            section: dict[str, Any] = {"nodes": nodes, "pods_per_round": args.cycle_pods, "rounds": args.repeats,
                                       "heartbeat_s": args.heartbeat_s}
            section.update({key: None if (m := _median(r[key] for r in rounds)) is None else round(m, 3)
                            for key in CYCLE_KEYS})
            section["rss_mib"] = round(server.rss_mib(), 1)
        section["load_average_1m"] = round(os.getloadavg()[0], 2)
        results[f"nodes_{nodes}"] = section
        _progress(f"{nodes} nodes: " + ", ".join(f"{k} {section[k]}" for k in CYCLE_KEYS))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2) if args.json else f"written to {out}")
    return 0


def cycle_round(server: _Server, names: list[str], fleet: _Fleet, args: argparse.Namespace,
                k: int) -> dict[str, float | None]:
    """A report from each of (at most 1,000) nodes as fast as they go (CPU per report), then
    `--cycle-pods` pods one at a time while the agents report at the heartbeat's rate."""
    burst = names[: min(len(names), 1000)]
    bodies = [fleet.report(n) for n in burst]
    cpu0 = server.cpu_s()
    _post_many(server, bodies, threads=4)
    per_report_ms = (server.cpu_s() - cpu0) * 1000.0 / len(bodies)
    agents = _Reporter(server, fleet, names, len(names) / args.heartbeat_s)
    agents.start()
    rng = random.Random(k)
    conn = server.connection()
    headers = {"Content-Type": "application/json"}
    verbs: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    cpu_start = server.cpu_s()
    for i in range(args.cycle_pods):
        pod = _scheduler_pod(f"cycle-{k}-{i}")
        order = names[:]
        rng.shuffle(order)  # kube-scheduler's parallel filters collect the feasible nodes in no fixed order
        t0 = time.perf_counter()
        status, answer = _post(conn, "/filter", json.dumps({"Pod": pod, "NodeNames": order}).encode(), headers)
        t1 = time.perf_counter()
        passed = json.loads(answer).get("NodeNames") or [] if status == 200 else []
        if not passed:
            raise RuntimeError(f"the filter passed no node: {status} {answer[:200]!r}")
        best = passed[0]
        if len(passed) > 1:  # kube-scheduler asks no prioritize of a single feasible node
            body = json.dumps({"Pod": pod, "NodeNames": passed}).encode()
            t2 = time.perf_counter()
            status, answer = _post(conn, "/prioritize", body, headers)
            t3 = time.perf_counter()
            best = max(json.loads(answer), key=lambda entry: entry["Score"])["Host"]
            verbs["prioritize"].append((t3 - t2) * 1000.0)
        meta = pod["metadata"]
        body = json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                           "Node": best}).encode()
        t4 = time.perf_counter()
        status, answer = _post(conn, "/bind", body, headers)
        t5 = time.perf_counter()
        if status != 200 or json.loads(answer).get("Error"):
            raise RuntimeError(f"bind failed: {status} {answer[:200]!r}")
        for verb, ms in (("filter", t1 - t0), ("bind", t5 - t4)):
            verbs[verb].append(ms * 1000.0)
    cpu_ms = (server.cpu_s() - cpu_start) * 1000.0
    reports_per_s = agents.stop()
    conn.close()
    figures = {f"{verb}_{q}_ms": _percentile(values, p) if values else None for verb, values in verbs.items()
               for q, p in (("p50", 50), ("p99", 99))}
    figures.update(server_cpu_ms_per_pod=round(cpu_ms / args.cycle_pods, 3),
                   server_cpu_ms_per_report=round(per_report_ms, 3), reports_per_s=round(reports_per_s, 1))
    _progress(f"  {len(names)} nodes, round {k + 1}: " + ", ".join(f"{key} {figures[key]}" for key in CYCLE_KEYS))
    return figures


class _Fleet(_Cluster):
    """The cycle's nodes: 8 empty 80 GB GPUs each (`deepres bench cluster`'s), reports with rising
    sequence numbers and one boot id per node, utilisation moving as a live GPU's does."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names, random.Random(0))
        self.boot = os.urandom(8).hex()

    def report(self, node: str) -> bytes:
        with self.lock:
            self.sequence[node] += 1
            sequence = self.sequence[node]
            util = [round(self.rng.random(), 2) for _ in range(8)]
        gpus = [{"uuid": f"GPU-{node}-{i}", "index": i, "model": "NVIDIA A100-SXM4-80GB",
                 "memory_total_mib": CYCLE_GPU_MIB, "memory_used_mib": 0.0, "utilization_gpu": util[i]}
                for i in range(8)]
        return json.dumps({"node": node, "sequence": sequence, "timestamp_s": time.time(), "agent_version": "bench",
                           "source": "simulated", "gpus": gpus, "pods": [], "boot_id": self.boot}).encode()


def _scheduler_pod(name: str) -> dict[str, Any]:
    """A pod as kube-scheduler sends it to an extender: the API server's object, defaults and all."""
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"deepres-bench/{name}"))
    return {
        "metadata": {
            "name": name, "namespace": "deepres-bench", "uid": uid, "resourceVersion": "100000",
            "creationTimestamp": "2026-11-24T08:00:00Z",
            "annotations": {"deepres.io/gpu-memory": "10Gi", "deepres.io/criticality": "normal"},
            "managedFields": [{"manager": "OpenAPI-Generator", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-24T08:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {
                                   "f:metadata": {"f:annotations": {".": {}, "f:deepres.io/criticality": {},
                                                                    "f:deepres.io/gpu-memory": {}}},
                                   "f:spec": {"f:containers": {'k:{"name":"c"}': {".": {}, "f:command": {},
                                                                                   "f:image": {}, "f:name": {}}},
                                              "f:schedulerName": {}}}}]},
        "spec": {
            "volumes": [{"name": "kube-api-access-x1", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                            "volumeMounts": [{"name": "kube-api-access-x1", "readOnly": True,
                                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                            "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 0, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "schedulerName": "deepres-scheduler", "priority": 0,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
