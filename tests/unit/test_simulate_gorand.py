"""Go's math/rand reimplementation: Go's own published outputs, and the jump-ahead against stepping."""

from __future__ import annotations

import random

from extender.simulate.gorand import _LEN, GoRand, _advance, _seed_values


def test_seed_one_matches_go() -> None:
    # Go (<1.20): rand.New(rand.NewSource(1)).Int() prints these; rand.Intn(100) gives 81 87 47 59 ...
    r = GoRand(1)
    assert [r.go_int(), r.go_int()] == [5577006791947779410, 8674665223082153551]
    r = GoRand(1)
    assert [r.intn(100) for _ in range(10)] == [81, 87, 47, 59, 81, 18, 25, 40, 56, 0]


def test_jump_ahead_equals_stepping() -> None:
    seed = random.Random(7).randrange(1, 2**31 - 1)
    vec = _seed_values(seed, (20, 10))
    stepped = list(vec)
    tap, feed = 0, _LEN - 273
    for _ in range(3000):
        tap = (tap - 1) % _LEN
        feed = (feed - 1) % _LEN
        stepped[feed] = (stepped[feed] + stepped[tap]) & ((1 << 64) - 1)
    assert _advance(vec, 3000) == stepped


def test_perm_and_shuffle_are_permutations_and_seeded() -> None:
    a, b = GoRand(42), GoRand(42)
    assert a.perm(1213) == b.perm(1213)
    perm = GoRand(43).perm(500)
    assert sorted(perm) == list(range(500)) and perm != list(range(500))
    order = GoRand(44).shuffle_indices(1000)
    assert sorted(order) == list(range(1000)) and order != list(range(1000))
    assert all(0 <= GoRand(5).intn(n) < n for n in (1, 2, 3, 10, 2**31 - 1, 2**40))
