"""Splits: disjoint, complete, and each one tests what its name says."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.splits import (
    calibration_split,
    family_splits,
    grouped_calibration_split,
    grouped_folds,
    grouped_split,
    random_split,
    size_split,
)


def _disjoint_and_complete(train: np.ndarray, test: np.ndarray, n: int) -> None:
    assert not set(train.tolist()) & set(test.tolist())
    assert sorted(train.tolist() + test.tolist()) == list(range(n))


def test_random_split_is_70_30_disjoint_and_seeded() -> None:
    s = random_split(100, 0.3, seed=1)
    _disjoint_and_complete(s.train, s.test, 100)
    assert len(s.test) == 30
    assert np.array_equal(s.test, random_split(100, 0.3, seed=1).test)
    assert not np.array_equal(s.test, random_split(100, 0.3, seed=2).test)


def test_family_split_holds_each_family_out() -> None:
    families = np.array(["mlp", "gpt", "cnn", "gpt", "mlp", "vit"])
    splits = family_splits(families)
    assert [s.name for s in splits] == ["family:cnn", "family:gpt", "family:mlp", "family:vit"]
    for split in splits:
        held = split.name.split(":")[1]
        _disjoint_and_complete(split.train, split.test, len(families))
        assert set(families[split.test]) == {held}
        assert held not in set(families[split.train])


def test_size_split_tests_on_the_largest() -> None:
    params = np.array([5.0, 1.0, 100.0, 3.0, 50.0, 2.0, 7.0, 8.0, 9.0, 10.0])
    s = size_split(params, 0.2)
    _disjoint_and_complete(s.train, s.test, len(params))
    assert sorted(params[s.test].tolist()) == [50.0, 100.0]
    assert params[s.train].max() < params[s.test].min()


def test_calibration_fold_is_inside_train() -> None:
    train = np.arange(10, 110)
    fit, cal = calibration_split(train, 0.15, seed=0)
    assert len(cal) == 15 and not set(fit.tolist()) & set(cal.tolist())
    assert set(fit.tolist()) | set(cal.tolist()) == set(train.tolist())


def test_bad_fraction_is_rejected() -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        random_split(10, 1.5)


def _groups(n_groups: int = 40, seed: int = 3) -> np.ndarray:
    """Groups of uneven sizes (1..12 rows), rows interleaved so a group is not a contiguous block."""
    rng = np.random.default_rng(seed)
    labels = np.concatenate([[f"g{i}"] * int(rng.integers(1, 13)) for i in range(n_groups)])
    return labels[rng.permutation(len(labels))]


def test_grouped_split_keeps_every_group_on_one_side() -> None:
    groups = _groups()
    s = grouped_split(groups, 0.3, seed=0)
    _disjoint_and_complete(s.train, s.test, len(groups))
    assert not set(groups[s.train].tolist()) & set(groups[s.test].tolist())
    # about 30% of the rows: at most one group's worth (12 rows) over the target
    assert 0.3 * len(groups) <= len(s.test) <= 0.3 * len(groups) + 12
    assert np.array_equal(s.test, grouped_split(groups, 0.3, seed=0).test)
    assert not np.array_equal(s.test, grouped_split(groups, 0.3, seed=1).test)


def test_grouped_split_needs_two_groups() -> None:
    with pytest.raises(ValueError, match="2 groups"):
        grouped_split(np.array(["a", "a", "a"]))
    s = grouped_split(np.array(["a", "a", "b"]), 0.9)
    assert len(s.train) >= 1 and len(s.test) >= 1


def test_grouped_calibration_fold_is_carved_by_group_from_the_training_rows() -> None:
    groups = _groups(60)
    outer = grouped_split(groups, 0.3, seed=0)
    fit, cal = grouped_calibration_split(outer.train, groups, 0.2, seed=0)
    assert sorted(fit.tolist() + cal.tolist()) == sorted(outer.train.tolist())
    assert not set(groups[fit].tolist()) & set(groups[cal].tolist())
    assert not set(cal.tolist()) & set(outer.test.tolist())
    # one group only: a random row fold (nothing else is possible)
    fit1, cal1 = grouped_calibration_split(np.arange(10), np.array(["x"] * 10), 0.2, seed=0)
    assert len(cal1) == 2 and len(fit1) == 8


def test_grouped_folds_partition_the_rows_by_group_and_balance_them() -> None:
    groups = _groups(50)
    rows = np.arange(len(groups))[::2]  # a training subset, not all rows
    folds = grouped_folds(rows, groups, 5, seed=0)
    assert sorted(np.concatenate(folds).tolist()) == rows.tolist()
    seen: set[str] = set()
    for fold in folds:
        names = set(groups[fold].tolist())
        assert not names & seen
        seen |= names
    sizes = [len(f) for f in folds]
    assert max(sizes) - min(sizes) <= 12  # greedy balance: within one group's size (groups have <= 12 rows)
    with pytest.raises(ValueError, match="at least 5 groups"):
        grouped_folds(np.arange(4), np.array(["a", "b", "c", "d"]), 5)
