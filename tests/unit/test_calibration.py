"""Calibration: the fit, the held-out split, rebuilding measured MLPs, the shipped constants."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch

from predictor.dataset import calibration

ROW = {
    "Filename": "input:20_output:3_depth:2_arch:pyramid_batch:16_act:relu_dropout:0.25_dropout:True_batchnorm:True.out",
    "Activations-Params": "[('linear', 10, 210), ('batch_normalization', 10, 20), ('ReLU', 10, 0), "
                          "('dropout', 10, 0), ('linear', 3, 33), ('Softmax', 3, 0)]",
    "Batch Size": "16",
    "Max GPU Memory (MiB)": "1500",
}


def test_fit_line_recovers_a_known_line() -> None:
    traced = [10.0, 50.0, 200.0, 800.0, 2500.0]
    measured = [1400.0 + 1.3 * t for t in traced]
    fit = calibration.fit_line(traced, measured)
    assert fit.context_mib == pytest.approx(1400.0, rel=1e-9)
    assert fit.factor == pytest.approx(1.3, rel=1e-9)


def test_fit_line_with_noise_stays_close() -> None:
    rng = random.Random(0)
    traced = [rng.uniform(0, 3000) for _ in range(400)]
    measured = [(1441.0 + 1.28 * t) * (1 + rng.gauss(0, 0.01)) for t in traced]
    fit = calibration.fit_line(traced, measured)
    assert fit.context_mib == pytest.approx(1441.0, rel=0.02)
    assert fit.factor == pytest.approx(1.28, rel=0.03)
    errors = calibration.abs_rel_errors(fit, traced, measured)
    assert calibration.percentile(errors, 50) < 0.01


def test_fit_line_rejects_degenerate_input() -> None:
    with pytest.raises(ValueError):
        calibration.fit_line([1.0], [2.0])
    with pytest.raises(ValueError):
        calibration.fit_line([5.0, 5.0, 5.0], [1.0, 2.0, 3.0])


def test_holdout_split_is_seeded_and_disjoint() -> None:
    keys = [str(i) for i in range(100)]
    fit_a, hold_a = calibration.split_holdout(keys, 0.3, seed=1)
    fit_b, hold_b = calibration.split_holdout(keys, 0.3, seed=1)
    assert (fit_a, hold_a) == (fit_b, hold_b)
    assert len(hold_a) == 30 and not set(fit_a) & set(hold_a) and len(fit_a) + len(hold_a) == 100
    assert calibration.split_holdout(keys, 0.3, seed=2)[1] != hold_a


def test_percentile_interpolates() -> None:
    assert calibration.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert calibration.percentile([5.0], 90) == 5.0


def test_measured_run_is_rebuilt_layer_by_layer() -> None:
    run = calibration.parse_run("t:0", ROW)
    assert (run.input_dim, run.batch_size, run.dropout, run.measured_mib) == (20, 16, 0.25, 1500.0)
    model = calibration.build_mlp(run)
    assert sum(p.numel() for p in model.parameters()) == 210 + 20 + 33
    out = model(torch.randn(4, 20))
    assert out.shape == (4, 3)
    peak_mib, parts = calibration.trace_run(run)
    # parameters plus the batch norm's running mean/var (fp32) and its int64 batch counter
    assert peak_mib > 0 and parts["params"] == pytest.approx(((263 + 20) * 4 + 8) / (1 << 20))


def test_a_row_without_input_size_is_refused() -> None:
    with pytest.raises(ValueError, match="no input size"):
        calibration.parse_run("t:1", {**ROW, "Filename": "something.out"})


def test_real_gpumemnet_rows_rebuild_with_their_parameter_counts(shared_data: Path) -> None:
    for name in calibration.SOURCE_FILES:
        with open(shared_data / "gpumem" / name, newline="") as handle:
            reader = csv.DictReader(handle)
            for i, row in zip(range(5), reader, strict=False):
                model = calibration.build_mlp(calibration.parse_run(f"{name}:{i}", row))
                assert sum(p.numel() for p in model.parameters()) == int(row["Total Parameters"])


def test_shipped_constants_name_their_source_and_drive_calibrate() -> None:
    data = json.loads(calibration.CONSTANTS_PATH.read_text())
    assert "GPUMemNet" in data["source"] and "A100" in data["source"]
    fit = calibration.calibration_constants()
    assert calibration.calibrate(0.0) == pytest.approx(fit.context_mib)
    assert calibration.calibrate(1000.0) > calibration.calibrate(100.0)
    assert 0.5 < fit.factor < 3.0 and 0 < fit.context_mib < 5000
