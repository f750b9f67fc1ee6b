"""A candidate family point (issue 47, measured, not served): the network's point corrected by a ridge
regression of log(truth / network point) on the family, size, depth, input, batch, precision, optimizer
and the traced table's reading of the family (`predictor.family_table`; `design`), each architecture
group weighted alike. `predictor.family_eval` fits it on the *other* held-out groups of each seed
(`family_eval.stacked`, its penalty chosen by inner group folds) and scores it as `stacked` beside the
network's point: it did not win (docs/predictor.md, "The family path on held-out groups"), so the
network's point is served (the traced table's for the text families: `predictor.family_table.served_point`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

#: The families with an intercept of their own (others share the slopes only).
FAMILIES = ("cnn", "resnet", "vit", "transformer", "gpt", "lstm", "gru", "mlp")
TEXT = ("transformer", "gpt")
NAMES = (*(f"family={f}" for f in FAMILIES), "log_params", "log_layers", "log_input", "log_batch",
         "amp", "bf16", "sgd", "table_vision", "table_text", "has_table")
#: The correction never moves the point by more than this factor either way.
MAX_LOG_CORRECTION = math.log(2.0)


def design(model_type: str, params_millions: float, num_layers: float, input_dim: float, batch_size: float,
           precision: str, optimizer: str, network_mib: float, table_mib: float | None) -> list[float]:
    """The regression's inputs for one job (NAMES, in order); `table_mib` None: the table lacks the family."""
    row = [1.0 if model_type == f else 0.0 for f in FAMILIES]
    row += [math.log(max(params_millions, 1e-3)), math.log(max(num_layers, 1.0)), math.log(max(input_dim, 1.0)),
            math.log(max(batch_size, 1.0)), 1.0 if precision in ("amp", "bf16-mixed") else 0.0,
            1.0 if precision in ("bf16", "bf16-true", "fp16") else 0.0, 1.0 if optimizer == "sgd" else 0.0]
    t = 0.0 if table_mib is None or network_mib <= 0 else math.log(max(table_mib, 1.0) / network_mib)
    text = model_type in TEXT
    row += [0.0 if text else t, t if text else 0.0, 0.0 if table_mib is None else 1.0]
    return row


def fit(X: npt.NDArray[np.float64], y: npt.NDArray[np.float64], groups: npt.NDArray[Any],
        lam: float) -> dict[str, Any]:
    """Ridge on standardised columns (the intercepts' columns too), every group weighted alike."""
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse]
    w = w / w.sum()
    mean = (w[:, None] * X).sum(axis=0)
    scale = np.sqrt((w[:, None] * (X - mean) ** 2).sum(axis=0))
    scale = np.where(scale > 1e-9, scale, 1.0)
    Z = (X - mean) / scale
    y0 = float((w * y).sum())
    A = Z.T @ (w[:, None] * Z) + lam * np.eye(X.shape[1]) / len(counts)
    beta = np.linalg.solve(A, Z.T @ (w * (y - y0)))
    return {"mean": mean.tolist(), "scale": scale.tolist(), "intercept": y0, "beta": beta.tolist(), "lambda": lam}


def predict(model: dict[str, Any], X: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    Z = (X - np.asarray(model["mean"])) / np.asarray(model["scale"])
    out: npt.NDArray[np.float64] = np.clip(model["intercept"] + Z @ np.asarray(model["beta"]),
                                           -MAX_LOG_CORRECTION, MAX_LOG_CORRECTION)
    return out
