"""The real-GPU campaign's program (predictor/dataset/campaign.py): the GPU-machine step runs here on
the CPU (fork, build with the dataset's builders, real training iterations, one record per job), and
the report step turns the committed H100 measurements into the measured table and the calibration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.dataset import campaign

RAW = campaign.MEASURED_DIR / "raw"


def _tiny_job(job: str = "t0") -> dict[str, object]:
    return {"job": job, "name": "nn/mlp-d3-w64", "source": "nn", "group": "nn-mlp", "family": "mlp",
            "kind": "features", "default_input": 1024, "input_dim": 64, "batch_size": 8, "precision": "fp32",
            "optimizer": "adam", "params_millions": 0.0, "num_layers": 3, "traced_peak_mib": 1.0,
            "label_mib": 1.0, "held_out_group": False}


def test_run_measures_a_planned_job_in_a_forked_process_and_resumes(tmp_path: Path) -> None:
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps(_tiny_job()) + "\n" + json.dumps({**_tiny_job("t1"), "name": "nn/mlp-d9-nope"}) + "\n")
    out = tmp_path / "runs.jsonl"
    assert campaign.main(["run", "--plan", str(plan), "--out", str(out), "--device", "cpu"]) == 0
    records = {r["job"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["t0"]["status"] == "ok"
    # 64 -> 64 -> 64 -> 1000 Linear layers: parameters counted by hand
    by_hand = (64 * 64 + 64) * 2 + 64 * 1000 + 1000
    assert records["t0"]["params_measured_millions"] == pytest.approx(by_hand / 1e6)
    assert records["t0"]["step_s"] > 0
    assert records["t1"]["status"] == "error"  # a job that does not build is recorded, not fatal
    # a later call skips what the first measured
    assert campaign.main(["run", "--plan", str(plan), "--out", str(out), "--device", "cpu",
                          "--skip", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2


def test_read_runs_keeps_a_jobs_last_record_and_sets_probes_apart(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(json.dumps({"job": "c1", "status": "oom"}) + "\n"
                     + json.dumps({"job": "probe-context", "probe": "context", "status": "ok"}) + "\n")
    second.write_text(json.dumps({"job": "c1", "status": "ok"}) + "\n")
    jobs, probes = campaign.read_runs([first, second])
    assert [j["status"] for j in jobs] == ["ok"] and [p["probe"] for p in probes] == ["context"]


def test_the_line_is_fitted_on_relative_error() -> None:
    """The campaign's lines are the dataset calibration's own fit (`calibration.fit_line`)."""
    from predictor.dataset.calibration import fit_line

    traced = np.asarray([10.0, 100.0, 1000.0, 10000.0])
    line = fit_line(traced.tolist(), (900.0 + 1.13 * traced).tolist())
    context, factor = line.context_mib, line.factor
    assert context == pytest.approx(900.0) and factor == pytest.approx(1.13)
    # one small job 50% off weighs as much as one large job 50% off, not 1000x less
    measured = 900.0 + 1.13 * traced
    measured[0] *= 1.5
    tilted = fit_line(traced.tolist(), measured.tolist()).factor
    assert tilted < 1.13


@pytest.mark.skipif(not any(RAW.glob("runs-*.jsonl")), reason="no campaign measurements in this checkout")
def test_report_writes_every_measured_job_and_the_calibration_key(tmp_path: Path) -> None:
    runs = sorted(RAW.glob("runs-*.jsonl"))
    records = {}
    for path in runs:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records[record["job"]] = record
    ok = [r for r in records.values() if "probe" not in r and r["status"] == "ok"]
    (tmp_path / "reports").mkdir()
    result = campaign.report(runs, "h100", "test", tmp_path, tmp_path / "reports")
    assert len(campaign.read_table(tmp_path / "h100-test.csv")) == len(ok) == result["jobs_measured"]
    calibration = json.loads((tmp_path / "reports" / "calibration.json").read_text())
    assert set(calibration["campaign"]) >= {"median_abs_rel_err", "mlp_calibration_median_abs_rel_err"}
    # the held-out rows never fitted the lines: their count and the fit's add up to the measured jobs
    assert result["campaign"]["n_fit"] + result["campaign"]["n_holdout"] == len(ok)
    # what nvidia-smi shows per process is torch's reserved memory plus the CUDA context
    gaps = [r["nvml_process_peak_mib"] - r["torch_max_reserved_mib"] for r in ok]
    assert result["nvml_minus_torch_reserved_mib"]["p50"] == pytest.approx(float(np.median(gaps)), abs=0.1)


def test_the_exact_bound_covers_the_held_out_real_gpu_jobs() -> None:
    """The exact path's bound on the campaign's held-out 30% (groups its measured lines never saw):
    with the public A100 line's 3% alone, 18% of the H100 jobs were above it."""
    from predictor import exact

    table = sorted(campaign.MEASURED_DIR.glob("*.csv"))[0]
    rows = campaign.read_table(table)
    _, held = campaign.calibration_split(rows)
    memory, upper, measured = campaign.exact_on_measured([rows[i] for i in held])
    assert len(measured) > 100
    assert float(np.mean(upper < measured)) <= 0.05
    # the public line's own bound (no measured lines) on the same jobs: what the lines fixed
    public = memory * (1.0 + float(exact.load_table()["bound"]["calibration_rel"]))
    assert float(np.mean(public < measured)) > 0.10


def test_a_table_without_measured_lines_keeps_the_calibration_bound() -> None:
    from predictor import exact

    assert exact.measured_upper({}, "fp32", 1000.0) == 0.0
    line = {"precision": "fp32", "context_mib": 800.0, "factor": 1.2, "rel": 0.1}
    assert exact.measured_upper({"measured_lines": [line]}, "fp32", 1000.0) == pytest.approx(2000.0 * 1.1)
    assert exact.measured_upper({"measured_lines": [line]}, "amp", 1000.0) == 0.0
