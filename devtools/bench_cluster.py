"""`deepres bench cluster`: pods through the real kube-scheduler + deepres on a local control plane.

The end-to-end figure: kube-apiserver, etcd and kube-scheduler (devtools.localcluster) with N kwok
nodes of 8 simulated 80 GB GPUs each; the extender (`deepres serve`, cluster mode, default settings)
and the simulated agents of every node from this process: each node reports every `--heartbeat-s`
(the chart's agent.heartbeatSeconds, 15 s), spread evenly, under a token bound to that node (as the
agents' projected tokens are), so the extender's default telemetry TTL (30 s) holds.
Per client-limit setting (kube-scheduler's defaults, qps 50 / burst 100; and `--kube-api-qps 500`),
`--pods` plain pods are created at once and placed by kube-scheduler with the chart's
KubeSchedulerConfiguration (`helm template`) without the extender, then as many GPU pods by the same
configuration with it; the verbs go over plain HTTP to the main port (`--verbs-access loopback`, the
default, as the earlier reports ran), or as the chart's default sidecar sends them (`--verbs-access
mtls`: to the extender's own listener, `server.scheduler_bind`, over TLS with kube-scheduler's client
certificate, the per-pod certificates made here by `deepres pod-certs`), or over plain HTTP to that
listener (`--verbs-access listener`: not a chart setting; measured against loopback in
docs/benchmarks.md, "Fourth pass"). The plain phases run first,
with the agents silent and no pod of the extender's scheduler (what a cluster without deepres has);
the agents start before the GPU phases.
Latency: from the pod's creation (client clock) to the watch showing it bound. CPU: utime+stime of
every process over each phase (the extender's process tree, kube-scheduler, kube-apiserver, etcd,
kwok, kube-controller-manager, and this process: the pod creator, the watch, the agents), per
placed pod; per verb: the extender's own time per call during the GPU phase (its request
histogram). This process parses no API objects into models (raw JSON), so that the harness takes
as little of the machine as it can. The machine is shared by everything above: the figures are for
this machine, not a cluster. Writes reports/bench-cluster.json (`nodes_<N>` sections; a run of some
sizes or limits replaces only those in the file). `--api-accounting FILE` also counts what each
client asks of kube-apiserver per pod (devtools.bench_api).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import yaml

from devtools import bench_api, pyspy
from devtools import bench_cluster_readings as readings
from devtools import bench_cluster_rounds as rounds_figures
from devtools.bench_cluster_agents import GPU_MEMORY_MIB, GPUS_PER_NODE, _Agents, _report_body
from devtools.localcluster import REPO, ControlPlane, env_for, free_port, start_process, stop_pid
from extender.cli import UsageError
from extender.server import podcerts
from predictor.progress import Bar, say

BENCH_NS = "deepres-bench"
AGENT_SA = "agent"
AUDIENCE = "deepres-extender"
GPU_SCHEDULER = "deepres-scheduler"
#: the plain phases' profile: the chart's, renamed, so the extender's pod watch never sees plain pods
PLAIN_SCHEDULER = "plain-scheduler"
#: How kube-scheduler reaches the verbs (`--verbs-access`).
VERBS_PATHS = ("loopback", "mtls", "listener")
LIMITS = {"default_limits": 50, "high_qps": 500}
#: Rounds per cluster size: a round's phases are a few seconds each on this machine, and identical
#: runs of one tree gave ratios from 0.57 to 0.85 (docs/benchmarks.md): one round is one draw.
REPEATS = 3
HEARTBEAT_S = 15.0  # helm/deepres/values.yaml agent.heartbeatSeconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000], help="cluster sizes (default 1000 5000)")
    parser.add_argument("--pods", type=int, default=1000, help="plain pods, then GPU pods, per run (default 1000)")
    parser.add_argument("--limits", nargs="+", choices=sorted(LIMITS), default=list(LIMITS),
                        help="client-limit settings to run (default both); others keep their figures in the report")
    parser.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_S,
                        help="seconds between two reports of one simulated agent (default 15, the chart's)")
    parser.add_argument("--verbs-access", choices=VERBS_PATHS, default="loopback",
                        help="how kube-scheduler calls the verbs: loopback (default: plain HTTP to the main port), "
                             "mtls (the chart's default: the extender's own listener, TLS with a client certificate) "
                             "or listener (plain HTTP to that listener, server.scheduler_bind with verbs_access "
                             "loopback: not a chart setting)")
    parser.add_argument("--order", choices=("plain-first", "gpu-first"), default="plain-first",
                        help="which kind of pods goes first (default plain-first: the plain phases, then the agents "
                             "start and the GPU phases); gpu-first runs the GPU phases first and stops the agents "
                             "before the plain ones, to see what the phases' order does to the comparison")
    parser.add_argument("--repeats", type=int, default=REPEATS, metavar="N",
                        help=f"rounds per cluster size (default {REPEATS}): the plain phases, then the GPU phases, "
                             "N times on one control plane, the agents stopped between rounds; the report shows the "
                             "round whose ratio is the median and lists every round")
    parser.add_argument("--floor", action="store_true",
                        help="the extender with its placement rule taken out (devtools/floor_extender.py: each GPU "
                             "pod's filter names one offered node in turn): what everything but the rule costs per "
                             "pod; not the benchmark's figures, so --out must name another file")
    parser.add_argument("--with-floor", action="store_true",
                        help="after the rounds, on the same control plane, the floor extender (--floor's) through "
                             "the GPU phases at the default limits, once per round: extender_cpu_ms_per_pod_floor")
    parser.add_argument("--keep", default="", help="keep the control plane's folder (logs) here")
    parser.add_argument("--profile", default="", metavar="FILE",
                        help="sample the extender's processes with py-spy during the GPU phases and write their "
                             "collapsed stacks to FILE.N.txt (N: the node count; py-spy must be on PATH or beside "
                             "the interpreter)")
    parser.add_argument("--api-accounting", default="", metavar="FILE",
                        help="audit kube-apiserver and write each client's requests and the watch events per pod "
                             "(and in idle windows) to FILE; timings of such a run are not the benchmark's")


def _progress(message: str) -> None:
    say(f"bench cluster: {message}")  # above the bar


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _scheduler_config(ports: tuple[int, int], kubeconfig: Path, qps: int, with_extender: bool,
                      verbs_access: str = "loopback", client_dir: Path | None = None) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration (helm template), pointed at this extender and API server;
    without the extender, its profile is renamed PLAIN_SCHEDULER and nothing else changes. `ports`:
    the extender's main port and its scheduler's listener. With `verbs_access` mtls (the chart's
    default, sidecar mode) the verbs go to the scheduler's listener over TLS with kube-scheduler's
    client certificate, the per-pod files (`deepres pod-certs`) at `client_dir` instead of the pod's
    mount; with loopback, over plain HTTP to the main port (granian); with listener, to the listener."""
    helm = str(Path(sys.executable).with_name("helm"))
    access = [] if verbs_access == "mtls" else ["--set", "extender.verbsAccess=loopback"]
    rendered = subprocess.run(
        [helm, "template", "deepres", str(REPO / "helm" / "deepres"), "--show-only",
         "templates/scheduler/configmap.yaml", "--set", f"extender.port={ports[0]}",
         "--set", f"extender.schedulerPort={ports[1]}", "--set", "scheduler.leaderElection.enabled=false", *access],
        capture_output=True, text=True, check=True).stdout
    config: dict[str, Any] = yaml.safe_load(yaml.safe_load(rendered)["data"]["scheduler-config.yaml"])
    for extender in config.get("extenders") or ():
        tls = extender.get("tlsConfig")
        if tls and client_dir is not None:  # the pod's mount -> this run's files
            extender["tlsConfig"] = {k: str(client_dir / Path(v).name) for k, v in tls.items()}
        if verbs_access == "listener":
            extender["urlPrefix"] = f"http://127.0.0.1:{ports[1]}"
    config["clientConnection"] = {"kubeconfig": str(kubeconfig), "qps": qps, "burst": 2 * qps}
    if not with_extender:
        config.pop("extenders", None)
        for profile in config["profiles"]:
            profile["schedulerName"] = PLAIN_SCHEDULER
    return config


def _pod(name: str, gpu: bool) -> dict[str, Any]:
    annotations = {"deepres.io/gpu-memory": "10Gi", "deepres.io/criticality": "normal"} if gpu else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": BENCH_NS, "annotations": annotations},
            "spec": {"schedulerName": GPU_SCHEDULER if gpu else PLAIN_SCHEDULER, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}


class _Run:
    """One control plane with N nodes, the extender, and its simulated agents."""

    def __init__(self, root: Path, nodes: int, heartbeat_s: float, accounting: str = "",
                 verbs_access: str = "loopback", floor: bool = False) -> None:
        client: Any = importlib.import_module("kubernetes.client")
        config: Any = importlib.import_module("kubernetes.config")
        audit = bench_api.apiserver_args(root / "audit") if accounting else []
        self.plane = ControlPlane(root, extra_apiserver_args=audit).start(log=_progress)
        self.accounting = bench_api.Accounting(Path(accounting), root / "audit" / "audit.log",
                                               lambda: self.plane.get("/metrics", timeout_s=30), self._cpu,
                                               lambda path, timeout_s: self.plane.get(path, timeout_s=timeout_s),
                                               ) if accounting else None
        # the control plane's own default kube-scheduler plays no part here: stopped, not measured
        self.plane.stop_one("kube-scheduler")
        configuration = client.Configuration()
        config.load_kube_config(str(self.plane.admin_kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 32  # the 16 threads creating pods keep their connections
        self.api: Any = client.ApiClient(configuration)
        self.api.user_agent = bench_api.BENCH_AGENT  # tells this process's requests from the extender's
        self.core: Any = client.CoreV1Api(self.api)
        self.client: Any = client
        self.names = [f"gpu-{i:05d}" for i in range(nodes)]
        self.heartbeat_s = heartbeat_s
        self.extender_port = free_port()
        self.scheduler_port = free_port()  # the extender's listener for kube-scheduler (server.scheduler_bind)
        self.verbs_access = verbs_access
        self.floor = floor
        self.pod_tls = root / "pod-tls"  # what the chart's init container makes in the pod (deepres pod-certs)
        self.extender_pid = 0
        self._env_access: tuple[dict[str, str], list[str]] = ({}, [])  # the extender's (setup)
        self.scheduler_pid = 0
        self.tokens: dict[str, str] = {}
        self.agents: _Agents | None = None
        self.agents_stopped = False
        self.profile_s: dict[str, float] = {}  # --api-accounting: seconds of the API server's profile per phase

    def setup(self) -> None:
        c = self.client
        self.core.create_namespace({"metadata": {"name": BENCH_NS}})
        self.core.create_namespaced_service_account(BENCH_NS, {"metadata": {"name": AGENT_SA}})
        _progress(f"creating {len(self.names)} nodes")
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "", "labels": {"type": "kwok"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}
        self._parallel([lambda n=n: self.core.create_node({**body, "metadata": {**body["metadata"], "name": n}},
                                                          _preload_content=False).data for n in self.names])
        env = env_for(self.plane.admin_kubeconfig)
        env.update(DEEPRES_SCHEDULER_NAME=GPU_SCHEDULER, DEEPRES_TOKEN_AUDIENCE=AUDIENCE,
                   DEEPRES_AGENT_SERVICE_ACCOUNTS=json.dumps([f"system:serviceaccount:{BENCH_NS}:{AGENT_SA}"]))
        access: list[str] = []
        if self.verbs_access == "mtls":  # as the chart's default sidecar runs it
            podcerts.make(self.pod_tls / "extender", self.pod_tls / "scheduler")
            env.update(DEEPRES_SCHEDULER_BIND=f"127.0.0.1:{self.scheduler_port}",
                       DEEPRES_SCHEDULER_TLS_CERT=str(self.pod_tls / "extender" / "tls.crt"),
                       DEEPRES_SCHEDULER_TLS_KEY=str(self.pod_tls / "extender" / "tls.key"))
            access = ["--verbs-access", "mtls", "--tls-client-ca", str(self.pod_tls / "extender" / "ca.crt")]
        elif self.verbs_access == "listener":  # plain HTTP on the scheduler's listener (verbs_access loopback)
            env.update(DEEPRES_SCHEDULER_BIND=f"127.0.0.1:{self.scheduler_port}")
        self._env_access = (env, access)
        self.start_extender(self.floor)
        _progress(f"tokens for {len(self.names)} nodes")
        listed = json.loads(self.core.list_node(_preload_content=False).data)
        node_uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in listed["items"]}

        def token(name: str) -> None:
            spec = c.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=7200,
                                        bound_object_ref=c.V1BoundObjectReference(
                                            api_version="v1", kind="Node", name=name, uid=node_uids[name]))
            self.tokens[name] = self.core.create_namespaced_service_account_token(
                AGENT_SA, BENCH_NS, c.AuthenticationV1TokenRequest(spec=spec)).status.token

        self._parallel([lambda n=n: token(n) for n in self.names])

    def start_extender(self, floor: bool) -> None:
        """`deepres serve` (or the floor extender) in cluster mode, ready (its pod watch synced)."""
        env, access = self._env_access
        self.extender_pid = start_process("extender-floor" if floor else "extender", [
            sys.executable, "-m", "devtools.floor_extender" if floor else "extender.cli", "serve",
            "--bind", f"127.0.0.1:{self.extender_port}",
            "--log-level", "warning", *access], self.plane.logs, env, cwd=REPO).pid
        deadline = time.monotonic() + 180
        while self._http("/readyz")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the extender never turned ready; see {self.plane.logs}/extender.log")
            time.sleep(0.5)

    def floor_instead(self) -> None:
        """--with-floor: the floor extender in place of the real one (on its port), its agents anew."""
        self.stop_agents()
        stop_pid(self.extender_pid)
        self.start_extender(floor=True)
        self.agents = None
        self.start_agents()

    def start_agents(self) -> None:
        """Every node reports now (as agents starting up do), then each every heartbeat (again after
        `stop_agents`: the reports of a pause are stale)."""
        if self.agents is not None and not self.agents_stopped:
            return
        self.agents_stopped = False
        _progress(f"telemetry for {len(self.names)} nodes, then one report per node every {self.heartbeat_s:g} s")

        def report(node: str) -> None:
            token = {"Authorization": f"Bearer {self.tokens[node]}"}
            for _ in range(50):  # 503: the extender bounds the TokenReviews in flight; agents retry
                status, text = self._http("/v1/telemetry", _report_body(node), token)
                if status != 503:
                    break
                time.sleep(0.2)
            if status != 200:
                raise RuntimeError(f"telemetry for {node} refused: {status} {text[:200]!r}")

        self._parallel([lambda n=n: report(n) for n in self.names])
        self.agents = _Agents(self.extender_port, self.tokens, self.heartbeat_s)
        if self.heartbeat_s > 0:
            self.agents.start()

    def stop_agents(self) -> None:
        if self.agents is not None:
            self.agents.stop()
            self.agents_stopped = True

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

    def _cpu(self) -> dict[str, float]:
        """CPU seconds so far of every process taking part."""
        pids = {name: pid for name, pid in self.plane.pids.items() if name != "kube-scheduler"}
        pids["kube-scheduler"] = self.scheduler_pid
        pids["extender"] = self.extender_pid
        out = {name: readings.cpu_s(pid) for name, pid in pids.items()}
        times = os.times()
        out["bench"] = times.user + times.system  # pod creator, watch, simulated agents
        return out

    def _wait_scheduler_ready(self, port: int) -> None:
        """kube-scheduler's /readyz (its informers synced, its handlers registered)."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"kube-scheduler not ready; see {self.plane.logs}")

    def phase(self, label: str, pods: int, qps: int, gpu: bool) -> dict[str, Any]:
        """Start kube-scheduler with the chart's config, create `pods` pods at once, wait until all are bound."""
        config = _scheduler_config((self.extender_port, self.scheduler_port),
                                   self.plane.root / "kube-scheduler.kubeconfig", qps, gpu, self.verbs_access,
                                   self.pod_tls / "scheduler")
        config_file = self.plane.root / f"scheduler-{label}.yaml"
        config_file.write_text(yaml.safe_dump(config))
        port = free_port()
        self.scheduler_pid = start_process(f"kube-scheduler-{label}", [
            str(self.plane.bin_dir / "kube-scheduler"), f"--config={config_file}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", "--v=1"], self.plane.logs).pid
        self._wait_scheduler_ready(port)
        names = [f"{label}-{i:05d}" for i in range(pods)]
        created: dict[str, float] = {}
        bound: dict[str, float] = {}
        running: set[str] = set()
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_binds, args=(set(names), bound, done, running), daemon=True)
        watcher.start()
        time.sleep(1.0)
        verbs0 = self._verb_totals() if gpu else {}
        binding0 = self._apiserver_binding()
        if self.accounting is not None:
            self.accounting.begin(label)
            self.accounting.begin(f"{label}-settled")
            self.accounting.profile(label, self.profile_s.get(label, 4.0 if gpu else 2.0))  # while pods pour in
        cpu0 = self._cpu()
        start = time.monotonic()

        # the pods go out as plain JSON through the client's own connection pool and credentials: the
        # client's models (validated from a dict, then serialised back) cost this process more CPU
        # per pod than the API server's answer
        _, url, headers, _, _ = self.api.param_serialize(
            "POST", "/api/v1/namespaces/{namespace}/pods", path_params={"namespace": BENCH_NS},
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"])

        def create(name: str) -> None:
            resp = self.api.call_api("POST", url, header_params=headers, body=_pod(name, gpu))
            answer = resp.read()  # read to the end: the connection goes back to the pool clean
            if resp.status != 201:
                raise RuntimeError(f"creating pod {name}: HTTP {resp.status} {answer[:300]!r}")
            created[name] = time.monotonic()

        self._parallel([lambda n=n: create(n) for n in names])
        if not done.wait(max(600.0, pods)):
            raise RuntimeError(f"{label}: only {len(bound)} of {pods} pods bound")
        elapsed = max(bound.values()) - start
        cpu1 = self._cpu()
        running_at_bound = len(running)
        if self.accounting is not None:
            self.accounting.end(label, pods)
        # and until kwok has every pod Running: the work a fast phase leaves behind its window (the status
        # kwok writes for each pod, the API server's handling of it, the watchers' events), counted for
        # both kinds of pods alike
        deadline = time.monotonic() + 120
        while len(running) < pods and time.monotonic() < deadline:
            time.sleep(0.05)
        settled_s = time.monotonic() - start
        cpu2 = self._cpu()
        if self.accounting is not None:
            self.accounting.end(f"{label}-settled", pods,
                                {k: round(1000 * (cpu2[k] - cpu0[k]) / pods, 2) for k in cpu2})
        verbs1 = self._verb_totals() if gpu else {}
        binding1 = self._apiserver_binding()
        stop_pid(self.scheduler_pid)
        latencies = [bound[n] - created[n] for n in names]
        result: dict[str, Any] = {
            "pods_per_s": round(pods / elapsed, 1), "latency_p50_s": round(_percentile(latencies, 0.5), 2),
            "latency_p99_s": round(_percentile(latencies, 0.99), 2),
            "latency_p50_ms": round(1000 * _percentile(latencies, 0.5), 1),
            "latency_p99_ms": round(1000 * _percentile(latencies, 0.99), 1),
            "cpu_ms_per_pod": {k: round(1000 * (cpu1[k] - cpu0[k]) / pods, 2) for k in cpu1},
            "cpu_ms_per_pod_settled": {k: round(1000 * (cpu2[k] - cpu0[k]) / pods, 2) for k in cpu2},
            "running_share_at_bound": round(running_at_bound / pods, 3),
            "settled_s": round(settled_s, 2), "pods_running": len(running),
            # the API server's own time per Binding (whoever sent it: kube-scheduler, or the extender)
            "apiserver_binding_ms": round(1000 * (binding1[0] - binding0[0]) / max(1.0, binding1[1] - binding0[1]), 1),
        }
        if gpu:
            result["extender_ms_per_call"] = readings.verb_ms(verbs0, verbs1)
            reports = verbs1.get("telemetry_n", 0.0) - verbs0.get("telemetry_n", 0.0)
            result["telemetry_reports_per_s"] = round(reports / elapsed, 1)
            # binds refused (the GPUs taken meanwhile: the pod goes through a whole scheduling cycle again)
            # and the prioritize's assumptions, per 1,000 pods
            result["per_1000_pods"] = {key: round(1000 * (verbs1[key] - verbs0.get(key, 0.0)) / pods, 1)
                                       for key in sorted(verbs1) if ":" in key}
            result.update(self.gpu_check())
        _progress(f"{label}: {result}")
        _ = self.core.delete_collection_namespaced_pod(BENCH_NS, grace_period_seconds=0, _preload_content=False).data
        while json.loads(self.core.list_namespaced_pod(BENCH_NS, limit=1, _preload_content=False).data)["items"]:
            time.sleep(1)
        return result

    def node_status_round(self) -> None:
        """--api-accounting: every Node's status written once, as kubelets report theirs (a heartbeat
        condition): what the Node watches of every client cost the API server per Node update."""
        assert self.accounting is not None
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status",
                                           "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
        cpu0 = self._cpu()
        self.accounting.begin("node-status")
        self._parallel([lambda n=n: self.core.patch_node_status(
            n, body, _content_type="application/strategic-merge-patch+json", _preload_content=False).data
            for n in self.names])
        time.sleep(2.0)  # the watches deliver
        cpu1 = self._cpu()
        self.accounting.end("node-status", len(self.names),
                            {k: round(1000 * (cpu1[k] - cpu0[k]) / len(self.names), 2) for k in cpu1})

    def _watch_binds(self, names: set[str], bound: dict[str, float], done: threading.Event,
                     running: set[str] | None = None) -> None:
        """Record when each pod is first seen bound; a watch that ends or fails is resumed from a relist.
        Raw JSON lines: this process must not take the machine's CPU from what it measures."""

        def seen(pod: dict[str, Any]) -> None:
            name = pod["metadata"]["name"]
            if running is not None and name in names and (pod.get("status") or {}).get("phase") == "Running":
                running.add(name)
            if name in names and (pod.get("spec") or {}).get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) == len(names):
                    done.set()

        def finished() -> bool:  # every pod bound (and Running, when asked to follow that too)
            return done.is_set() and (running is None or len(running) >= len(names))

        while not finished():
            try:
                listed = json.loads(self.core.list_namespaced_pod(BENCH_NS, _preload_content=False).data)
                for pod in listed["items"]:
                    seen(pod)
                resp = self.core.list_namespaced_pod(BENCH_NS, watch=True, timeout_seconds=60, _preload_content=False,
                                                     resource_version=listed["metadata"]["resourceVersion"])
                pending = b""
                for chunk in resp.stream(amt=None, decode_content=False):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        event = orjson.loads(line)
                        if event.get("type") == "ERROR":
                            raise RuntimeError(str(event.get("object")))
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            seen(event["object"])
                    if finished():
                        resp.close()
                        return
            except Exception as err:  # the measurement goes on from a relist
                _progress(f"bind watch ended ({err}); relisting")
                time.sleep(0.5)

    def gpu_check(self) -> dict[str, int]:
        """GPU pods not placed, and GPUs booked beyond their memory (from the pods' own annotations)."""
        booked: dict[str, float] = {}
        unplaced = 0
        for pod in json.loads(self.core.list_namespaced_pod(BENCH_NS, _preload_content=False).data)["items"]:
            annotations = pod["metadata"].get("annotations") or {}
            gpus = annotations.get("deepres.io/assigned-gpus", "")
            if not (pod.get("spec") or {}).get("nodeName") or not gpus:
                unplaced += 1
                continue
            for uuid in gpus.split(","):
                booked[uuid] = booked.get(uuid, 0.0) + float(annotations["deepres.io/admission-memory-mib"])
        over = sum(1 for b in booked.values() if b > GPU_MEMORY_MIB)
        return {"gpu_pods_unplaced": unplaced, "gpus_overcommitted": over}

    def _apiserver_binding(self) -> tuple[float, float]:
        """kube-apiserver's request histogram for Bindings: (seconds in total, requests)."""
        status, text = self.plane.get("/metrics", timeout_s=30)
        return readings.apiserver_binding(text.decode()) if status == 200 else (0.0, 0.0)

    def _verb_totals(self) -> dict[str, float]:
        return readings.verb_totals(self._http("/metrics")[1])

    def close(self) -> None:
        if self.agents is not None:
            self.agents.stop()
        if self.scheduler_pid:
            stop_pid(self.scheduler_pid)
        if self.extender_pid:
            stop_pid(self.extender_pid)
        self.plane.stop()


def _phases(bench: _Run, limits: list[str], pods: int, suffix: str, gpu: bool, bar: Bar) -> dict[str, Any]:
    """One phase of `pods` pods per client limit, plain or GPU (`suffix`: the round's, in the labels)."""
    kind = "gpu" if gpu else "plain"
    out = {}
    for name in limits:
        label = f"{kind}-{name.replace('_', '-')}{suffix}"
        out[name] = bench.phase(label, pods, LIMITS[name], gpu=gpu)
        bar.advance(note=label)
    return out


def run(args: argparse.Namespace) -> int:
    if args.pods < 10:
        raise UsageError(f"--pods must be at least 10, got {args.pods}")
    if args.heartbeat_s < 0:
        raise UsageError(f"--heartbeat-s must be >= 0, got {args.heartbeat_s:g}")
    gpu_first = args.order == "gpu-first"
    if args.floor and Path(args.out).resolve() == (REPO / "reports" / "bench-cluster.json").resolve():
        raise UsageError("--floor measures the extender without its placement rule, not the benchmark: "
                         "give --out another file")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
    if args.repeats > 1 and args.api_accounting:
        raise UsageError("--api-accounting audits one round: leave --repeats at 1")
    if gpu_first and args.api_accounting:
        raise UsageError("--api-accounting measures the plain phases first: leave --order as it is")
    report: dict[str, Any] = {}
    out = Path(args.out)
    if out.exists():
        report = json.loads(out.read_text())
    limits = [name for name in LIMITS if name in args.limits]
    # one bar over every phase of the run (per cluster size: the control plane and nodes, then each round's
    # plain and GPU phase per client limit), its total known before the first
    bar = Bar(len(args.nodes) * (1 + args.repeats * 2 * len(limits)), "bench cluster", unit="phase")
    with bar:
        for nodes in args.nodes:
            root = Path(args.keep) / f"nodes-{nodes}" if args.keep else Path(tempfile.mkdtemp(prefix="bench-cluster-"))
            if args.keep:
                shutil.rmtree(root, ignore_errors=True)  # a fresh control plane each run (etcd's data included)
            bench = _Run(root, nodes, args.heartbeat_s, args.api_accounting and f"{args.api_accounting}.{nodes}.json",
                         args.verbs_access, args.floor)
            previous = report.get(f"nodes_{nodes}", {})
            section: dict[str, Any] = {**previous, "nodes": nodes, "pods": args.pods, "gpus_per_node": GPUS_PER_NODE,
                                       "agent_heartbeat_s": args.heartbeat_s, "verbs_access": args.verbs_access,
                                       "order": args.order, **({"floor": True} if args.floor else {})}
            load = [round(os.getloadavg()[0], 2)]
            try:
                bench.setup()
                bar.advance(note=f"{nodes} nodes up")
                accounting = bench.accounting
                rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
                for rnd in range(args.repeats):
                    suffix = f"-{rnd + 1}" if args.repeats > 1 else ""
                    plain = {} if gpu_first else _phases(bench, limits, args.pods, suffix, gpu=False, bar=bar)
                    if accounting is not None:  # the background without pods: no agents, as in the plain phases
                        accounting.idle("idle-no-agents", max(w["seconds"] for w in accounting.windows.values()))
                    bench.start_agents()
                    profiled = args.profile and not rnd  # the first round's GPU phases
                    spy = pyspy.record(bench.extender_pid, f"{args.profile}.{nodes}.txt") if profiled else None
                    gpus = _phases(bench, limits, args.pods, suffix, gpu=True, bar=bar)
                    if spy is not None:
                        pyspy.stop(spy)
                        spy = None
                    if gpu_first or rnd + 1 < args.repeats:  # the plain phases run beside an idle extender
                        bench.stop_agents()
                    if gpu_first:
                        plain = _phases(bench, limits, args.pods, suffix, gpu=False, bar=bar)
                    rounds.append((plain, gpus))
                command = (f"deepres bench cluster --nodes {nodes} --pods {args.pods} --limits {{}} "
                           f"--verbs-access {args.verbs_access} --heartbeat-s {args.heartbeat_s:g}"
                           + (" --order gpu-first" if gpu_first else "") + (" --floor" if args.floor else "")
                           + f" --repeats {args.repeats}")
                for name in limits:
                    section[name] = rounds_figures.shown(
                        [rounds_figures.figures(LIMITS[name], p[name], g[name]) for p, g in rounds],
                        command.format(name))
                if accounting is not None:  # the background of the GPU phases: agents reporting, no pods
                    gpu_windows = [w["seconds"] for k, w in accounting.windows.items() if k.startswith("gpu-")]
                    accounting.idle("idle-agents", max(gpu_windows))
                    bench.node_status_round()
                    _progress("API requests by client\n" + bench_api.table(accounting.write()))
                if bench.agents is not None and bench.agents.refused:
                    _progress(f"{len(bench.agents.refused)} reports refused, e.g. {bench.agents.refused[:3]}")
                section["extender_rss_mib"] = readings.rss_mib(bench.extender_pid)  # after the last GPU phase
                if args.with_floor:
                    bench.floor_instead()
                    floors = [bench.phase(f"floor-gpu-default-limits-{r + 1}", args.pods, LIMITS["default_limits"],
                                          gpu=True) for r in range(args.repeats)]
                    section.update(rounds_figures.floor(floors, command.format("default_limits") + " --with-floor"))
                load.append(round(os.getloadavg()[0], 2))
            finally:
                bench.close()
                if not args.keep:
                    shutil.rmtree(root, ignore_errors=True)
            if "default_limits" in section:
                section["extender_cpu_ms_per_pod"] = section["default_limits"]["extender_cpu_ms_per_pod"]
                section["extender_ms_per_call"] = section["default_limits"]["extender_ms_per_call"]
            for name in ("default_limits", "high_qps"):  # pod created to bound, at the limit of the CPU figure
                if "scheduling_latency_ms" in section.get(name, {}):
                    section["scheduling_latency_ms"] = section[name]["scheduling_latency_ms"]
                    break
            for name in ("high_qps", "default_limits"):  # the client limit at which CPU, not the limit, sets the pace
                if "cpu_ratio_gpu_over_plain" in section.get(name, {}):
                    section["cpu_ratio_gpu_over_plain"] = section[name]["cpu_ratio_gpu_over_plain"]
                    break
            section["load_average_1m"] = max(load)
            section["load_average_1m_start_end"] = load
            report[f"nodes_{nodes}"] = section
            say(json.dumps({f"nodes_{nodes}": section}, indent=1), stream=sys.stdout)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(rounds_figures.all_placed(report[f"nodes_{n}"].get(limit, {}))
                    for n in args.nodes for limit in limits) else 1
