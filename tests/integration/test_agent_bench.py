"""`deepres bench agent` end to end on a tiny fake node: the JSON has exactly the agreed keys and the
measured process never imports torch (the worker refuses to report figures if it did)."""

from __future__ import annotations

from pathlib import Path

from devtools import bench_agent as bench
from tests.fixtures.bench_cli import run_bench


def test_bench_writes_exactly_the_agreed_keys(tmp_path: Path) -> None:
    argv = ["--json", "--rounds", "10", "--gpus", "2", "--processes", "4"]
    figures = run_bench(bench, tmp_path / "bench-agent.json", argv)
    assert list(figures) == ["rss_mib", "cpu_fraction_of_core", "sample_ms_p50", "sample_ms_p99", "report_bytes"]
    assert all(isinstance(v, int | float) and v > 0 for v in figures.values())
    assert figures["sample_ms_p99"] >= figures["sample_ms_p50"]
