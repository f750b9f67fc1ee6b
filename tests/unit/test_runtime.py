"""The runtime Predictor: loads an artifact, deterministic, cached, thread-safe, clear errors."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from predictor.runtime import ArtifactError, Predictor
from predictor.spec import Demand, JobSpec, estimate_gpu_seconds
from predictor.splits import random_split
from predictor.train import fit_model, load_dataset, save_artifact, score
from tests.unit._predictor_frames import write_jobs_csv


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny artifact: the tuned model trained 2 epochs on a synthetic frame (fast, not accurate)."""
    root = tmp_path_factory.mktemp("artifact")
    data = load_dataset(write_jobs_csv(root / "jobs.csv", n=120))
    split = random_split(data.n_rows, 0.3, 0)
    model = fit_model("transformer_bigru_tuned", data, split, seed=0, epochs_scale=2 / 120)
    save_artifact(model, data, root / "art", 0, score(model, data, split.test), 1.0)
    return root / "art"


SPECS = [
    JobSpec("cnn", params_millions=15, batch_size=64, input_dim=224, num_layers=5, precision="amp", optimizer="sgd"),
    JobSpec("gpt", params_millions=350, batch_size=8, input_dim=1024, num_layers=24, optimizer="adamw"),
    JobSpec("lstm", params_millions=5, batch_size=32),
]


def test_predict_returns_a_consistent_demand(artifact: Path) -> None:
    p = Predictor.load(artifact)
    meta = json.loads((artifact / "metadata.json").read_text())
    for spec in SPECS:
        d = p.predict(spec)
        assert isinstance(d, Demand)
        assert d.model_version == p.version == meta["version"]
        assert 0 < d.memory_mib <= d.memory_mib_upper
        assert d.gflops_per_iteration > 0
        assert d.gpu_seconds == pytest.approx(
            estimate_gpu_seconds(d.gflops_per_iteration, spec.iterations, spec.precision), rel=1e-5)


def test_deterministic_across_loads_and_batch(artifact: Path) -> None:
    a, b = Predictor.load(artifact), Predictor.load(artifact)
    assert [a.predict(s) for s in SPECS] == [b.predict(s) for s in SPECS]
    assert b.with_cache_size(0).predict_many(SPECS) == [a.predict(s) for s in SPECS]


def test_cache_hits_and_bound(artifact: Path) -> None:
    p = Predictor.load(artifact, cache_size=2)
    first = p.predict(SPECS[0])
    again = p.predict(JobSpec.parse(SPECS[0].to_annotations()))  # equal spec, different object
    assert again is first and p.hits == 1 and p.misses == 1
    p.predict(SPECS[1])
    p.predict(SPECS[2])  # evicts SPECS[0] (least recently used)
    p.predict(SPECS[0])
    assert p.misses == 4


def test_thread_safe(artifact: Path) -> None:
    p = Predictor.load(artifact, cache_size=8)
    expected = {s: Predictor.load(artifact).predict(s) for s in SPECS}
    errors: list[str] = []

    def worker(k: int) -> None:
        for i in range(30):
            spec = SPECS[(i + k) % len(SPECS)]
            if p.predict(spec) != expected[spec]:
                errors.append(f"thread {k} call {i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert p.hits + p.misses == 180


def test_missing_artifact_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="deepres train"):
        Predictor.load(tmp_path)


def test_corrupt_artifact_is_a_clear_error(artifact: Path, tmp_path: Path) -> None:
    (tmp_path / "metadata.json").write_text((artifact / "metadata.json").read_text())
    (tmp_path / "transformer_bigru_tuned.pt").write_bytes(b"not torch")
    with pytest.raises(ArtifactError, match="unreadable"):
        Predictor.load(tmp_path)
