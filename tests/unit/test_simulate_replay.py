"""Replay experiment bookkeeping on a slice of the default trace: every job ends somewhere, nothing
goes negative, the cluster drains back to empty, static never over-commits, and preemption only
ever evicts strictly lower DeepRes priority."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from extender.policy import PolicyParams, priority_of
from extender.policy.fragmentation import MIX_REBUILD, DemandWindow
from extender.settings import PolicySettings
from extender.simulate import replay
from extender.simulate.jobs import load_job_pool, load_predictor
from extender.simulate.report import ablations_follow_usage
from extender.simulate.traces import DEFAULT_DATA, Node, Pod, node_list_path, pod_list_path, read_nodes, read_pods

needs_trace = pytest.mark.skipif(not (DEFAULT_DATA / "openb_pod_list_default.csv").is_file(),
                                 reason="../shared/data/openb not available")


@pytest.fixture(scope="module")
def setup() -> tuple[list[replay.Job], list[Node]]:
    nodes = read_nodes(node_list_path(DEFAULT_DATA))[::256]
    pods = read_pods(pod_list_path(DEFAULT_DATA, "default"))
    pool = load_job_pool()
    predictor, _ = load_predictor(pool, 1)
    jobs = replay.build_jobs(pods, pool, predictor, 1, lambda p: 16 * 1024.0, limit=2500)
    return jobs, nodes


@needs_trace
@pytest.mark.parametrize("cls", [replay.Static, replay.Request, replay.DeepRes, replay.DeepResNoFrag])
def test_every_job_accounted_and_cluster_drains(cls: type[replay.Strategy],
                                                setup: tuple[list[replay.Job], list[Node]]) -> None:
    jobs, nodes = setup
    clusters: list[replay.Cluster] = []
    original = replay.Cluster.__init__

    def remember(self: replay.Cluster, n: Sequence[Node]) -> None:
        original(self, n)
        clusters.append(self)

    replay.Cluster.__init__ = remember  # type: ignore[method-assign,assignment]
    try:
        out = replay.simulate(cls, jobs, nodes, PolicyParams())
    finally:
        replay.Cluster.__init__ = original  # type: ignore[method-assign]
    m = out.metrics
    assert m["completed"] + m["failed"] + m["never_placed"] == len(jobs)
    assert len(out.jct_s) == m["completed"]
    assert all(j >= 0 for j in out.jct_s)
    cluster = clusters[0]
    assert abs(cluster.reserved).max() < 1e-6 and abs(cluster.used).max() < 1e-6
    assert all(not gpu for node in cluster.jobs_on for gpu in node)
    assert (cluster.cpu_left == [n.cpu_milli for n in nodes]).all()
    assert 0 <= m["jain"] <= 1 and 0 <= m["deadline_miss_rate"] <= 1
    if cls is replay.Static:
        assert m["oom_kills"] == 0  # one job per GPU: never over-committed


@needs_trace
def test_preemption_only_evicts_strictly_lower_priority(setup: tuple[list[replay.Job], list[Node]]) -> None:
    jobs, nodes = setup
    seen: list[tuple[float, float]] = []

    class Watched(replay.DeepRes):
        def preempt(self, job: replay.Job, now: float) -> list[int] | None:
            victims = super().preempt(job, now)
            for v in victims or []:
                seen.append((priority_of(self.inputs(self.jobs[v]), now, self.params),
                             priority_of(self.inputs(job), now, self.params)))
            return victims

    out = replay.simulate(Watched, jobs, nodes, PolicyParams())
    assert out.metrics["preemptions"] == len(seen) > 0  # the slice is contended enough to preempt
    assert all(victim < preemptor for victim, preemptor in seen)
    assert not math.isnan(out.metrics["mean_jct_s"])


def test_demand_window_keeps_the_frequent_binned_shapes() -> None:
    """The replay's demand mix: admissions binned up (512 MiB, 1000 mCPU), rebuilt every MIX_REBUILD binds,
    the most frequent shapes covering MIX_COVER of the window, weights renormalised."""
    window = DemandWindow()
    assert len(window.mix()) == 0
    for _ in range(60):
        window.admit(7_900.0, 1, 1_500.0)  # -> (8192, 1, 2000)
    for _ in range(39):
        window.admit(3_000.0, 2, 500.0)  # -> (3072, 2, 1000)
    window.admit(20_000.0, 1, 0.0)  # 1 % of the window: beyond the 95 % cover
    shapes = {(s.memory_mib, s.gpus, s.cpu_milli): s.probability for s in window.mix().shapes}
    assert shapes == {(8_192.0, 1, 2_000.0): pytest.approx(60 / 99), (3_072.0, 2, 1_000.0): pytest.approx(39 / 99)}
    for _ in range(MIX_REBUILD - 1):
        window.admit(20_000.0, 1, 0.0)
    assert len(window.mix()) == 2  # not rebuilt before MIX_REBUILD new binds
    window.admit(20_000.0, 1, 0.0)
    assert (20_480.0, 1, 0.0) in {(s.memory_mib, s.gpus, s.cpu_milli) for s in window.mix().shapes}


@needs_trace
def test_representatives_give_the_same_decision_as_scoring_every_node(
        setup: tuple[list[replay.Job], list[Node]]) -> None:
    """DeepRes scores one node per distinct state; the winner must be the node that scoring every
    passed node with `score_nodes_fragaware` gives 10, at every placement of a short replay."""
    from extender.policy import filter_nodes, score_nodes_fragaware, spreads

    jobs, _ = setup
    checked = 0
    original = replay.DeepRes.place

    def place_and_check(self: replay.DeepRes, job: replay.Job, now: float) -> tuple[int, list[int], float] | None:
        nonlocal checked
        answer = original(self, job, now)
        pod = self.request(job, now)
        if answer is not None and not spreads(pod, self.params):
            views = {self.c.names[int(i)]: self.view(int(i), now) for i in np.flatnonzero(self.c.base_mask(job.pod))}
            result = filter_nodes(pod, list(views), views, 0.0, self.params)
            pod, passed = result.request or pod, result.passed  # the whole-GPU request when the fallback applied
            cpu = {n: float(self.c.cpu_left[self._index[n]]) for n in passed}
            full = dict(score_nodes_fragaware(pod, passed, views, self.params, self.demand.mix(), cpu,
                                              float(job.pod.cpu_milli)))
            assert full[self.c.names[answer[0]]] == 10
            checked += 1
        return answer

    replay.DeepRes.place = place_and_check  # type: ignore[method-assign]
    try:
        # the memory packing path (the check below rebuilds the views without the sharing rule)
        replay.simulate(replay.DeepRes, jobs[:400], read_nodes(node_list_path(DEFAULT_DATA))[::32],
                        PolicyParams(sharing=False))
    finally:
        replay.DeepRes.place = original  # type: ignore[method-assign]
    assert checked > 100


# ---- the replay runs the live rules (synthetic clusters: no trace needed) ----

GB = 1024.0


def _job(idx: int, qos: str, true_gb: float, upper_gb: float, arrival: float, duration: float,
         spec: tuple[str, ...] = ()) -> replay.Job:
    pod = Pod(f"p{idx}", 1000, 1024, 1, 500, spec, qos, int(arrival), int(arrival + duration))
    deadline = arrival + replay.DEADLINE_FACTOR * duration if qos == "LS" else None
    return replay.Job(idx, pod, f"sig-{idx}", true_gb * GB, 0.9 * upper_gb * GB, upper_gb * GB, qos, arrival,
                      duration, deadline)


@pytest.mark.parametrize("cls", [replay.DeepRes, replay.DeepResPack, replay.DeepResNoFrag])
def test_deepres_and_its_ablations_follow_observed_peaks(cls: type[replay.Strategy]) -> None:
    """A job admitted at 12 GB that uses 3 GB shrinks to 3.3 GB once it has shown its peak (the plateau
    after its start), so a second 12 GB job that comes later fits the 16 GB GPU at once; an ablation
    that never followed peaks (the old replay) made it wait."""
    nodes = [Node("n0", 64_000, 256_000, 1, "V100M16")]
    params = PolicySettings().params()
    later = max(params.usage_warmup_s, params.usage_plateau_s) + 100.0
    jobs = [_job(0, "BE", 3, 12, 0.0, 1000.0), _job(1, "BE", 3, 12, later, 1000.0)]
    # memory only: two GPU-bound jobs on one GPU is what the sharing rule refuses (test_simulate_compute)
    out = replay.simulate(cls, jobs, nodes, replace(PolicySettings().params(), sharing=False))
    assert out.metrics["usage_followed"] >= 1
    assert out.metrics["completed"] == 2 and out.metrics["mean_queue_s"] == 0.0


def test_a_normal_pod_preempts_a_low_one_as_the_extender_does() -> None:
    """The live self-preemption has no priority floor (strictly lower victims only): a normal pod evicts
    a low (BE) one whose GPU memory it needs; the old replay preempted only from priority 20."""
    nodes = [Node("n0", 64_000, 256_000, 1, "V100M16")]
    jobs = [_job(0, "BE", 10, 10, 0.0, 10_000.0), _job(1, "Burstable", 10, 10, 500.0, 1000.0)]
    out = replay.simulate(replay.DeepRes, jobs, nodes, PolicySettings().params())
    assert out.metrics["preemptions"] == 1
    assert out.per_qos["Burstable"]["mean_queue_s"] == 0.0


def test_the_replay_preempts_on_the_node_the_extender_would_choose() -> None:
    """Node "a" (T4) holds one normal job, node "b" (P100) two low ones; an LS job fits either after one
    eviction. The extender's rule (`choose_preemption`) evicts on "b" (lower victim priority); the old
    replay took the lowest-ranked node with the fewest victims, "a"."""
    nodes = [Node("a", 64_000, 256_000, 1, "T4"), Node("b", 64_000, 256_000, 1, "P100")]
    jobs = [_job(0, "Burstable", 10, 10, 0.0, 10_000.0, ("T4",)),
            _job(1, "BE", 5.5, 5.5, 0.0, 10_000.0, ("P100",)), _job(2, "BE", 5.5, 5.5, 0.0, 10_000.0, ("P100",)),
            _job(3, "LS", 9, 9, 500.0, 1000.0)]
    evicted: list[int] = []

    class Watched(replay.DeepRes):
        def preempt(self, job: replay.Job, now: float) -> list[int] | None:
            victims = super().preempt(job, now)
            evicted.extend(victims or [])
            return victims

    out = replay.simulate(Watched, jobs, nodes, PolicySettings().params())
    assert len(evicted) == 1 and evicted[0] in (1, 2)
    assert out.per_qos["LS"]["mean_queue_s"] == 0.0


def test_the_report_key_is_computed_from_the_runs() -> None:
    def outcome(name: str, followed: float) -> replay.ReplayOutcome:
        return replay.ReplayOutcome(name, {"usage_followed": followed}, {}, [], [], [], [])

    def experiment(*outcomes: replay.ReplayOutcome) -> replay.ReplayExperiment:
        return replay.ReplayExperiment({o.policy: o for o in outcomes}, [], [])

    good = experiment(outcome("deepres", 3), outcome("deepres-pack", 2), outcome("deepres-nofrag", 1))
    bad = experiment(outcome("deepres", 3), outcome("deepres-pack", 0), outcome("deepres-nofrag", 1))
    assert ablations_follow_usage([good]) is True
    assert ablations_follow_usage([good, bad]) is False
    assert ablations_follow_usage([experiment(outcome("deepres", 3))]) is None
