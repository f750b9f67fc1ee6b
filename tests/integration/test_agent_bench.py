"""`deepres bench agent` end to end on a tiny fake node: the JSON has exactly the agreed keys and the
measured process never imports torch (the worker refuses to report figures if it did)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from extender.agent import bench


def test_bench_writes_exactly_the_agreed_keys(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out")
    bench.add_arguments(parser)
    out = tmp_path / "bench-agent.json"
    args = parser.parse_args(["--json", "--out", str(out), "--rounds", "10", "--gpus", "2", "--processes", "4"])
    assert bench.run(args) == 0
    figures = json.loads(out.read_text())
    assert list(figures) == ["rss_mib", "cpu_fraction_of_core", "sample_ms_p50", "sample_ms_p99", "report_bytes"]
    assert all(isinstance(v, int | float) and v > 0 for v in figures.values())
    assert figures["sample_ms_p99"] >= figures["sample_ms_p50"]
