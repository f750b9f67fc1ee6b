"""`deepres bench cluster --floor`: the extender with its placement rule taken out (devtools/floor_extender.py).

The floor's figures say what everything but the rule costs per pod, so its filter must make no
choice (one offered node per GPU pod, in turn, even one the rule would refuse), while any other pod
and every bind go through the real verbs; and it must never write the benchmark's report.
"""

from __future__ import annotations

import argparse

import pytest

from devtools import bench_cluster, floor_extender
from extender.cli import UsageError
from extender.server import placing
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod
from tests.unit.test_app import make, send_report


def test_the_floor_filter_names_one_offered_node_in_turn_and_bind_still_refuses_a_full_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placing.Placer, "filter", floor_extender.floor_filter)
    client, _, clock = make()
    names = ["full", "a", "b"]
    send_report(client, "full", 1, [(40960.0, 40000.0)], clock)  # no room for the pod
    for seq, name in enumerate(names[1:], start=2):
        send_report(client, name, seq, [(40960.0, 0.0)], clock)
    answers = [client.post("/filter", json=extender_args(pod(f"p{i}", CNN_ANNOTATIONS), names=names)).get_json()
               for i in range(6)]
    chosen = [a["NodeNames"] for a in answers]
    assert all(len(c) == 1 and c[0] in names for c in chosen), chosen
    assert {c[0] for c in chosen} == set(names), "each offered node in turn, the full one too: no choice made"
    assert all(a["FailedNodes"] == {} and a["Error"] == "" for a in answers)
    plain = client.post("/filter", json=extender_args(pod("plain", {}), names=names)).get_json()
    assert plain["NodeNames"] == names, "a pod that is no GPU job gets the real filter's answer"
    refused = client.post("/bind", json=binding_args(pod("p0", CNN_ANNOTATIONS), "full")).get_json()
    assert refused["Error"].startswith("cannot bind default/p0 to full:"), refused
    assert client.post("/bind", json=binding_args(pod("p1", CNN_ANNOTATIONS), "a")).get_json()["Error"] == ""


def test_the_floor_never_writes_the_benchmark_report() -> None:
    parser = argparse.ArgumentParser()
    bench_cluster.add_arguments(parser)
    parser.add_argument("--out", default="reports/bench-cluster.json")
    with pytest.raises(UsageError, match="--floor"):
        bench_cluster.run(parser.parse_args(["--floor", "--nodes", "10"]))
