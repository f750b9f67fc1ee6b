"""The trainer's dataset: `deepres train` / `evaluate` read jobs.csv into a `Dataset` (`load_dataset`):
the usable rows as columns, both feature sets, the targets, the architecture groups and families, and the
physics decomposition calibrated by the dataset's nvidia-smi constants (`memory_calibration`).

Kept apart from `predictor.train` (the fitting) so that the report, the predictions and the scripts
read the dataset without the trainer; this module imports nothing of `predictor.train`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from predictor import features as feats
from predictor.features import SHAPES_FILE, shape_columns, shapes_dropped

FloatArray = npt.NDArray[np.float64]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT / "predictor" / "data" / "real_jobs.csv.gz"
CALIBRATION_CONSTANTS = REPO_ROOT / "predictor" / "dataset" / "calibration.json"
TARGETS: tuple[str, ...] = ("memory_mib", "gflops_per_iteration")


class DatasetError(Exception):
    """The dataset file is missing or does not have the contract's columns."""


@dataclass(frozen=True)
class Dataset:
    """The usable rows of jobs.csv as columns, both feature sets and the targets."""

    cols: dict[str, npt.NDArray[Any]]
    seed_x: feats.FeatureMatrix
    physics_x: feats.FeatureMatrix
    y: FloatArray  # (n, 2): memory_mib, gflops_per_iteration
    sha256: str
    path: Path
    groups: npt.NDArray[np.str_]
    """Architecture group per row (the `group` column; else `arch`; else the row itself)."""
    report_families: npt.NDArray[np.str_]
    """Family per row for the per-family tables and leave-family-out (the `family` column, else model_type)."""
    terms: feats.Decomposition
    """The physics decomposition of every row (`predictor.features.decomposition`), calibrated."""
    physics_t: FloatArray
    """The targets as the physics models learn them (`terms.encode(y)`: activation and FLOPs densities)."""
    physics_x_bare: feats.FeatureMatrix | None = None
    """The physics features with the optional shape annotations left out (what a job without them reads)."""
    terms_bare: feats.Decomposition | None = None
    """The decomposition of the same jobs without the shape annotations (a stated activation count sets the scale)."""
    fitted: tuple[feats.FeatureMatrix, FloatArray] | None = None
    """(physics features, physics targets) of the rows as models fit them: the shape annotations kept or
    dropped per architecture (`shapes_dropped`), the targets in the decomposition those features read."""

    def fit_x(self, rows: npt.NDArray[np.int64]) -> FloatArray:
        """Physics features of the rows a model fits (`fitted`)."""
        return (self.physics_x if self.fitted is None else self.fitted[0]).values[rows]

    def fit_t(self, rows: npt.NDArray[np.int64]) -> FloatArray:
        """The physics targets of the rows a model fits, each in the decomposition its features read (`fit_x`)."""
        return (self.physics_t if self.fitted is None else self.fitted[1])[rows]

    def without_shapes(self) -> Dataset:
        """The same rows as jobs that leave the optional shape annotations out (evaluated apart)."""
        if self.physics_x_bare is None or self.terms_bare is None:
            return self
        cols = {**self.cols, **{c: np.zeros(self.n_rows) for c in feats.SHAPE_COLUMNS}}
        return replace(self, cols=cols, physics_x=self.physics_x_bare, terms=self.terms_bare,
                       physics_t=self.terms_bare.encode(self.y), physics_x_bare=None, terms_bare=None, fitted=None)

    def terms_for(self, feature_set: str, rows: npt.NDArray[np.int64]) -> feats.Decomposition:
        """The decomposition a model of this feature set decodes with (identity for the paper's raw targets)."""
        return self.terms.take(rows) if feature_set == "physics" else feats.Decomposition.identity(len(rows))

    def targets_for(self, feature_set: str) -> FloatArray:
        return self.physics_t if feature_set == "physics" else self.y

    @property
    def n_rows(self) -> int:
        return len(self.y)

    @property
    def families(self) -> npt.NDArray[Any]:
        return self.cols["model_type"]


def load_dataset(path: Path = DEFAULT_DATA, max_rows: int | None = None, seed: int = 0) -> Dataset:
    """Read the dataset (.csv or .csv.gz), keep `status == ok` rows with positive targets, build both
    feature sets. `max_rows`: a seeded random subset of that many usable rows (CPU budget; every
    model and split then sees the same subset); the sha256 names the subset too."""
    import pandas as pd

    if not path.is_file():
        raise DatasetError(f"{path} not found: generate it with `deepres dataset` first")
    raw = path.read_bytes()
    frame = pd.read_csv(path)
    missing = [c for c in (*feats.SEED_COLUMNS, *TARGETS, "status") if c not in frame.columns]
    if missing:
        raise DatasetError(f"{path} lacks the columns {', '.join(missing)} (see docs/CONTRACTS.md 'Dataset')")
    ok = frame[(frame["status"] == "ok") & (frame[list(TARGETS)] > 0).all(axis=1)].reset_index(drop=True)
    digest = hashlib.sha256(raw).hexdigest()
    if max_rows is not None and len(ok) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(len(ok), max_rows, replace=False))
        ok = ok.iloc[keep].reset_index(drop=True)
        digest = hashlib.sha256(f"{digest}:{max_rows}:{seed}".encode()).hexdigest()
    if len(ok) < 20:
        raise DatasetError(f"{path} has only {len(ok)} usable rows (status ok, positive targets): need at least 20")
    cols = feats.columns_from_frame(ok)
    if "group" in ok.columns:
        groups = ok["group"].astype(str).to_numpy()
    elif "arch" in ok.columns:
        groups = (ok["model_type"].astype(str) + ":" + ok["arch"].astype(str)).to_numpy()
    else:
        groups = np.asarray([f"row{i}" for i in range(len(ok))])
    families = ok["family"].astype(str).to_numpy() if "family" in ok.columns else cols["model_type"].astype(str)
    y = ok[list(TARGETS)].to_numpy(dtype=np.float64)
    names = ok["name"].astype(str).to_numpy() if "name" in ok.columns else np.asarray(groups, dtype=str)
    if "name" in ok.columns and not any(c in ok.columns for c in feats.SHAPE_COLUMNS):
        cols.update(shape_columns(cols, names, path.parent / SHAPES_FILE))
        digest = hashlib.sha256(f"{digest}:shapes:{_file_sha(path.parent / SHAPES_FILE)}".encode()).hexdigest()
    bare_cols = {**cols, **{c: np.zeros(len(y)) for c in feats.SHAPE_COLUMNS}}
    terms = feats.decomposition(cols, *memory_calibration())
    dropped = shapes_dropped(names)
    fit_cols = {**cols, **{c: np.where(dropped[:, j], 0.0, cols[c]) for j, c in enumerate(feats.SHAPE_COLUMNS)}}
    fit_terms = feats.decomposition(fit_cols, *memory_calibration())
    return Dataset(
        cols=cols, seed_x=feats.seed_features(cols), physics_x=feats.physics_features(cols),
        y=y, sha256=digest, path=path,
        groups=np.asarray(groups, dtype=str), report_families=np.asarray(families, dtype=str),
        terms=terms, physics_t=terms.encode(y), physics_x_bare=feats.physics_features(bare_cols),
        terms_bare=feats.decomposition(bare_cols, *memory_calibration()),
        fitted=(feats.physics_features(fit_cols), fit_terms.encode(y)),
    )


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "none"


def memory_calibration() -> tuple[float, float]:
    """(context_mib, factor) of the dataset's nvidia-smi calibration (predictor/dataset/calibration.json):
    the labels are `context + factor x traced`, so the decomposition decodes with the same constants."""
    constants = json.loads(CALIBRATION_CONSTANTS.read_text())
    return float(constants["context_mib"]), float(constants["factor"])
