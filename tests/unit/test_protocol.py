"""Extender v1 wire types: golden payloads from the official client decode, answers use Go keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.policy import FilterResult
from extender.protocol import (
    ExtenderArgs,
    ProtocolError,
    decode_extender_args,
    filter_error,
    filter_result,
    host_priority_json,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
    parse_pod,
    parse_preemption_args,
    preemption_result,
    soft_preferences,
)
from tests.fixtures.kube.payloads import golden

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kube"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def test_golden_files_match_what_the_client_models_produce() -> None:
    for name, body in golden().items():
        assert load(name) == json.loads(json.dumps(body)), f"{name} is out of date: regenerate it"


def test_names_mode_and_nodes_mode_decode_to_the_same_candidates() -> None:
    by_names = parse_extender_args(load("filter_names.json"))
    by_nodes = parse_extender_args(load("filter_nodes.json"))
    assert by_names.node_names == by_nodes.node_names == ("gpu-node-1", "gpu-node-2")
    assert by_names.nodes is None and by_nodes.nodes is not None
    pod = by_names.pod
    assert (pod.namespace, pod.name, pod.uid) == ("ml", "resnet-train", "0b4f5a9e-1111-4c1e-9d1e-000000000001")
    assert pod.annotations["deepres.io/model-type"] == "cnn"
    assert pod.created_s is not None and pod.scheduler_name == "deepres-scheduler"


def test_filter_result_keys_and_nodes_mode_echoes_passed_objects() -> None:
    args = parse_extender_args(load("filter_nodes.json"))
    result = FilterResult(("gpu-node-2",), {"gpu-node-1": "gpu-0: needs 2.0 GiB, 1.0 GiB free"}, {}, {})
    out = filter_result(result, args)
    assert set(out) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-node-2"]
    assert out["NodeNames"] == ["gpu-node-2"] and out["Error"] == ""
    names_out = filter_result(FilterResult((), {}, {}, {}), parse_extender_args(load("filter_names.json")))
    assert names_out["NodeNames"] == [] and names_out["FailedNodes"] == {} and names_out["Nodes"] is None
    assert filter_error("boom")["NodeNames"] == []


def test_bind_and_preempt_args_both_victim_modes() -> None:
    bind = parse_binding_args(load("bind.json"))
    assert (bind.pod_namespace, bind.pod_name, bind.node) == ("ml", "resnet-train", "gpu-node-1")
    meta = parse_preemption_args(load("preempt_meta.json"))
    full = parse_preemption_args(load("preempt_full.json"))
    assert meta.victims == full.victims == {"gpu-node-1": ("0b4f5a9e-1111-4c1e-9d1e-000000000002",)}
    assert meta.meta and not full.meta
    out = preemption_result(meta.victims, meta.pdb_violations)
    assert out == {"NodeNameToMetaVictims": {"gpu-node-1": {
        "Pods": [{"UID": "0b4f5a9e-1111-4c1e-9d1e-000000000002"}], "NumPDBViolations": 0}}}
    assert host_priority_list([("a", 3)]) == [{"Host": "a", "Score": 3}]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.text(max_size=12), st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True)),
                          st.integers(0, 10)), max_size=30))
def test_the_spliced_host_priority_json_is_the_list_of_dicts(entries: list[tuple[str, int]]) -> None:
    """Any names (quotes, backslashes, control characters, non-ASCII, empty: the dicts' path; DNS
    names: the spliced template), from scratch and from the template kept for the list."""
    hosts = [host for host, _ in entries]
    scores = np.array([score for _, score in entries], dtype=np.int64)
    expected = [{"Host": host, "Score": score} for host, score in entries]
    derived: dict[str, object] = {}
    assert json.loads(host_priority_json(hosts, scores, derived)) == expected
    assert json.loads(host_priority_json(hosts, scores[::-1].copy(), derived)) == [
        {"Host": host, "Score": score} for host, score in zip(hosts, scores[::-1].tolist(), strict=True)]
    assert json.loads(host_priority_json(hosts, scores)) == expected


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (None, "ExtenderArgs"),
        ([], "ExtenderArgs"),
        ({"Pod": None, "NodeNames": []}, "Pod"),
        ({"Pod": {"metadata": {}}, "NodeNames": []}, "Pod.metadata.name"),
        ({"Pod": {"metadata": {"name": 3}}, "NodeNames": []}, "Pod.metadata.name"),
        ({"Pod": {"metadata": {"name": "p"}}}, "ExtenderArgs"),
        ({"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1]}, "NodeNames[0]"),
        ({"Pod": {"metadata": {"name": "p"}}, "NodeNames": "a"}, "NodeNames"),
        ({"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {}}]}}, "Nodes.items[0].metadata.name"),
        ({"Pod": {"metadata": {"name": "p", "annotations": {"a": 1}}}, "NodeNames": []}, "Pod.metadata.annotations[a]"),
        ({"Pod": {"metadata": {"name": "p", "creationTimestamp": "yesterday"}}, "NodeNames": []},
         "Pod.metadata.creationTimestamp"),
        ({"Pod": {"metadata": {"name": "p"}, "spec": {"priority": "high"}}, "NodeNames": []}, "Pod.spec.priority"),
    ],
)
def test_malformed_extender_args_name_the_field(body: Any, path: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_extender_args(body)
    assert err.value.path == path
    assert decode_extender_args(orjson.dumps(body)) is None  # the fast path leaves the wording to the parser


def answer(args: ExtenderArgs, passed: tuple[str, ...]) -> Any:
    """The filter's answer as kube-scheduler decodes it."""
    return orjson.loads(orjson.dumps(filter_result(FilterResult(passed, {}, {}, {}), args)))


def test_fast_decoding_of_the_golden_requests_equals_the_parser() -> None:
    for name in ("filter_names.json", "filter_nodes.json"):
        raw = (FIXTURES / name).read_bytes()
        fast, slow = decode_extender_args(raw), parse_extender_args(json.loads(raw))
        assert fast is not None
        assert (fast.pod, fast.node_names, fast.raw_pod) == (slow.pod, slow.node_names, slow.raw_pod)
        for passed in ((), ("gpu-node-2",), slow.node_names):
            assert answer(fast, passed) == answer(slow, passed)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=3), max_leaves=8)
names = st.sampled_from(["n1", "n2", "n3", ""])
node_objects = st.builds(lambda name, extra: {"metadata": {"name": name, **extra}, "status": extra},
                         names, st.dictionaries(st.sampled_from(["x", "labels"]), json_values, max_size=2))
pods = st.one_of(json_values, st.builds(lambda name, ann: {"metadata": {"name": name, "annotations": ann}},
                                        names, st.dictionaries(st.text(max_size=3), json_values, max_size=2)))
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"Pod": pods, "NodeNames": st.one_of(st.lists(names, max_size=4), json_values)}),
    st.fixed_dictionaries({"Pod": pods, "NodeNames": st.none(),
                           "Nodes": st.one_of(st.fixed_dictionaries({"metadata": st.just({}),
                                                                     "items": st.lists(node_objects, max_size=4)}),
                                              json_values)}),
)


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_fast_decoding_agrees_with_the_parser_and_defers_its_errors(body: Any) -> None:
    fast = decode_extender_args(orjson.dumps(body))
    try:
        slow = parse_extender_args(body)
    except ProtocolError:
        assert fast is None
        return
    assert fast is not None
    assert (fast.pod, fast.node_names, fast.raw_pod) == (slow.pod, slow.node_names, slow.raw_pod)
    assert answer(fast, fast.node_names[:2]) == answer(slow, slow.node_names[:2])


def test_pod_defaults_namespace_and_reads_priority() -> None:
    pod = parse_pod({"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
                     "spec": {"priority": 1000, "priorityClassName": "team-high", "nodeName": "n1"},
                     "status": {"phase": "Running"}})
    assert pod.namespace == "default" and pod.priority == 1000 and pod.priority_class == "team-high"
    assert pod.node_name == "n1" and pod.phase == "Running" and pod.created_s == 1767225600.0


@pytest.mark.parametrize("body", [{"PodName": "p", "Node": "n"}, {"PodUID": "u", "Node": "n"}, {"PodName": "p",
                                                                                                 "PodUID": "u"}])
def test_bind_args_require_name_uid_and_node(body: dict[str, str]) -> None:
    with pytest.raises(ProtocolError):
        parse_binding_args(body)



def test_an_rfc3339_leap_second_is_a_time() -> None:
    """The schema says date-time (RFC 3339), which allows second 60; Python's datetime does not."""
    raw = {"Pod": {"metadata": {"name": "p", "creationTimestamp": "2016-12-31T23:59:60Z"}}, "NodeNames": []}
    assert parse_extender_args(raw).pod.created_s == 1483228799.0


PREFERRED = [{"weight": 1, "preference": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}}]


@pytest.mark.parametrize(("spec", "soft"), [
    (None, False),
    ({}, False),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
     False),
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED}}}, True),
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}, False),
    ({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED}}}, True),
    ({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED}}}, True),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}]}, False),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"},
                                    {"maxSkew": 1, "topologyKey": "h", "whenUnsatisfiable": "ScheduleAnyway"}]}, True),
    ({"affinity": "odd"}, True),  # a shape not understood: the full answer
    ({"topologySpreadConstraints": {"not": "a list"}}, True),
    ("odd", True),
])
def test_soft_preferences_are_the_ones_kube_scheduler_scores(spec: Any, soft: bool) -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p"}}
    if spec is not None:
        pod["spec"] = spec
    assert soft_preferences(pod) is soft
    assert soft_preferences(["not", "a pod"]) is True
