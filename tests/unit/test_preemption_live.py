"""Preemption that does not churn, through the live verbs (issue 33): the extender's own evictions
weigh what they gain against what they throw away (`preemption.preemption_pays` with the sharing
rule's predicted wait), a workload evicted by one kind of arrival is not evicted again by the same
kind (`Reservation.evicted_by`, carried to its next pod), and a busy GPU takes no new sharer while a
higher-priority GPU pod waits (`sharing.draining`)."""

from __future__ import annotations

from typing import Any

from extender.server.app import extender_of
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod, preemption_args
from tests.unit.test_app import NEED, bound_one, make, send_report


def _owned(name: str, annotations: dict[str, str], owner: str) -> dict[str, Any]:
    """A pod made by a controller (a Job) whose uid is `owner`."""
    body = pod(name, annotations)
    body["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner,
                                             "uid": f"uid-{owner}", "controller": True}]
    return body


LOW = {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"}
HIGH = {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"}
CRITICAL = {**CNN_ANNOTATIONS, "deepres.io/criticality": "critical"}


def test_a_workload_evicted_by_one_kind_of_arrival_is_not_evicted_again_by_that_kind() -> None:
    client, cluster, clock = make(default_criticality_ceiling="critical")
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)  # room for one pod
    worker = extender_of(client.application).worker
    first = _owned("train-0", LOW, "train")
    client.post("/filter", json=extender_args(first, names=["a"]))
    assert client.post("/bind", json=binding_args(first, "a")).get_json() == {"Error": ""}
    h1 = pod("h1", HIGH)
    client.post("/filter", json=extender_args(h1, names=["a"]))
    assert worker.drain() and cluster.evictions == ["default/train-0"]
    # the Job makes its pod again; the high pod went elsewhere; the grace of its hold runs out
    clock.now += 121
    send_report(client, "a", 2, [(NEED * 1.5, 0.0)], clock)
    again = _owned("train-1", LOW, "train")
    assert client.post("/filter", json=extender_args(again, names=["a"])).get_json()["NodeNames"] == ["a"]
    assert client.post("/bind", json=binding_args(again, "a")).get_json() == {"Error": ""}
    h2 = pod("h2", HIGH)  # the same kind of arrival (high, one GPU): no second eviction of the workload
    assert client.post("/filter", json=extender_args(h2, names=["a"])).get_json()["NodeNames"] == []
    assert worker.drain() and cluster.evictions == ["default/train-0"]
    other = pod("lone", LOW)  # another workload on another node is still a victim for the same kind
    send_report(client, "b", 1, [(NEED * 1.5, 0.0)], clock)
    client.post("/filter", json=extender_args(other, names=["b"]))
    assert client.post("/bind", json=binding_args(other, "b")).get_json() == {"Error": ""}
    h3 = pod("h3", HIGH)
    client.post("/filter", json=extender_args(h3, names=["a", "b"]))
    assert worker.drain() and cluster.evictions == ["default/train-0", "default/lone"]
    c1 = pod("c1", CRITICAL)  # another kind (critical) may evict it
    client.post("/filter", json=extender_args(c1, names=["a"]))
    assert worker.drain() and cluster.evictions == ["default/train-0", "default/lone", "default/train-1"]


def test_the_churn_rule_survives_an_extender_restart() -> None:
    """The kind that evicted a workload is written on its next pod at bind (`deepres.io/evicted-by`) and read
    back by the restore: a restarted extender does not evict it again for the same kind of arrival (it
    did before: the restored reservation had no `evicted_by`), while another kind still may."""
    from extender.kube.local import InMemoryCluster

    cluster = InMemoryCluster()
    client, _, clock = make(cluster, default_criticality_ceiling="critical")
    send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
    worker = extender_of(client.application).worker
    first = _owned("train-0", LOW, "train")
    client.post("/filter", json=extender_args(first, names=["a"]))
    assert client.post("/bind", json=binding_args(first, "a")).get_json() == {"Error": ""}
    assert cluster.pods[("default", "train-0")]["metadata"]["annotations"]["deepres.io/evicted-by"] == "none"
    client.post("/filter", json=extender_args(pod("h1", HIGH), names=["a"]))
    assert worker.drain() and cluster.evictions == ["default/train-0"]
    clock.now += 121
    send_report(client, "a", 2, [(NEED * 1.5, 0.0)], clock)
    again = _owned("train-1", LOW, "train")
    client.post("/filter", json=extender_args(again, names=["a"]))
    assert client.post("/bind", json=binding_args(again, "a")).get_json() == {"Error": ""}
    kind = cluster.pods[("default", "train-1")]["metadata"]["annotations"]["deepres.io/evicted-by"]
    assert kind != "none"
    # restart: a new process over the same cluster; the node reports again
    client2, _, _ = make(cluster, clock, default_criticality_ceiling="critical")
    (restored,) = extender_of(client2.application).state.reservations()
    assert restored.name == "train-1" and restored.evicted_by == kind
    send_report(client2, "a", 3, [(NEED * 1.5, 0.0)], clock)
    worker2 = extender_of(client2.application).worker
    assert client2.post("/filter", json=extender_args(pod("h2", HIGH), names=["a"])).get_json()["NodeNames"] == []
    assert worker2.drain() and cluster.evictions == ["default/train-0"]  # the same kind: not again
    client2.post("/filter", json=extender_args(pod("c1", CRITICAL), names=["a"]))
    assert worker2.drain() and cluster.evictions == ["default/train-0", "default/train-1"]  # another kind may


def test_an_unreadable_evicted_by_is_restored_as_none_and_said() -> None:
    from extender.kube.local import InMemoryCluster

    cluster = InMemoryCluster()
    _, clock, _ = bound_one(cluster)
    cluster.pods[("default", "p1")]["metadata"]["annotations"]["deepres.io/evicted-by"] = "c9/everything"
    client2, _, _ = make(cluster, clock)
    (restored,) = extender_of(client2.application).state.reservations()
    assert restored.evicted_by == ""
    metrics = client2.get("/metrics").get_data(as_text=True)
    assert 'deepres_extender_restore_unparsable_pods_total{part="evicted_by"} 1.0' in metrics


def _long(annotations: dict[str, str], iterations: int) -> dict[str, str]:
    return {**annotations, "deepres.io/iterations": str(iterations)}


def test_the_extender_evicts_only_when_it_gains_more_than_it_throws_away() -> None:
    """A victim about to end (its predicted run nearly over): waiting for it costs less than the
    progress evicting it throws away, so the high pod waits; a victim far from its end is evicted."""
    for victim_iterations, evicted in ((10**7, False), (10**10, True)):
        client, cluster, clock = make(sharing=True)
        send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
        low = pod("low", _long(LOW, victim_iterations))  # predicted run: ~54 s or ~15 h
        client.post("/filter", json=extender_args(low, names=["a"]))
        assert client.post("/bind", json=binding_args(low, "a")).get_json() == {"Error": ""}
        clock.now += 600  # 10 min of progress: evicting throws it away (no checkpoint) plus a restart
        send_report(client, "a", 2, [(NEED * 1.5, 0.0)], clock)
        high = pod("high", _long(HIGH, 10**7))
        out = client.post("/filter", json=extender_args(high, names=["a"])).get_json()
        assert out["NodeNames"] == []
        assert extender_of(client.application).worker.drain()
        assert cluster.evictions == (["default/low"] if evicted else []), victim_iterations


def test_a_busy_gpu_takes_no_new_sharer_while_a_higher_priority_pod_waits() -> None:
    for drain in (False, True):
        client, _, clock = make(sharing=True, drain=drain, self_preemption=False, default_gpu_share_floor=0.0)
        send_report(client, "a", 1, [(NEED * 2.5, 0.0)], clock)  # one GPU: room for two small pods
        low = pod("resident", {**LOW, "deepres.io/gpu-share": "0.05"})
        client.post("/filter", json=extender_args(low, names=["a"]))
        assert client.post("/bind", json=binding_args(low, "a")).get_json() == {"Error": ""}
        big = pod("big", {**HIGH, "deepres.io/gpu-memory": f"{int(NEED * 2)}Mi"})  # waits for the GPU whole
        assert client.post("/filter", json=extender_args(big, names=["a"])).get_json()["NodeNames"] == []
        sharer = pod("sharer", {**LOW, "deepres.io/gpu-share": "0.05"})
        out = client.post("/filter", json=extender_args(sharer, names=["a"])).get_json()
        assert out["NodeNames"] == ([] if drain else ["a"]), drain


def test_a_gpu_full_of_memory_deepres_did_not_place_does_not_stop_sharing() -> None:
    """Through the verbs: node x's one GPU is full of memory no pod of deepres's holds (another
    scheduler's pod), node y's GPU runs one long small pod. A second such pod joins y (the sharing rule:
    joining costs less than waiting for an empty GPU). Before, x's GPU counted as empty in the wait, the
    wait was 0, and the pod waited with nowhere to go."""
    client, _, clock = make(sharing=True, self_preemption=False, default_gpu_share_floor=0.0)
    send_report(client, "x", 1, [(NEED * 2.5, NEED * 2.45)], clock)
    send_report(client, "y", 1, [(NEED * 2.5, 0.0)], clock)
    small = {**_long(LOW, 10**9), "deepres.io/gpu-share": "0.05"}
    first = pod("first", small)
    assert client.post("/filter", json=extender_args(first, names=["y"])).get_json()["NodeNames"] == ["y"]
    assert client.post("/bind", json=binding_args(first, "y")).get_json() == {"Error": ""}
    second = pod("second", small)
    assert client.post("/filter", json=extender_args(second, names=["x", "y"])).get_json()["NodeNames"] == ["y"]


def test_the_preempt_verb_answers_only_victims_whose_eviction_pays() -> None:
    """kube-scheduler's /preempt: the same gain check as the extender's own evictions."""
    for victim_iterations, answered in ((10**7, False), (10**10, True)):
        client, _, clock = make(sharing=True)
        send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
        low = pod("low", _long(LOW, victim_iterations))
        client.post("/filter", json=extender_args(low, names=["a"]))
        assert client.post("/bind", json=binding_args(low, "a")).get_json() == {"Error": ""}
        clock.now += 600
        send_report(client, "a", 2, [(NEED * 1.5, 0.0)], clock)
        high = pod("high", _long(HIGH, 10**7))
        out = client.post("/preempt", json=preemption_args(high, {"a": [low]})).get_json()
        victims = {"a": {"Pods": [{"UID": low["metadata"]["uid"]}], "NumPDBViolations": 0}}
        assert out == {"NodeNameToMetaVictims": victims if answered else {}}, victim_iterations


def test_no_eviction_is_planned_around_a_node_not_heard_from_since_the_start() -> None:
    """Just (re)started, a node the scheduler offers has not reported yet: it is unknown, not full, so the
    pod that found no room on the nodes heard so far evicts nobody (cluster scenario 1 saw `cnn-small`
    evicted for a pod that had room on a node reporting a moment later). Once that node reports with room,
    the pod lands there; a node still silent after `kube.telemetry_grace_s` no longer holds evictions back."""
    for silent_node_reports, evicted in ((True, []), (False, ["default/low"])):
        client, cluster, clock = make(sharing=True)
        send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)  # room for one pod
        low = pod("low", _long(LOW, 10**10))
        client.post("/filter", json=extender_args(low, names=["a"]))
        assert client.post("/bind", json=binding_args(low, "a")).get_json() == {"Error": ""}
        clock.now += 5  # still within the telemetry grace of the extender's start
        send_report(client, "a", 2, [(NEED * 1.5, 0.0)], clock)
        high = pod("high", _long(HIGH, 10**7))
        worker = extender_of(client.application).worker
        if silent_node_reports:
            assert client.post("/filter", json=extender_args(high, names=["a", "b"])).get_json()["NodeNames"] == []
            assert worker.drain() and cluster.evictions == []
            send_report(client, "b", 1, [(NEED * 1.5, 0.0)], clock)
            assert client.post("/filter", json=extender_args(high, names=["a", "b"])).get_json()["NodeNames"] == ["b"]
        else:
            clock.now += 30  # the grace over: b, still silent, is the staleness rule's
            send_report(client, "a", 3, [(NEED * 1.5, 0.0)], clock)
            assert client.post("/filter", json=extender_args(high, names=["a", "b"])).get_json()["NodeNames"] == []
        assert worker.drain() and cluster.evictions == evicted, silent_node_reports
