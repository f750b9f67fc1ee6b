"""`deepres bench extender --per-nodes`: the extender's CPU per scheduling cycle at two cluster sizes,
the code as it is beside the placement modules at a git ref, written as the report's `per_nodes`
section next to the keys already there (issue 48, item 3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from devtools import bench_extender
from tests.fixtures.bench_cli import run_bench
from tests.fixtures.kube.server import PREDICTOR_DOUBLE


def test_per_nodes_writes_its_section_and_keeps_the_reports_other_keys(tmp_path: Path) -> None:
    out = tmp_path / "bench-extender.json"
    earlier = {"names": {"pods_per_s": 1.0}, "rss_mib": 2.0, "cluster_nodes": 3}
    out.write_text(json.dumps(earlier))
    factory = ["--predictor-factory", PREDICTOR_DOUBLE]
    figures = run_bench(bench_extender, out, ["--per-nodes", "40", "30", "--cycle-pods", "10", "--repeats", "1",
                                              *factory])
    assert {k: figures[k] for k in earlier} == earlier  # the other keys as they were
    section = figures["per_nodes"]
    assert len(section["baseline_ref"]) == 40 and section["rounds"] == 1 and section["pods_per_round"] == 10
    assert section["provenance"]["command"].startswith("deepres bench extender --per-nodes 30 40 ")
    for nodes in (30, 40):
        entry = section[f"nodes_{nodes}"]
        for code in ("current", "baseline"):
            values = entry[code]
            assert set(values) == {"cpu_ms_per_cycle_gpu_memory", "cpu_ms_per_cycle_predicted"}
            assert all(math.isfinite(v) and v > 0 for v in values.values())
        for kind in ("gpu_memory", "predicted"):
            ratio = entry["baseline_over_current"][kind]
            assert ratio == round(entry["baseline"][f"cpu_ms_per_cycle_{kind}"]
                                  / entry["current"][f"cpu_ms_per_cycle_{kind}"], 2)
    growth = section["growth_40_over_30"]["current"]["gpu_memory"]
    assert growth == round(section["nodes_40"]["current"]["cpu_ms_per_cycle_gpu_memory"]
                           / section["nodes_30"]["current"]["cpu_ms_per_cycle_gpu_memory"], 2)
