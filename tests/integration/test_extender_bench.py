"""`deepres bench extender` end to end on a tiny cluster: the production server starts, the warm-up
binds happen, every mode runs, and the JSON has exactly the keys issue #3 names."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from devtools import bench_extender
from tests.fixtures.bench_cli import run_bench
from tests.fixtures.kube.server import PREDICTOR_DOUBLE

MODE_KEYS = ["pods_per_s", "filter_p50_ms", "filter_p99_ms", "prioritize_p50_ms", "prioritize_p99_ms"]


def _predictor_argv() -> list[str]:
    return ["--predictor-factory", PREDICTOR_DOUBLE]


def test_bench_writes_exactly_the_agreed_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--nodes", "60", "--candidates", "20", "--full-nodes", "5", "--clients", "2",
            "--duration-s", "0.5", "--telemetry-rate", "50", "--repeats", "2", *_predictor_argv()]
    figures = run_bench(bench_extender, tmp_path / "bench-extender.json", argv)
    # kube-scheduler's cycle (issue #48): the server's filter leaves one node (the chart's shortlist of
    # one), so no prioritize goes out, and a pod the filter passed is bound there (60 nodes fill up
    # soon: most pods then find no room, and are neither prioritized nor bound)
    loads = re.findall(r"(\d+) pods in [\d.]+ s \((\d+) prioritized, (\d+) bound\)", capsys.readouterr().err)
    assert len(loads) == 6  # three modes, two rounds
    assert all(int(pods) >= int(bound) and int(prioritized) == 0 for pods, prioritized, bound in loads)
    assert sum(int(bound) for _, _, bound in loads) > 0
    for mode in ("names", "nodes", "under_telemetry"):
        assert figures[mode]["prioritize_p50_ms"] is None and figures[mode]["prioritize_p99_ms"] is None
    assert list(figures) == ["names", "nodes", "under_telemetry", "rss_mib", "cluster_nodes", "provenance"]
    assert figures["provenance"]["command"].startswith("deepres bench extender --nodes 60 ")  # what made it
    assert figures["cluster_nodes"] == 60  # the size asked for: the RSS is read at it
    for mode in ("names", "nodes", "under_telemetry"):
        assert list(figures[mode]) == MODE_KEYS
        values = figures[mode]
        timed = MODE_KEYS[:3]  # the prioritize's are null: none was sent
        assert all(isinstance(values[k], float) and math.isfinite(values[k]) and values[k] > 0 for k in timed)
        assert values["filter_p99_ms"] >= values["filter_p50_ms"]
    assert 50 < figures["rss_mib"] < 4096


def test_the_serial_cycle_writes_its_keys_per_cluster_size(tmp_path: Path) -> None:
    """`--cycle`: kube-scheduler's one-pod-at-a-time cycle (filter, prioritize, bind) under agents."""
    argv = ["--cycle", "30", "40", "--cycle-pods", "12", "--repeats", "1", "--heartbeat-s", "5", *_predictor_argv()]
    figures = run_bench(bench_extender, tmp_path / "bench-extender-cycle.json", argv)
    assert list(figures) == ["nodes_30", "nodes_40"]
    for nodes, section in ((30, figures["nodes_30"]), (40, figures["nodes_40"])):
        assert section["nodes"] == nodes and section["pods_per_round"] == 12
        assert section["prioritize_p50_ms"] is None  # one node passed per pod: kube-scheduler binds it unasked
        for key in bench_extender.CYCLE_KEYS:
            if not key.startswith("prioritize_"):
                assert isinstance(section[key], float) and math.isfinite(section[key]) and section[key] >= 0, key
        assert section["filter_p99_ms"] >= section["filter_p50_ms"] > 0
        assert section["server_cpu_ms_per_pod"] > 0 and section["reports_per_s"] > 0
