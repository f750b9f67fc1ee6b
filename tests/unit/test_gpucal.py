"""Per-GPU-model calibration and the real-jobs figures (issue 25, parts 1 and 4)."""

from __future__ import annotations

import json

import pytest

from predictor import gpucal, realjobs
from predictor.features import row_spec
from predictor.spec import Demand


def test_a_measured_gpu_reads_the_demand_on_its_own_line() -> None:
    demand = Demand(10_000.0, 11_000.0, 1.0, 1.0, "v+exact")
    on_h100 = gpucal.on_gpu(demand, "amp", "NVIDIA H100 80GB HBM3")
    line = gpucal.lines()["gpus"]["h100-sxm"]["exact"]["amp"]
    traced = gpucal.traced_equivalent(10_000.0)
    assert on_h100.calibrated
    assert on_h100.memory_mib == pytest.approx(line["context_mib"] + line["factor"] * traced, abs=0.1)
    assert on_h100.memory_mib_upper == pytest.approx(on_h100.memory_mib * (1 + line["rel"]), abs=0.2)


def test_an_unmeasured_gpu_keeps_the_wider_bound_and_says_so() -> None:
    demand = Demand(10_000.0, 13_000.0, 1.0, 1.0, "v")
    other = gpucal.on_gpu(demand, "fp32", "Tesla T4")
    assert not other.calibrated and other.memory_mib_upper == 13_000.0 and "T4" in other.note


def test_dataset_rows_keep_whole_model_bf16_and_mixers_read_as_vit() -> None:
    row = {"model_type": "mlp", "params_millions": "59.9", "batch_size": "32", "input_dim": "224", "num_layers": "12",
           "precision": "bf16", "optimizer": "adamw", "family": "mlp", "source": "timm"}
    spec = row_spec(row)
    assert spec is not None and spec.precision == "bf16" and spec.model_type == "vit" and not spec.notes
    hand_written = row_spec({**row, "source": "nn", "input_dim": "784"})
    assert hand_written is not None and hand_written.model_type == "mlp"


def test_realjobs_keys_in_the_report() -> None:
    data = json.loads(realjobs.REPORT.read_text())["realjobs"]
    for path in ("exact", "family"):
        assert {"median_abs_rel_err", "under_rate", "median_bound_ratio", "n"} <= set(data[path])
