"""W over what the pod can use (issue 46, item 3), through the live verbs: the sharing rule's wait for
an empty GPU counts only GPUs that can hold the pod's admission (`sharing.can_hold`), on the nodes the
pod may go to (the filter's node list, which kube-scheduler's own plugins made: selectors, affinity,
taints). Before, an empty GPU too small for the pod, or on a node the pod may not go to, made W 0: a
pod then refused to share a GPU (joining had to beat waiting no time at all) and an eviction never
paid, for a GPU that would never hold it. The replay (`Strategy.wait_s`) counts the same GPUs."""

from __future__ import annotations

from extender.server.app import extender_of
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod, preemption_args
from tests.unit.test_app import NEED, make, send_report

LOW = {**CNN_ANNOTATIONS, "deepres.io/criticality": "low"}
HIGH = {**CNN_ANNOTATIONS, "deepres.io/criticality": "high"}


def _small(annotations: dict[str, str]) -> dict[str, str]:
    """A light (duty 0.05), long (~15 h predicted) job: joining a GPU that runs one such job pays
    whenever an empty GPU is far off."""
    return {**annotations, "deepres.io/gpu-share": "0.05", "deepres.io/iterations": str(10**10)}


def _resident(client: object, clock: object, node: str) -> None:
    first = pod("first", _small(LOW))
    out = client.post("/filter", json=extender_args(first, names=[node])).get_json()  # type: ignore[attr-defined]
    assert out["NodeNames"] == [node]
    assert client.post("/bind", json=binding_args(first, node)).get_json() == {"Error": ""}  # type: ignore[attr-defined]


def test_an_empty_gpu_too_small_for_the_pod_is_no_gpu_to_wait_for() -> None:
    """Node `small`'s one GPU is empty but holds less than the pod's admission; node `y`'s GPU runs one
    light long job. A high-priority light pod joins `y` (waiting for an empty GPU that can hold it
    means waiting ~15 h); the same cluster with `small`'s GPU large enough makes it wait (W is 0:
    it takes the empty GPU)."""
    for small_mib, passed in ((NEED * 0.8, ["y"]), (NEED * 2.5, ["small"])):
        client, _, clock = make(sharing=True, self_preemption=False, default_gpu_share_floor=0.0)
        send_report(client, "small", 1, [(small_mib, 0.0)], clock)
        send_report(client, "y", 1, [(NEED * 2.5, 0.0)], clock)
        _resident(client, clock, "y")
        second = pod("second", _small(HIGH))
        out = client.post("/filter", json=extender_args(second, names=["small", "y"])).get_json()
        assert out["NodeNames"] == passed, small_mib
        if passed == ["y"]:
            assert client.post("/bind", json=binding_args(second, "y")).get_json() == {"Error": ""}


def test_an_empty_gpu_on_a_node_the_pod_may_not_go_to_is_no_gpu_to_wait_for() -> None:
    """Node `z` has an empty GPU, but kube-scheduler did not send it (the pod may not go there: a node
    selector, a taint). The pod joins `y`, and its bind, which sees `y` alone, keeps the filter's W
    (over every node, W would be 0 and the bind would refuse the GPU the filter passed)."""
    client, _, clock = make(sharing=True, self_preemption=False, default_gpu_share_floor=0.0)
    send_report(client, "z", 1, [(NEED * 2.5, 0.0)], clock)
    send_report(client, "y", 1, [(NEED * 2.5, 0.0)], clock)
    _resident(client, clock, "y")
    second = pod("second", _small(HIGH))
    assert client.post("/filter", json=extender_args(second, names=["y"])).get_json()["NodeNames"] == ["y"]
    assert client.post("/bind", json=binding_args(second, "y")).get_json() == {"Error": ""}
    third = pod("third", _small(HIGH))  # the node list with z: z's empty GPU is the pod's, W 0
    assert client.post("/filter", json=extender_args(third, names=["y", "z"])).get_json()["NodeNames"] == ["z"]


def test_an_eviction_pays_when_only_a_gpu_too_small_for_the_pod_is_empty() -> None:
    """The preemption gain check reads the same W: a victim far from its end (~15 h predicted) on the
    only GPU that can hold the high pod is evicted, although another node's GPU, too small for the
    pod, is empty (before: W 0, no eviction ever paid). The /preempt verb answers it, and the
    extender's own eviction takes it."""
    for verb in ("preempt", "self"):
        client, cluster, clock = make(sharing=True)
        send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)
        send_report(client, "small", 1, [(NEED * 0.8, 0.0)], clock)
        low = pod("low", {**LOW, "deepres.io/iterations": str(10**10)})
        client.post("/filter", json=extender_args(low, names=["a"]))
        assert client.post("/bind", json=binding_args(low, "a")).get_json() == {"Error": ""}
        clock.now += 600
        send_report(client, "a", 2, [(NEED * 1.5, 0.0)], clock)
        send_report(client, "small", 2, [(NEED * 0.8, 0.0)], clock)
        high = pod("high", {**HIGH, "deepres.io/iterations": str(10**7)})
        if verb == "preempt":
            out = client.post("/preempt", json=preemption_args(high, {"a": [low]})).get_json()
            victims = {"a": {"Pods": [{"UID": low["metadata"]["uid"]}], "NumPDBViolations": 0}}
            assert out == {"NodeNameToMetaVictims": victims}
            continue
        out = client.post("/filter", json=extender_args(high, names=["a", "small"])).get_json()
        assert out["NodeNames"] == []
        assert extender_of(client.application).worker.drain()
        assert cluster.evictions == ["default/low"]


def test_the_replay_counts_only_gpus_that_can_hold_the_pod() -> None:
    """The replay's W is the live one (`Strategy.wait_s`, `sharing.can_hold`): two light (share 0.3)
    30 GB jobs, one H100 80 GB node and one A10 24 GB node, the second job arriving while the first runs
    for long. The A10's empty GPU cannot hold it: it joins the H100 (before: W 0, it waited ~3 h for
    the first job to end). With a second H100 instead of the A10, it takes that empty GPU."""
    from extender.policy import PolicyParams
    from extender.simulate import replay
    from extender.simulate.traces import Node
    from tests.unit.test_simulate_compute import _job

    for second_model, shared in (("A10", 2), ("H100", 0)):
        jobs = [_job(0, 0.3, duration=10_000.0, milli=300), _job(1, 0.3, duration=1000.0, arrival=10.0, milli=300)]
        for job in jobs:
            job.true_mib = job.predicted_mib = job.upper_mib = 30_000.0
        nodes = [Node("n0", 64_000, 262_144, 1, "H100"), Node("n1", 64_000, 262_144, 1, second_model)]
        out = replay.simulate(replay.DeepRes, jobs, nodes, PolicyParams(), interference=True)
        assert out.metrics["completed"] == 2 and out.metrics["shared_jobs"] == shared, second_model
        if shared:
            assert out.metrics["mean_queue_s"] < 100.0  # joined at once (waiting: ~5,000 s on average)
