"""Train/test splits used to compare every model on the same rows.

* `random`: the seed paper's 70/30 random split (seeded).
* `family`: one fold per architecture family, trained without it and tested on it: can a model
  predict an architecture it has never seen?
* `size`: trained on the smaller 80% of jobs by requested parameters, tested on the largest 20%:
  can it extrapolate to bigger models than it was trained on?

Splits are index arrays into the dataset's rows (pure functions, no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
SPLIT_NAMES: tuple[str, ...] = ("random", "family", "size")


@dataclass(frozen=True)
class Split:
    """One train/test partition of row indices; `name` is e.g. `random`, `family:gpt`, `size`."""

    name: str
    train: IntArray
    test: IntArray


def random_split(n_rows: int, test_fraction: float = 0.3, seed: int = 0) -> Split:
    """The seed's random split: `test_fraction` of the rows, chosen by `seed`, are the test set."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if n_rows < 2:
        raise ValueError(f"need at least 2 rows to split, got {n_rows}")
    order = np.random.default_rng(seed).permutation(n_rows)
    n_test = min(n_rows - 1, max(1, round(n_rows * test_fraction)))
    return Split("random", np.sort(order[n_test:]).astype(np.int64), np.sort(order[:n_test]).astype(np.int64))


def family_splits(families: Sequence[str] | npt.NDArray[np.str_]) -> list[Split]:
    """One split per family present: test = that family's rows, train = every other row."""
    values = np.asarray(families).astype(str)
    out = []
    for family in sorted(set(values.tolist())):
        mask = values == family
        if mask.all():
            continue  # a single-family dataset cannot hold one family out
        out.append(Split(f"family:{family}", np.flatnonzero(~mask).astype(np.int64),
                         np.flatnonzero(mask).astype(np.int64)))
    return out


def size_split(params_millions: Sequence[float] | npt.NDArray[np.float64], test_fraction: float = 0.2) -> Split:
    """Test = the largest `test_fraction` of jobs by parameters (ties broken by row order)."""
    values = np.asarray(params_millions, dtype=np.float64)
    if len(values) < 2:
        raise ValueError(f"need at least 2 rows to split, got {len(values)}")
    order = np.argsort(values, kind="stable")
    n_test = min(len(values) - 1, max(1, round(len(values) * test_fraction)))
    return Split("size", np.sort(order[:-n_test]).astype(np.int64), np.sort(order[-n_test:]).astype(np.int64))


def calibration_split(train: IntArray, fraction: float = 0.15, seed: int = 0) -> tuple[IntArray, IntArray]:
    """Carve a calibration fold out of a training set: (fit rows, calibration rows).

    Every model fits on the first part and sets its memory safety margin on the second, so the
    margin is measured on rows the model has not seen and the test set stays untouched.
    """
    order = np.random.default_rng(seed).permutation(len(train))
    n_cal = min(len(train) - 1, max(1, round(len(train) * fraction)))
    return np.sort(train[order[n_cal:]]), np.sort(train[order[:n_cal]])
