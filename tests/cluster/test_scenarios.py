"""deepres under the real kube-scheduler and kube-apiserver (local control plane, kwok nodes).

The kind suite's scenarios (tests/e2e/scenarios.py; 2-4 as they are from tests/e2e/shared_scenarios.py),
plus what needs a control plane we can poke:
concurrent submissions, bad annotations, deepres down, hundreds of CPU nodes, restarts of each
process, and the API server closing every watch. Scenarios run in file order on one cluster.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from typing import Any

import pytest

from devtools.localchart import DEVICE_RESOURCE, node_body
from extender.annotations import parse_time
from tests.cluster.conftest import LocalCluster
from tests.e2e import scenarios as s
from tests.e2e.scenarios import JOBS_NAMESPACE, PREFIX, create, node_of, scheduled, sized, wait_for
from tests.fixtures.kube.server import post


def test_1_annotated_pods_land_where_their_predicted_memory_fits(clean: LocalCluster) -> None:
    s.annotated_pods_land_where_their_predicted_memory_fits(clean)
    # created with annotations only: the chart's admission policy gave them the scheduler and the device
    # plugin's resource, which kube-scheduler counted against the GPU nodes' slots
    pods = s.live_gpu_pods(clean)
    assert len(pods) >= 3, "the scenario left its pods running"
    for pod in pods:
        assert pod.spec.scheduler_name == "deepres-scheduler"
        assert [c.resources.requests.get(DEVICE_RESOURCE) for c in pod.spec.containers] == ["1"]
        node = clean.core.read_node(pod.spec.node_name)
        assert int(node.status.allocatable[DEVICE_RESOURCE]) > 0


from tests.e2e.shared_scenarios import *  # noqa: E402,F403  (scenarios 2-4, here in file order)


def test_5_thirty_concurrent_pods_on_four_gpus_never_overcommit(clean: LocalCluster) -> None:
    """30 pods of mixed sizes created at once from 6 threads: whatever is placed fits, the rest waits."""
    cluster = clean
    sizes = [6, 10, 14, 20, 30, 36]
    names = [f"burst-{i}" for i in range(30)]
    errors: list[BaseException] = []

    def submit(chunk: list[int]) -> None:
        try:
            for i in chunk:
                create(cluster, sized(names[i], sizes[i % len(sizes)]))
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=submit, args=(list(range(k, 30, 6)),)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    time.sleep(5)
    s.wait_for("the burst to settle (no pod placed for 10 s)", lambda: _settled(cluster, names, 10), 180, 0)
    placed = [n for n in names if node_of(cluster, n)]
    assert len(placed) >= 6, f"only {placed} placed: 4 GPUs (16, 40, 80, 80 GB) hold at least six of these"
    s.assert_no_gpu_overcommitted(cluster)


def _settled(cluster: LocalCluster, names: list[str], quiet_s: float) -> bool:
    before = sum(1 for n in names if node_of(cluster, n))
    time.sleep(quiet_s)
    return sum(1 for n in names if node_of(cluster, n)) == before


def test_6_bad_annotations_give_an_event_and_no_placement(clean: LocalCluster) -> None:
    cluster = clean
    pod = s.workload("bad-memory", {f"{PREFIX}gpu-memory": "lots", f"{PREFIX}criticality": "normal"},
                     usage_mib=1000)
    create(cluster, pod)
    events = wait_for("an InvalidAnnotation event", lambda: [
        e for e in cluster.events("bad-memory") if e.reason == "InvalidAnnotation"], 60, 0.5)
    assert "gpu-memory" in events[0].message, events[0].message
    assert events[0].type == "Warning"
    assert node_of(cluster, "bad-memory") is None


def _plain_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": JOBS_NAMESPACE, "labels": {"deepres-e2e": "workload"}},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}}


def test_7_pods_of_the_default_scheduler_are_unaffected_while_deepres_is_down(clean: LocalCluster) -> None:
    cluster = clean
    cluster.stop_scheduler_pod(hard=True)
    try:
        create(cluster, _plain_pod("plain-while-down"))
        create(cluster, sized("gpu-while-down", 6))
        assert scheduled(cluster, "plain-while-down", timeout_s=30)
        assert s.stays_pending(cluster, "gpu-while-down", 5), "a deepres pod was placed with deepres down"
    finally:
        cluster.start_scheduler_pod()
    scheduled(cluster, "gpu-while-down", timeout_s=60)


def test_8_three_hundred_cpu_nodes_every_gpu_pod_placed_at_its_first_attempt(clean: LocalCluster) -> None:
    """kube-scheduler must send the extender every feasible node (the chart's percentageOfNodesToScore),
    else GPU nodes are sampled out among CPU nodes and GPU pods fail attempts ("no agent report")."""
    cluster = clean
    names = [f"cpu-{i:03d}" for i in range(300)]
    for name in names:
        cluster.core.create_node(node_body(name))
    try:
        wait_for("300 CPU nodes Ready", lambda: sum(
            1 for n in cluster.core.list_node(label_selector="type=kwok").items
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))) >= 304, 120)
        pods = [f"among-cpu-{i}" for i in range(6)]
        for name in pods:
            create(cluster, sized(name, 6))
        for name in pods:
            scheduled(cluster, name, timeout_s=60)
        failed = {n: [e.message for e in cluster.events(n) if e.reason == "FailedScheduling"] for n in pods}
        failed = {n: m for n, m in failed.items() if m}
        assert not failed, f"GPU pods failed attempts among CPU nodes: {failed}"
        s.assert_no_gpu_overcommitted(cluster)
    finally:
        for name in names:
            cluster.core.delete_node(name)


@pytest.mark.parametrize("hard", [False, True], ids=["graceful_restart", "hard_kill_of_the_process_tree"])
def test_9_extender_restart_loses_no_reservation(clean: LocalCluster, hard: bool) -> None:
    cluster = clean
    during = s.extender_restart_loses_no_reservation_and_double_books_nothing(
        cluster, lambda while_down: cluster.restart_scheduler_pod(while_down, hard=hard))
    wait_for("pods submitted during the restart placed", lambda: sum(
        1 for n in during if node_of(cluster, n)) >= len(during) - 1, s.TTL_S + 30)


def test_11_pods_created_during_an_extender_restart_are_placed_within_10s_of_readiness(
    clean: LocalCluster
) -> None:
    cluster = clean
    names = [f"restart-burst-{i}" for i in range(6)]

    def submit() -> None:
        for name in names:
            create(cluster, sized(name, 6))

    ready_at = cluster.restart_scheduler_pod(submit, hard=True)
    late = []
    for name in names:
        node = wait_for(f"{name} placed", lambda: node_of(cluster, name), 60, 0.25)  # noqa: B023
        assert node
        if time.monotonic() - ready_at > 10:
            late.append(name)
    assert not late, f"placed more than 10 s after the extender turned ready: {late}"


def test_12_kill_9_of_the_extender_leaves_nothing_listening(clean: LocalCluster) -> None:
    """Only the main process is killed (as an OOM kill or a crash would); its workers must go too,
    or a restarted extender would share its port with the old one's ledger."""
    import os

    cluster = clean
    assert cluster.scheduler is not None
    cluster.scheduler.supervised = False  # no restart: the port must fall silent
    os.kill(cluster.scheduler.pids["extender"], 9)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", cluster.extender_port)) != 0:
                break
        time.sleep(0.2)
    listening = cluster.http(f"http://127.0.0.1:{cluster.extender_port}/healthz", 1.0)[0] != 0
    cluster.stop_scheduler_pod(hard=True)
    cluster.start_scheduler_pod()
    assert not listening, "the extender's port still answers 10 s after its main process was killed"


def test_13_agent_restart_resumes_telemetry_without_long_staleness(clean: LocalCluster) -> None:
    cluster = clean

    def restart_agents() -> None:
        for node in list(cluster.agents):
            cluster.stop_agent(node)  # the DaemonSet makes a new pod: a new name, uid and token
        for node in cluster.simulated_gpus:
            cluster.start_agent(node)

    s.agent_restart_resumes_telemetry_without_long_staleness(cluster, restart_agents)


def test_14_watches_the_api_server_closes_are_resumed(clean: LocalCluster) -> None:
    """kube-apiserver restarts: every watch is closed and a watch resumed from before gets 410 Gone;
    the extender must relist and keep placing pods (it sees them only through its watch)."""
    from kubernetes import client

    cluster = clean
    create(cluster, sized("before-apiserver-restart", 6))
    scheduled(cluster, "before-apiserver-restart")
    old_version = cluster.core.list_namespaced_pod(JOBS_NAMESPACE).metadata.resource_version
    for i in range(30):  # move the store well past the old version
        cluster.core.create_namespaced_config_map(JOBS_NAMESPACE, {"metadata": {"name": f"churn-{i}"}})
    plane = cluster.plane
    plane.stop_one("kube-apiserver")
    plane.start_apiserver(["--etcd-compaction-interval=1s"])
    plane.wait_ready(time.monotonic() + 120)
    time.sleep(3)  # a compaction ran: the old resourceVersion is gone
    gone: int | None = None
    try:
        stream = cluster.core.list_namespaced_pod(JOBS_NAMESPACE, watch=True, resource_version=old_version,
                                                  timeout_seconds=2, _preload_content=False)
        body = stream.read().decode()
        gone = 410 if '"code":410' in body.replace(" ", "") else None
    except client.ApiException as err:
        gone = err.status
    assert gone == 410, "the old resourceVersion should be expired (the scenario needs a real 410)"
    create(cluster, sized("after-apiserver-restart", 6))
    scheduled(cluster, "after-apiserver-restart", timeout_s=90)
    assert cluster.scheduler is not None
    print(f"container restarts of the scheduler pod: {cluster.scheduler.restarts}")
    for i in range(30):
        cluster.core.delete_namespaced_config_map(f"churn-{i}", JOBS_NAMESPACE)
    assert node_of(cluster, "before-apiserver-restart")


def test_15_a_flood_of_invented_tokens_leaves_agents_and_scheduling_served(clean: LocalCluster) -> None:
    """Issue 13 item 7 against the chart's extender process and the real API server's TokenReview:
    800 reports with invented bearer tokens over 200 connections at once. Each is refused (401; 503 when
    the 4 reviews allowed in flight are taken), kube-scheduler's filter calls stay quick, a GPU pod
    created during the flood is placed and the agents' reports are still accepted. A loopback API
    server answers a review in milliseconds, so this shows the real path end to end; the bound that
    matters when reviews are slow is held by tests/unit/test_auth.py (a 50 ms TokenReview)."""
    cluster = clean
    base = f"http://127.0.0.1:{cluster.extender_port}"
    accepted_before = s.accepted_reports(cluster)
    statuses: list[int] = []
    lock = threading.Lock()

    def flood(k: int) -> None:
        for i in range(4):
            status, _ = post(base + "/v1/telemetry", {}, token=f"invented-{k}-{i}")
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=flood, args=(k,), daemon=True) for k in range(200)]
    for thread in threads:
        thread.start()
    create(cluster, sized("during-token-flood", 4))
    probe = {"Pod": sized("filter-probe", 4), "NodeNames": sorted(cluster.simulated_gpus)}
    latencies: list[float] = []
    while any(thread.is_alive() for thread in threads) or len(latencies) < 10:
        started = time.monotonic()
        assert cluster.verb("filter", probe)[0] == 200
        latencies.append(time.monotonic() - started)
        time.sleep(0.05)
    for thread in threads:
        thread.join(60)
    assert len(statuses) == 800 and set(statuses) <= {401, 503}, sorted(set(statuses))
    assert statistics.median(latencies) < 0.5 and max(latencies) < 5.0, latencies  # 5 s: the chart's httpTimeout
    assert scheduled(cluster, "during-token-flood", timeout_s=60) in cluster.simulated_gpus
    wait_for("an agent report accepted after the flood", lambda: s.accepted_reports(cluster) > accepted_before, 60)


#: Nodes the shortlist scenario adds, each with 8 reported GPUs of 80 GB: more than the chart's
#: extender.filterShortlist (1) and than the 100 it once was, so every GPU pod's filter has more
#: nodes that fit than it names.
MANY_NODES = 130
MANY_GPU_MIB = 81920.0
TIGHT_NODE, BUSY_NODE = "many-077", "many-101"


class _Reporters:
    """Telemetry for the scenario's extra nodes, as their agents would send it: tokens of the chart's
    agent ServiceAccount bound to each node (TokenRequest), one report per node every few seconds."""

    def __init__(self, cluster: LocalCluster, nodes: list[str], gpus: dict[str, list[tuple[float, float]]]) -> None:
        from kubernetes import client

        self.url = f"http://127.0.0.1:{cluster.extender_port}/v1/telemetry"
        self.gpus = gpus
        self.stop = threading.Event()
        self.refused: list[str] = []
        uids = {n.metadata.name: n.metadata.uid for n in cluster.core.list_node(label_selector="many=true").items}
        self.tokens = {}
        for node in nodes:
            spec = client.V1TokenRequestSpec(audiences=["deepres-extender"], expiration_seconds=3600,
                                             bound_object_ref=client.V1BoundObjectReference(
                                                 api_version="v1", kind="Node", name=node, uid=uids[node]))
            self.tokens[node] = cluster.core.create_namespaced_service_account_token(
                "deepres-agent", s.NAMESPACE, client.AuthenticationV1TokenRequest(spec=spec)).status.token
        self.sequence = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def report_all(self) -> None:
        self.sequence += 1
        for node, token in self.tokens.items():
            gpus = [{"uuid": f"GPU-{node}-{i}", "index": i, "model": "NVIDIA A100-SXM4-80GB",
                     "memory_total_mib": MANY_GPU_MIB, "memory_used_mib": used, "utilization_gpu": util}
                    for i, (used, util) in enumerate(self.gpus[node])]
            status, answer = post(self.url, {"node": node, "sequence": self.sequence, "timestamp_s": time.time(),
                                             "agent_version": "scenario", "source": "simulated", "gpus": gpus,
                                             "pods": []}, token=token)
            if status != 200:
                self.refused.append(f"{node}: {status} {answer}")

    def _run(self) -> None:
        while not self.stop.wait(4.0):  # the suite's telemetry TTL is 20 s
            self.report_all()


def _prioritize(cluster: LocalCluster, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    """The extender's own ranking of `names` for `pod` now (the verb kube-scheduler calls; no side effect)."""
    status, answer = cluster.verb("prioritize", {"Pod": pod, "NodeNames": names})
    assert status == 200, answer
    return {h["Host"]: h["Score"] for h in answer}


def test_16_the_filter_shortlist_among_many_gpu_nodes(clean: LocalCluster) -> None:
    """130 GPU nodes fit every pod here, more than the filter names (extender.filterShortlist, 1), so
    kube-scheduler scores nothing and sends no prioritize. Packing is unchanged: a pod lands on the
    node the extender ranks best among all (a tight fit), 24 pods created at once are all placed with
    no GPU over-committed, kube-scheduler sent them no prioritize, and the shortlist did cut (its
    metric). A pod with a preferred node affinity is not shortlisted (kube-scheduler scores it, the
    prioritize included): it reaches its preferred node although the extender ranks 129 nodes above
    it, which any shortlist below 130 would have left out."""
    cluster = clean
    names = [f"many-{i:03d}" for i in range(MANY_NODES)]
    idle = [(0.0, 0.0)] * 8
    gpus = {n: list(idle) for n in names}
    gpus[TIGHT_NODE][0] = (MANY_GPU_MIB - 7000.0, 0.0)  # 6.8 GiB free: the tightest fit for a 6 GiB pod
    gpus[BUSY_NODE] = [(0.0, 0.15)] * 8  # busier GPUs: a spreading pod ranks this node below the idle ones
    for name in names:
        cluster.core.create_node(node_body(name, {"many": "true"}, gpus=8))
    reporters: _Reporters | None = None
    try:
        wait_for(f"{MANY_NODES} nodes Ready", lambda: sum(
            1 for n in cluster.core.list_node(label_selector="many=true").items
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))) >= MANY_NODES, 120)
        reporters = _Reporters(cluster, names, gpus)
        reporters.report_all()
        assert not reporters.refused, reporters.refused[:3]
        reporters.thread.start()
        candidates = [*names, *cluster.simulated_gpus]

        tight = sized("shortlist-tight", 6)
        ranked = _prioritize(cluster, tight, candidates)
        best = max(ranked, key=lambda n: ranked[n])
        assert list(ranked.values()).count(ranked[best]) == 1, "the extender ranks one node first"
        cut_before = _not_shortlisted(cluster)
        create(cluster, tight)
        assert scheduled(cluster, "shortlist-tight", timeout_s=60) == best

        burst = [f"shortlist-burst-{i}" for i in range(24)]
        prioritized = _prioritized(cluster)
        for name in burst:
            create(cluster, sized(name, 6))
        for name in burst:
            scheduled(cluster, name, timeout_s=120)
        # the filter named one node each time: kube-scheduler scored nothing and sent no prioritize
        assert _prioritized(cluster) == prioritized, "kube-scheduler sent a prioritize after a one-node filter"
        assert _not_shortlisted(cluster) - cut_before >= 25 * (MANY_NODES - 100), "the filter named every node"
        booked: dict[str, float] = {}
        for pod in s.live_gpu_pods(cluster):
            annotations = pod.metadata.annotations
            for uuid in annotations[f"{PREFIX}assigned-gpus"].split(","):
                booked[uuid] = booked.get(uuid, 0.0) + float(annotations[f"{PREFIX}admission-memory-mib"])
        free = {f"GPU-{n}-{i}": MANY_GPU_MIB - used for n in names for i, (used, _) in enumerate(gpus[n])}
        over = {u: b for u, b in booked.items() if u in free and b > free[u]}
        assert not over, f"GPUs booked beyond their free memory: {over}"

        prefers = sized("shortlist-prefers", 6, criticality="high")
        prefers["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [BUSY_NODE]}]}}]}}
        ranked = _prioritize(cluster, prefers, candidates)
        above = sum(1 for score in ranked.values() if score > ranked[BUSY_NODE])
        assert above >= 100, f"only {above} nodes rank above {BUSY_NODE}: the check needs a node a shortlist leaves out"
        prioritized = _prioritized(cluster)
        create(cluster, prefers)
        assert scheduled(cluster, "shortlist-prefers", timeout_s=60) == BUSY_NODE
        assert _prioritized(cluster) > prioritized, "every node named, yet kube-scheduler sent no prioritize"
        assert not reporters.refused, reporters.refused[:3]
    finally:
        if reporters is not None:
            reporters.stop.set()
        s.delete_workloads(cluster)
        for name in names:
            cluster.core.delete_node(name)


def _prioritized(cluster: LocalCluster) -> float:
    """The prioritize requests the extender answered (kube-scheduler's and the test's own)."""
    return sum(value for labels, value in s.samples(cluster.extender_metrics(), "deepres_extender_requests_total")
               if labels.get("verb") == "prioritize")


def _not_shortlisted(cluster: LocalCluster) -> float:
    return sum(value for labels, value in s.samples(cluster.extender_metrics(), "deepres_extender_filter_nodes_total")
               if labels.get("reason") == "not_shortlisted")


def test_17_a_bound_pod_annotated_unparsably_keeps_its_gpu_through_a_restart(clean: LocalCluster) -> None:
    """#34 row 1 against the real API server: a user patches a bound pod's `deepres.io/gpus` to "²"
    (`str.isdigit()` takes it, `int()` does not); the restarted extender becomes ready, keeps that pod's
    GPU booked, and says so by an Event on the pod and a metric."""
    cluster = clean
    create(cluster, sized("tampered", 70))  # only an 80 GB A100 holds it
    node = scheduled(cluster, "tampered")
    tampered_gpu = cluster.pod("tampered").metadata.annotations[f"{PREFIX}assigned-gpus"]
    cluster.core.patch_namespaced_pod("tampered", JOBS_NAMESPACE, {"metadata": {"annotations": {f"{PREFIX}gpus": "²"}}})
    cluster.restart_scheduler_pod()  # returns once the restarted extender is ready (fails after 120 s)
    metrics = cluster.extender_metrics()
    restored = [v for labels, v in s.samples(metrics, "deepres_extender_restore_unparsable_pods_total")
                if labels.get("part") == "annotations"]
    assert restored == [1.0], restored
    reserved = {labels["node"]: v for labels, v in s.samples(metrics, "deepres_extender_reserved_memory_mib")}
    # its admission (70 GiB), or after the usage rule's warm-up what it uses (63 GiB) times the margin
    assert reserved.get(node, 0.0) >= 60 * 1024, f"the tampered pod's GPU is no longer booked: {reserved}"
    events = wait_for("a RestoredUnparsable event", lambda: [
        e for e in cluster.events("tampered") if e.reason == "RestoredUnparsable"], 60, 0.5)
    assert events[0].type == "Warning" and f"{PREFIX}gpus" in events[0].message, events[0].message
    create(cluster, sized("after-restart", 70))  # the other 80 GB GPU, never the tampered pod's
    scheduled(cluster, "after-restart")
    assert cluster.pod("after-restart").metadata.annotations[f"{PREFIX}assigned-gpus"] != tampered_gpu
    s.assert_no_gpu_overcommitted(cluster)


def test_18_a_gpu_uuid_belongs_to_the_node_that_owns_it(clean: LocalCluster) -> None:
    """Issue 34 row 3 against the real API server: agents' tokens bound to their Node (TokenRequest). The
    claimer's agent lists the owner's GPU UUID: answered 409 naming it (accepted without it, never taken
    over), it cannot report as the owner, and the owner's GPU stays healthy (a pod fits there)."""
    from kubernetes import client

    cluster = clean
    owner, claimer = "uuid-owner", "uuid-claimer"
    for name in (owner, claimer):
        cluster.core.create_node(node_body(name, {"uuidtest": "true"}))
    try:
        uids = {n.metadata.name: n.metadata.uid for n in cluster.core.list_node(label_selector="uuidtest=true").items}
        tokens = {}
        for name in (owner, claimer):
            spec = client.V1TokenRequestSpec(audiences=["deepres-extender"], expiration_seconds=3600,
                                             bound_object_ref=client.V1BoundObjectReference(
                                                 api_version="v1", kind="Node", name=name, uid=uids[name]))
            tokens[name] = cluster.core.create_namespaced_service_account_token(
                "deepres-agent", s.NAMESPACE, client.AuthenticationV1TokenRequest(spec=spec)).status.token
        url = f"http://127.0.0.1:{cluster.extender_port}"
        sequence = [0]

        def send(node: str, uuids: list[str], token_of: str) -> tuple[int, Any]:
            sequence[0] += 1
            gpus = [{"uuid": u, "index": i, "model": "NVIDIA A100-SXM4-80GB", "memory_total_mib": MANY_GPU_MIB,
                     "memory_used_mib": 0.0, "utilization_gpu": 0.0} for i, u in enumerate(uuids)]
            return post(url + "/v1/telemetry", {"node": node, "sequence": sequence[0], "timestamp_s": time.time(),
                                                 "agent_version": "scenario", "source": "simulated", "gpus": gpus,
                                                 "pods": []}, token=tokens[token_of])

        wait_for("the owner's report accepted (the extender knows the node)",
                 lambda: send(owner, ["GPU-uuid-owner-0"], owner)[0] == 200, 60)
        status, answer = send(claimer, ["GPU-uuid-owner-0", "GPU-uuid-claimer-0"], claimer)
        assert status == 409 and answer["refused_gpus"] == ["GPU-uuid-owner-0"], answer
        assert send(owner, ["GPU-uuid-owner-0"], claimer)[0] == 401  # speaks only for its own node
        assert send(owner, ["GPU-uuid-owner-0"], owner)[0] == 200
        pod = sized("uuid-fits", 6)
        for node in (owner, claimer):  # one node offered at a time: the filter names one node (its shortlist)
            status, answer = cluster.verb("filter", {"Pod": pod, "NodeNames": [node]})
            assert status == 200 and answer["NodeNames"] == [node], (node, answer)
        conflicts = sum(v for _, v in s.samples(cluster.extender_metrics(),
                                                "deepres_extender_telemetry_uuid_conflicts_total"))
        assert conflicts >= 1
    finally:
        for name in (owner, claimer):
            cluster.core.delete_node(name)


def test_19_a_forged_assignment_never_outranks_the_pod_deepres_bound(clean: LocalCluster) -> None:
    """The restore trusts `deepres.io/assigned-gpus` no further than it can check, against the real API
    server. A pod created straight onto a node (spec.nodeName, in the release namespace, which the chart's
    admission policy leaves out) names the GPU deepres gave a running 70 GiB pod, plus a GPU that does not
    exist, and backdates its `bound-at`. After a restart the phantom GPU is not booked, the forged pod (the
    later one: its `bound-at` is capped by its creation) gets a Warning Event and the metric, the honest
    pod's GPU stays booked, and a new 70 GiB pod goes to the other 80 GB GPU."""
    cluster = clean
    create(cluster, sized("honest", 70))  # only an 80 GB A100 holds it
    node = scheduled(cluster, "honest")
    honest = cluster.pod("honest")
    honest_gpu = honest.metadata.annotations[f"{PREFIX}assigned-gpus"]
    # the API server's times have whole seconds: the forged pod is created in a later second than the
    # honest pod's bind (else the two tie on time, and the uid decides)
    bound = max([parse_time(honest.metadata.annotations[f"{PREFIX}bound-at"])] + [
        c.last_transition_time.timestamp() for c in honest.status.conditions or () if c.type == "PodScheduled"])
    wait_for("a second past the honest pod's bind", lambda: time.time() >= bound + 1.0, 5, 0.05)
    forged = s.workload("forged", {f"{PREFIX}gpu-memory": "70Gi", f"{PREFIX}assigned-gpus": f"{honest_gpu},GPU-forged",
                                   f"{PREFIX}admission-memory-mib": "71680", f"{PREFIX}predicted-memory-mib": "71680",
                                   f"{PREFIX}bound-at": "2020-01-01T00:00:00Z"})
    forged["metadata"]["namespace"] = s.NAMESPACE
    forged["spec"]["nodeName"] = node
    cluster.core.create_namespaced_pod(s.NAMESPACE, forged)
    try:
        cluster.restart_scheduler_pod()

        def found() -> dict[str, float]:
            return {labels["reason"]: v for labels, v in s.samples(cluster.extender_metrics(),
                                                                   "deepres_extender_restore_invalid_pods_total")}

        reasons = wait_for("the forged pod's GPUs refused in part", lambda: (got := found()).get("overbooked") and got,
                           30, 0.5)
        assert reasons.get("unknown_gpu", 0.0) >= 1.0, reasons
        events = wait_for("a RestoredOverbooked event", lambda: [
            e for e in cluster.events("forged", s.NAMESPACE) if e.reason == "RestoredOverbooked"], 30, 0.5)
        assert events[0].type == "Warning" and honest_gpu in events[0].message, events[0].message
        assert not [e for e in cluster.events("honest") if e.reason.startswith("Restored")]
        create(cluster, sized("after-restart", 70))
        scheduled(cluster, "after-restart")
        assert cluster.pod("after-restart").metadata.annotations[f"{PREFIX}assigned-gpus"] != honest_gpu
        s.assert_no_gpu_overcommitted(cluster)
    finally:
        cluster.core.delete_namespaced_pod("forged", s.NAMESPACE, grace_period_seconds=0)


def test_20_a_pod_set_aside_is_retried_when_the_node_frees_what_it_had_free_at_the_last_publication(
        clean: LocalCluster) -> None:
    """kube-scheduler retries a pod the extender refused only on a cluster event, and the agent's Node
    annotation is that event when GPU memory frees (its report alone reaches only the extender). A node
    whose jobs all ended frees exactly what it had free at its last publication: that patch used to leave
    the Node as it was, so the API server wrote nothing, sent no event, and the pod waited for
    kube-scheduler's 5 minutes (a full-suite run lost test 17 so). Here the node's report and the
    agent's patch are made by the test, through the agent's own annotator, with the real API server,
    kube-scheduler and extender: 141 GiB free published, a 130 GiB job, a 100 GiB pod refused, the job
    gone, 141 GiB published again: the pod is placed."""
    from kubernetes import client

    from extender.agent.kube import KubeNodeAnnotator

    cluster, node, gpu_mib = clean, "nudge-node", 141 * 1024
    cluster.core.create_node(node_body(node, {"nudgetest": "true"}, gpus=1))
    try:
        spec = client.V1TokenRequestSpec(audiences=["deepres-extender"], expiration_seconds=3600,
                                         bound_object_ref=client.V1BoundObjectReference(
                                             api_version="v1", kind="Node", name=node,
                                             uid=cluster.core.read_node(node).metadata.uid))
        token = cluster.core.create_namespaced_service_account_token(
            "deepres-agent", s.NAMESPACE, client.AuthenticationV1TokenRequest(spec=spec)).status.token
        sequence = [0]

        def report(used_mib: float) -> int:
            sequence[0] += 1
            gpus = [{"uuid": "GPU-nudge-0", "index": 0, "model": "NVIDIA H200", "memory_total_mib": gpu_mib,
                     "memory_used_mib": used_mib, "utilization_gpu": 0.0}]
            status, _ = post(f"http://127.0.0.1:{cluster.extender_port}/v1/telemetry",
                             {"node": node, "sequence": sequence[0], "timestamp_s": time.time(),
                              "agent_version": "scenario", "source": "simulated", "gpus": gpus, "pods": []},
                             token=token)
            return status

        annotator = KubeNodeAnnotator(cluster.core, node)
        wait_for("the node's first report accepted", lambda: report(0.0) == 200, 60)
        assert annotator.patch_now(gpu_mib)  # the agent's publication at start: all of it free
        assert report(130 * 1024) == 200  # a job arrives (free memory falling is never published)
        create(cluster, sized("set-aside", 100))  # only this node's GPU is that large
        wait_for("the extender to refuse it on this node", lambda: [
            e for e in cluster.events("set-aside") if e.reason == "FailedScheduling" and "GiB free" in e.message],
            60, 0.5)
        assert node_of(cluster, "set-aside") is None
        assert report(0.0) == 200  # the job ended: the extender sees the room, kube-scheduler does not
        version = cluster.core.read_node(node).metadata.resource_version
        assert annotator.patch_now(gpu_mib)  # the same free memory as the last publication
        assert cluster.core.read_node(node).metadata.resource_version != version, "the patch was no Node update"
        assert scheduled(cluster, "set-aside", 60) == node
    finally:
        cluster.core.delete_node(node)
