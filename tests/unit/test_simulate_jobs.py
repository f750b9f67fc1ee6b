"""The replay's job pool: it reads the real-architecture dataset the shipped predictor is trained on,
annotates jobs as docs/data-scientist.md tells a user to (the activation count scaled to the job's input, given
for half of the architectures), and falls back to the template dataset only when that file is absent."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
from pathlib import Path

import pytest

from extender.simulate.jobs import load_job_pool

HEADER = ["model_type", "params_millions", "batch_size", "input_dim", "num_layers", "iterations", "precision",
          "optimizer", "learning_rate", "regularization", "data_augmentation", "memory_mib", "status", "name"]


def _row(name: str, family: str, side: int, peak: float, status: str = "ok") -> dict[str, str]:
    return {"model_type": family, "params_millions": "25.6", "batch_size": "32", "input_dim": str(side),
            "num_layers": "50", "iterations": "1000", "precision": "amp", "optimizer": "adamw",
            "learning_rate": "0.001", "regularization": "0", "data_augmentation": "1", "memory_mib": str(peak),
            "status": status, "name": name}


def _write_real(data: Path, rows: list[dict[str, str]], shapes: dict[str, dict[str, float]]) -> None:
    data.mkdir(parents=True)
    with gzip.open(data / "real_jobs.csv.gz", "wt", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=HEADER)
        writer.writeheader()
        writer.writerows(rows)
    (data / "real_shapes.json").write_text(json.dumps({"architectures": shapes}))


def _given(name: str) -> bool:
    """The documented rule: an architecture keeps its count unless the first byte of its name's sha256
    falls in the lower half."""
    return hashlib.sha256(name.encode()).digest()[0] >= 128


def _names(given: bool, n: int) -> list[str]:
    return [f"timm/net{i}" for i in range(200) if _given(f"timm/net{i}") == given][:n]


def test_real_dataset_wins_and_counts_scale_with_the_input(tmp_path: Path) -> None:
    kept, dropped = _names(True, 1)[0], _names(False, 1)[0]
    rows = [_row(kept, "resnet", 224, 5000.0), _row(kept, "resnet", 448, 9000.0),
            _row(dropped, "cnn", 224, 3000.0), _row(kept, "resnet", 224, 4000.0, status="error")]
    _write_real(tmp_path / "predictor" / "data", rows,
                {kept: {"activations_millions": 10.0, "input_default": 224},
                 dropped: {"activations_millions": 7.0, "input_default": 224}})
    # a template dataset beside it must not be read
    (tmp_path / "predictor" / "data" / "jobs.csv").write_text("model_type,memory_mib\nmlp,1\n")
    pool = load_job_pool(tmp_path)
    assert "real_jobs.csv.gz" in pool.source and "3 ok rows" in pool.source
    by_peak = {job.true_mib: job.spec for job in pool.jobs}
    assert sorted(by_peak) == [3000.0, 5000.0, 9000.0]
    assert by_peak[5000.0].activations_millions == pytest.approx(10.0)
    assert by_peak[9000.0].activations_millions == pytest.approx(40.0)  # twice the side: four times the pixels
    assert by_peak[3000.0].activations_millions == 0.0  # this architecture's jobs are the ones without it
    assert by_peak[3000.0].model_type == "cnn" and by_peak[5000.0].batch_size == 32
    assert by_peak[5000.0].model == ""  # family annotations, not the exact-architecture path


def test_unknown_architecture_and_bad_rows_lose_only_themselves(tmp_path: Path) -> None:
    kept = _names(True, 2)
    rows = [_row(kept[0], "vit", 224, 2000.0), _row(kept[1], "vit", 224, 2100.0),
            {**_row(kept[0], "vit", 224, 2200.0), "batch_size": "lots"}, _row(kept[0], "vit", 224, -5.0)]
    _write_real(tmp_path / "predictor" / "data", rows, {kept[0]: {"activations_millions": 4.0, "input_default": 224}})
    pool = load_job_pool(tmp_path)
    counts = sorted((job.true_mib, job.spec.activations_millions) for job in pool.jobs)
    assert counts == [(2000.0, pytest.approx(4.0)), (2100.0, 0.0)]  # not in the table: no count


def test_template_dataset_is_the_fallback(tmp_path: Path) -> None:
    data = tmp_path / "predictor" / "data"
    data.mkdir(parents=True)
    row = _row("", "mlp", 512, 1234.0)
    with (data / "jobs.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=HEADER)
        writer.writeheader()
        writer.writerow(row)
    pool = load_job_pool(tmp_path)
    assert "jobs.csv" in pool.source and [j.true_mib for j in pool.jobs] == [1234.0]
