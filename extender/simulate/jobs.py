"""Training-job descriptions for the replay, and the memory predictor DeepRes admits them with.

Job pool, first found wins (`JobPool.source` names it in the report):
1. predictor/data/real_jobs.csv.gz, the real architectures the shipped predictor is trained on
   (`deepres dataset real`). Each job is annotated as a data scientist describing a custom model
   would: the family annotations of the row, plus the optional activation count
   (`activations-millions`, scaled to the job's input) for the architectures the predictor's own
   fits give it to (`predictor.features.shapes_dropped`: half of them, by a hash of the name), so
   the replay meets the bound with and without it as the evaluation does. No `model` annotation:
   the exact-architecture path would make the replay's admission nearly exact.
2. predictor/data/jobs.csv, the template dataset of earlier releases (rows with status == ok);
3. predictor/dataset/_work/*.csv, its in-progress files (same columns);
4. fallback: ../shared/data/gpumem GPUMemNet MLP measurements (real A100 peaks) as MLP JobSpecs.
The job's true peak is the dataset's calibrated `memory_mib` (what nvidia-smi would show).

Predictor: `predictor.runtime.Predictor.load()` when it exists; otherwise a clearly labelled
PLACEHOLDER that knows the true peak and adds seeded log-normal noise (it flatters DeepRes: replace
it as soon as the shipped predictor lands).
"""

from __future__ import annotations

import csv
import gzip
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor import datapaths, features
from predictor.spec import Demand, JobSpec, SpecError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
GPUMEM = datapaths.GPUMEM

@dataclass(frozen=True)
class PoolJob:
    spec: JobSpec
    true_mib: float


@dataclass(frozen=True)
class JobPool:
    jobs: list[PoolJob]
    source: str


def _ok_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a dataset file (plain or gzipped csv) with status ok and a label."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
        return [row for row in csv.DictReader(handle)
                if row.get("status", "ok") == "ok" and row.get("memory_mib")]


def _pool_job(row: dict[str, str], spec: JobSpec | None) -> PoolJob | None:
    """The row's job with its true peak (None: the row does not parse or has no usable peak)."""
    try:
        true = float(row["memory_mib"])
    except ValueError:
        return None
    return PoolJob(spec, true) if spec is not None and true > 0 and math.isfinite(true) else None


def _from_dataset(path: Path) -> list[PoolJob]:
    return [job for row in _ok_rows(path) if (job := _pool_job(row, features.row_spec(row))) is not None]


def _from_real(path: Path) -> list[PoolJob]:
    """real_jobs.csv.gz annotated as the module docstring says (`features.annotated_specs`)."""
    rows = _ok_rows(path)
    specs = features.annotated_specs(rows, path.parent)
    return [job for row, spec in zip(rows, specs, strict=True) if (job := _pool_job(row, spec)) is not None]


def _from_gpumem(path: Path) -> list[PoolJob]:
    out = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                match = re.search(r"input:(\d+)", row["Filename"])
                spec = JobSpec(model_type="mlp", params_millions=max(float(row["Total Parameters"]) / 1e6, 0.001),
                               batch_size=int(row["Batch Size"]), input_dim=int(match.group(1)) if match else 1024,
                               num_layers=max(int(row["Depth"]), 1))
                out.append(PoolJob(spec, float(row["Max GPU Memory (MiB)"])))
            except (KeyError, ValueError, SpecError):
                continue
    return out


def load_job_pool(repo: Path = REPO) -> JobPool:
    """The first available source of the module docstring's list."""
    real = repo / "predictor" / "data" / "real_jobs.csv.gz"
    if real.is_file():
        jobs = _from_real(real)
        if jobs:
            with_count = sum(1 for j in jobs if j.spec.activations_millions > 0)
            return JobPool(jobs, f"the predictor's dataset of real architectures {real.relative_to(repo)} "
                                 f"({len(jobs)} ok rows, {with_count} of them annotated with the activation count)")
    dataset = repo / "predictor" / "data" / "jobs.csv"
    if dataset.is_file():
        jobs = _from_dataset(dataset)
        if jobs:
            return JobPool(jobs, f"predictor dataset {dataset.relative_to(repo)} ({len(jobs)} ok rows)")
    work = sorted((repo / "predictor" / "dataset" / "_work").glob("*.csv"))
    jobs = [j for path in work for j in _from_dataset(path)]
    if jobs:
        return JobPool(jobs, f"predictor dataset work files predictor/dataset/_work ({len(jobs)} ok rows, in progress)")
    fallback = GPUMEM / "gpumemnet_mlp_data_step2.csv"
    if fallback.is_file():
        jobs = _from_gpumem(fallback)
        if jobs:
            return JobPool(jobs, f"FALLBACK: GPUMemNet MLP measurements ({len(jobs)} runs); the predictor's dataset "
                                 "was not available")
    raise FileNotFoundError("no job source: predictor/data/real_jobs.csv.gz, predictor/data/jobs.csv, "
                            f"predictor/dataset/_work/*.csv or {fallback} is needed for the replay")


class PlaceholderPredictor:
    """PLACEHOLDER until predictor.runtime lands: true peak x lognormal(0, sigma); upper = x (1 + margin)."""

    version = "placeholder-oracle-noise"

    def __init__(self, truth: dict[JobSpec, float], sigma: float = 0.15, margin: float = 0.2, seed: int = 0) -> None:
        self.truth = truth
        self.sigma = sigma
        self.margin = margin
        self.rng = np.random.default_rng(seed)
        self._cache: dict[JobSpec, Demand] = {}

    def predict(self, spec: JobSpec) -> Demand:
        found = self._cache.get(spec)
        if found is None:
            mib = self.truth[spec] * float(np.exp(self.rng.normal(0.0, self.sigma)))
            found = Demand(mib, mib * (1 + self.margin), 0.0, 0.0, self.version)
            self._cache[spec] = found
        return found


def load_predictor(pool: JobPool, seed: int) -> tuple[Any, str]:
    """(predictor, description): the shipped one when importable and loadable, else the placeholder."""
    try:
        from predictor.runtime import Predictor  # type: ignore[import-not-found,unused-ignore]

        shipped = Predictor.load()
        return shipped, f"shipped predictor.runtime.Predictor (version {getattr(shipped, 'version', '?')})"
    except Exception as err:
        log.warning("shipped predictor unavailable (%s); using the labelled placeholder", err)
        truth = {j.spec: j.true_mib for j in pool.jobs}
        return (PlaceholderPredictor(truth, seed=seed),
                f"PLACEHOLDER predictor (true peak x lognormal(0, 0.15), upper bound +20 %): "
                f"predictor.runtime is not available ({type(err).__name__})")
