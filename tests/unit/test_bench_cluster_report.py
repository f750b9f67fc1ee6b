"""reports/bench-cluster.json holds the keys issue 14 names (tools read them), from a real run."""

from __future__ import annotations

import json
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "reports" / "bench-cluster.json"


def test_the_report_has_the_issue_keys_and_every_gpu_pod_placed() -> None:
    report = json.loads(REPORT.read_text())
    for path in ("nodes_1000.default_limits.ratio", "nodes_1000.high_qps.gpu_pods_per_s",
                 "nodes_5000.high_qps.gpu_pods_per_s", "nodes_1000.extender_cpu_ms_per_pod"):
        value = report
        for key in path.split("."):
            assert key in value, f"{path}: {key} missing"
            value = value[key]
        assert isinstance(value, float | int) and value > 0, f"{path} = {value!r}"
    for section in ("nodes_1000", "nodes_5000"):
        for limits in ("default_limits", "high_qps"):
            run = report[section][limits]
            assert run["gpu_pods_unplaced"] == 0 and run["gpus_overcommitted"] == 0, (section, limits, run)
            assert run["ratio"] == round(run["gpu_pods_per_s"] / run["plain_pods_per_s"], 2)


def test_the_readme_table_shows_the_report_figures() -> None:
    """docs/benchmarks.md: one row per size and client limit, each figure as the report has it."""
    readme = (REPORT.parents[1] / "docs" / "benchmarks.md").read_text()
    report = json.loads(REPORT.read_text())
    for section in ("nodes_1000", "nodes_5000"):
        nodes = f"{report[section]['nodes']:,}"
        for limits, label in (("default_limits", "default (qps 50)"), ("high_qps", "qps 500")):
            run = report[section][limits]
            row = (f"| {nodes} | {label} | {run['gpu_pods_per_s']} | {run['plain_pods_per_s']} | {run['ratio']} | "
                   f"{run['gpu_latency_p50_s']} / {run['gpu_latency_p99_s']} | "
                   f"{run['plain_latency_p50_s']} / {run['plain_latency_p99_s']} | {run['extender_cpu_ms_per_pod']} |")
            assert row in readme, f"docs/benchmarks.md lacks the row {row}"
    calls = report["nodes_1000"]["default_limits"]["extender_ms_per_call"]
    said = tuple(f"{verb} {calls[verb]} ms" for verb in ("filter", "prioritize", "bind", "telemetry")
                 if verb in calls)  # no prioritize when the filter names one node (the chart's default)
    assert "filter" in calls and "bind" in calls, calls
    flat = " ".join(readme.split())
    assert all(s in flat for s in said), f"docs/benchmarks.md's per-call figures are not {said}"
