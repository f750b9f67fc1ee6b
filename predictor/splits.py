"""Train/test splits used to compare every model on the same rows.

* `grouped`: about 30% of the architecture *groups* are the test set (a group is one architecture
  and its close variants: resnet50 and resnet50d, a timm module, an HF model type), so no
  architecture is on both sides. This is what a user with a model the predictor never saw meets:
  the headline figures.
* `leave_family_out` (`family_splits`): one fold per family, trained without it and tested on it:
  a whole kind of network the predictor has never seen.
* `random`: the seed paper's 70/30 random split (seeded), kept for the paper's comparison; the same
  architecture at other batch sizes sits on both sides, so it flatters every model.
* `size`: trained on the smaller 80% of jobs by requested parameters, tested on the largest 20%.

Calibration folds (`grouped_calibration_split`) are carved out of a training set by group too, so
the admission bound is calibrated on architectures the model did not fit.

Splits are index arrays into the dataset's rows (pure functions, no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
SPLIT_NAMES: tuple[str, ...] = ("grouped", "leave_family_out", "random", "size")


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


def _group_order(groups: npt.NDArray[np.str_], seed: int) -> list[str]:
    """The distinct groups in a seeded random order (sorted first, so the order depends on the seed only)."""
    unique = sorted(set(groups.tolist()))
    return [unique[i] for i in np.random.default_rng(seed).permutation(len(unique))]


def grouped_split(groups: Sequence[str] | npt.NDArray[np.str_], test_fraction: float = 0.3, seed: int = 0) -> Split:
    """Whole groups go to the test set, in a seeded order, until it holds `test_fraction` of the rows.

    No group has rows on both sides; at least one group is on each side.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    values = np.asarray(groups).astype(str)
    order = _group_order(values, seed)
    if len(order) < 2:
        raise ValueError(f"need at least 2 groups to split by group, got {len(order)}")
    test_groups: set[str] = set()
    counts = {g: int(c) for g, c in zip(*np.unique(values, return_counts=True), strict=True)}
    n_test, target = 0, test_fraction * len(values)
    for group in order[:-1]:  # the last group always stays in training
        if n_test >= target:
            break
        test_groups.add(group)
        n_test += counts[group]
    mask = np.isin(values, list(test_groups))
    return Split("grouped", np.flatnonzero(~mask).astype(np.int64), np.flatnonzero(mask).astype(np.int64))


def grouped_calibration_split(train: IntArray, groups: Sequence[str] | npt.NDArray[np.str_], fraction: float = 0.2,
                              seed: int = 0) -> tuple[IntArray, IntArray]:
    """Carve a calibration fold of whole groups out of a training set: (fit rows, calibration rows).

    `groups` holds every dataset row's group (indexed by the row numbers in `train`). With a single
    group in `train` it falls back to a random row fold (nothing else is possible).
    """
    train = np.asarray(train, dtype=np.int64)
    sub = np.asarray(groups).astype(str)[train]
    if len(set(sub.tolist())) < 2:
        return calibration_split(train, fraction, seed)
    inner = grouped_split(sub, fraction, seed)
    return train[inner.train], train[inner.test]


def grouped_folds(rows: IntArray, groups: Sequence[str] | npt.NDArray[np.str_], k: int,
                  seed: int = 0) -> list[IntArray]:
    """`rows` cut into `k` folds of whole groups with about as many rows each (seeded: the groups in
    a random order, each to the fold with the fewest rows so far). Sorted row arrays; none empty
    when there are at least k groups."""
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    sub = np.asarray(groups).astype(str)[rows]
    order = _group_order(sub, seed)
    if len(order) < k:
        raise ValueError(f"need at least {k} groups for {k} folds, got {len(order)}")
    sizes = [0] * k
    fold_of: dict[str, int] = {}
    counts = {g: int(c) for g, c in zip(*np.unique(sub, return_counts=True), strict=True)}
    for group in order:
        target = min(range(k), key=lambda i: (sizes[i], i))
        fold_of[group] = target
        sizes[target] += counts[group]
    assignment = np.asarray([fold_of[g] for g in sub.tolist()])
    return [rows[assignment == i] for i in range(k)]
