"""`deepres simulate --via-http`: the real server (`deepres serve --no-kube`, gunicorn, loopback) and
the simulator's DeepRes policy decide the same, pod by pod, on a small slice of the openb trace."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from devtools.simulate_http import compare, local_server, small_cluster
from extender.simulate.traces import DEFAULT_DATA, build_workload, node_list_path, pod_list_path, read_nodes, read_pods

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("extender.server.serve") is None,
                       reason="extender.server.serve not built yet"),
    pytest.mark.skipif(not (DEFAULT_DATA / "openb_pod_list_default.csv").is_file(),
                       reason="../shared/data/openb not available"),
]


def test_server_and_simulator_decide_the_same(tmp_path: Path) -> None:
    all_nodes = read_nodes(node_list_path(DEFAULT_DATA))
    nodes = small_cluster(all_nodes, 12)
    workload = build_workload(read_pods(pod_list_path(DEFAULT_DATA, "default")), len(all_nodes), 42, 6_212_000)
    pods = [p for p in workload.pods if p.num_gpu > 0][:90]
    with local_server(tmp_path, "test-token") as (url, log):
        result = compare(url, log, "test-token", nodes, pods)
    assert result.mismatches == []
    assert result.agreed_node == result.pods == 90
    assert 0 < result.placed < result.pods  # both fits and rejections were compared
    assert result.agreed_gpus == result.gpus_checked == result.placed
