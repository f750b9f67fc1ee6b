"""The ledger: telemetry with receipt time, ordering per agent boot, reservations keyed by (node, GPU),
the no-over-commit rule, peaks only when real, GPUs tied to their node, foreign memory."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import ledger as ledger_module
from extender.ledger import ACCEPTED, OLD_SEQUENCE, TOO_MANY_NODES, UNKNOWN_NODE, Reserved
from extender.ledger import Ledger as ClusterState
from extender.policy import PodRequest, PolicyParams, PriorityInputs, Reservation
from extender.telemetry import GpuReport, NodeReport, PodUsage, ProcessReport

# memory accounting: the sharing rule (compute) is off here; test_sharing and test_duty cover it
P = PolicyParams(usage_warmup_s=60.0, sharing=False)
NOW = 5_000.0


def report(node: str = "n1", seq: int = 1, used: tuple[float, ...] = (0.0, 0.0), ts: float = 100.0,
           pods: tuple[PodUsage, ...] = (), boot: str = "b1", uuids: tuple[str, ...] | None = None,
           processes: tuple[tuple[ProcessReport, ...], ...] | None = None) -> NodeReport:
    names = uuids or tuple(f"{node}-u{i}" for i in range(len(used)))
    procs = processes or tuple(() for _ in used)
    gpus = tuple(GpuReport(names[i], i, "A100", 40_000.0, u, processes=procs[i]) for i, u in enumerate(used))
    return NodeReport(node, seq, ts, "0.1", "simulated", gpus, pods, boot_id=boot)


def reserved(state: ClusterState, req: PodRequest, node: str, now: float = NOW) -> Reservation:
    out = state.reserve_on(req, template(req, node, now), now)
    assert isinstance(out, Reserved), out
    return out.reservation


def request(uid: str, need: float, gpus: int = 1) -> PodRequest:
    return PodRequest(uid, "ns", uid, gpus, need, need, 10.0)


def template(req: PodRequest, node: str, now_s: float) -> Reservation:
    return Reservation(req.uid, req.namespace, req.name, node, (), req.admission_mib, req.admission_mib,
                       req.predicted_mib, PriorityInputs(), now_s, signature="sig")


def test_old_sequence_ignored_but_restarted_agent_accepted() -> None:
    state = ClusterState(P)
    assert state.apply_report(report(seq=5, ts=100.0), NOW) == ACCEPTED
    assert state.apply_report(report(seq=4, ts=90.0), NOW) == OLD_SEQUENCE
    assert state.apply_report(report(seq=5, ts=100.0), NOW) == OLD_SEQUENCE
    assert state.apply_report(report(seq=0, ts=200.0, boot="b2"), NOW + 1) == ACCEPTED  # agent restarted
    view = state.node_view("n1")
    assert view is not None and view.received_s == NOW + 1


def test_ordering_is_by_sequence_within_a_boot_never_by_the_agents_clock() -> None:
    state = ClusterState(P)
    # the agent's clock ran an hour fast, then it restarted with the right time: a new boot is accepted
    assert state.apply_report(report(seq=10, ts=100_000.0 + 3600, boot="fast"), NOW) == ACCEPTED
    assert state.apply_report(report(seq=1, ts=100_000.0, boot="fixed"), NOW + 1) == ACCEPTED
    assert state.apply_report(report(seq=2, ts=1.0, boot="fixed"), NOW + 2) == ACCEPTED  # clock stepped back
    assert state.apply_report(report(seq=11, ts=1e9, boot="fast"), NOW + 3) == OLD_SEQUENCE  # an earlier boot
    # no boot id (older agents): a lower sequence is taken only once the last report is stale
    assert state.apply_report(report(seq=0, boot=""), NOW + 4) == OLD_SEQUENCE
    assert state.apply_report(report(seq=0, boot=""), NOW + 3 + P.telemetry_ttl_s + 1) == ACCEPTED


def test_an_unchanged_report_refreshes_the_node_and_keeps_what_it_knew() -> None:
    """An idle node's heartbeat (the same GPUs and readings) keeps the node fresh, keeps its
    reservations and foreign memory in the view, and leaves its matrix row's version (the merits
    memo's key) alone; ordering still applies, and a changed reading rebuilds."""
    state = ClusterState(P)
    foreign = (ProcessReport(7, 9_000.0),)  # a process deepres did not place
    assert state.apply_report(report(seq=1, used=(9_000.0, 0.0), processes=(foreign, ())), NOW) == ACCEPTED
    reserved(state, request("p1", 25_000.0), "n1")
    before = state.node_view("n1")
    assert before is not None and sum(g.reserved_mib for g in before.gpus) == 25_000.0
    row = state.matrix.index["n1"]
    version = int(state.matrix.arrays.version[row])
    later = NOW + P.telemetry_ttl_s - 1
    assert state.apply_report(report(seq=2, used=(9_000.0, 0.0), processes=(foreign, ())), later) == ACCEPTED
    assert state.apply_report(report(seq=2, used=(9_000.0, 0.0), processes=(foreign, ())), later) == OLD_SEQUENCE
    view = state.node_view("n1")
    assert view is not None and view.received_s == later and state.matrix.arrays.received[row] == later
    assert int(state.matrix.arrays.version[row]) == version
    assert view.gpus == before.gpus and view.gpus[0].foreign_mib == 9_000.0
    fresh = later + P.telemetry_ttl_s - 1  # stale for the first report, fresh for the heartbeat
    most = max(g.free_mib for g in view.gpus)
    too_much = request("p2", most + 1.0)
    assert isinstance(state.reserve_on(too_much, template(too_much, "n1", fresh), fresh), str)  # no over-commit
    fits = request("p3", most)
    assert isinstance(state.reserve_on(fits, template(fits, "n1", fresh), fresh), Reserved)
    version = int(state.matrix.arrays.version[row])
    assert state.apply_report(report(seq=3, used=(9_000.0, 5_000.0), processes=(foreign, ())), fresh) == ACCEPTED
    assert int(state.matrix.arrays.version[row]) > version
    changed = state.node_view("n1")
    assert changed is not None and [g.used_mib for g in changed.gpus] == [9_000.0, 5_000.0]


def test_reports_of_nodes_outside_the_cluster_are_refused_once_the_node_list_is_known() -> None:
    state = ClusterState(P)
    assert state.apply_report(report("phantom"), NOW) == ACCEPTED  # no node list yet (local mode)
    assert state.set_known_nodes(["n1"]) == ["phantom"] and state.node_view("phantom") is None
    assert state.apply_report(report("phantom", seq=2), NOW) == UNKNOWN_NODE
    state.node_added("phantom")
    assert state.apply_report(report("phantom", seq=3), NOW) == ACCEPTED


def test_invented_nodes_cannot_grow_the_ledger_without_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_module, "NODES_MAX", 3)
    state = ClusterState(P)
    assert [state.apply_report(report(f"n{i}"), NOW + i) for i in range(3)] == [ACCEPTED] * 3
    assert state.apply_report(report("n0", seq=2), NOW + 3) == ACCEPTED  # n0 reported again: n1 is silent longest
    # local mode (no node list): a new node makes room by forgetting the node silent longest
    assert state.apply_report(report("n3"), NOW + 4) == ACCEPTED
    assert sorted(state.views) == ["n0", "n2", "n3"] and state.nodes_dropped == 1
    assert state.expire_nodes(NOW + 100, 50) == ["n2", "n0", "n3"]
    # in a cluster the node list bounds the nodes: at the cap a report is refused, nothing is forgotten
    cluster = ClusterState(P)
    cluster.set_known_nodes([f"k{i}" for i in range(4)])
    assert [cluster.apply_report(report(f"k{i}"), NOW) for i in range(4)] == [ACCEPTED] * 3 + [TOO_MANY_NODES]


def test_a_gpu_uuid_belongs_to_its_node() -> None:
    state = ClusterState(P)
    state.apply_report(report("b", used=(0.0,)), NOW)
    res = reserved(state, request("pb", 30_000.0), "b")
    # node a's agent reports b's GPU as its own: that GPU is ignored, b's reservation stays on b
    state.apply_report(report("a", used=(0.0, 0.0), uuids=("a-u0", "b-u0")), NOW)
    view_a, view_b = state.node_view("a"), state.node_view("b")
    assert view_a is not None and [g.uuid for g in view_a.gpus] == ["a-u0"]
    assert view_b is not None and view_b.gpus[0].reserved_mib == 30_000.0
    assert state.gpus_refused == 1 and state.reservation("pb") == res
    assert state.reserved_mib("a", "b-u0") == 0.0


def test_foreign_memory_is_not_free() -> None:
    """used 9 GiB by a process of no deepres pod + 10 GiB reserved for a pod that has not allocated
    yet: 19 GiB occupied, where max(used, reserved) said 10."""
    state = ClusterState(P)
    state.apply_report(report(used=(0.0,)), NOW)
    res = reserved(state, request("p", 10_000.0), "n1")
    foreign = (ProcessReport(4242, 9_000.0, ""),)
    state.apply_report(report(seq=2, used=(9_000.0,), processes=(foreign,)), NOW)
    view = state.node_view("n1")
    assert view is not None and view.gpus[0].free_mib == 40_000.0 - 19_000.0
    # the deepres pod's own process is not foreign: used 9 GiB (its own) + reserved 10 GiB -> 10 GiB occupied
    own = (ProcessReport(77, 9_000.0, res.pod_uid),)
    state.apply_report(report(seq=3, used=(9_000.0,), processes=(own,)), NOW)
    view = state.node_view("n1")
    assert view is not None and view.gpus[0].free_mib == 30_000.0


def test_peaks_only_when_real_bounded_and_agreed_by_several_nodes() -> None:
    params = PolicyParams(usage_warmup_s=60.0)
    state = ClusterState(params)
    for node in ("n1", "n2"):
        state.apply_report(report(node, used=(0.0,)), NOW)
    res = reserved(state, request("a", 20_000.0), "n1")
    zero = PodUsage("a", 0.0, 0.0, res.gpu_uuids)  # NVML without per-process memory
    state.apply_report(report(seq=2, used=(0.0,), pods=(zero,)), NOW + 100)
    assert state.reserved_mib("n1", res.gpu_uuids[0]) == 20_000.0 and state.correction("sig") is None
    huge = PodUsage("a", 1e12, 1e12, res.gpu_uuids)
    state.apply_report(report(seq=3, used=(0.0,), pods=(huge,)), NOW + 100)
    assert state.reserved_mib("n1", res.gpu_uuids[0]) == 40_000.0 * params.usage_margin  # bounded by the GPU
    assert state.correction("sig") is None  # recorded once the pod has shown its peak
    for seq, t in ((4, 250.0), (5, 400.0)):
        state.apply_report(report(seq=seq, used=(0.0,), pods=(huge,)), NOW + t)
    correction = state.correction("sig")
    assert correction is not None and correction.peak_mib == 40_000.0 and correction.nodes == 1


def test_effective_free_is_capacity_minus_max_of_used_and_reserved() -> None:
    state = ClusterState(P)
    state.apply_report(report(used=(30_000.0, 0.0)), NOW)
    res = reserved(state, request("a", 5_000.0), "n1")
    view = state.node_view("n1")
    assert view is not None
    frees = {g.uuid: g.free_mib for g in view.gpus}
    # best fit: the partly used GPU (10,000 free) takes it. The report lists no processes, so the
    # fresh reservation cannot be inside the 30,000 used: 35,000 occupied until it has settled
    assert res.gpu_uuids == ("n1-u0",) and frees["n1-u0"] == 5_000.0
    # a later report, past the warm-up: used 30,000 > reserved 5,000, the reservation may be inside it
    state.apply_report(report(seq=2, used=(30_000.0, 0.0)), NOW + P.usage_warmup_s + 1)
    view = state.node_view("n1")
    assert view is not None and view.gpus[0].free_mib == 10_000.0
    state.release("a")
    assert state.reserved_mib("n1", "n1-u0") == 0.0


def test_reserve_refuses_stale_and_unknown_nodes_and_counts_refusals() -> None:
    state = ClusterState(P)
    state.apply_report(report(), NOW)
    req = request("a", 1_000.0)
    assert state.reserve_on(req, template(req, "nx", NOW), NOW) == "no agent report"
    assert state.reserve_on(req, template(req, "n1", NOW), NOW + 100) == "telemetry stale (100s old)"
    assert state.overcommits_refused == 2


def test_retried_bind_is_idempotent_and_other_node_refused() -> None:
    state = ClusterState(P)
    state.apply_report(report("n1"), NOW)
    state.apply_report(report("n2"), NOW)
    req = request("a", 1_000.0)
    first = reserved(state, req, "n1")
    assert state.reserve_on(req, template(req, "n1", NOW), NOW) == Reserved(first, True)
    assert state.reserve_on(req, template(req, "n2", NOW), NOW) == "pod ns/a already holds GPUs on n1"


def test_usage_rule_moves_reservation_and_records_signature_peak() -> None:
    state = ClusterState(P)
    state.apply_report(report(seq=1), NOW)
    req = request("a", 20_000.0)
    res = reserved(state, req, "n1")
    usage = PodUsage("a", 8_000.0, 9_000.0, res.gpu_uuids)
    state.apply_report(report(seq=2, pods=(usage,)), NOW + 10)  # warm-up: unchanged
    assert state.reserved_mib("n1", res.gpu_uuids[0]) == 20_000.0
    state.apply_report(report(seq=3, pods=(usage,)), NOW + 100)  # warmed up, not yet flat for the plateau
    assert state.reserved_mib("n1", res.gpu_uuids[0]) == 20_000.0
    state.apply_report(report(seq=4, pods=(usage,)), NOW + 10 + P.usage_plateau_s)
    assert state.reserved_mib("n1", res.gpu_uuids[0]) == 9_000.0 * P.usage_margin
    correction = state.correction("sig")
    assert correction is not None and correction.peak_mib == 9_000.0
    state.release("a")
    assert state.reserved_mib("n1", res.gpu_uuids[0]) == 0.0


def test_restore_rebuilds_without_double_allocation() -> None:
    state = ClusterState(P)
    state.apply_report(report(used=(0.0,)), NOW)
    res = Reservation("a", "ns", "a", "n1", ("n1-u0",), 30_000.0, 30_000.0, 30_000.0, PriorityInputs(), NOW)
    assert state.restore(res) and not state.restore(res)
    req = request("b", 20_000.0)
    assert isinstance(state.reserve_on(req, template(req, "n1", NOW), NOW), str)


def test_threads_racing_for_one_gpu_place_exactly_as_many_as_fit() -> None:
    state = ClusterState(P)
    state.apply_report(report(used=(0.0,)), NOW)
    results: list[object] = []
    barrier = threading.Barrier(32)

    def bind(i: int) -> None:
        req = request(f"p{i}", 3_000.0)
        barrier.wait()
        results.append(state.reserve_on(req, template(req, "n1", NOW), NOW))

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Reserved) for r in results) == 40_000 // 3_000
    assert state.reserved_mib("n1", "n1-u0") <= 40_000.0


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
            out = state.reserve_on(req, template(req, name, NOW), NOW)
            res = out.reservation if isinstance(out, Reserved) else None
            if res is not None and held is None:  # a new admission: every GPU had room
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
                assert state.reserved_mib(res.node, uuid) <= 40_000.0 + 1e-6


def test_a_burst_never_fills_a_gpu_twice_when_its_report_lists_no_processes() -> None:
    """Seen with the real kube-scheduler (cluster scenario 16): a GPU reporting 33,000 of 40,000 MiB
    used and no process list took one 6,000 MiB pod after another, because max(used, reserved) stayed
    at the used memory until the reservations passed it, and booked ~40,000 on 7,000 free."""
    state = ClusterState(P)
    state.apply_report(report(used=(33_000.0,)), NOW)
    reserved(state, request("first", 6_000.0), "n1", NOW + 1)
    second = state.reserve_on(request("second", 6_000.0), template(request("second", 6_000.0), "n1", NOW + 2), NOW + 2)
    assert isinstance(second, str)
    view = state.node_view("n1")
    assert view is not None and view.gpus[0].free_mib == 1_000.0
    # an unchanged report (heartbeat) after the warm-up: the first pod's use would show by now, and
    # it does not, so observed use decides again (the usage rule)
    state.apply_report(report(seq=2, used=(33_000.0,)), NOW + 1 + P.usage_warmup_s + 1)
    view = state.node_view("n1")
    assert view is not None and view.gpus[0].free_mib == 7_000.0
    # where the report lists processes, attribution decides and nothing is pending
    listed = ClusterState(P)
    foreign = (ProcessReport(4242, 33_000.0, ""),)
    listed.apply_report(report(used=(33_000.0,), processes=(foreign,)), NOW)
    reserved(listed, request("first", 6_000.0), "n1", NOW + 1)
    view = listed.node_view("n1")
    assert view is not None and view.gpus[0].free_mib == 1_000.0 and view.gpus[0].pending_mib == 0.0


def test_the_ledger_keeps_each_nodes_gpu_model_key_and_how_many_nodes_have_it() -> None:
    """Admission per GPU model reads these instead of each name's report (`ModelDemands.by_model`): they
    follow every report (a driver upgrade in an otherwise unchanged heartbeat too) and a forgotten node."""
    state = ClusterState(PolicyParams())

    def send(node: str, seq: int, model: str, driver: str, gpus: int = 2) -> None:
        report = NodeReport(node, seq, float(seq), "t", "nvml",
                            tuple(GpuReport(f"{node}-g{i}", i, model, 80_000.0, 0.0) for i in range(gpus)),
                            boot_id="b", driver_version=driver, cuda_version="13.0")
        assert state.apply_report(report, float(seq)) == ACCEPTED

    h100, a100 = ("NVIDIA H100 80GB HBM3",), ("NVIDIA A100-SXM4-80GB",)
    send("n1", 1, h100[0], "580")
    send("n2", 1, h100[0], "580")
    key_of, in_use = state.model_keys()
    assert in_use == ((h100, "580/13.0"),) and key_of["n1"] == key_of["n2"] == (h100, "580/13.0")
    assert key_of["n1"] is key_of["n2"] is in_use[0]  # one object per key: the filter groups by identity
    send("n3", 1, a100[0], "580")
    assert sorted(state.model_keys()[1]) == sorted([(h100, "580/13.0"), (a100, "580/13.0")])
    send("n1", 2, h100[0], "590")  # the same GPU readings, another driver: the heartbeat path
    key_of, in_use = state.model_keys()
    assert key_of["n1"] == (h100, "590/13.0") and len(in_use) == 3
    send("n1", 3, h100[0], "580")
    assert len(state.model_keys()[1]) == 2  # back: no key is left with no node
    state.set_known_nodes(["n1", "n2"])  # n3 leaves the cluster
    key_of, in_use = state.model_keys()
    assert "n3" not in key_of and in_use == ((h100, "580/13.0"),)
    send("n2", 2, h100[0], "580", gpus=0)  # a report without GPUs: no key
    key_of, in_use = state.model_keys()
    assert "n2" not in key_of and in_use == ((h100, "580/13.0"),)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["reserve", "release", "report", "processes"]), st.integers(0, 2),
                          st.sampled_from([3_000.0, 9_000.0, 30_000.0])), min_size=1, max_size=30))
def test_a_rebuilt_view_equals_one_built_afresh(ops: list[tuple[str, int, float]]) -> None:
    """The rebuild keeps the views of GPUs whose inputs did not change (one reservation changes one
    GPU): after any sequence of reservations, releases and reports (with and without processes, used
    memory moving), every node's view is field for field the view built from nothing."""
    state = ClusterState(PolicyParams(usage_warmup_s=60.0))  # the sharing rule on: duties enter the views
    seq = {f"n{i}": 1 for i in range(3)}
    for node in seq:
        assert state.apply_report(report(node, 1, used=(0.0,) * 4, ts=NOW), NOW) == ACCEPTED
    held: list[Reservation] = []
    for i, (op, n, mib) in enumerate(ops):
        node = f"n{n}"
        if op == "reserve":
            out = state.reserve_on(request(f"p{i}", mib), template(request(f"p{i}", mib), node, NOW), NOW)
            if isinstance(out, Reserved):
                held.append(out.reservation)
        elif op == "release" and held:
            state.release(held.pop(n % len(held)).pod_uid)
        else:
            seq[node] += 1
            mine = [r for r in held if r.node == node]
            used = tuple(sum(r.memory_mib for r in mine if f"{node}-u{g}" in r.gpu_uuids) for g in range(4))
            procs = tuple(tuple(ProcessReport(100 + k, r.memory_mib, r.pod_uid) for k, r in enumerate(mine)
                                if f"{node}-u{g}" in r.gpu_uuids) for g in range(4)) if op == "processes" else None
            state.apply_report(report(node, seq[node], used=used, ts=NOW + seq[node], processes=procs),
                               NOW + seq[node])
    for node in seq:
        kept = state.node_view(node)
        with state._lock:
            state._views.pop(node)  # nothing to keep: every GPU's view built anew
            state._rebuild(node)
        assert kept == state.node_view(node)
