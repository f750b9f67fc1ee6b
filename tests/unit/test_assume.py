"""A GPU pod's prioritize reserves the GPUs of its best-scored node until its bind (`Planner.assume`,
`kube.assume_on_prioritize`), through the live verbs: kube-scheduler filters the next pods while the first
one's bind is on its way, and without it they all counted on the same free GPU and their binds were refused
(`deepres bench cluster`, issue 31)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from extender.policy import PriorityInputs, Reservation
from extender.policy.preemption import evictable
from extender.policy.types import PolicyParams
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod
from tests.unit.test_app import NEED, make, send_report


def _cycle(client: Any, body: dict[str, Any], names: list[str]) -> tuple[list[str], str]:
    """kube-scheduler's scheduling cycle for one pod: filter, prioritize, the best score's node (with one
    node left, that node and no prioritize, as kube-scheduler's schedulePod)."""
    passed = client.post("/filter", json=extender_args(body, names=names)).get_json()["NodeNames"]
    if len(passed) == 1:
        return passed, passed[0]
    scores = client.post("/prioritize", json=extender_args(body, names=passed)).get_json()
    best = max(scores, key=lambda h: h["Score"])["Host"] if scores else ""
    return passed, best


def _metric(client: Any, outcome: str) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    line = f'deepres_extender_assumptions_total{{outcome="{outcome}"}} '
    return next((float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)), 0.0)


def test_the_next_pod_filtered_before_the_first_ones_bind_does_not_count_on_its_gpu() -> None:
    for assume in (True, False):
        client, _, clock = make(assume_on_prioritize=assume, filter_shortlist=100)  # two nodes: a prioritize
        for node in ("a", "b"):  # one GPU each, room for one pod
            send_report(client, node, 1, [(NEED * 1.5, 0.0)], clock)
        first, second = pod("first", CNN_ANNOTATIONS), pod("second", CNN_ANNOTATIONS)
        passed, best = _cycle(client, first, ["a", "b"])
        assert sorted(passed) == ["a", "b"]
        # the first pod's bind is on its way: kube-scheduler filters the second one meanwhile
        passed2, best2 = _cycle(client, second, ["a", "b"])
        if assume:
            assert passed2 == [n for n in ("a", "b") if n != best], "the first pod's GPU counted as free"
        else:
            assert best in passed2  # both count on the first pod's GPU: one bind will be refused
        assert client.post("/bind", json=binding_args(first, best)).get_json() == {"Error": ""}
        answer = client.post("/bind", json=binding_args(second, best2)).get_json()
        assert (answer == {"Error": ""}) == (assume or best2 != best), answer
        if assume:
            assert _metric(client, "made") == 2 and _metric(client, "bound") == 2


def test_a_filter_that_leaves_one_node_assumes_it() -> None:
    """kube-scheduler sends no prioritize when its filters leave one node ("only one node after predicate,
    just use it"): the filter makes the assumption then, or the next pod counted on the same GPU and its
    bind was refused (with `extender.filterShortlist: 1` every GPU pod's answer is one node)."""
    from extender.server.app import extender_of

    for shortlist in (100, 1):
        client, _, clock = make(filter_shortlist=shortlist)
        state = extender_of(client.application).state
        send_report(client, "a", 1, [(NEED * 1.5, 0.0)], clock)  # room for one pod
        send_report(client, "b", 1, [(NEED * 1.5, 0.0)], clock)
        first, second, third = (pod(name, CNN_ANNOTATIONS) for name in ("first", "second", "third"))
        names = ["a"] if shortlist == 100 else ["a", "b"]
        passed = client.post("/filter", json=extender_args(first, names=names)).get_json()["NodeNames"]
        assert len(passed) == 1 and [(r.name, r.assumed) for r in state.reservations()] == [("first", True)]
        # the first pod's bind is on its way, no prioritize came: the next filter sees its GPU taken
        passed2 = client.post("/filter", json=extender_args(second, names=names)).get_json()["NodeNames"]
        assert passed[0] not in passed2, shortlist
        assert client.post("/bind", json=binding_args(first, passed[0])).get_json() == {"Error": ""}
        if passed2:
            assert client.post("/bind", json=binding_args(second, passed2[0])).get_json() == {"Error": ""}
        assert client.post("/filter", json=extender_args(third, names=names)).get_json()["NodeNames"] == []
        assert _metric(client, "made") == _metric(client, "bound") == 1 + len(passed2), shortlist


def test_a_pod_bound_elsewhere_than_assumed_moves_and_an_assumption_without_bind_expires() -> None:
    client, _, clock = make(filter_shortlist=100)
    for node in ("a", "b"):
        send_report(client, node, 1, [(NEED * 1.5, 0.0)], clock)
    first = pod("first", CNN_ANNOTATIONS)
    _, best = _cycle(client, first, ["a", "b"])
    other = "b" if best == "a" else "a"
    # kube-scheduler's own scores chose the other node: the assumed GPUs go back, the pod is bound there
    assert client.post("/bind", json=binding_args(first, other)).get_json() == {"Error": ""}
    assert _metric(client, "moved") == 1
    second = pod("second", CNN_ANNOTATIONS)
    passed, _ = _cycle(client, second, ["a", "b"])
    assert passed == [best], "the GPU assumed for the first pod was not given back"
    # the second pod's bind never comes (its scheduling cycle failed after the prioritize): 15 s later the
    # next filter releases what it assumed
    clock.now += 16
    for node in ("a", "b"):
        send_report(client, node, 2, [(NEED * 1.5, 0.0)], clock)
    third = pod("third", CNN_ANNOTATIONS)
    assert client.post("/filter", json=extender_args(third, names=["a", "b"])).get_json()["NodeNames"] == [best]
    assert _metric(client, "expired") == 1


def test_an_assumed_pod_is_never_a_victim() -> None:
    """It runs nowhere yet: evicting it would delete a pending pod."""
    res = Reservation("u", "ns", "p", "n", ("g",), 1000.0, 1000.0, 1000.0, PriorityInputs(), 0.0)
    assert evictable(res, 10.0, PolicyParams())
    assert not evictable(replace(res, assumed=True), 10.0, PolicyParams())
