"""ClusterState: telemetry with receipt time, sequence numbers, the ledger and its no-over-commit rule."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.policy import PodRequest, PolicyParams, PriorityInputs, Reservation
from extender.state import ACCEPTED, OLD_SEQUENCE, ClusterState
from extender.telemetry import GpuReport, NodeReport, PodUsage

P = PolicyParams(usage_warmup_s=60.0)
NOW = 5_000.0


def report(node: str = "n1", seq: int = 1, used: tuple[float, ...] = (0.0, 0.0), ts: float = 100.0,
           pods: tuple[PodUsage, ...] = ()) -> NodeReport:
    gpus = tuple(GpuReport(f"{node}-u{i}", i, "A100", 40_000.0, u) for i, u in enumerate(used))
    return NodeReport(node, seq, ts, "0.1", "simulated", gpus, pods)


def request(uid: str, need: float, gpus: int = 1) -> PodRequest:
    return PodRequest(uid, "ns", uid, gpus, need, need, 10.0)


def builder(req: PodRequest, node: str, now_s: float):  # type: ignore[no-untyped-def]
    def build(uuids: tuple[str, ...]) -> Reservation:
        return Reservation(req.uid, req.namespace, req.name, node, uuids, req.admission_mib, req.admission_mib,
                           req.predicted_mib, PriorityInputs(), now_s, signature="sig")
    return build


def test_old_sequence_ignored_but_restarted_agent_accepted() -> None:
    state = ClusterState(P)
    assert state.apply_report(report(seq=5, ts=100.0), NOW) == ACCEPTED
    assert state.apply_report(report(seq=4, ts=90.0), NOW) == OLD_SEQUENCE
    assert state.apply_report(report(seq=5, ts=100.0), NOW) == OLD_SEQUENCE
    assert state.apply_report(report(seq=0, ts=200.0), NOW + 1) == ACCEPTED  # agent restarted
    view = state.node_view("n1")
    assert view is not None and view.received_s == NOW + 1


def test_effective_free_is_capacity_minus_max_of_used_and_reserved() -> None:
    state = ClusterState(P)
    state.apply_report(report(used=(30_000.0, 0.0)), NOW)
    res = state.reserve_on(request("a", 5_000.0), "n1", builder(request("a", 5_000.0), "n1", NOW), NOW)
    assert isinstance(res, Reservation)
    view = state.node_view("n1")
    assert view is not None
    frees = {g.uuid: g.free_mib for g in view.gpus}
    # best fit: the partly used GPU (10,000 free) takes it; used 30,000 > reserved 5,000
    assert res.gpu_uuids == ("n1-u0",) and frees["n1-u0"] == 10_000.0
    state.release("a")
    assert state.reserved_mib("n1-u0") == 0.0


def test_reserve_refuses_stale_and_unknown_nodes_and_counts_refusals() -> None:
    state = ClusterState(P)
    state.apply_report(report(), NOW)
    req = request("a", 1_000.0)
    assert state.reserve_on(req, "nx", builder(req, "nx", NOW), NOW) == "no agent report"
    assert state.reserve_on(req, "n1", builder(req, "n1", NOW), NOW + 100) == "telemetry stale (100s old)"
    assert state.overcommits_refused == 2


def test_retried_bind_is_idempotent_and_other_node_refused() -> None:
    state = ClusterState(P)
    state.apply_report(report("n1"), NOW)
    state.apply_report(report("n2"), NOW)
    req = request("a", 1_000.0)
    first = state.reserve_on(req, "n1", builder(req, "n1", NOW), NOW)
    assert state.reserve_on(req, "n1", builder(req, "n1", NOW), NOW) is first
    assert state.reserve_on(req, "n2", builder(req, "n2", NOW), NOW) == "pod ns/a already holds GPUs on n1"


def test_usage_rule_moves_reservation_and_records_signature_peak() -> None:
    state = ClusterState(P)
    state.apply_report(report(seq=1), NOW)
    req = request("a", 20_000.0)
    res = state.reserve_on(req, "n1", builder(req, "n1", NOW), NOW)
    assert isinstance(res, Reservation)
    usage = PodUsage("a", 8_000.0, 9_000.0, res.gpu_uuids)
    state.apply_report(report(seq=2, pods=(usage,)), NOW + 10)  # warm-up: unchanged
    assert state.reserved_mib(res.gpu_uuids[0]) == 20_000.0
    state.apply_report(report(seq=3, pods=(usage,)), NOW + 100)
    assert state.reserved_mib(res.gpu_uuids[0]) == 9_000.0 * P.usage_margin
    correction = state.correction("sig")
    assert correction is not None and correction.peak_mib == 9_000.0
    state.release("a")
    assert state.reserved_mib(res.gpu_uuids[0]) == 0.0


def test_restore_rebuilds_without_double_allocation() -> None:
    state = ClusterState(P)
    state.apply_report(report(used=(0.0,)), NOW)
    res = Reservation("a", "ns", "a", "n1", ("n1-u0",), 30_000.0, 30_000.0, 30_000.0, PriorityInputs(), NOW)
    assert state.restore(res) and not state.restore(res)
    req = request("b", 20_000.0)
    assert isinstance(state.reserve_on(req, "n1", builder(req, "n1", NOW), NOW), str)


def test_threads_racing_for_one_gpu_place_exactly_as_many_as_fit() -> None:
    state = ClusterState(P)
    state.apply_report(report(used=(0.0,)), NOW)
    results: list[object] = []
    barrier = threading.Barrier(32)

    def bind(i: int) -> None:
        req = request(f"p{i}", 3_000.0)
        barrier.wait()
        results.append(state.reserve_on(req, "n1", builder(req, "n1", NOW), NOW))

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Reservation) for r in results) == 40_000 // 3_000
    assert state.reserved_mib("n1-u0") <= 40_000.0


op_st = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 9), st.sampled_from(["n1", "n2"]), st.floats(100, 30_000),
              st.integers(1, 2)),
    st.tuples(st.just("release"), st.integers(0, 9)),
    st.tuples(st.just("telemetry"), st.sampled_from(["n1", "n2"]), st.floats(0, 40_000), st.floats(0, 40_000)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op_st, max_size=40))
def test_no_sequence_of_binds_releases_and_telemetry_overcommits(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    state = ClusterState(PolicyParams(usage_warmup_s=1e9))
    seq = 0
    for name in ("n1", "n2"):
        seq += 1
        state.apply_report(report(name, seq, (0.0, 0.0), ts=float(seq)), NOW)
    for op in ops:
        if op[0] == "bind":
            _, i, name, need, gpus = op
            view = state.node_view(name)
            assert view is not None
            before = {g.uuid: g.free_mib for g in view.gpus}
            req = request(f"p{i}", need, gpus)
            held = state.reservation(req.uid)
            res = state.reserve_on(req, name, builder(req, name, NOW), NOW)
            if isinstance(res, Reservation) and held is None:  # a new admission: every GPU had room
                assert len(res.gpu_uuids) == gpus
                assert all(before[u] >= need for u in res.gpu_uuids)
            elif held is not None:  # a retried bind changes nothing
                assert state.reservation(req.uid) is held
        elif op[0] == "release":
            state.release(f"p{op[1]}")
        else:
            _, name, u0, u1 = op
            seq += 1
            state.apply_report(report(name, seq, (u0, u1), ts=float(seq)), NOW)
        for res in state.reservations():
            for uuid in res.gpu_uuids:
                assert state.reserved_mib(uuid) <= 40_000.0 + 1e-6
