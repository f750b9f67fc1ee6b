"""The packing simulator's memo keys (`CpuLevels`): decisions taken from memoised scores equal those
computed afresh, with the exact CPU left, for every feasible node."""

from __future__ import annotations

import random

import numpy as np
import pytest

from extender.simulate.packing import (
    CpuLevels,
    FgdPolicy,
    FragAwarePolicy,
    Fragmentation,
    NodeView,
    fgd_node_score,
)
from extender.simulate.traces import Node, Pod, TypicalPod, typical_pods


def test_cpu_levels_count_the_thresholds_at_or_below() -> None:
    levels = CpuLevels([4000, 1000, 4000, 8000])
    assert [levels(c) for c in (0, 999, 1000, 3999, 4000, 7999, 8000, 10**6)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert levels(None) == -1
    # values in one bucket compare the same way with every threshold
    for a, b in ((1000, 3999), (4000, 7999)):
        assert all((a >= t) == (b >= t) for t in (1000, 4000, 8000))


def tight_cluster(seed: int) -> tuple[list[Node], list[Pod]]:
    """A small cluster whose CPU runs out before its GPUs, so CPU levels change decisions."""
    rng = random.Random(seed)
    nodes = [Node(f"n{i:02d}", rng.choice([8000, 16000, 32000]), 10**6, rng.choice([1, 2, 4, 8]),
                  rng.choice(["T4", "V100M32"])) for i in range(24)]
    pods = []
    for i in range(400):
        kind = rng.random()
        cpu = rng.choice([500, 1000, 2000, 3000, 4000, 6000])
        if kind < 0.15:
            pods.append(Pod(f"p{i:03d}", cpu, 0, 0, 0, ()))
        elif kind < 0.75:
            pods.append(Pod(f"p{i:03d}", cpu, 0, 1, rng.choice([100, 250, 500, 800]),
                            rng.choice([(), ("T4",), ("V100M32",)])))
        else:
            pods.append(Pod(f"p{i:03d}", cpu, 0, rng.choice([1, 2, 4]), 1000, ()))
    return nodes, pods


def fresh_fgd(typical: list[TypicalPod], models: list[str], view: NodeView, pod: Pod,
              feasible: np.ndarray) -> tuple[int, list[int]] | None:
    """FGD's choice with no memo at all: every node scored from its exact state."""
    frag = Fragmentation(typical, models, memoise=False)
    best: tuple[int, int, list[int]] | None = None
    for i in feasible.tolist():
        state = (int(view.model[i]), int(view.cpu_left[i]), tuple(int(v) for v in view.gpu_left[i, : view.n_gpu[i]]))
        score, gpus = fgd_node_score(frag, state, pod)
        if best is None or score > best[0]:
            best = (score, i, gpus)
    return None if best is None else (best[1], best[2])


def fresh_fragaware(policy: FragAwarePolicy, view: NodeView, pod: Pod,
                    feasible: np.ndarray) -> tuple[int, list[int]] | None:
    """DeepRes's choice calling the shared `fragmentation_delta` per node with its exact CPU left."""
    from extender.policy import fragmentation_delta, merit_from_delta
    from extender.simulate.adapters import node_view, pod_request

    best: tuple[int, int, list[int]] | None = None
    for i in feasible.tolist():
        model = view.models[int(view.model[i])]
        gpus = tuple(int(v) for v in view.gpu_left[i, : view.n_gpu[i]])
        found = fragmentation_delta(pod_request(pod, model), node_view("x", model, gpus), policy.mix(model),
                                    float(view.cpu_left[i]), float(pod.cpu_milli))
        if found is None:
            continue
        merit = merit_from_delta(found[0])
        if best is None or merit > best[0]:
            best = (merit, i, [g.index for g in found[1]])
    return None if best is None else (best[1], best[2])


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("kind", ["fgd", "deepres"])
def test_memoised_choices_equal_fresh_ones_step_by_step(kind: str, seed: int) -> None:
    nodes, pods = tight_cluster(seed)
    typical = typical_pods(pods)
    models = sorted({n.model for n in nodes})
    view = NodeView(nodes, list(range(len(nodes))))
    fgd = FgdPolicy(Fragmentation(typical, models))
    ours = FragAwarePolicy(typical)
    compared = placed = 0
    cpu_bound = 0
    for p in pods:
        feasible = np.flatnonzero(view.feasible(p))
        if not len(feasible):
            continue
        if kind == "fgd":
            got, want = fgd.choose(view, p, feasible), fresh_fgd(typical, models, view, p, feasible)
        else:
            got, want = ours.choose(view, p, feasible), fresh_fragaware(ours, view, p, feasible)
            if p.num_gpu == 0 and want is None:
                continue
        assert got == want, p.name
        compared += 1
        cpu_bound += int((view.cpu_left[feasible] < 6000).any())
        if got is not None:
            view.place(got[0], p, got[1])
            placed += 1
    assert compared > 60 and placed > 40
    assert cpu_bound > 20  # nodes low on CPU were among the candidates: the CPU levels mattered
