"""Splits: disjoint, complete, and each one tests what its name says."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.splits import calibration_split, family_splits, random_split, size_split


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
