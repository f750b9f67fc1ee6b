"""The restore's checks of `deepres.io/assigned-gpus` (extender/policy/restoring.py), table-driven; the
attacks themselves, through a restarted extender, are tests/adversarial/test_restore_assigned.py."""

from __future__ import annotations

import itertools

import pytest

from extender.policy.restoring import (
    GPU_COUNT,
    GPU_LIST,
    MAX_CLAIMED,
    UNKNOWN_GPU,
    claimed_gpus,
    overbooked,
    settle_restored,
)

NODE = ("g0", "g1", "g2", "g3")


@pytest.mark.parametrize(("text", "names", "reasons"), [
    ("g0", ("g0",), []),
    ("g0,g1", ("g0", "g1"), []),
    (" g0 , g1 ", ("g0", "g1"), []),
    ("g0,g0", ("g0",), [GPU_LIST]),
    ("g0,,g1", ("g0", "g1"), [GPU_LIST]),
    ("g0,has space", ("g0",), [GPU_LIST]),
    ("g0,GPU-①", ("g0",), [GPU_LIST]),
    ("x" * 257, (), [GPU_LIST]),
    (",".join(f"g{i}" for i in range(MAX_CLAIMED + 5)), tuple(f"g{i}" for i in range(MAX_CLAIMED)), [GPU_LIST]),
])
def test_the_list_parses_to_names_that_can_be_gpus(text: str, names: tuple[str, ...], reasons: list[str]) -> None:
    got = claimed_gpus(text)
    assert got.gpu_uuids == names
    assert [r for r, _ in got.problems] == reasons


@pytest.mark.parametrize(("claimed", "wanted", "observed", "booked", "reasons"), [
    (("g0",), 1, (), ("g0",), []),
    (("g0", "phantom"), 1, (), ("g0",), [UNKNOWN_GPU]),
    (("phantom",), 1, (), (), [UNKNOWN_GPU, GPU_COUNT]),
    (("g0", "g1", "g2"), 1, (), ("g0",), [GPU_COUNT]),
    (("g0", "g1", "g2"), 1, ("g2",), ("g2",), [GPU_COUNT]),
    (("g0", "g1"), 1, ("g0", "g1"), ("g0", "g1"), [GPU_COUNT]),  # seen running on both: never cut
    (("g0",), 2, (), ("g0",), [GPU_COUNT]),  # fewer than asked: nothing invented
    (("g0",), 2, ("g3",), ("g3", "g0"), []),  # the agent shows the GPU the list left out
    (("g0", "g1"), None, (), ("g0", "g1"), []),  # request unknown: not cut
    (("g0",), 1, ("elsewhere",), ("g0",), []),  # a process on another node's GPU is not this node's
])
def test_settled_to_the_nodes_gpus_and_the_pods_request(claimed: tuple[str, ...], wanted: int | None,
                                                        observed: tuple[str, ...], booked: tuple[str, ...],
                                                        reasons: list[str]) -> None:
    got = settle_restored(claimed, wanted, "n1", NODE, observed)
    assert got.gpu_uuids == booked
    assert [r for r, _ in got.problems] == reasons


def test_the_earlier_bind_wins_whatever_the_order() -> None:
    bookings = [((10.0, 1.0, "a"), "a", ("g0",), 12_000.0),  # bound first
                ((20.0, 0.0, "b"), "b", ("g0",), 12_000.0),  # created first, bound later
                ((5.0, 2.0, "c"), "c", ("g1",), 4_000.0)]
    capacity = {"g0": 16_384.0, "g1": 16_384.0}
    for order in itertools.permutations(bookings):
        assert overbooked(order, capacity, ["a", "b", "c"]) == {"b": ("g0", 12_000.0, 16_384.0)}
    # only the candidates are named; a GPU no report gave a capacity is not judged
    assert overbooked(bookings, capacity, ["a"]) == {}
    assert overbooked(bookings, {"g1": 16_384.0}, ["a", "b", "c"]) == {}
    # a tie on bind time goes to the earlier creation, then the uid
    tied = [((10.0, 2.0, "x"), "x", ("g0",), 9_000.0), ((10.0, 1.0, "y"), "y", ("g0",), 9_000.0)]
    assert set(overbooked(tied, capacity, ["x", "y"])) == {"x"}
