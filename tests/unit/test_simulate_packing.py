"""Packing experiment (FGD's method): binning, typical pods, FGD and BestFit scores by hand,
bookkeeping, workload tuning, and DeepRes decisions identical to the live policy functions."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from extender.simulate import packing
from extender.simulate.packing import (
    BestFitPolicy,
    DeepResPolicy,
    FgdPolicy,
    FragAwarePolicy,
    Fragmentation,
    NodeView,
    PackingResult,
    RandomPolicy,
    best_fit_raw,
    bin_allocation,
    fgd_node_score,
    normalize_scores,
    run_packing,
)
from extender.simulate.traces import (
    DEFAULT_DATA,
    Node,
    Pod,
    TypicalPod,
    build_workload,
    node_list_path,
    pod_list_path,
    read_nodes,
    read_pods,
    typical_pods,
)


def result(arrived: list[int], allocated: list[int], capacity: int = 100_000) -> PackingResult:
    n = len(arrived)
    return PackingResult("x", 0, np.array(arrived), np.array(allocated), np.ones(n, dtype=bool), capacity)


def test_binning_rounds_bins_and_falls_back_to_neighbours() -> None:
    # capacity 100000 milli: 1 % = 1000 milli. x = round(A/1000), y = round(U/1000, 2)
    r = result([1000, 1400, 1600, 5000, 5000], [1000, 1400, 1500, 4000, 4100])
    cols = bin_allocation(r, columns=8)
    assert cols[1] == round((1.0 + 1.4) / 2, 2)  # 1.0 and 1.4 both round to x=1
    assert cols[2] == 1.5  # 1.6 -> x=2
    assert cols[0] == round((1.0 + 1.4) / 2, 2)  # empty: mean over x in -1..1, i.e. bin 1 only
    assert cols[3] == 1.5  # empty: neighbours 2 (1.5) and 4 (none)
    assert cols[5] == round((4.0 + 4.1) / 2, 2)
    assert cols[4] == cols[5] and cols[6] == cols[5]
    assert cols[7] is None and cols[8] is None
    assert bin_allocation(result([2500], [2500]), columns=3)[2] == 2.5  # Python round: 2.5 -> 2 (banker's)


def pod(name: str, cpu: int, gpus: int, milli: int, spec: tuple[str, ...] = (), mem: int = 0) -> Pod:
    return Pod(name, cpu, mem, gpus, milli if gpus else 0, spec)


def test_typical_pods_on_a_handmade_trace() -> None:
    pods = ([pod(f"a{i}", 4000, 1, 500) for i in range(50)] + [pod(f"b{i}", 8000, 1, 1000) for i in range(30)]
            + [pod(f"c{i}", 2000, 0, 0) for i in range(15)] + [pod(f"d{i}", 1000, 2, 1000) for i in range(3)]
            + [pod(f"e{i}", 1000, 1, 250) for i in range(2)])
    typical = typical_pods(pods)
    # counts 50, 30, 15 reach 95 of 100: the prefix stops there; renormalised over 95
    assert [(t.cpu_milli, t.gpu_milli, t.num_gpu) for t in typical] == [(4000, 500, 1), (8000, 1000, 1), (2000, 0, 0)]
    assert [t.probability for t in typical] == pytest.approx([50 / 95, 30 / 95, 15 / 95])
    tie = typical_pods([pod("x", 1000, 1, 300), pod("y", 2000, 1, 300)], coverage=0.5)
    assert tie[0].cpu_milli == 2000  # equal counts: larger key first


def test_fgd_fragmentation_and_score_by_hand() -> None:
    typical = [TypicalPod(4000, 500, 1, (), 0.5), TypicalPod(8000, 1000, 2, (), 0.3), TypicalPod(1000, 0, 0, (), 0.2)]
    frag = Fragmentation(typical, ["T4"])
    # node: GPUs left 1000, 300, 600; CPU 10000
    # m1 (0.5 GPU, 1 GPU, 4 cores): 2 GPUs >= 500, cpu ok -> stranded = 300
    # m2 (2 whole GPUs, 8 cores): only 1 whole GPU -> all idle = 1900
    # m3 CPU-only: idle = 1900
    expected = 0.5 * 300 + 0.3 * 1900 + 0.2 * 1900
    assert frag.amount(0, 10_000, (1000, 300, 600)) == pytest.approx(expected)
    # CPU below m1's 4 cores: m1 counts idle too
    assert frag.amount(0, 3000, (1000, 300, 600)) == pytest.approx(1900.0)
    # placing a 0.5-GPU, 2-core pod: GPU 0 -> (500,300,600): F = .5*300 + .5*1400 ;
    # GPU 2 -> (1000,300,100): F = .5*400 + .5*1400 ; GPU 1 (300) does not fit
    share = pod("p", 2000, 1, 500)
    after0 = 0.5 * 300 + 0.5 * 1400
    after2 = 0.5 * 400 + 0.5 * 1400
    best = max(int(100 / (1 + math.exp(-(expected - a) / 1000))) for a in (after0, after2))
    score, gpus = fgd_node_score(frag, (0, 10_000, (1000, 300, 600)), share)
    assert score == best
    assert gpus == [0]  # GPU 0 leaves less stranded


def test_best_fit_raw_and_normalisation_by_hand() -> None:
    p = pod("p", 8000, 1, 500)
    raw = best_fit_raw(np.array([64000, 128000]), np.array([1000, 8000]), p)
    # node 0: .5*(56000/128000) + .5*(500/8000) = .25 ; node 1: .5*(120000/128000) + .5*(7500/8000) = .9375
    assert raw.tolist() == [75, 6]
    assert normalize_scores(np.array([75, 6, 40])).tolist() == [100, 0, (40 - 6) * 100 // 69]
    assert normalize_scores(np.array([5, 5])).tolist() == [0, 0]


def small_cluster(seed: int) -> tuple[list[Node], list[Pod]]:
    rng = random.Random(seed)
    nodes = [Node(f"n{i:02d}", rng.choice([16000, 32000, 64000]), 131072, rng.choice([1, 2, 4, 8]),
                  rng.choice(["T4", "P100", "V100M32"])) for i in range(12)]
    pods = []
    for i in range(300):
        kind = rng.random()
        if kind < 0.15:
            pods.append(pod(f"p{i:03d}", rng.choice([1000, 4000]), 0, 0, mem=rng.choice([1024, 8192])))
        elif kind < 0.7:
            pods.append(pod(f"p{i:03d}", rng.choice([1000, 4000, 8000]), 1, rng.choice([100, 250, 500, 800]),
                            rng.choice([(), ("T4",), ("P100", "V100M32")]), mem=4096))
        else:
            pods.append(pod(f"p{i:03d}", rng.choice([2000, 8000]), rng.choice([1, 2, 4]), 1000, mem=8192))
    return nodes, pods


MODELS = ["P100", "T4", "V100M32"]
POLICIES: list[Callable[[list[TypicalPod]], Any]] = [
    lambda typ: RandomPolicy(3), lambda typ: BestFitPolicy(), lambda typ: FgdPolicy(Fragmentation(typ, MODELS)),
    lambda typ: DeepResPolicy(), lambda typ: FragAwarePolicy(typ),
]


@pytest.mark.parametrize("make", POLICIES)
def test_bookkeeping_every_pod_accounted_and_nothing_negative(make: Callable[[list[TypicalPod]], Any]) -> None:
    nodes, pods = small_cluster(11)
    order = list(range(len(nodes)))
    random.Random(2).shuffle(order)
    typical = typical_pods(pods)
    policy = make(typical)
    seen: list[NodeView] = []
    original = packing.NodeView.place

    def checked_place(self: NodeView, i: int, p: Pod, gpus: Sequence[int]) -> None:
        original(self, i, p, gpus)
        assert (self.cpu_left >= 0).all() and (self.mem_left >= 0).all()
        present = self.gpu_left[self.gpu_left >= 0]
        assert ((present >= 0) & (present <= 1000)).all()
        if not seen:
            seen.append(self)

    packing.NodeView.place = checked_place  # type: ignore[method-assign,assignment]
    try:
        res = run_packing(nodes, pods, order, policy)
    finally:
        packing.NodeView.place = original  # type: ignore[method-assign]
    assert len(res.placed) == len(pods)
    placed_milli = sum(p.total_gpu_milli for p, ok in zip(pods, res.placed, strict=True) if ok)
    assert res.allocated_milli[-1] == placed_milli
    assert res.arrived_milli[-1] == sum(p.total_gpu_milli for p in pods)
    assert (np.diff(res.arrived_milli) >= 0).all() and (res.allocated_milli <= res.arrived_milli).all()
    view = seen[0]
    used = sum(n.gpus for n in nodes) * 1000 - int(view.gpu_left[view.gpu_left >= 0].sum())
    assert used == placed_milli
    assert 0 < res.placed.sum() < len(pods)  # the small cluster fills up


def test_place_refuses_overcommit() -> None:
    nodes = [Node("a", 4000, 1024, 1, "T4")]
    view = NodeView(nodes, [0])
    view.place(0, pod("x", 1000, 1, 600), [0])
    with pytest.raises(ValueError):
        view.place(0, pod("y", 1000, 1, 600), [0])
    with pytest.raises(ValueError):
        view.place(0, pod("z", 8000, 0, 0), [])


needs_data = pytest.mark.skipif(not (DEFAULT_DATA / "openb_pod_list_default.csv").is_file(),
                                reason="../shared/data/openb not available")


@needs_data
def test_workload_tuning_reaches_the_target_from_both_sides() -> None:
    nodes = read_nodes(node_list_path(DEFAULT_DATA))
    capacity = sum(n.gpus for n in nodes) * 1000
    for trace in ("default", "multigpu50"):
        pods = read_pods(pod_list_path(DEFAULT_DATA, trace))
        w = build_workload(pods, len(nodes), 42, capacity)
        total = sum(p.total_gpu_milli for p in w.pods)
        assert total <= 1.3 * capacity
        assert total > 1.3 * capacity - 8000  # stops within one pod of the target
        assert sorted(w.node_order) == list(range(len(nodes)))
    again = build_workload(read_pods(pod_list_path(DEFAULT_DATA, "default")), len(nodes), 42, capacity)
    assert [p.name for p in again.pods] == [p.name for p in w.pods] or trace != "default"


@needs_data
def test_deepres_memoised_decisions_equal_live_calls_over_all_nodes() -> None:
    nodes = read_nodes(node_list_path(DEFAULT_DATA))
    pods = read_pods(pod_list_path(DEFAULT_DATA, "default"))
    w = build_workload(pods, len(nodes), 43, sum(n.gpus for n in nodes) * 1000)
    sample = w.pods[:2500:10]  # a sample of the arrival order (the cluster fills a little)
    fast, live = DeepResPolicy(), DeepResPolicy(memoise=False)
    view = NodeView(nodes, w.node_order)
    for p in sample:
        feasible = np.flatnonzero(view.feasible(p))
        a, b = fast.choose(view, p, feasible), live.choose(view, p, feasible)
        assert a == b, p.name
        if a is not None:
            view.place(a[0], p, a[1])


def test_fragaware_node_scores_match_the_drop_in_score_nodes() -> None:
    from extender.policy import DemandMix, DemandShape, PolicyParams, fragmentation, score_nodes_fragaware
    from extender.simulate.adapters import node_view, pod_request

    mix = DemandMix([DemandShape(8000.0, 1, 0.6, 4000.0), DemandShape(16000.0, 2, 0.4, 8000.0)])
    # node GPUs free 16000, 4800 (of 16000): shape 1 -> 1 GPU >= 8000 -> stranded 4800/16000 = .3
    # shape 2 needs 2 GPUs with 16000 free -> all free: 1 + .3
    assert fragmentation([16000.0, 4800.0], [16000.0, 16000.0], mix) == pytest.approx(0.6 * 0.3 + 0.4 * 1.3)
    assert fragmentation([16000.0, 4800.0], [16000.0, 16000.0], mix, cpu_left_milli=2000.0) == pytest.approx(1.3)
    nodes = {n: node_view(n, "T4", left) for n, left in (("a", (1000, 300)), ("b", (1000, 1000)), ("c", (100, 0)))}
    req = pod_request(pod("p", 1000, 1, 300), "T4")
    scores = dict(score_nodes_fragaware(req, ["a", "b", "c"], nodes, PolicyParams(), mix))
    assert scores["c"] == 0  # does not fit
    assert scores["a"] > scores["b"]  # filling the 300 hole strands nothing; splitting a whole GPU does


def test_scores_from_merits_gives_one_ten_in_the_stable_order() -> None:
    from extender.policy import scores_from_merits

    out = scores_from_merits([("a", 40), ("b", 57), ("c", 57), ("d", 0)])
    assert out == {"a": 9 * 40 // 100, "b": 10, "c": 9, "d": 0}
    assert scores_from_merits([]) == {}


def test_fragaware_simulator_picks_what_the_drop_in_scores_would_pick() -> None:
    from extender.policy import PolicyParams, score_nodes_fragaware
    from extender.simulate.adapters import node_view, pod_request

    nodes, pods = small_cluster(5)
    # one GPU model, so one request (one memory share) covers every candidate, as in the live extender
    nodes = sorted((Node(n.name, n.cpu_milli, n.memory_mib, n.gpus, "T4") for n in nodes), key=lambda n: n.name)
    models = {n.name: n.model for n in nodes}
    policy = FragAwarePolicy(typical_pods(pods))
    view = NodeView(nodes, list(range(len(nodes))))  # rank = name order, the drop-in's stable order
    checked = 0
    for p in pods:
        feasible = np.flatnonzero(view.feasible(p))
        if not len(feasible) or p.num_gpu == 0:
            continue
        choice = policy.choose(view, p, feasible)
        assert choice is not None
        names = [view.names[int(i)] for i in feasible]
        answers: dict[str, int] = {}
        for model in sorted({models[n] for n in names}):
            group = [n for n in names if models[n] == model]
            gviews = {n: node_view(n, model, view.state_keys[int(view.state_id[view.names.index(n)])][2])
                      for n in group}
            cpu = {n: float(view.cpu_left[view.names.index(n)]) for n in group}
            scored = score_nodes_fragaware(pod_request(p, model), group, gviews, PolicyParams(), policy.mix(model),
                                           cpu, float(p.cpu_milli))
            answers.update(dict(scored))
        assert view.names[choice[0]] == next(n for n in names if answers[n] == 10)
        checked += 1
        view.place(choice[0], p, choice[1])
    assert checked > 30  # every GPU pod the small cluster could take was compared
