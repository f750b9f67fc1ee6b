"""Admission per GPU model groups a filter's names by their node's (GPU models, node software) key
(`gpu_demand.grouped_by_key`, in C loops): the same groups, in the same order, as a loop over the names."""

from __future__ import annotations

import random

from extender.server.gpu_demand import grouped_by_key


def test_the_grouping_equals_a_loop_over_the_names() -> None:
    rng = random.Random(5)
    models = [(("NVIDIA H100 80GB HBM3",), "580/13.0"), (("NVIDIA H100 80GB HBM3",), "590/13.0"),
              (("NVIDIA A100-SXM4-80GB",), "580/13.0"), (("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"), "")]
    for _ in range(200):
        nodes = [f"n{i}" for i in range(rng.randint(0, 60))]
        key_of = {n: rng.choice(models) for n in nodes if rng.random() < 0.9}  # (one object per key, as the ledger)
        names = tuple(rng.sample([*nodes, "ghost-1", "ghost-2"], rng.randint(0, len(nodes) + 2)))
        expected: dict[object, list[str]] = {}
        for name in names:
            expected.setdefault(key_of.get(name), []).append(name)
        got = grouped_by_key(names, key_of, tuple(dict.fromkeys(key_of.values())))
        assert {k: list(v) for k, v in got.items()} == expected
        assert sorted(n for v in got.values() for n in v) == sorted(names)
