"""`deepres bench cluster`: pods through the real kube-scheduler + deepres on a local control plane.

The end-to-end figure: kube-apiserver, etcd and kube-scheduler (extender.localcluster) with N kwok
nodes of 8 simulated 80 GB GPUs each; the extender (`deepres serve`, cluster mode) with one report per
node posted from this process under a token bound to that node (as the agents' projected tokens are).
Per client-limit setting (kube-scheduler's defaults, qps 50 / burst 100; and `--kube-api-qps 500`),
`--pods` GPU pods are created at once and placed by kube-scheduler with the chart's
KubeSchedulerConfiguration (`helm template`, extender included), then the same number of plain pods by
the same configuration without the extender. Latency: from the pod's creation (client clock) to the
watch showing it bound. Extender CPU: utime+stime of the extender's processes during the GPU phase,
per placed pod; per verb: the extender's own time per call (its request histogram).
The machine is shared by everything above: the figures are for this machine, not a cluster.
Writes reports/bench-cluster.json (`nodes_<N>` sections).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from extender.cli import UsageError
from extender.localcluster import REPO, ControlPlane, env_for, free_port, start_process, stop_pid

GPU_MODEL, GPU_MEMORY_MIB, GPUS_PER_NODE = "NVIDIA A100-SXM4-80GB", 81920.0, 8
BENCH_NS = "deepres-bench"
AGENT_SA = "agent"
AUDIENCE = "deepres-extender"
HIGH_QPS = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000], help="cluster sizes (default 1000)")
    parser.add_argument("--pods", type=int, default=1000, help="GPU pods, then plain pods, per run (default 1000)")
    parser.add_argument("--keep", default="", help="keep the control plane's folder (logs) here")


def _progress(message: str) -> None:
    print(f"bench cluster: {message}", file=sys.stderr, flush=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _cpu_s(pid: int) -> float:
    """utime+stime of `pid` and its children alive now (the extender's server and workers)."""
    total = 0
    ticks = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    for child in Path(f"/proc/{pid}/task").iterdir():
        children = child / "children"
        if children.exists():
            pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def _scheduler_config(extender_port: int, kubeconfig: Path, qps: int, with_extender: bool) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration (helm template), pointed at this extender and API server."""
    helm = str(Path(sys.executable).with_name("helm"))
    rendered = subprocess.run(
        [helm, "template", "deepres", str(REPO / "helm" / "deepres"), "--show-only",
         "templates/scheduler/configmap.yaml", "--set", f"extender.port={extender_port}",
         "--set", "scheduler.leaderElection.enabled=false"],
        capture_output=True, text=True, check=True).stdout
    config: dict[str, Any] = yaml.safe_load(yaml.safe_load(rendered)["data"]["scheduler-config.yaml"])
    config["clientConnection"] = {"kubeconfig": str(kubeconfig), "qps": qps, "burst": 2 * qps}
    if not with_extender:
        config.pop("extenders", None)
    return config


def _pod(name: str, gpu: bool) -> dict[str, Any]:
    annotations = {"deepres.io/gpu-memory": "10Gi", "deepres.io/criticality": "normal"} if gpu else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": BENCH_NS, "annotations": annotations},
            "spec": {"schedulerName": "deepres-scheduler", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}


class _Run:
    """One control plane with N nodes, the extender, and its simulated agents."""

    def __init__(self, root: Path, nodes: int) -> None:
        client: Any = importlib.import_module("kubernetes.client")
        config: Any = importlib.import_module("kubernetes.config")
        self.plane = ControlPlane(root).start(log=_progress)
        configuration = client.Configuration()
        config.load_kube_config(str(self.plane.admin_kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 32  # the 16 threads creating pods keep their connections
        self.api: Any = client.ApiClient(configuration)
        self.core: Any = client.CoreV1Api(self.api)
        self.client: Any = client
        self.names = [f"gpu-{i:05d}" for i in range(nodes)]
        self.extender_port = free_port()
        self.extender_pid = 0
        self.scheduler_pid = 0

    def setup(self) -> None:
        c = self.client
        self.core.create_namespace({"metadata": {"name": BENCH_NS}})
        self.core.create_namespaced_service_account(BENCH_NS, {"metadata": {"name": AGENT_SA}})
        _progress(f"creating {len(self.names)} nodes")
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "", "labels": {"type": "kwok"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}
        self._parallel([lambda n=n: self.core.create_node({**body, "metadata": {**body["metadata"], "name": n}})
                        for n in self.names])
        env = env_for(self.plane.admin_kubeconfig)
        env.update(DEEPRES_SCHEDULER_NAME="deepres-scheduler", DEEPRES_TOKEN_AUDIENCE=AUDIENCE,
                   DEEPRES_AGENT_SERVICE_ACCOUNTS=json.dumps([f"system:serviceaccount:{BENCH_NS}:{AGENT_SA}"]),
                   DEEPRES_TELEMETRY_TTL_S="3600")
        self.extender_pid = start_process("extender", [
            sys.executable, "-m", "extender.cli", "serve", "--bind", f"127.0.0.1:{self.extender_port}",
            "--log-level", "warning"], self.plane.logs, env, cwd=REPO).pid
        deadline = time.monotonic() + 180
        while self._http("/readyz")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the extender never turned ready; see {self.plane.logs}/extender.log")
            time.sleep(0.5)
        _progress(f"tokens and telemetry for {len(self.names)} nodes")
        node_uids = {n.metadata.name: n.metadata.uid for n in self.core.list_node().items}
        tokens: dict[str, str] = {}

        def token(name: str) -> None:
            spec = c.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=7200,
                                        bound_object_ref=c.V1BoundObjectReference(
                                            api_version="v1", kind="Node", name=name, uid=node_uids[name]))
            tokens[name] = self.core.create_namespaced_service_account_token(
                AGENT_SA, BENCH_NS, c.AuthenticationV1TokenRequest(spec=spec)).status.token

        self._parallel([lambda n=n: token(n) for n in self.names])
        self._parallel([lambda n=n: self._report(n, tokens[n]) for n in self.names])

    def _report(self, node: str, token: str) -> None:
        gpus = [{"uuid": f"GPU-{node}-{i}", "index": i, "model": GPU_MODEL,
                 "memory_total_mib": GPU_MEMORY_MIB, "memory_used_mib": 0.0, "utilization_gpu": 0.0}
                for i in range(GPUS_PER_NODE)]
        body = json.dumps({"node": node, "sequence": int(time.time() * 1000), "timestamp_s": time.time(),
                           "agent_version": "bench", "source": "simulated", "gpus": gpus, "pods": []}).encode()
        status, text = self._http("/v1/telemetry", body, {"Authorization": f"Bearer {token}"})
        if status != 200:
            raise RuntimeError(f"telemetry for {node} refused: {status} {text[:200]!r}")

    def _http(self, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.extender_port}{path}", data=body,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode(errors="replace")
        except OSError:
            return 0, ""

    @staticmethod
    def _parallel(calls: list[Any], threads: int = 16) -> None:
        errors: list[BaseException] = []

        def work(chunk: list[Any]) -> None:
            for call in chunk:
                try:
                    call()
                except BaseException as err:
                    errors.append(err)
                    return

        pool = [threading.Thread(target=work, args=(calls[i::threads],)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]

    def phase(self, label: str, pods: int, qps: int, gpu: bool) -> dict[str, float]:
        """Start kube-scheduler with the chart's config, create `pods` pods at once, wait until all are bound."""
        config = _scheduler_config(self.extender_port, self.plane.root / "kube-scheduler.kubeconfig", qps, gpu)
        config_file = self.plane.root / f"scheduler-{label}.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.scheduler_pid = start_process(f"kube-scheduler-{label}", [
            str(self.plane.bin_dir / "kube-scheduler"), f"--config={config_file}", "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}", "--v=1"], self.plane.logs).pid
        time.sleep(3)  # informers synced
        names = [f"{label}-{i:05d}" for i in range(pods)]
        created: dict[str, float] = {}
        bound: dict[str, float] = {}
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_binds, args=(set(names), bound, done), daemon=True)
        watcher.start()
        time.sleep(0.5)
        cpu0 = _cpu_s(self.extender_pid)
        start = time.monotonic()

        def create(name: str) -> None:
            self.core.create_namespaced_pod(BENCH_NS, _pod(name, gpu))
            created[name] = time.monotonic()

        self._parallel([lambda n=n: create(n) for n in names])
        if not done.wait(max(600.0, pods)):
            raise RuntimeError(f"{label}: only {len(bound)} of {pods} pods bound")
        elapsed = max(bound.values()) - start
        cpu = _cpu_s(self.extender_pid) - cpu0
        stop_pid(self.scheduler_pid)
        checks = self.gpu_check() if gpu else {}
        latencies = [bound[n] - created[n] for n in names]
        result = {"pods_per_s": round(pods / elapsed, 1), "latency_p50_s": round(_percentile(latencies, 0.5), 2),
                  "latency_p99_s": round(_percentile(latencies, 0.99), 2)}
        if gpu:
            result["extender_cpu_ms_per_pod"] = round(1000 * cpu / pods, 2)
            result.update(checks)
        _progress(f"{label}: {result}")
        self.core.delete_collection_namespaced_pod(BENCH_NS, grace_period_seconds=0)
        while self.core.list_namespaced_pod(BENCH_NS, limit=1).items:
            time.sleep(1)
        return result

    def _watch_binds(self, names: set[str], bound: dict[str, float], done: threading.Event) -> None:
        """Record when each pod is first seen bound; a watch that ends or fails is resumed from a relist."""
        watch: Any = importlib.import_module("kubernetes.watch")

        def seen(pod: Any) -> None:
            if pod.metadata.name in names and pod.spec.node_name and pod.metadata.name not in bound:
                bound[pod.metadata.name] = time.monotonic()
                if len(bound) == len(names):
                    done.set()

        while not done.is_set():
            try:
                listed = self.core.list_namespaced_pod(BENCH_NS)
                for pod in listed.items:
                    seen(pod)
                for event in watch.Watch().stream(self.core.list_namespaced_pod, BENCH_NS, timeout_seconds=60,
                                                  resource_version=listed.metadata.resource_version):
                    seen(event["object"])
                    if done.is_set():
                        return
            except Exception as err:  # the measurement goes on from a relist
                _progress(f"bind watch ended ({err}); relisting")
                time.sleep(0.5)

    def gpu_check(self) -> dict[str, int]:
        """GPU pods not placed, and GPUs booked beyond their memory (from the pods' own annotations)."""
        booked: dict[str, float] = {}
        unplaced = 0
        for pod in self.core.list_namespaced_pod(BENCH_NS).items:
            annotations = pod.metadata.annotations or {}
            gpus = annotations.get("deepres.io/assigned-gpus", "")
            if not pod.spec.node_name or not gpus:
                unplaced += 1
                continue
            for uuid in gpus.split(","):
                booked[uuid] = booked.get(uuid, 0.0) + float(annotations["deepres.io/admission-memory-mib"])
        over = sum(1 for b in booked.values() if b > GPU_MEMORY_MIB)
        return {"gpu_pods_unplaced": unplaced, "gpus_overcommitted": over}

    def verb_ms(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        _, text = self._http("/metrics")
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                verb = s.labels.get("verb", "")
                if not verb or family.name != "deepres_extender_request_seconds":
                    continue
                if s.name.endswith("_sum"):
                    sums[verb] = sums.get(verb, 0.0) + s.value
                elif s.name.endswith("_count"):
                    counts[verb] = counts.get(verb, 0.0) + s.value
        return {v: round(1000 * sums[v] / counts[v], 2) for v in sums if counts.get(v)}

    def close(self) -> None:
        if self.extender_pid:
            stop_pid(self.extender_pid)
        self.plane.stop()


def run(args: argparse.Namespace) -> int:
    if args.pods < 10:
        raise UsageError(f"--pods must be at least 10, got {args.pods}")
    report: dict[str, Any] = {}
    out = Path(args.out)
    if out.exists():
        report = json.loads(out.read_text())
    for nodes in args.nodes:
        root = Path(args.keep) / f"nodes-{nodes}" if args.keep else Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        bench = _Run(root, nodes)
        section: dict[str, Any] = {"nodes": nodes, "pods": args.pods, "gpus_per_node": GPUS_PER_NODE}
        try:
            bench.setup()
            for limits, qps in (("default_limits", 50), ("high_qps", HIGH_QPS)):
                gpu = bench.phase(f"gpu-{limits.replace('_', '-')}", args.pods, qps, gpu=True)
                plain = bench.phase(f"plain-{limits.replace('_', '-')}", args.pods, qps, gpu=False)
                section[limits] = {
                    "kube_api_qps": qps,
                    "gpu_pods_per_s": gpu["pods_per_s"], "plain_pods_per_s": plain["pods_per_s"],
                    "ratio": round(gpu["pods_per_s"] / plain["pods_per_s"], 2),
                    "gpu_latency_p50_s": gpu["latency_p50_s"], "gpu_latency_p99_s": gpu["latency_p99_s"],
                    "plain_latency_p50_s": plain["latency_p50_s"], "plain_latency_p99_s": plain["latency_p99_s"],
                    "extender_cpu_ms_per_pod": gpu["extender_cpu_ms_per_pod"],
                    "gpu_pods_unplaced": int(gpu["gpu_pods_unplaced"]),
                    "gpus_overcommitted": int(gpu["gpus_overcommitted"]),
                }
            section["extender_cpu_ms_per_pod"] = section["default_limits"]["extender_cpu_ms_per_pod"]
            section["extender_ms_per_call"] = bench.verb_ms()
            section["load_average_1m"] = round(os.getloadavg()[0], 2)
        finally:
            bench.close()
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        report[f"nodes_{nodes}"] = section
        print(json.dumps({f"nodes_{nodes}": section}, indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(s.get("default_limits", {}).get("gpu_pods_unplaced", 1) == 0 for s in
                    (report[f"nodes_{n}"] for n in args.nodes)) else 1
