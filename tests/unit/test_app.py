"""The Flask app through its test client: verbs, rollback, restart, telemetry auth, robustness."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from extender.kube.cluster import TokenIdentity
from extender.kube.local import InMemoryCluster
from extender.protocol import parse_pod
from extender.server import planner as app_module  # the scores the verbs call live there
from extender.server.app import create_app, extender_of
from extender.settings import Settings
from tests.fixtures.kube.doubles import FormulaPredictor
from tests.fixtures.kube.payloads import (
    CNN_ANNOTATIONS,
    binding_args,
    extender_args,
    node,
    pod,
    preemption_args,
    report,
)

TOKEN = "t0ken"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(cluster: InMemoryCluster | None = None, clock: Clock | None = None, local: bool = True,
         **policy: Any) -> tuple[FlaskClient, InMemoryCluster, Clock]:
    settings = Settings()
    settings.kube.no_kube = local
    settings.telemetry.telemetry_token = TOKEN
    settings.server.max_body_bytes = 200_000
    settings.telemetry.telemetry_max_bytes = 50_000
    # these tests are about memory: the compute rule (policy/sharing.py) is tested in test_sharing and
    # in the replay; a test asks for it with sharing=True
    settings.policy.sharing = False
    for key, value in policy.items():
        setattr(settings.kube if hasattr(settings.kube, key) else settings.policy, key, value)
    cluster = cluster if cluster is not None else InMemoryCluster()
    clock = clock or Clock()
    app = create_app(settings, predictor=FormulaPredictor(), clock=clock, cluster=cluster)
    return app.test_client(), cluster, clock


def send_report(client: FlaskClient, node_name: str, seq: int, gpus: list[tuple[float, float]],
                clock: Clock, pods: list[dict[str, Any]] | None = None, token: str = TOKEN) -> Any:
    body = report(node_name, seq, clock.now, gpus, pods)
    return client.post("/v1/telemetry", json=body, headers={"Authorization": f"Bearer {token}"})


def admission(annotations: dict[str, str]) -> float:
    from predictor.spec import JobSpec
    spec = JobSpec.parse({k.removeprefix("deepres.io/"): v for k, v in annotations.items()
                          if k.removeprefix("deepres.io/") not in ("gpus", "deadline", "criticality")})
    return FormulaPredictor().predict(spec).memory_mib_upper


NEED = admission(CNN_ANNOTATIONS)


@pytest.mark.parametrize("shortlist", [0, 100])
def test_filter_passes_fitting_nodes_and_explains_the_rest(shortlist: int) -> None:
    """Every failure is explained when no node fits (kube-scheduler's "0/N nodes are available" and
    its preemption read them), and with the shortlist off also beside nodes that fit; with the
    shortlist on, an answer with nodes that fit carries no failures (kube-scheduler drops every node
    not named)."""
    client, _, clock = make(filter_shortlist=shortlist)
    send_report(client, "old", 1, [(40960.0, 0.0)], clock)
    clock.now += 100  # the extender's clock at receipt decides the age, not the agent's timestamp
    send_report(client, "fits", 1, [(40960.0, 0.0)], clock)
    send_report(client, "full", 1, [(40960.0, 40000.0)], clock)
    for names, passed in ((["fits", "full", "old", "ghost"], ["fits"]), (["full", "old", "ghost"], [])):
        out = client.post("/filter", json=extender_args(pod("p", CNN_ANNOTATIONS), names=names)).get_json()
        assert out["NodeNames"] == passed and out["Error"] == ""
        if passed and shortlist:
            assert out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}
            continue
        assert out["FailedNodes"] == {"full": f"gpu-0: needs {NEED / 1024:.1f} GiB, 0.9 GiB free"}
        assert out["FailedAndUnresolvableNodes"]["ghost"] == "no agent report"
        assert out["FailedAndUnresolvableNodes"]["old"] == "telemetry stale (100s old)"


def _many_nodes(client: FlaskClient, clock: Clock, count: int) -> dict[str, float]:
    """`count` one-GPU nodes with different free memory (node-i: i GiB used of 40), in a shuffled order."""
    used = {f"n{i:03d}": float(1024 * (i % 37)) for i in range(count)}
    for seq, (name, mib) in enumerate(used.items()):
        send_report(client, name, seq + 1, [(40960.0, mib)], clock)
    return used


@pytest.mark.parametrize("annotations", [CNN_ANNOTATIONS, {**CNN_ANNOTATIONS, "deepres.io/criticality": "critical"}],
                         ids=["packing", "spreading"])
def test_filter_shortlists_the_best_fitting_nodes_by_the_prioritize_score(annotations: dict[str, str]) -> None:
    """With more nodes fitting than `filter_shortlist`, the filter names only that many: exactly the
    best by the score the full prioritize gives (ties to kube-scheduler's order), and the prioritize
    over them gives each the score it had among all (so the node kube-scheduler takes is the same)."""
    client, _, clock = make(filter_shortlist=5, assume_on_prioritize=False)  # the shortlist's mechanics alone
    used = _many_nodes(client, clock, 60)
    names = sorted(used, key=lambda n: (int(n[1:]) * 23) % 60)  # kube-scheduler's order is its own
    unlimited = pod("p", annotations)
    everyone = {h["Host"]: h["Score"] for h in client.post(
        "/prioritize", json=extender_args(unlimited, names=names)).get_json()}
    assert len(set(everyone.values())) > 2, everyone  # the ranking has something to rank
    out = client.post("/filter", json=extender_args(unlimited, names=names)).get_json()
    short = out["NodeNames"]
    assert len(short) == 5 and out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}
    assert short == [n for n in names if n in short], "kube-scheduler's order is kept"
    expected = sorted(names, key=lambda n: (-everyone[n], names.index(n)))[:5]
    assert set(short) == set(expected)
    again = {h["Host"]: h["Score"] for h in client.post(
        "/prioritize", json=extender_args(unlimited, names=short)).get_json()}
    assert again == {n: everyone[n] for n in short}


def _counting_scores(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls of the two scores over the matrix (the packing score and the spreading one)."""
    calls: list[int] = []
    for name in ("score_matrix", "score_matrix_fragaware"):
        original = getattr(app_module, name)

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(1)
            return _original(*args, **kwargs)

        monkeypatch.setattr(app_module, name, counted)
    return calls


@pytest.mark.parametrize("annotations", [CNN_ANNOTATIONS, {**CNN_ANNOTATIONS, "deepres.io/criticality": "critical"}],
                         ids=["packing", "spreading"])
def test_prioritize_after_the_filter_answers_the_scores_the_shortlist_was_ranked_by(
        annotations: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler sends a pod's prioritize right after its filter, with the shortlist: the
    extender answers with the scores it ranked the shortlist by (computed once, in the filter), which
    are the scores a prioritize computed anew gives."""
    # the shortlist's own mechanics: no assumption (`assume_on_prioritize`, tested on its own) moves scores
    client, _, clock = make(filter_shortlist=12, assume_on_prioritize=False)
    names = sorted(_many_nodes(client, clock, 60), key=lambda n: (int(n[1:]) * 23) % 60)
    for i in range(3):  # admissions: a demand mix for the packing score (the fragmentation-aware one)
        placed = pod(f"placed-{i}", CNN_ANNOTATIONS)
        client.post("/filter", json=extender_args(placed, names=names))
        assert client.post("/bind", json=binding_args(placed, names[i])).get_json()["Error"] == ""
    ext = extender_of(client.application)
    body = pod("p", annotations)
    packing = ext._packing_mix(ext.plan(parse_pod(body), clock.now).request) is not None
    assert packing == (annotations == CNN_ANNOTATIONS)
    calls = _counting_scores(monkeypatch)
    short = client.post("/filter", json=extender_args(body, names=names)).get_json()["NodeNames"]
    assert len(calls) == 1
    # scored anew on the state the prioritize reads (its answer then reserves the best node for the pod until
    # its bind: `Planner.assume`)
    plan = ext.plan(parse_pod(body), clock.now)
    fresh = ext.scores(plan.request, tuple(short))
    kept = client.post("/prioritize", json=extender_args(body, names=short)).get_json()
    assert len(calls) == 2, "the prioritize scored the shortlist again"
    assert kept == [{"Host": n, "Score": v} for n, v in fresh.pairs()]
    assert len({h["Score"] for h in kept}) > 1, kept  # the ranking has something to rank


def test_prioritize_scores_anew_when_what_the_score_reads_changed_since_the_filter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortlist's scores stand only while nothing they read changed: a report that changes a
    shortlisted node between the filter and the prioritize, another order of the names, or a pod of
    several GPUs (whose score reads the NodeViews) gets a prioritize computed anew."""
    client, _, clock = make(filter_shortlist=5, assume_on_prioritize=False)  # the shortlist's mechanics alone
    used = _many_nodes(client, clock, 60)
    names = list(used)
    calls = _counting_scores(monkeypatch)
    ext = extender_of(client.application)

    def cycle(body: dict[str, Any], between: Any = None, reorder: bool = False) -> tuple[list[Any], list[Any]]:
        short = client.post("/filter", json=extender_args(body, names=names)).get_json()["NodeNames"]
        if between is not None:
            between(short)
        asked = short[::-1] if reorder else short
        answer = client.post("/prioritize", json=extender_args(body, names=asked)).get_json()
        fresh = ext.scores(ext.plan(parse_pod(body), clock.now).request, tuple(asked)).pairs()
        return answer, [{"Host": n, "Score": v} for n, v in fresh]

    def fill(short: list[str]) -> None:  # the best node fills up (another scheduler's pod, say)
        send_report(client, short[0], 10_000, [(40960.0, 40000.0)], clock)

    del calls[:]
    answer, fresh = cycle(pod("a", CNN_ANNOTATIONS), between=fill)
    assert answer == fresh and len(calls) == 3  # filter, prioritize anew, and `fresh`
    assert answer[0]["Score"] == 0, "the filled node kept its old score"
    del calls[:]
    answer, fresh = cycle(pod("b", CNN_ANNOTATIONS), reorder=True)
    assert answer == fresh and len(calls) == 3
    del calls[:]
    two = pod("c", {**CNN_ANNOTATIONS, "deepres.io/gpus": "2"})
    for n in names:  # nodes of two GPUs, so that a two-GPU pod fits somewhere
        send_report(client, n, 20_000 + names.index(n), [(40960.0, used[n]), (40960.0, 0.0)], clock)
    answer, fresh = cycle(two)
    assert answer == fresh and len(calls) == 3


def test_no_shortlist_for_pods_kube_scheduler_scores_by_their_own_preferences() -> None:
    """A preferred node affinity (or pod affinity, or a ScheduleAnyway spread) is scored by
    kube-scheduler's plugins over the nodes the filter names: such a pod gets every node that fits,
    and so does a pod that is not a GPU job; with the shortlist off, everyone does."""
    client, _, clock = make(filter_shortlist=3)
    used = _many_nodes(client, clock, 12)
    names = list(used)
    prefers = pod("prefers", CNN_ANNOTATIONS)
    prefers["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n011"]}]}}]}}
    spreads = pod("spreads", CNN_ANNOTATIONS)
    spreads["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"app": "x"}}}]
    strict = pod("strict", CNN_ANNOTATIONS)
    strict["spec"]["topologySpreadConstraints"] = [{**spreads["spec"]["topologySpreadConstraints"][0],
                                                    "whenUnsatisfiable": "DoNotSchedule"}]
    for body, count in ((prefers, 12), (spreads, 12), (pod("web", {"app": "nginx"}), 12), (strict, 3),
                        (pod("plain", CNN_ANNOTATIONS), 3)):
        out = client.post("/filter", json=extender_args(body, names=names)).get_json()
        assert len(out["NodeNames"]) == count, body["metadata"]["name"]
    off, _, clock = make(filter_shortlist=0)
    _many_nodes(off, clock, 12)
    assert len(off.post("/filter", json=extender_args(pod("plain", CNN_ANNOTATIONS), names=names))
               .get_json()["NodeNames"]) == 12


def test_full_node_objects_mode_returns_node_objects() -> None:
    client, _, clock = make()
    send_report(client, "a", 1, [(40960.0, 0.0)], clock)
    body = extender_args(pod("p", CNN_ANNOTATIONS), nodes=[node("a"), node("b")])
    out = client.post("/filter", json=body).get_json()
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["a"] and out["NodeNames"] == ["a"]


def test_bad_annotation_fails_every_node_unresolvable_with_one_warning_event() -> None:
    client, cluster, clock = make()
    send_report(client, "a", 1, [(40960.0, 0.0)], clock)
    body = extender_args(pod("p", {**CNN_ANNOTATIONS, "deepres.io/gpus": "many"}), names=["a", "b"])
    for _ in range(3):
        out = client.post("/filter", json=body).get_json()
    reason = out["FailedAndUnresolvableNodes"]["a"]
    assert set(out["FailedAndUnresolvableNodes"]) == {"a", "b"} and out["NodeNames"] == []
    assert "deepres.io/gpus='many'" in reason and "1 to 64" in reason
    assert extender_of(client.application).events.drain()  # events are sent off the request path
    assert [e for e in cluster.events if e[1] == "InvalidAnnotation"] == [("default/p", "InvalidAnnotation",
                                                                           reason, True)]


def test_not_a_gpu_job_passes_and_scores_neutrally_and_binds_without_reservation() -> None:
    client, cluster, clock = make()
    send_report(client, "a", 1, [(40960.0, 40960.0)], clock)
    web = pod("web", {"app": "nginx"})
    assert client.post("/filter", json=extender_args(web, names=["a"])).get_json()["NodeNames"] == ["a"]
    assert client.post("/prioritize", json=extender_args(web, names=["a"])).get_json() == [{"Host": "a", "Score": 5}]
    assert client.post("/bind", json=binding_args(web, "a")).get_json() == {"Error": ""}
    assert cluster.pods[("default", "web")]["spec"]["nodeName"] == "a"


def test_bind_reserves_annotates_binds_and_refuses_overcommit() -> None:
    client, cluster, clock = make()
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    first, second = pod("p1", CNN_ANNOTATIONS), pod("p2", CNN_ANNOTATIONS)
    for p in (first, second):
        client.post("/filter", json=extender_args(p, names=["a"]))
    assert client.post("/bind", json=binding_args(first, "a")).get_json() == {"Error": ""}
    stored = cluster.pods[("default", "p1")]
    assert stored["spec"]["nodeName"] == "a"
    notes = stored["metadata"]["annotations"]
    assert notes["deepres.io/assigned-gpus"] == "a-gpu0" and notes["deepres.io/assigned-node"] == "a"
    assert float(notes["deepres.io/admission-memory-mib"]) == pytest.approx(NEED, abs=1)
    assert notes["deepres.io/predictor-version"] == "test-double-1"
    assert "placed on a gpu 0" in notes["deepres.io/placement"] and "GFLOP/iter" in notes["deepres.io/placement"]
    refused = client.post("/bind", json=binding_args(second, "a")).get_json()["Error"]
    assert refused.startswith("cannot bind default/p2 to a: gpu-0: needs")
    assert ("default", "p2") not in cluster.pods
    filtered = client.post("/filter", json=extender_args(second, names=["a"])).get_json()
    assert filtered["NodeNames"] == [] and "a" in filtered["FailedNodes"]


@pytest.mark.parametrize("placed_events", [False, True])
def test_the_placed_event_is_sent_only_when_asked(placed_events: bool) -> None:
    """By default the Binding is the bind's only API write (the placement is in its annotations);
    `placed_events` adds a `Placed` Event with the same text."""
    client, cluster, clock = make(placed_events=placed_events)
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    first = pod("p1", CNN_ANNOTATIONS)
    client.post("/filter", json=extender_args(first, names=["a"]))
    assert client.post("/bind", json=binding_args(first, "a")).get_json() == {"Error": ""}
    extender_of(client.application).events.drain()
    placed = [e for e in cluster.events if e[1] == "Placed"]
    if placed_events:
        annotation = cluster.pods[("default", "p1")]["metadata"]["annotations"]["deepres.io/placement"]
        assert [e[2] for e in placed] == [annotation]
    else:
        assert placed == []


def test_failed_binding_rolls_the_reservation_back_and_writes_no_annotation() -> None:
    """The annotations travel in the Binding (one API update): a refused Binding leaves none."""
    failing = "fail_bind"
    client, cluster, clock = make()
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    p = pod("p1", CNN_ANNOTATIONS)
    client.post("/filter", json=extender_args(p, names=["a"]))
    setattr(cluster, failing, True)
    assert "injected failure" in client.post("/bind", json=binding_args(p, "a")).get_json()["Error"]
    ext = extender_of(client.application)
    assert ext.state.reservations() == []
    stored = cluster.pods.get(("default", "p1"))
    assert stored is None or "deepres.io/assigned-gpus" not in (stored["metadata"].get("annotations") or {})
    setattr(cluster, failing, False)
    assert client.post("/bind", json=binding_args(p, "a")).get_json() == {"Error": ""}


def bound_one(cluster: InMemoryCluster) -> tuple[FlaskClient, Clock, dict[str, Any]]:
    """An extender over `cluster` with node "a" (room for one pod) and pod "p1" filtered and bound there."""
    client, _, clock = make(cluster)
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    p1 = pod("p1", CNN_ANNOTATIONS)
    client.post("/filter", json=extender_args(p1, names=["a"]))
    assert client.post("/bind", json=binding_args(p1, "a")).get_json() == {"Error": ""}
    return client, clock, p1


def test_pod_end_releases_and_restart_rebuilds_without_double_allocation() -> None:
    cluster = InMemoryCluster()
    _, clock, p1 = bound_one(cluster)
    # restart: a new process, same cluster
    client2, _, _ = make(cluster, clock)
    restored = extender_of(client2.application).state.reservations()
    assert [(r.pod_uid, r.gpu_uuids) for r in restored] == [(p1["metadata"]["uid"], ("a-gpu0",))]
    send_report(client2, "a", 1, [(NEED * 1.5, 0.0)], clock)  # no usage seen yet: the reservation holds
    p2 = pod("p2", CNN_ANNOTATIONS)
    out = client2.post("/filter", json=extender_args(p2, names=["a"])).get_json()
    assert out["NodeNames"] == []
    assert client2.post("/bind", json=binding_args(p2, "a")).get_json()["Error"]
    cluster.finish_pod("default", "p1")
    assert extender_of(client2.application).state.reservations() == []
    assert client2.post("/bind", json=binding_args(p2, "a")).get_json() == {"Error": ""}


def test_usage_rule_shrinks_a_reservation_once_the_peak_is_shown() -> None:
    client, _, clock = make(usage_warmup_s=60.0, usage_plateau_s=120.0, usage_plateau_samples=2,
                            correction_min_pods=1, correction_min_nodes=1)
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    p1 = pod("p1", CNN_ANNOTATIONS)
    client.post("/filter", json=extender_args(p1, names=["a"]))
    client.post("/bind", json=binding_args(p1, "a"))
    usage = [{"pod_uid": p1["metadata"]["uid"], "current_memory_mib": 300.0, "peak_memory_mib": 400.0,
              "gpu_uuids": ["a-gpu0"]}]
    clock.now += 60
    send_report(client, "a", 2, [(NEED * 1.5, 400.0)], clock, pods=usage)
    state = extender_of(client.application).state
    assert state.reserved_mib("a", "a-gpu0") > 440.0  # warmed up, but one sample shows no plateau
    clock.now += 120
    send_report(client, "a", 3, [(NEED * 1.5, 400.0)], clock, pods=usage)
    assert state.reserved_mib("a", "a-gpu0") == pytest.approx(440.0)
    p2 = pod("p2", CNN_ANNOTATIONS)  # same signature: admitted with the observed peak, not the prediction
    out = client.post("/filter", json=extender_args(p2, names=["a"])).get_json()
    assert out["NodeNames"] == ["a"]
    predicted = client.post("/v1/predict", json={"annotations": CNN_ANNOTATIONS}).get_json()
    assert predicted["admission_source"] == "corrected" and predicted["admission_memory_mib"] == pytest.approx(440.0)


def test_preempt_only_strictly_lower_priority_and_never_empty_nodes() -> None:
    client, _, clock = make()
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    send_report(client, "b", 1, [(NEED * 1.5, 0.0)], clock)
    low = pod("low", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"})
    peer = pod("peer", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"})
    for p, n in ((low, "a"), (peer, "b")):
        client.post("/filter", json=extender_args(p, names=[n]))
        assert client.post("/bind", json=binding_args(p, n)).get_json() == {"Error": ""}
    high = pod("high", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"})
    for meta in (True, False):
        out = client.post("/preempt", json=preemption_args(high, {"a": [], "b": [peer]}, meta=meta)).get_json()
        assert out == {"NodeNameToMetaVictims": {"a": {"Pods": [{"UID": low["metadata"]["uid"]}],
                                                       "NumPDBViolations": 0}}}


def test_telemetry_auth_validation_and_sequence() -> None:
    client, _, clock = make()
    body = report("a", 5, clock.now, [(1000.0, 0.0)])
    assert client.post("/v1/telemetry", json=body).status_code == 401
    assert client.post("/v1/telemetry", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = client.post("/v1/telemetry", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.get_json() == {"accepted": True, "outcome": "accepted", "deltas": True}
    again = client.post("/v1/telemetry", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert again.get_json() == {"accepted": False, "outcome": "old sequence"}
    bad = client.post("/v1/telemetry", json={**body, "gpus": "x"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bad.status_code == 400 and bad.get_json()["error"].startswith("report.gpus")
    huge = client.post("/v1/telemetry", data=b"{" + b" " * 60_000 + b"}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert huge.status_code == 413


def test_cluster_tokens_are_bound_to_their_node() -> None:
    cluster = InMemoryCluster(tokens={
        "tok-a": TokenIdentity("system:serviceaccount:deepres:agent", "a", ("deepres-extender",)),
        "tok-unbound": TokenIdentity("system:serviceaccount:deepres:agent", "", ("deepres-extender",)),
        "tok-aud": TokenIdentity("system:serviceaccount:deepres:agent", "a", ("other",)),
    })
    client, _, clock = make(cluster, local=False, agent_service_accounts=["system:serviceaccount:deepres:agent"])
    assert send_report(client, "a", 1, [(1000.0, 0.0)], clock, token="tok-a").status_code == 200
    wrong = send_report(client, "b", 1, [(1000.0, 0.0)], clock, token="tok-a")
    assert wrong.status_code == 401 and "bound to node a" in wrong.get_json()["error"]
    assert send_report(client, "a", 2, [(1000.0, 0.0)], clock, token="tok-unbound").status_code == 401
    assert send_report(client, "a", 2, [(1000.0, 0.0)], clock, token="tok-aud").status_code == 401
    assert send_report(client, "a", 2, [(1000.0, 0.0)], clock, token=TOKEN).status_code == 401


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/preempt"])
@pytest.mark.parametrize("data", [b"not json", b"\xff\xfe\x00", b"null", b"[]", b"{}", b'{"Pod": null}',
                                  b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": null, "Nodes": null}',
                                  b'{"PodName": null, "Node": 3}', b"[" * 5000 + b"]" * 5000])
def test_malformed_verbs_answer_200_with_their_shape(path: str, data: bytes) -> None:
    client, _, _ = make()
    response = client.post(path, data=data, content_type="application/json")
    assert response.status_code == 200
    out = response.get_json()
    assert "Traceback" not in response.get_data(as_text=True)
    if path in ("/filter", "/bind"):
        assert out["Error"]
    elif path == "/prioritize":
        assert out == []
    else:
        assert out == {"NodeNameToMetaVictims": {}}


def test_huge_verb_body_is_413_and_unknown_routes_are_json() -> None:
    client, _, _ = make()
    response = client.post("/filter", data=b"x" * 300_000, content_type="application/json")
    assert response.status_code == 413 and "larger than" in response.get_json()["error"]
    assert client.get("/nope").status_code == 404 and client.get("/filter").status_code == 405


def test_predict_probes_metrics_and_openapi() -> None:
    client, _, clock = make()
    out = client.post("/v1/predict", json={"model-type": "cnn", "batch-size": "64"}).get_json()
    assert out["gpu_job"] and out["demand"]["model_version"] == "test-double-1" and out["admission_source"] == "model"
    assert client.post("/v1/predict", json={"model-type": "cnnx"}).status_code == 400
    assert client.post("/v1/predict", json=[1]).status_code == 400
    # a Pod is read as the extender reads a pod: another tool's annotation is not a deepres key
    other = {"kubectl.kubernetes.io/last-applied-configuration": "{}", "deepres.io/model-type": "cnn"}
    as_pod = client.post("/v1/predict", json={"metadata": {"name": "p", "annotations": other}})
    assert as_pod.status_code == 200 and as_pod.get_json()["gpu_job"], as_pod.get_json()
    assert client.get("/healthz").status_code == 200 and client.get("/readyz").get_json()["ready"] is True
    send_report(client, "a", 1, [(1000.0, 0.0)], clock)
    client.post("/filter", json=extender_args(pod("p", CNN_ANNOTATIONS), names=["a"]))
    text = client.get("/metrics").get_data(as_text=True)
    for name in ("deepres_extender_requests_total", "deepres_extender_request_seconds_bucket",
                 "deepres_extender_filter_nodes_total", "deepres_extender_predictions_total",
                 'deepres_extender_telemetry_age_seconds{node="a"}', "deepres_extender_reservations",
                 "deepres_extender_overcommit_refused_total"):
        assert name in text
    doc = client.get("/openapi.json").get_json()
    assert doc["openapi"].startswith("3.") and {"/filter", "/bind", "/v1/telemetry"} <= set(doc["paths"])


def test_relist_releases_pods_gone_but_not_just_bound_ones() -> None:
    client, _, clock = make()
    send_report(client, "a", 1, [(NEED * 3, 0.0)], clock)
    p1 = pod("p1", CNN_ANNOTATIONS)
    client.post("/filter", json=extender_args(p1, names=["a"]))
    assert client.post("/bind", json=binding_args(p1, "a")).get_json() == {"Error": ""}
    ext = extender_of(client.application)
    ext.on_pods_listed([])  # a list taken just before the bind must not undo it
    assert len(ext.state.reservations()) == 1
    clock.now += 61
    ext.on_pods_listed([])
    assert ext.state.reservations() == []


def test_deleted_or_unlisted_nodes_lose_their_telemetry() -> None:
    client, cluster, clock = make()
    for name in ("a", "b"):
        send_report(client, name, 1, [(40960.0, 0.0)], clock)
    cluster.delete_node("a")
    extender_of(client.application).on_nodes_listed(["a"])  # a relist without b
    out = client.post("/filter", json=extender_args(pod("p", CNN_ANNOTATIONS), names=["a", "b"])).get_json()
    assert out["FailedAndUnresolvableNodes"] == {"a": "no agent report", "b": "no agent report"}


def test_extender_evicts_strictly_lower_priority_itself() -> None:
    client, cluster, clock = make()
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    send_report(client, "b", 1, [(NEED * 1.5, 0.0)], clock)
    low = pod("low", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"})
    peer = pod("peer", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"})
    for p, n in ((low, "a"), (peer, "b")):
        client.post("/filter", json=extender_args(p, names=[n]))
        assert client.post("/bind", json=binding_args(p, n)).get_json() == {"Error": ""}
    equal = pod("equal", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"})
    client.post("/filter", json=extender_args(equal, names=["b"]))
    worker = extender_of(client.application).worker
    assert worker.drain() and cluster.evictions == []  # the same priority is never a victim
    high = pod("high", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high", "deepres.io/deadline": "2h"})
    out = client.post("/filter", json=extender_args(high, names=["a", "b"])).get_json()
    assert out["NodeNames"] == [] and set(out["FailedNodes"]) == {"a", "b"}
    assert worker.drain() and cluster.evictions == ["default/low"]  # the lower of the two, not the peer
    assert [e[2] for e in cluster.events if e[1] == "Preempting"] == [
        f"evicting default/low (lower priority) on a to make room for {NEED / 1024:.1f} GiB per GPU"]
    assert [e[0] for e in cluster.events if e[1] == "Preempted"] == ["default/low"]
    again = client.post("/filter", json=extender_args(high, names=["a", "b"])).get_json()
    assert again["NodeNames"] == ["a"]  # the victim's reservation went with its pod
    assert client.post("/bind", json=binding_args(high, "a")).get_json() == {"Error": ""}


def test_a_pod_whose_bound_exceeds_the_gpus_evicts_lower_priority_pods_for_a_whole_gpu_and_says_so() -> None:
    """The whole-GPU fallback in the extender: the self-preemption and bind decide it as the filter
    did, the reservation is the GPU's memory, and the placement annotation says why."""
    point = NEED / 1.1  # FormulaPredictor: the bound is the point x 1.1
    size = round((point + NEED) / 2)
    client, cluster, clock = make()
    send_report(client, "w", 1, [(size, 0.0)], clock)
    low = pod("low-small", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low", "deepres.io/gpu-memory": "1Gi"})
    client.post("/filter", json=extender_args(low, names=["w"]))
    assert client.post("/bind", json=binding_args(low, "w")).get_json() == {"Error": ""}
    high = pod("whole-high", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"})
    out = client.post("/filter", json=extender_args(high, names=["w"])).get_json()
    assert out["NodeNames"] == []
    assert out["FailedNodes"] == {"w": f"gpu-0: needs a whole GPU ({(size - 128) / 1024:.1f} GiB free), "
                                       f"{(size - 1024) / 1024:.1f} GiB free"}
    assert extender_of(client.application).worker.drain() and cluster.evictions == ["default/low-small"]
    again = client.post("/filter", json=extender_args(high, names=["w"])).get_json()
    assert again["NodeNames"] == ["w"]
    assert client.post("/bind", json=binding_args(high, "w")).get_json() == {"Error": ""}
    notes = cluster.pods[("default", "whole-high")]["metadata"]["annotations"]
    assert float(notes["deepres.io/admission-memory-mib"]) == size  # the whole GPU, not the bound
    assert "whole GPU: the upper bound exceeds every GPU it could be given" in notes["deepres.io/placement"]
    late = pod("late-small", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low", "deepres.io/gpu-memory": "1Gi"})
    assert client.post("/filter", json=extender_args(late, names=["w"])).get_json()["NodeNames"] == []


def test_self_preemption_waits_for_its_victims_and_can_be_disabled() -> None:
    for enabled in (True, False):
        client, cluster, clock = make(self_preemption=enabled)
        send_report(client, "a", 1, [(NEED * 2.5, 0.0)], clock)
        for name in ("low0", "low1"):
            low = pod(name, {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"})
            client.post("/filter", json=extender_args(low, names=["a"]))
            assert client.post("/bind", json=binding_args(low, "a")).get_json() == {"Error": ""}
        big = pod("big", {**CNN_ANNOTATIONS, "deepres.io/criticality": "critical",
                          "deepres.io/gpu-memory": f"{int(NEED * 1.5)}Mi"})
        client.post("/filter", json=extender_args(big, names=["a"]))
        client.post("/filter", json=extender_args(big, names=["a"]))  # within the grace: no second round
        worker = extender_of(client.application).worker
        assert worker.drain() and len(cluster.evictions) == (1 if enabled else 0)
        if enabled:
            clock.now += 121
            client.post("/filter", json=extender_args(big, names=["a"]))
            assert worker.drain() and len(cluster.evictions) == 1  # it fits now: nothing more to evict


#: A low-priority (packing) pod: criticality low, no deadline.
LOW_ANNOTATIONS = {**{k: v for k, v in CNN_ANNOTATIONS.items() if k != "deepres.io/deadline"},
                   "deepres.io/criticality": "low"}


def admit_low_pods(client: FlaskClient, node_name: str, count: int) -> None:
    """Filter and bind `count` low-priority pods on one node: admissions that form a demand mix."""
    for i in range(count):
        earlier = pod(f"w{i}", LOW_ANNOTATIONS)
        client.post("/filter", json=extender_args(earlier, names=[node_name]))
        assert client.post("/bind", json=binding_args(earlier, node_name)).get_json() == {"Error": ""}


def test_packing_pods_follow_the_fragmentation_aware_score_once_admissions_form_a_demand_mix() -> None:
    """Best fit prefers the tighter node; with a mix of recent admissions of this size the extender
    prefers the node where placing the pod strands no memory another such pod could use."""
    low = LOW_ANNOTATIONS
    capacity = 4 * NEED
    client, _, clock = make(assume_on_prioritize=False)  # the probe is scored again and again, never bound
    send_report(client, "tight", 1, [(capacity, capacity - 1.5 * NEED)], clock)  # leaves 0.5x: stranded
    send_report(client, "roomy", 1, [(capacity, capacity - 2.5 * NEED)], clock)  # leaves 1.5x: still fits one
    send_report(client, "warm", 1, [(40 * NEED, 0.0)], clock)
    probe = extender_args(pod("probe", low), names=["tight", "roomy"])

    def scores() -> dict[str, int]:
        return {h["Host"]: h["Score"] for h in client.post("/prioritize", json=probe).get_json()}

    before = scores()
    assert before["tight"] > before["roomy"], "without a demand mix: best fit on memory"
    admit_low_pods(client, "warm", 3)  # admissions of the same shape make the demand mix
    after = scores()
    assert after["roomy"] > after["tight"], after
    assert scores() == after  # the same pod again: the merits come from the memo
    text = client.get("/metrics").get_data(as_text=True)
    assert 'deepres_extender_packing_merits_total{source="computed"} 2.0' in text
    assert 'deepres_extender_packing_merits_total{source="reused"} 2.0' in text


@pytest.mark.parametrize("fragmentation_aware", [True, False])
def test_bind_takes_the_gpu_the_packing_score_chose(fragmentation_aware: bool) -> None:
    """With a demand mix, bind picks GPUs as the fragmentation-aware score does (the GPU where the pod
    strands nothing another such pod could use), not the tightest fit; with the rule off, best fit."""
    low = LOW_ANNOTATIONS
    capacity = 4 * NEED
    client, cluster, clock = make(fragmentation_aware_packing=fragmentation_aware)
    # gpu 0 leaves 0.5x after the pod (stranded), gpu 1 leaves 1.5x (another such pod still fits)
    send_report(client, "two", 1, [(capacity, capacity - 1.5 * NEED), (capacity, capacity - 2.5 * NEED)], clock)
    send_report(client, "warm", 1, [(40 * NEED, 0.0)], clock)
    admit_low_pods(client, "warm", 3)
    placed = pod("placed", low)
    client.post("/filter", json=extender_args(placed, names=["two"]))
    assert client.post("/bind", json=binding_args(placed, "two")).get_json() == {"Error": ""}
    gpus = cluster.pods[("default", "placed")]["metadata"]["annotations"]["deepres.io/assigned-gpus"]
    assert gpus == ("two-gpu1" if fragmentation_aware else "two-gpu0")


def test_prioritize_reuses_its_filters_plan_only_for_the_same_pod_within_a_second() -> None:
    predictor = FormulaPredictor()
    settings = Settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = TOKEN
    clock = Clock()
    client = create_app(settings, predictor=predictor, clock=clock, cluster=InMemoryCluster()).test_client()
    send_report(client, "a", 1, [(40960.0, 0.0)], clock)
    job = pod("job", CNN_ANNOTATIONS)
    client.post("/filter", json=extender_args(job, ["a"]))
    client.post("/prioritize", json=extender_args(job, ["a"]))
    assert predictor.calls == 1  # the prioritize right after its filter
    clock.now += 1.5
    client.post("/prioritize", json=extender_args(job, ["a"]))
    assert predictor.calls == 2  # too late: planned again
    client.post("/filter", json=extender_args(job, ["a"]))
    changed = pod("job", {**CNN_ANNOTATIONS, "deepres.io/batch-size": "128"})
    scores = client.post("/prioritize", json=extender_args(changed, ["a"])).get_json()
    assert predictor.calls == 4 and scores[0]["Host"] == "a"  # the pod changed: planned again
    assert type(scores[0]["Score"]) is int and 0 <= scores[0]["Score"] <= 10  # a JSON integer, as Go's int64 wants


def test_a_retried_bind_of_a_plain_pod_succeeds_and_binds_once() -> None:
    client, cluster, _ = make()
    plain = pod("plain")  # no deepres annotations: not a GPU job
    client.post("/filter", json=extender_args(plain, names=["a"]))
    for _ in range(2):
        assert client.post("/bind", json=binding_args(plain, "a")).get_json() == {"Error": ""}
    assert cluster.pods[("default", "plain")]["spec"]["nodeName"] == "a"
    out = client.post("/bind", json=binding_args(plain, "b")).get_json()
    assert out["Error"] == "cannot bind default/plain to b: already bound to a"


def test_preempt_answers_nothing_before_the_rebuild() -> None:
    class Unsynced(InMemoryCluster):
        def start(self, handlers: Any) -> None:
            self._handlers = handlers  # the first pod list never comes

        def synced(self) -> bool:
            return False

    client, _, _ = make(cluster=Unsynced())
    victim = pod("old", CNN_ANNOTATIONS, node_name="a")
    body = preemption_args(pod("p", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"}), {"a": [victim]})
    assert client.post("/preempt", json=body).get_json() == {"NodeNameToMetaVictims": {}}
    out = client.post("/filter", json=extender_args(pod("p", CNN_ANNOTATIONS), names=["a"])).get_json()
    assert out["Error"] == "extender not ready: waiting for first cluster sync" and out["NodeNames"] == []
    assert client.get("/readyz").status_code == 503


class WatchLag(InMemoryCluster):
    """An API server double whose pod watch lags (`watched` is what the watch last saw) and which
    counts the reads bind makes against the API server itself."""

    def __init__(self) -> None:
        super().__init__(learn_pods=False)
        self.watched: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def watched_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.watched.get((namespace, name))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return super().read_pod(namespace, name)


def test_bind_trusts_the_watch_only_for_that_pod_pending_else_asks_the_api_server() -> None:
    import copy

    cluster = WatchLag()
    client, _, clock = make(cluster)
    send_report(client, "a", 1, [(NEED * 9, 0.0)], clock)
    fresh = pod("fresh", CNN_ANNOTATIONS)
    cluster.add_pod(fresh)
    cluster.watched[("default", "fresh")] = copy.deepcopy(fresh)
    assert client.post("/bind", json=binding_args(fresh, "a")).get_json() == {"Error": ""}
    assert cluster.reads == 0  # the watch's copy of that very pod, pending: no GET
    assert cluster.pods[("default", "fresh")]["metadata"]["annotations"]["deepres.io/assigned-node"] == "a"

    # the watch still shows an older pod of that name: the API server decides (and has the new one)
    replaced = pod("replaced", CNN_ANNOTATIONS)
    cluster.watched[("default", "replaced")] = {**copy.deepcopy(replaced), "metadata": {
        **replaced["metadata"], "uid": "an-older-pod"}}
    cluster.add_pod(replaced)
    assert client.post("/bind", json=binding_args(replaced, "a")).get_json() == {"Error": ""}
    assert cluster.reads == 1

    # not seen by the watch yet, or seen being deleted: the API server decides
    unseen = pod("unseen", CNN_ANNOTATIONS)
    cluster.add_pod(unseen)
    assert client.post("/bind", json=binding_args(unseen, "a")).get_json() == {"Error": ""}
    deleting = pod("deleting", CNN_ANNOTATIONS)
    cluster.add_pod(deleting)
    cluster.watched[("default", "deleting")] = {**copy.deepcopy(deleting), "metadata": {
        **deleting["metadata"], "deletionTimestamp": "2027-01-01T00:00:00Z"}}
    assert client.post("/bind", json=binding_args(deleting, "a")).get_json() == {"Error": ""}
    assert cluster.reads == 3

    # a watch copy of a pod the API server no longer has: the Binding itself is refused, nothing held
    ghost = pod("ghost", CNN_ANNOTATIONS)
    cluster.watched[("default", "ghost")] = copy.deepcopy(ghost)
    assert "not found" in client.post("/bind", json=binding_args(ghost, "a")).get_json()["Error"]
    assert ghost["metadata"]["uid"] not in {r.pod_uid for r in extender_of(client.application).ledger.reservations()}


def _victim_evicted_for_a_high_priority_pod() -> tuple[FlaskClient, Clock, dict[str, Any]]:
    """Node "a" full with a low-criticality pod; a high-criticality pod's filter made the worker evict it."""
    client, cluster, clock = make()
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    victim = pod("victim", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"})
    client.post("/filter", json=extender_args(victim, names=["a"]))
    assert client.post("/bind", json=binding_args(victim, "a")).get_json() == {"Error": ""}
    high = pod("high", {**CNN_ANNOTATIONS, "deepres.io/criticality": "high", "deepres.io/deadline": "2h"})
    assert client.post("/filter", json=extender_args(high, names=["a"])).get_json()["NodeNames"] == []
    assert extender_of(client.application).worker.drain() and cluster.evictions == ["default/victim"]
    return client, clock, high


def test_room_freed_by_the_extenders_eviction_is_held_for_the_pod_it_was_freed_for() -> None:
    """A lower-priority pod waiting in kube-scheduler's queue must not take the GPU the extender just
    emptied for a higher-priority pod (seen in the cluster suite: the critical pod then waited on)."""
    client, _, high = _victim_evicted_for_a_high_priority_pod()
    waiting = pod("waiting", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"})
    out = client.post("/filter", json=extender_args(waiting, names=["a"])).get_json()
    assert out["NodeNames"] == [] and "room held" in out["FailedAndUnresolvableNodes"]["a"]
    assert "room held" in client.post("/bind", json=binding_args(waiting, "a")).get_json()["Error"]
    assert client.post("/filter", json=extender_args(high, names=["a"])).get_json()["NodeNames"] == ["a"]
    assert client.post("/bind", json=binding_args(high, "a")).get_json() == {"Error": ""}
    # bound: the hold is gone (the node is simply full now)
    out = client.post("/filter", json=extender_args(waiting, names=["a"])).get_json()
    assert "room held" not in str(out["FailedNodes"]) + str(out["FailedAndUnresolvableNodes"])


def test_a_hold_ends_with_the_preemption_grace() -> None:
    client, clock, _ = _victim_evicted_for_a_high_priority_pod()
    waiting = pod("waiting", {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"})
    assert client.post("/filter", json=extender_args(waiting, names=["a"])).get_json()["NodeNames"] == []
    clock.now += 121  # preemption_grace_s: the pod it was held for never came
    send_report(client, "a", 2, [(NEED * 1.5, 0.0)], clock)
    assert client.post("/filter", json=extender_args(waiting, names=["a"])).get_json()["NodeNames"] == ["a"]
