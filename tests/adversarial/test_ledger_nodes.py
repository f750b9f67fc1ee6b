"""Issue 34, what nodes' agents can do to other nodes:

- row 7, the telemetry token holder at the node cap (local mode): re-reporting invented nodes and
  adding new ones never pushes out a real node that reports on its heartbeat and holds or recently
  held pods, and making room touches only the forgotten node's GPUs (it scanned every GPU's owner
  under the ledger lock: 15-59 ms per new node at 20,000 nodes);
- row 3, one node's agent listing another node's GPU UUIDs: refused for that report with a clear
  error to the reporting agent and a metric, never taken over, the owning node's GPUs stay healthy.
"""

from __future__ import annotations

from typing import Any

from extender import ledger as ledger_module
from extender.ledger import Ledger, Reserved
from extender.policy.types import PodRequest, PolicyParams, PriorityInputs, Reservation
from extender.telemetry import GpuReport, NodeReport

P = PolicyParams(sharing=False)
GPU_MIB = 16_384.0
CAP = 50


def node_report(node: str, seq: int, gpus: int = 1) -> NodeReport:
    return NodeReport(node, seq, 0.0, "test", "simulated",
                      tuple(GpuReport(f"{node}-gpu{i}", i, "T4", GPU_MIB, 0.0) for i in range(gpus)), (), boot_id="b")


def place(ledger: Ledger, uid: str, node: str, now_s: float) -> None:
    req = PodRequest(uid, "ns", uid, 1, 4096.0, 4096.0, 1.0)
    template = Reservation(uid, "ns", uid, node, (), 4096.0, 4096.0, 4096.0, PriorityInputs(), now_s)
    assert isinstance(ledger.reserve_on(req, template, now_s), Reserved)


def test_reports_of_nodes_nobody_placed_on_never_push_out_a_node_that_had_pods(monkeypatch: Any) -> None:
    """At the cap (lowered to 50), the attacker re-reports its invented nodes faster than the real nodes'
    heartbeat and adds a new one each round: the real node whose pod just ended (no reservation now)
    and the one holding a pod both stay; invented nodes make room for the new ones."""
    monkeypatch.setattr(ledger_module, "NODES_MAX", CAP)
    ledger = Ledger(P)
    now, seq = 0.0, 1
    for real in ("real-emptied", "real-busy"):
        assert ledger.apply_report(node_report(real, seq), now) == "accepted"
    place(ledger, "finished", "real-emptied", now)
    place(ledger, "running", "real-busy", now)
    assert ledger.release("finished") is not None  # its pod ended: a recent placement, no reservation
    phantoms = [f"phantom-{i}" for i in range(CAP)]
    for name in phantoms:
        ledger.apply_report(node_report(name, 1), now)
    for round_ in range(3 * CAP):
        now, seq = now + 5.0, seq + 1
        for real in ("real-emptied", "real-busy"):  # their heartbeat: a report every 5 s
            assert ledger.apply_report(node_report(real, seq), now) == "accepted"
        for name in [n for n in ledger.views if not n.startswith("real")]:  # re-reported after the heartbeat
            ledger.apply_report(node_report(name, seq), now + 1.0)
        assert ledger.apply_report(node_report(f"new-{round_}", 1), now + 2.0) == "accepted"
    views = ledger.views
    assert "real-emptied" in views and "real-busy" in views
    assert len(views) == CAP and f"new-{3 * CAP - 1}" in views


def test_making_room_at_the_cap_touches_only_the_forgotten_nodes_gpus(monkeypatch: Any) -> None:
    """Each new node at the cap forgets one node; it used to scan every GPU's owner for it (O(all GPUs)
    under the ledger lock). Counted: no pass over the owner map while 100 nodes make room."""
    monkeypatch.setattr(ledger_module, "NODES_MAX", 1_000)
    ledger = Ledger(P)
    for i in range(1_000):
        ledger.apply_report(node_report(f"n{i}", 1, gpus=8), 0.0)

    class Counted(dict[str, str]):
        passes = 0

        def items(self) -> Any:
            Counted.passes += 1
            return super().items()

        def __iter__(self) -> Any:
            Counted.passes += 1
            return super().__iter__()

    ledger._owner = Counted(ledger._owner)
    for i in range(100):
        assert ledger.apply_report(node_report(f"late-{i}", 1, gpus=8), 1.0) == "accepted"
    assert Counted.passes == 0
    assert len(ledger.views) == 1_000 and "n0" not in ledger.views and "late-99" in ledger.views
    # the forgotten nodes' GPUs are free to be reported again (by a node that now has them)
    assert ledger.apply_report(node_report("n0", 2, gpus=8), 2.0) == "accepted"
    view = ledger.node_view("n0")
    assert view is not None and len(view.healthy) == 8



# ---- row 3: a GPU UUID belongs to one node ----

def _local_app() -> tuple[Any, Any]:
    from extender.kube.local import InMemoryCluster
    from extender.server.app import create_app, extender_of
    from extender.settings import Settings
    from tests.fixtures.kube.doubles import FormulaPredictor

    settings = Settings()
    settings.kube.no_kube = True
    settings.policy.sharing = False
    settings.telemetry.telemetry_token = "agents"
    app = create_app(settings, predictor=FormulaPredictor(), cluster=InMemoryCluster())
    return app.test_client(), extender_of(app)


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_local_mode_a_conflicting_uuid_claim_is_refused_loudly_and_the_owner_stays_healthy() -> None:
    """Local mode, first come: node b's agent lists node a's two GPUs (and one of its own). It is told
    which (409 naming the GPUs and their owner), the metric counts it, its own GPU is accepted, and
    a keeps both GPUs healthy and schedulable. The other order (the impostor first) is as loud: the
    real node's agent gets the 409 naming the node that claimed its GPUs, not a silent '0 healthy'."""
    from tests.adversarial.ledger_support import gpu, report
    from tests.fixtures.kube.payloads import binding_args, extender_args, pod

    client, ext = _local_app()
    headers = {"Authorization": "Bearer agents"}

    def send(node: str, seq: int, uuids: list[str]) -> Any:
        body = report(node, seq, [gpu(u, GPU_MIB, index=i) for i, u in enumerate(uuids)])
        return client.post("/v1/telemetry", json=body, headers=headers)

    assert send("a", 1, ["a-gpu0", "a-gpu1"]).status_code == 200
    for seq in (1, 2, 3):
        out = send("b", seq, ["a-gpu0", "a-gpu1", "b-gpu0"])
        assert out.status_code == 409
        answer = out.get_json()
        assert answer["refused_gpus"] == ["a-gpu0", "a-gpu1"] and "a-gpu0 (node a)" in answer["error"]
    assert send("a", 2, ["a-gpu0", "a-gpu1"]).status_code == 200  # the owner keeps reporting: never refused
    view_a, view_b = ext.state.node_view("a"), ext.state.node_view("b")
    assert view_a is not None and [g.uuid for g in view_a.healthy] == ["a-gpu0", "a-gpu1"]
    assert view_b is not None and [g.uuid for g in view_b.healthy] == ["b-gpu0"]
    p = pod("on-a", {"deepres.io/gpu-memory": "4Gi"})
    assert client.post("/filter", json=extender_args(p, names=["a"])).get_json()["NodeNames"] == ["a"]
    assert client.post("/bind", json=binding_args(p, "a")).get_json() == {"Error": ""}
    assert _metric(client.get("/metrics").get_data(as_text=True),
                   "deepres_extender_telemetry_uuid_conflicts_total") == 3.0
    # the impostor first: the real node's agent is told who holds its GPU
    assert send("x", 1, ["c-gpu0"]).status_code == 200
    out = send("c", 1, ["c-gpu0", "c-gpu1"])
    assert out.status_code == 409 and "c-gpu0 (node x)" in out.get_json()["error"]


def test_cluster_mode_an_agent_speaks_only_for_its_node() -> None:
    """Cluster mode with node-bound tokens: a's agent lists b's GPU UUID; refused for that report, never
    taken over (b's reservations and GPUs stay), and it cannot report as b."""
    from tests.adversarial.ledger_support import api_server, cluster_mode, gpu, report
    from tests.fixtures.kube.payloads import binding_args, pod
    from tests.fixtures.kube.server import post

    cluster = api_server()
    with cluster_mode(cluster) as (url, ext):
        ext.on_nodes_listed(["a", "b"])
        assert post(url + "/v1/telemetry", report("b", 1, [gpu("b-gpu0", GPU_MIB)]), token="token-b")[0] == 200
        held = pod("held", {"deepres.io/gpu-memory": "12Gi"})
        cluster.add_pod(held)
        assert post(url + "/bind", binding_args(held, "b")) == (200, {"Error": ""})
        claim = report("a", 1, [gpu("b-gpu0", GPU_MIB), gpu("a-gpu0", GPU_MIB, index=1)])
        status, out = post(url + "/v1/telemetry", claim, token="token-a")
        assert status == 409 and out["refused_gpus"] == ["b-gpu0"]
        assert post(url + "/v1/telemetry", report("b", 2, [gpu("b-gpu0", GPU_MIB)]), token="token-a")[0] == 401
        assert post(url + "/v1/telemetry", report("b", 2, [gpu("b-gpu0", GPU_MIB)]), token="token-b")[0] == 200
        view_b = ext.state.node_view("b")
        assert view_b is not None and [g.uuid for g in view_b.healthy] == ["b-gpu0"]
        assert view_b.healthy[0].reserved_mib == 12 * 1024.0
        view_a = ext.state.node_view("a")
        assert view_a is not None and [g.uuid for g in view_a.healthy] == ["a-gpu0"]
