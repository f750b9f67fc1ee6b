"""The filter at 5,000 nodes (issue 48, item 3): its per-name work is bounded (failures worded only
when read, each list looked up once, the GPU-model groups' rows taken from the list's), and its
answers are still the plain per-node rule's: `filtering.filter_nodes` name by name, `apply_sharing`
node by node, the groups a loop over the names would make. Randomised snapshots of 5,000 nodes:
GPU counts and sizes, occupancy, unhealthy GPUs, stale and missing reports, names kube-scheduler
knows that never reported, in a new order each time."""

from __future__ import annotations

import random
from itertools import chain

import numpy as np

from extender.ledger import Ledger
from extender.policy.columnar import NodeMatrix, filter_matrix, sharing_matrix
from extender.policy.filtering import MEMORY, NO_REPORT, PASSED, STALE, TOO_FEW_GPUS, TOO_LARGE, filter_nodes
from extender.policy.sharing import apply_sharing
from extender.policy.types import FilterResult, GpuView, NodeView, PodRequest, PolicyParams
from extender.server.gpu_demand import ModelDemands, merged
from extender.telemetry import GpuReport, NodeReport

P = PolicyParams()
NOW = 1_000_000.0
GIB = 1024.0
NODES = 5_000


def random_cluster(rng: random.Random, count: int) -> dict[str, NodeView]:
    nodes = {}
    for i in range(count):
        name = f"node-{i:05d}"
        size = rng.choice((16, 40, 80)) * GIB
        gpus = []
        for k in range(rng.choice((1, 2, 4, 8))):
            used = rng.choice((0.0, 0.0, 0.0, 0.3, 0.7, 1.0)) * size
            reserved = rng.choice((0.0, used, min(size, used + 8 * GIB)))
            duties = (rng.choice((0.1, 0.5, 1.0)),) if used else ()
            gpus.append(GpuView(f"{name}-g{k}", k, size, used, reserved, rng.random(), healthy=rng.random() > 0.03,
                                duties=duties))
        age = rng.choice((0.0, 0.0, 0.0, 5.0, 10 * P.telemetry_ttl_s))  # some reports stale
        nodes[name] = NodeView(name, tuple(gpus), NOW - age)
    return nodes


def offered(rng: random.Random, nodes: dict[str, NodeView]) -> list[str]:
    """Every node's name and a few that never reported, in no fixed order (kube-scheduler's filters)."""
    names = [*nodes, *(f"unreported-{i}" for i in range(len(nodes) // 100))]
    rng.shuffle(names)
    return names


def random_pod(rng: random.Random, k: int) -> PodRequest:
    need = rng.choice((1.0, 8.0, 20.0, 38.0, 60.0, 79.0, 100.0)) * GIB
    return PodRequest(f"p{k}", "ns", f"p{k}", rng.choice((1, 1, 2, 4, 8, 9)), need, need * rng.choice((0.5, 0.9)),
                      10.0, fallback=rng.random() < 0.5, whole_gpu=rng.random() < 0.2,
                      duty=rng.choice((0.1, 0.5, 1.0)), predicted_run_s=rng.choice((0.0, 600.0, 7200.0)))


def test_the_filter_at_5000_nodes_answers_as_the_per_node_rule() -> None:
    """Passed names in the input order, every failure with the per-node rule's words (read from the
    answer: they are worded when read) and the same counts per kind."""
    rng = random.Random(48)
    seen: set[str] = set()
    for trial in range(3):
        nodes = random_cluster(rng, NODES)
        matrix = NodeMatrix()
        for view in nodes.values():
            matrix.put(view)
        for k in range(8):
            names = offered(rng, nodes)
            request = random_pod(rng, k)
            got = filter_matrix(request, names, matrix, nodes, NOW, P)
            expected = filter_nodes(request, names, nodes, NOW, P)
            assert got.passed == expected.passed, (trial, k)
            assert got.kinds == expected.kinds, (trial, k)
            assert list(got.failed) == list(expected.failed) and dict(got.failed) == expected.failed, (trial, k)
            assert list(got.unresolvable) == list(expected.unresolvable), (trial, k)
            assert dict(got.unresolvable) == expected.unresolvable, (trial, k)
            assert got.request == expected.request, (trial, k)
            seen.update(expected.kinds)
    assert {PASSED, NO_REPORT, STALE, TOO_FEW_GPUS, TOO_LARGE, MEMORY} <= seen  # every branch was exercised


def test_the_sharing_pass_at_5000_nodes_answers_as_the_per_node_rule() -> None:
    rng = random.Random(4800)
    nodes = random_cluster(rng, NODES)
    matrix = NodeMatrix()
    for view in nodes.values():
        matrix.put(view)
    dropped = 0
    for k in range(8):
        request = random_pod(rng, k)
        memory_only = filter_matrix(request, offered(rng, nodes), matrix, nodes, NOW, P)
        wait = rng.choice((0.0, 300.0, 1e5))
        got = sharing_matrix(request, memory_only, matrix, nodes, P, wait)
        expected = apply_sharing(request, memory_only, nodes, P, wait)
        assert (got.passed, dict(got.failed), dict(got.unresolvable), got.kinds) == (
            expected.passed, dict(expected.failed), dict(expected.unresolvable), expected.kinds), k
        dropped += len(got.passed) < len(memory_only.passed)
    assert dropped  # the rule dropped busy nodes in some trial: the per-node pass was exercised


def _ledger(rng: random.Random, count: int) -> Ledger:
    """A ledger that heard `count` nodes of two GPU models (and nodes that reported no GPU)."""
    ledger = Ledger(P)
    models = (("NVIDIA A100-SXM4-80GB", 80 * GIB), ("NVIDIA A100-SXM4-40GB", 40 * GIB), ("Tesla T4", 15 * GIB))
    for i in range(count):
        model, size = rng.choice(models)
        gpus = () if rng.random() < 0.01 else tuple(
            GpuReport(f"n{i}-g{k}", k, model, size, rng.choice((0.0, 0.5)) * size) for k in range(4))
        ledger.apply_report(NodeReport(f"node-{i:05d}", 1, NOW, "0", "nvml", gpus, boot_id="b"), NOW)
    return ledger


def test_the_gpu_model_groups_at_5000_nodes_are_a_loop_over_the_names() -> None:
    """The groups by GPU model, in the input order, as a loop over the names makes them; the rows each
    group's filter reads are its names' own; the merged answer passes, in the input order, the names
    that some group's filter passed, with every group's failures."""
    rng = random.Random(480)
    ledger = _ledger(rng, NODES)
    matrix = ledger.matrix
    names = [f"node-{i:05d}" for i in range(NODES)] + ["node-00007", "unreported"]  # a repeat, a stranger
    rng.shuffle(names)
    key_of, in_use = ledger.model_keys()
    groups = ModelDemands(ledger, P)._grouped(tuple(names), key_of, in_use)
    expected: dict[object, list[str]] = {}
    for name in dict.fromkeys(names):
        expected.setdefault(key_of.get(name), []).append(name)
    assert {key: list(members) for key, members in groups.items()} == expected
    assert len(groups) == 4  # three GPU models and the names without one
    for members in groups.values():
        assert matrix.lookup(members).rows.tolist() == [matrix.index.get(n, -1) for n in members]
    # a node changes GPU model, one joins and one leaves: the groups follow (no stale index of the rows)
    demands = ModelDemands(ledger, P)
    for change in range(3):
        name = f"node-{rng.randrange(NODES):05d}"
        if change == 0:
            gpus = (GpuReport(f"{name}-new", 0, "Tesla T4", 15 * GIB, 0.0),)
            ledger.apply_report(NodeReport(name, 2, NOW, "0", "nvml", gpus, boot_id="b"), NOW)
        elif change == 1:
            gpus = (GpuReport("joined-g0", 0, "NVIDIA A100-SXM4-80GB", 80 * GIB, 0.0),)
            ledger.apply_report(NodeReport("joined", 1, NOW, "0", "nvml", gpus, boot_id="b"), NOW)
            names.append("joined")
        else:
            ledger.forget_node(name)
            names.remove(name)
        key_of, in_use = ledger.model_keys()
        regrouped = demands._grouped(tuple(names), key_of, in_use)
        expected = {}
        for member in dict.fromkeys(names):
            expected.setdefault(key_of.get(member), []).append(member)
        assert {key: list(members) for key, members in regrouped.items()} == expected, change
        again = names[::-1]  # its index made: another order of the same names, the same groups in that order
        expected = {}
        for member in dict.fromkeys(again):
            expected.setdefault(key_of.get(member), []).append(member)
        assert {key: list(members) for key, members in demands._grouped(tuple(again), key_of, in_use).items()} \
            == expected, change
    groups = demands._grouped(tuple(names), *ledger.model_keys())
    request = PodRequest("p", "ns", "p", 1, 30 * GIB, 30 * GIB, 10.0)
    results = [filter_matrix(request, members, matrix, ledger.views, NOW, P) for members in groups.values()]
    answer = merged(results, tuple(names), matrix)
    assert answer.passed == tuple(n for n in dict.fromkeys(names) if any(n in r.passed for r in results))
    assert 0 < len(answer.passed) < NODES
    assert dict(answer.failed) == dict(chain.from_iterable(r.failed.items() for r in results))
    assert dict(answer.unresolvable) == dict(chain.from_iterable(r.unresolvable.items() for r in results))
    assert matrix.lookup(answer.passed).rows.tolist() == [matrix.index[n] for n in answer.passed]
    reference = filter_nodes(request, names, ledger.views, NOW, P)
    assert isinstance(reference, FilterResult) and answer.passed == reference.passed
    assert dict(answer.failed) == reference.failed and dict(answer.unresolvable) == reference.unresolvable


def _plain_merge(results: list[FilterResult], names: list[str]) -> tuple[tuple[str, ...], dict[str, str], object]:
    """What the groups' answers say as one, name by name: a node that passed only as a whole GPU fails
    when another group's nodes pass plainly; else the whole-GPU request is the answer's."""
    plain = any(r.passed and r.request is None for r in results)
    passed: set[str] = set()
    failed: dict[str, str] = {}
    for r in results:
        failed.update(r.failed)
        for name in r.passed:
            if plain and r.request is not None:
                failed[name] = "fits only as a whole GPU, and other nodes fit the pod"
            else:
                passed.add(name)
    fallback = next((r.request for r in results if r.passed and r.request is not None), None)
    return tuple(n for n in dict.fromkeys(names) if n in passed), failed, None if plain else fallback


def test_merging_the_groups_answers_at_5000_nodes_keeps_the_whole_gpu_fallback_rule() -> None:
    """Two groups of nodes, 80 GB and 16 GB GPUs, and a pod whose bound fits the first only: on the
    second it passes as a whole GPU (the fallback), which loses to the first group's plain passes;
    when the first group is full, the fallback's nodes and request are the answer."""
    rng = random.Random(4848)
    big = {f"big-{i:05d}": NodeView(f"big-{i:05d}", tuple(GpuView(f"big-{i}-g{k}", k, 80 * GIB,
                                                                  rng.choice((0.0, 75.0)) * GIB) for k in range(2)),
                                    NOW) for i in range(NODES // 2)}
    small = {f"small-{i:05d}": NodeView(f"small-{i:05d}", tuple(GpuView(f"small-{i}-g{k}", k, 16 * GIB,
                                                                        rng.choice((0.0, 8.0)) * GIB)
                                                                for k in range(2)), NOW) for i in range(NODES // 2)}
    for full_big in (False, True):
        if full_big:
            big = {n: NodeView(n, tuple(GpuView(g.uuid, g.index, g.capacity_mib, 75 * GIB) for g in v.gpus), NOW)
                   for n, v in big.items()}
        nodes = {**big, **small}
        matrix = NodeMatrix()
        for view in nodes.values():
            matrix.put(view)
        names = offered(rng, nodes)
        groups = (tuple(n for n in names if n in big), tuple(n for n in names if n in small))
        on_big = PodRequest("p", "ns", "p", 1, 30 * GIB, 12 * GIB, 10.0, fallback=True)
        on_small = PodRequest("p", "ns", "p", 1, 20 * GIB, 12 * GIB, 10.0, fallback=True)  # bound > 16 GB
        results = [filter_matrix(on_big, groups[0], matrix, nodes, NOW, P),
                   filter_matrix(on_small, groups[1], matrix, nodes, NOW, P)]
        assert (results[1].request is not None) and results[1].passed  # the fallback held on the small nodes
        assert bool(results[0].passed) is not full_big
        expected_passed, expected_failed, expected_request = _plain_merge(results, names)
        for answer in (merged(results, tuple(names), matrix), merged(results, tuple(names))):
            assert answer.passed == expected_passed
            assert dict(answer.failed) == expected_failed
            assert answer.request == expected_request
            assert answer.kinds == {k: results[0].kinds.get(k, 0) + results[1].kinds.get(k, 0)
                                    for k in {*results[0].kinds, *results[1].kinds}}


class _Counted(dict[str, int]):
    """The matrix's index of names, counting the names looked up in it."""

    read = 0

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        _Counted.read += 1
        return super().get(key, default)


def test_without_the_shortlist_the_prioritize_reads_the_rows_the_filter_answered_with() -> None:
    """The filter's steps pass their lists along by identity (no hash of thousands of names); the list it
    answers with is remembered by its names for the prioritize, which kube-scheduler sends in a request
    of its own: through the app, the prioritize of an answer the sharing pass cut looks no name up."""
    from extender.server.app import extender_of
    from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod
    from tests.unit.test_app import make, send_report

    client, _, clock = make(filter_shortlist=0, sharing=True)
    names = [f"node-{i:03d}" for i in range(300)]
    for name in names:
        send_report(client, name, 1, [(40960.0, 0.0)], clock)
    random.Random(7).shuffle(names)
    for i in range(10):  # ten nodes' one GPU taken by a GPU-bound job: with empty GPUs about, none is joined
        body = pod(f"first-{i}", CNN_ANNOTATIONS)
        assert client.post("/filter", json=extender_args(body, names)).get_json()["Error"] == ""
        assert client.post("/bind", json=binding_args(body, names[i])).get_json()["Error"] == ""
    body = pod("next", CNN_ANNOTATIONS)
    answer = client.post("/filter", json=extender_args(body, names)).get_json()
    passed = answer["NodeNames"]
    assert answer["Error"] == "" and passed == names[10:]  # the sharing pass left the busy nodes out
    matrix = extender_of(client.application).ledger.matrix
    index, matrix.index = matrix.index, _Counted(matrix.index)
    _Counted.read = 0
    try:
        scores = client.post("/prioritize", json=extender_args(body, list(passed))).get_json()
    finally:
        matrix.index = index
    assert [entry["Host"] for entry in scores] == passed
    assert _Counted.read <= 2  # the node the prioritize assumes the pod on is written (its row), no name read


def test_the_shortlist_of_5000_scores_is_the_best_by_score_then_position() -> None:
    """The shortlist without a sort of every node: the `keep` best by score, ties to the earlier
    position, in input order, as ranking every (score, position) pair says."""
    from extender.policy.placement import shortlist

    rng = random.Random(480048)
    for trial in range(200):
        size = rng.choice((2, 7, 100, NODES))
        scores = [rng.choice((0, 1, 5, 9, 10)) if trial % 2 else rng.randrange(11) for _ in range(size)]
        keep = rng.choice((1, 2, 3, 20, size - 1, size, size + 5))
        ranked = sorted(range(size), key=lambda i: (-scores[i], i))
        expected = sorted(ranked[:keep]) if 0 < keep < size else list(range(size))
        assert shortlist(scores, keep).tolist() == expected, (trial, size, keep)


def test_a_list_remembered_by_identity_and_forgotten_is_looked_up_again() -> None:
    """Lists a verb passes between its steps are found as the same object; once more recent lists have
    pushed one out, or a node joined since, its rows are read again from the names, never stale."""
    from extender.policy.columnar import Lookup

    rng = random.Random(4)
    nodes = random_cluster(rng, 200)
    matrix = NodeMatrix()
    for view in nodes.values():
        matrix.put(view)
    lists = [tuple(rng.sample(sorted(nodes), 50)) for _ in range(100)]
    for names in lists:  # rows deliberately wrong: what a stale memory would answer
        matrix.remember(names, Lookup(list(names), np.full(len(names), 0, dtype=np.int64), matrix.lookup(()).layout),
                        by_identity=True)
    assert matrix.lookup(lists[-1]).rows.tolist() == [0] * 50  # the latest: found as itself
    assert matrix.lookup(lists[0]).rows.tolist() == [matrix.index[n] for n in lists[0]]  # pushed out: read again
    matrix.put(NodeView("newcomer", (GpuView("newcomer-g0", 0, 80 * GIB),), NOW))
    assert matrix.lookup(lists[-1]).rows.tolist() == [matrix.index[n] for n in lists[-1]]  # the rows moved on


def test_the_filters_wait_for_an_empty_gpu_is_over_the_nodes_it_was_offered() -> None:
    """The sharing rule's W (the wait for an empty GPU) over the pod's nodes: the same whether the list
    names every node (read from the ledger's own nodes) or a few (read from the list)."""
    from extender.protocol import parse_pod
    from extender.server.app import extender_of
    from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, binding_args, extender_args, pod
    from tests.unit.test_app import make, send_report

    client, _, clock = make(filter_shortlist=0, sharing=True)
    names = [f"node-{i}" for i in range(6)]
    for name in names:
        send_report(client, name, 1, [(81920.0, 0.0)], clock)
    for i, name in enumerate(names):  # each node's GPU taken, one after the other: they empty in turn
        body = pod(f"first-{i}", CNN_ANNOTATIONS)
        assert client.post("/filter", json=extender_args(body, [name])).get_json()["Error"] == ""
        assert client.post("/bind", json=binding_args(body, name)).get_json()["Error"] == ""
        clock.now += 20.0
        for other in names:
            send_report(client, other, i + 2, [(81920.0, 0.0)], clock)
    ext = extender_of(client.application)
    waits = {}
    for k, offered_names in enumerate((names[::-1], names[:3], names[::2])):
        body = pod(f"next-{k}", CNN_ANNOTATIONS)
        answer = client.post("/filter", json=extender_args(body, offered_names)).get_json()
        assert answer["Error"] == ""
        uid = body["metadata"]["uid"]
        kept = ext.planner.wait_of(uid, ext.mono())
        assert kept is not None
        plan = ext.planner.filter_plan(parse_pod(body), clock.now)
        assert plan is not None
        need = plan.request.admission_mib
        expected = ext.ledger.wait_for_empty_s(1, ext.mono(), list(offered_names), need)
        assert kept == expected, k
        waits[k] = kept
    assert waits[0] < waits[1]  # overdue jobs: the one bound last is expected to end first, and it is not
    # among the first three
