"""A small synthetic jobs frame with the dataset's columns (docs/CONTRACTS.md "Dataset"), so the
predictor's tests never depend on the big generated file. Labels follow a simple analytic law
(context + 1.3 x weights/gradients/optimizer/activations, plus noise): learnable, not real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from predictor import features as feats
from predictor.spec import MODEL_FAMILIES, OPTIMIZERS, PRECISIONS


def synthetic_jobs(n: int = 240, seed: int = 0) -> Any:
    import pandas as pd

    rng = np.random.default_rng(seed)
    family = rng.choice(MODEL_FAMILIES, n)
    vision = np.isin(family, ("cnn", "resnet", "vit"))
    frame = pd.DataFrame({
        "model_type": family,
        "params_millions": np.round(np.exp(rng.uniform(np.log(0.5), np.log(300.0), n)), 3),
        "batch_size": rng.integers(1, 128, n),
        "input_dim": np.where(vision, rng.choice([32, 64, 128], n), rng.choice([32, 64, 128, 256], n)),
        "num_layers": rng.integers(1, 12, n),
        "iterations": rng.integers(100, 10_000, n),
        "precision": rng.choice(PRECISIONS, n),
        "optimizer": rng.choice(OPTIMIZERS, n),
        "learning_rate": rng.uniform(1e-4, 1e-2, n),
        "regularization": rng.integers(0, 2, n),
        "data_augmentation": rng.integers(0, 2, n),
    })
    est = feats.analytic_estimates(feats.columns_from_frame(frame))
    frame["memory_mib"] = (1400.0 + 1.3 * est["total_bytes"] / feats.MIB) * np.exp(rng.normal(0, 0.02, n))
    frame["gflops_per_iteration"] = est["flops"] / 1e9 * np.exp(rng.normal(0, 0.01, n)) + 1e-3
    frame["status"] = "ok"
    frame.loc[0, "status"] = "error"  # one failed trace: must be ignored
    return frame


def write_jobs_csv(path: Path, n: int = 240, seed: int = 0) -> Path:
    synthetic_jobs(n, seed).to_csv(path, index=False)
    return path
