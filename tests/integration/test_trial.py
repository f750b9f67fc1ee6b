"""The real trial runner (devtools/trial.py) on the CPU: tiny real training jobs, run one at a time and
then placed through a real `deepres serve --no-kube` fed by the runner's telemetry. What is checked is
what the report claims against what happened (the jobs' own result files and timings), not figures."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the trial's jobs need torch"),
]


def test_cpu_trial_runs_both_modes_and_reports_what_happened(tmp_path: Path) -> None:
    from devtools.trial import main, tiny_backlog

    out = tmp_path / "trial.json"
    assert main(["--device", "cpu", "--out", str(out), "--report-every-s", "0.25"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    names = [j.name for j in tiny_backlog()]

    assert report["device"] == "cpu" and report["telemetry"].startswith("stub")
    assert {"input_bound": True} in [{"input_bound": b["input_bound"]} for b in report["backlog"]]
    for mode in ("static", "deepres"):
        rows = report[mode]["jobs"]
        assert [r["job"] for r in rows] == names
        assert report[mode]["failed"] == 0 and report[mode]["ooms"] == 0, rows
        for r in rows:
            assert r["steps"] == next(j.steps for j in tiny_backlog() if j.name == r["job"])  # all work done
            assert r["end_s"] >= r["start_s"] >= 0 and r["peak_memory_mib"] > 0
        jct = sorted(r["jct_s"] for r in rows)
        assert report[mode]["makespan_s"] == pytest.approx(jct[-1], abs=0.01)
        assert report[mode]["median_jct_s"] == pytest.approx((jct[1] + jct[2]) / 2, abs=0.01)

    static = report["static"]["jobs"]
    for before, after in itertools.pairwise(static):  # one at a time, in backlog order
        assert after["start_s"] >= before["end_s"]
    solo = {r["job"]: r["run_s"] for r in static}
    deepres = report["deepres"]
    for r in deepres["jobs"]:
        assert r["solo_s"] == solo[r["job"]]
        assert r["slowdown"] == pytest.approx(r["run_s"] / solo[r["job"]], rel=0.02)
    # every job went through the extender: filtered, bound, then seen in the telemetry it was fed
    assert deepres["binds"] >= len(names) and deepres["filters"] >= deepres["binds"]
    assert deepres["reports_accepted"] > 0 and not deepres["report_errors"]
    assert deepres["processes_attributed"] > 0
    assert any(r["mean_duty"] is not None for r in deepres["jobs"])
