"""`deepres simulate --via-http`: drive a real `deepres serve --no-kube` with a small trace and check
that the server decides exactly as the simulator's DeepRes policy does.

The simulator plays kube-scheduler: it keeps the cluster's CPU/memory/GPU-model fit (what
kube-scheduler checks before calling the extender), sends the fitting node names to /filter, the
passed ones to /prioritize, picks the best score (ties to the lowest node rank) and /binds there.
Beside it, the packing experiment's DeepRes policy (unmemoised: the live functions over every node)
makes its own decision on its own copy of the state. Compared per pod: the filter's passed set, every
score, the chosen node, and the GPUs the server reserved (read from its INFO log line `bound ...`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import secrets
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devtools.localserver import LocalServer
from extender.simulate.adapters import capacity_mib
from extender.simulate.packing import DeepResPolicy, NodeView
from extender.simulate.traces import Node, Pod, build_workload, node_list_path, pod_list_path, read_nodes, read_pods

#: A real pod asks one absolute amount of memory: the share is taken of this model's GPU on every node.
REFERENCE_MODEL = "T4"
_BOUND = re.compile(r"bound pod=openb/(\S+) node=(\S+) gpus=(\S+)")


@dataclass
class Comparison:
    """What the server and the simulator decided, pod by pod."""

    pods: int = 0
    placed: int = 0
    agreed_filter: int = 0
    agreed_scores: int = 0
    agreed_node: int = 0
    agreed_gpus: int = 0
    gpus_checked: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.mismatches and self.agreed_node == self.pods

    def summary(self) -> dict[str, Any]:
        return {"pods": self.pods, "placed": self.placed, "same_filter": self.agreed_filter,
                "same_scores": self.agreed_scores, "same_node": self.agreed_node,
                "same_gpus": f"{self.agreed_gpus}/{self.gpus_checked}", "identical": self.identical,
                "mismatches": self.mismatches[:10]}


def _call(url: str, body: Any, token: str | None = None, timeout: float = 30.0) -> Any:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"POST {url} -> HTTP {err.code}: {err.read()[:300]!r}") from None


@contextlib.contextmanager
def local_server(workdir: Path, token: str) -> Iterator[tuple[str, Path]]:
    """`deepres serve --no-kube` on a free loopback port (devtools/localserver.py); yields (url, log
    path); stops it after."""
    env = {"DEEPRES_TELEMETRY_TTL_S": "86400",
           # the server learns its demand mix from its own binds, the simulator takes the trace's typical
           # pods: compare the shared filter / score / GPU-choice functions with the best-fit packing rule
           # (the fragmentation-aware rule is checked against the same functions in the unit tests)
           "DEEPRES_FRAGMENTATION_AWARE_PACKING": "false",
           # the packing experiment's policy is memory-only: compare the memory rules (the sharing rule,
           # compute, is checked by the replay's and the unit tests)
           "DEEPRES_SHARING": "false",
           # compared is every node the filter passes and its score on each: no shortlist (the default names
           # the best node only, which the scores compared here choose as well)
           "DEEPRES_FILTER_SHORTLIST": "0"}
    with LocalServer(workdir, token=token, env=env, log_level="info") as server:  # ready: the verbs wait for it
        yield server.url, server.log_path


def pod_body(pod: Pod, model_of_admission: str, uid: str) -> dict[str, Any]:
    """The pod as kube-scheduler would send it: its GPU share as an explicit gpu-memory (MiB)."""
    need = pod.gpu_milli * capacity_mib(model_of_admission) / 1000
    annotations = {"deepres.io/gpu-memory": f"{int(need)}Mi", "deepres.io/gpus": str(pod.num_gpu)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": "openb", "uid": uid, "annotations": annotations,
                         "creationTimestamp": "2026-11-21T12:00:00Z"},
            "spec": {"schedulerName": "deepres-scheduler", "containers": [
                {"name": "train", "image": "train",
                 "resources": {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}}}]},
            "status": {"phase": "Pending"}}


def report_body(node: Node, sequence: int) -> dict[str, Any]:
    cap = capacity_mib(node.model)
    return {"node": node.name, "sequence": sequence, "timestamp_s": time.time(), "agent_version": "simulate",
            "source": "simulated", "interval_s": 5.0,
            "gpus": [{"uuid": f"{node.name}-gpu{i}", "index": i, "model": node.model, "memory_total_mib": cap,
                      "memory_used_mib": 0.0, "utilization_gpu": 0.0} for i in range(node.gpus)],
            "pods": []}


def small_cluster(nodes: Sequence[Node], count: int) -> list[Node]:
    """Every k-th name-sorted node with the reference GPU memory (16 GB: P100, T4, V100M16, G2), so models,
    GPU counts and CPU sizes stay mixed while one absolute memory request means one share everywhere."""
    same = [n for n in nodes if capacity_mib(n.model) == capacity_mib(REFERENCE_MODEL)]
    step = max(len(same) // count, 1)
    return list(same[::step][:count])


def compare(url: str, log_path: Path, token: str, nodes: Sequence[Node], pods: Sequence[Pod]) -> Comparison:
    """Replay `pods` (one attempt each) through the server and the simulator side by side."""
    order = list(range(len(nodes)))
    view = NodeView(nodes, order)  # the simulator's state (rank = list order)
    sim = DeepResPolicy(memoise=False, reference_model=REFERENCE_MODEL)
    for k, node in enumerate(nodes):
        _call(url + "/v1/telemetry", report_body(node, k + 1), token=token)
    {n.name: n for n in nodes}
    result = Comparison()
    bound_seen = 0
    for k, pod in enumerate(pods):
        if pod.num_gpu == 0:
            continue
        result.pods += 1
        candidates = np.flatnonzero(_gpu_blind(view, pod))  # what kube-scheduler would send
        names = [view.names[int(i)] for i in candidates]
        uid = f"uid-{k}"
        scores_server: dict[str, int] = {}
        answer = _call(url + "/filter", {"Pod": pod_body(pod, REFERENCE_MODEL, uid), "Nodes": None, "NodeNames": names})
        if answer.get("Error"):
            raise RuntimeError(f"/filter error for {pod.name}: {answer['Error']}")
        passed_server = list(answer.get("NodeNames") or [])
        if passed_server:
            body = {"Pod": pod_body(pod, REFERENCE_MODEL, uid), "Nodes": None, "NodeNames": passed_server}
            for item in _call(url + "/prioritize", body):
                scores_server[item["Host"]] = int(item["Score"])
        sim_feasible = candidates
        sim_scores = sim._score_all(view, pod, sim_feasible) if len(sim_feasible) else np.array([], dtype=np.int64)
        sim_passed = {view.names[int(i)] for i, s in zip(sim_feasible, sim_scores, strict=True) if s >= 0}
        sim_by_name = {view.names[int(i)]: int(s) for i, s in zip(sim_feasible, sim_scores, strict=True) if s >= 0}
        if set(passed_server) == sim_passed:
            result.agreed_filter += 1
        else:
            result.mismatches.append(
                f"{pod.name}: filter server={sorted(passed_server)[:5]} sim={sorted(sim_passed)[:5]}")
        if scores_server == sim_by_name:
            result.agreed_scores += 1
        else:
            diff = {n: (scores_server.get(n), sim_by_name.get(n)) for n in set(scores_server) | set(sim_by_name)
                    if scores_server.get(n) != sim_by_name.get(n)}
            result.mismatches.append(f"{pod.name}: scores differ (server, sim) {dict(list(diff.items())[:4])}")
        server_choice = None
        if scores_server:
            ranked = sorted(scores_server.items(), key=lambda kv: (-kv[1], view.names.index(kv[0])))
            server_choice = ranked[0][0]
        choice = sim.choose(view, pod, sim_feasible) if len(sim_feasible) else None
        sim_choice = None if choice is None else view.names[choice[0]]
        if server_choice == sim_choice:
            result.agreed_node += 1
        else:
            result.mismatches.append(f"{pod.name}: node server={server_choice} sim={sim_choice}")
        if choice is None or server_choice is None:
            continue
        answer = _call(url + "/bind", {"PodName": pod.name, "PodNamespace": "openb", "PodUID": uid,
                                       "Node": server_choice})
        if answer.get("Error"):
            result.mismatches.append(f"{pod.name}: bind refused: {answer['Error']}")
            continue
        result.placed += 1
        view.place(choice[0], pod, choice[1])
        bound = _BOUND.findall(log_path.read_text())
        if len(bound) > bound_seen:
            bound_seen = len(bound)
            name, node_name, uuids = bound[-1]
            if name == pod.name:
                result.gpus_checked += 1
                server_gpus = sorted(int(u.rsplit("gpu", 1)[1]) for u in uuids.split(","))
                if server_gpus == sorted(choice[1]) and node_name == view.names[choice[0]]:
                    result.agreed_gpus += 1
                else:
                    result.mismatches.append(f"{pod.name}: GPUs server={server_gpus} sim={sorted(choice[1])}")
    return result


def _gpu_blind(view: NodeView, pod: Pod) -> np.ndarray:
    """Nodes that fit the pod's CPU, memory and GPU model but maybe not its GPU memory: kube-scheduler
    does not know GPU memory, so these reach the extender's filter too."""
    ok = (view.cpu_left >= pod.cpu_milli) & (view.mem_left >= pod.memory_mib)
    if pod.num_gpu:
        ok &= view.spec_ok(pod) & (view.n_gpu >= pod.num_gpu)
    result: np.ndarray = ok
    return result


def run_via_http(args: argparse.Namespace) -> int:
    nodes = small_cluster(read_nodes(node_list_path(args.data)), 24)
    pods_all = read_pods(pod_list_path(args.data, "default"))
    workload = build_workload(pods_all, len(read_nodes(node_list_path(args.data))), 42, 6_212_000)
    pods = [p for p in workload.pods if p.num_gpu > 0][: args.trace_limit]
    token = secrets.token_hex(16)
    started = time.monotonic()
    if args.server:
        raise SystemExit("--server: pass the URL of a server started with DEEPRES_TELEMETRY_TTL_S=86400 and "
                         "--log-level info; not supported yet, omit it to start one")
    with tempfile.TemporaryDirectory(prefix="deepres-via-http-") as tmp, local_server(Path(tmp), token) as (url, log):
        result = compare(url, log, token, nodes, pods)
    summary = {**result.summary(), "nodes": len(nodes), "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary, indent=2))
    return 0 if result.identical else 1
