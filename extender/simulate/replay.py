"""Experiment 2, replay: the default trace with its arrivals and departures, three ways of sharing GPUs.

Every GPU pod of the trace arrives at its creation time and needs its trace run time (deletion -
scheduled, or - creation if it never ran) of GPU time; it gets a training job drawn (seeded) from the
predictor's dataset, whose traced-and-calibrated memory is its true peak per GPU (drawn among jobs
that fit the smallest GPU the pod may use). Policies:

- static: whole GPUs per pod, FIFO (what `nvidia.com/gpu` gives without sharing);
- request: the trace's gpu_milli as the declared share of GPU memory, binpack, FIFO (HAMi-style);
- deepres (and its ablations deepres-pack, deepres-nofrag): the live `extender.policy` functions with
  the live defaults (`PolicySettings().params()`): admission = the predictor's upper bound (or a job
  signature's observed peak x margin, `corrected_admission`), the filter (`filter_nodes`, with its
  whole-GPU fallback: a bound above every GPU the pod may use, its point estimate fitting, asks for an
  empty GPU of the largest such size and reserves it whole, `whole_gpu_request`), the score
  and GPU choice (`packs_by_mix`, `score_nodes_fragaware` / `score_nodes`, `choose_gpus_for`),
  priority order (LS = high criticality, BE = low, others normal; LS jobs have a deadline of arrival
  + 2 x run time), the usage rule (`observe_usage`: the reservation follows the observed peak and the
  signature's peak is recorded once the warm-up has passed), and the extender's self-preemption
  (`choose_preemption` over the nodes the filter failed for memory, strictly lower priority victims
  only, at most once per pod per `preemption_grace_s`).

What the live extender does that the replay does not model: kube-scheduler's own preemption for CPU
and host memory (by PriorityClass; the trace has none), and eviction taking time (victims leave at
once). A job's true use is its peak from the start, so the usage rule applied at every report gives
the same reservation as applied at the reports that first show the peak (`usage_reports_s`: after
the warm-up, then spread over the plateau): the replay applies it then.

Compute (issue 24; `extender.simulate.compute` runs it): with `simulate(..., interference=True)` jobs
sharing a GPU run at the rate the interference model predicts from their true duties, and a job's
finish moves whenever its GPUs' jobs change; DeepRes places through the sharing rule
(`sharing_view`: busy GPUs it may not join shown full; its duties the reservation's, the prior until
the usage rule observes them) and its priority gets the predicted run time (`Job.predicted_s`), never
the true one. Without it (the default here, and the memory replay of `--report`) jobs run at full
speed whatever shares their GPU.

Memory actually used is the sum of the running jobs' true peaks (from their start). A placement
that makes a GPU's true use exceed its capacity kills the job that allocated last (the newcomer):
it holds its GPUs for `OOM_AFTER_S`, then restarts after a back-off (10 s doubling to 300 s);
after `MAX_RESTARTS` kills it fails. Preempted and killed jobs lose their progress.
"""

from __future__ import annotations

import heapq
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from extender.policy import (
    PolicyParams,
)
from extender.policy.interference import busy_shares, step_rate_fractions
from extender.policy.usage import usage_reports_s
from extender.settings import PolicySettings
from extender.simulate.adapters import GPU_MEMORY_GB
from extender.simulate.jobs import JobPool, load_job_pool, load_predictor
from extender.simulate.strategies import DeepRes as DeepRes
from extender.simulate.strategies import DeepResMemory as DeepResMemory
from extender.simulate.strategies import DeepResNoFrag as DeepResNoFrag
from extender.simulate.strategies import DeepResPack as DeepResPack
from extender.simulate.strategies import Request as Request
from extender.simulate.strategies import Static as Static
from extender.simulate.strategies import StaticPriority as StaticPriority
from extender.simulate.strategies import StaticSjf as StaticSjf
from extender.simulate.strategies import Strategy as Strategy
from extender.simulate.traces import Node, Pod, node_list_path, pod_list_path, read_nodes, read_pods

# the world and the policies live in world.py and strategies.py; callers reach them as replay.X too
from extender.simulate.world import BACKOFF_S as BACKOFF_S
from extender.simulate.world import COMPUTE_POLICIES as COMPUTE_POLICIES
from extender.simulate.world import DEADLINE_FACTOR as DEADLINE_FACTOR
from extender.simulate.world import MAX_RESTARTS as MAX_RESTARTS
from extender.simulate.world import MIB_PER_GB as MIB_PER_GB
from extender.simulate.world import OOM_AFTER_S as OOM_AFTER_S
from extender.simulate.world import POLICIES as POLICIES
from extender.simulate.world import SAMPLE_EVERY_S as SAMPLE_EVERY_S
from extender.simulate.world import Cluster as Cluster
from extender.simulate.world import Job as Job
from extender.simulate.world import ReplayExperiment as ReplayExperiment
from extender.simulate.world import ReplayOutcome as ReplayOutcome

if TYPE_CHECKING:
    from extender.simulate.capworld import World

log = logging.getLogger(__name__)


def build_jobs(pods: Sequence[Pod], pool: JobPool, predictor: Any, seed: int, min_cap_mib: Callable[[Pod], float],
               limit: int = 0) -> list[Job]:
    """One Job per GPU pod (in creation order), with a training job drawn uniformly (numpy seed)."""
    rng = np.random.default_rng(seed)
    gpu_pods = sorted((p for p in pods if p.num_gpu > 0), key=lambda p: (p.creation_s, p.name))
    if limit:
        gpu_pods = gpu_pods[:limit]
    by_true = sorted(pool.jobs, key=lambda j: j.true_mib)
    trues = np.array([j.true_mib for j in by_true])
    jobs = []
    for idx, pod in enumerate(gpu_pods):
        fitting = int(np.searchsorted(trues, min_cap_mib(pod), side="right"))
        if fitting == 0:
            raise ValueError(f"no job in the pool fits the GPUs pod {pod.name} may use")
        pick = by_true[int(rng.integers(fitting))]
        demand = predictor.predict(pick.spec)
        end = pod.deletion_s if pod.deletion_s >= 0 else pod.creation_s + 1
        duration = float(max(end - max(pod.creation_s, 0), 1))
        deadline = pod.creation_s + DEADLINE_FACTOR * duration if pod.qos == "LS" else None
        key = repr(sorted(pick.spec.to_annotations().items()))
        jobs.append(Job(idx, pod, key, pick.true_mib, float(demand.memory_mib), float(demand.memory_mib_upper),
                        pod.qos, float(pod.creation_s), duration, deadline))
    return jobs


def simulate(strategy_cls: type[Strategy], jobs_template: Sequence[Job], nodes: Sequence[Node],
             params: PolicyParams, progress: Callable[[str], None] | None = None,
             interference: bool = False, world: World | None = None) -> ReplayOutcome:
    """Event-driven replay of one policy; returns its metrics and time series.

    With `interference`, jobs sharing a GPU run at the rate the interference model predicts from
    their true duties (`interference.step_rate_fractions`; a multi-GPU job at its slowest GPU's), and
    their finish times move whenever a GPU's jobs change; without it (the "no slowdown" ablation and
    the memory replay of before) every job runs at full speed.

    With a `world` (`simulate.capworld`: implies interference), rates are the world's, duties drift
    and are sampled for the policy, evictions and kills cost the progress since the last checkpoint
    plus a restart, and killed jobs restart until they finish (none dropped)."""
    import copy

    interference = interference or world is not None
    jobs = [copy.copy(t) for t in jobs_template]
    for fresh in jobs:
        fresh.gpus = []
        fresh.queued_at = fresh.arrival
    cluster = Cluster(nodes)
    strat = strategy_cls(cluster, jobs, params)
    events: list[tuple[float, int, str, int, int]] = []
    seq = 0

    def push(t: float, kind: str, j: int, run: int = 0) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, j, run))
        seq += 1

    for each in jobs:
        push(each.arrival, "arrive", each.idx)
    pending: list[int] = []
    ooms = 0
    moved = 0
    series_busy: list[float] = []
    series_held: list[float] = []
    n_gpus = max(int(cluster.present.sum()), 1)

    def gpu_busy() -> float:
        """Mean over GPUs of the share of time they are busy (the jobs' busy shares by the model)."""
        total = 0.0
        for row in cluster.jobs_on:
            for on in row:
                if on:
                    duties = [jobs[j].duty for j in on]
                    total += min(1.0, sum(busy_shares(duties) if interference else duties))
        return total / n_gpus

    series_t: list[float] = []
    series_alloc: list[float] = []
    series_mem: list[float] = []
    arrivals = sorted(j.arrival for j in jobs)
    # the trace's first pods were created long before the bulk: sample from the 5th percentile arrival
    next_sample = arrivals[len(arrivals) // 20] if arrivals else 0.0
    last_arrival = arrivals[-1] if arrivals else 0.0
    finished = 0
    steps = 0

    doomed: set[int] = set()  # jobs placed over memory: OOM-killed soon, never finishing this run
    shared_now: set[int] = set()  # running jobs with another job on one of their GPUs

    def residents(node: int, gpus: Sequence[int]) -> set[int]:
        return {j for g in gpus for j in cluster.jobs_on[node][g]}

    def settle(j: int, now: float) -> None:
        """Progress of job j up to `now` at its current rate."""
        job = jobs[j]
        elapsed = now - job.since
        if elapsed > 0.0:
            job.work_left -= job.rate * elapsed
            if j in shared_now:
                job.shared_s += elapsed
        job.since = now

    def refresh(node: int, gpus: Sequence[int], now: float) -> None:
        """New rates (and finish events) for the jobs on these GPUs after their set changed."""
        fractions: dict[int, dict[int, float]] = {}
        for g in {g for j in residents(node, gpus) for g in jobs[j].gpus} | set(gpus):
            on = cluster.jobs_on[node][g]
            if world is not None:
                values = world.fractions([jobs[j] for j in on])
            else:
                values = step_rate_fractions([jobs[j].duty for j in on]) if interference else (1.0,) * len(on)
            fractions[g] = dict(zip(on, values, strict=True))
        for j in residents(node, gpus):
            job = jobs[j]
            settle(j, now)
            if any(len(cluster.jobs_on[node][g]) > 1 for g in job.gpus):
                shared_now.add(j)
            else:
                shared_now.discard(j)
            job.rate = min(fractions[g][j] for g in job.gpus)
            job.finish_token += 1
            if j not in doomed:
                push(now + max(job.work_left, 0.0) / max(job.rate, 1e-9), "finish", j, job.finish_token)

    def start(job: Job, node: int, gpus: list[int], reserve: float, now: float) -> None:
        nonlocal ooms
        for j in residents(node, gpus):
            settle(j, now)
        cluster.bind(job, node, gpus, reserve)
        job.run_id += 1
        job.start = now
        job.work_left, job.since, job.shared_s = job.duration, now, 0.0  # a (re)start begins from scratch
        if world is not None:  # ... or from its last checkpoint, after a restart
            job.work_left = job.duration - job.kept_s + (world.restart_s if job.restarts else 0.0)
            job.waited_s += max(now - job.queued_at, 0.0)
        job.run_alone_s = job.work_left
        strat.on_bind(job, now)
        if cluster.over_committed(job):  # the newcomer allocated last: OOM-killed after OOM_AFTER_S
            ooms += 1
            job.ooms += 1
            doomed.add(job.idx)
            push(now + OOM_AFTER_S, "oom", job.idx, job.run_id)
        elif strat.follows_usage:  # the reports that show the peak (see the module docstring)
            for at in usage_reports_s(strat.params):
                push(now + at, "usage", job.idx, job.run_id)
        if world is not None and job.idx not in doomed:
            push(now + world.tick_s, "tick", job.idx, job.run_id)
        refresh(node, gpus, now)

    def samples(job: Job) -> dict[str, float]:
        """The agent's samples of the jobs on `job`'s first GPU (the world's noisy NVML-like ones)."""
        assert world is not None
        on = [jobs[j] for j in cluster.jobs_on[job.node][job.gpus[0]]]
        return world.sample(on, world.fractions(on))

    def stop(job: Job, now: float, lost: bool = False) -> None:
        node, gpus = job.node, list(job.gpus)
        for j in residents(node, gpus):
            settle(j, now)
        if lost and world is not None:
            world.lose(job, now)
            job.queued_at = now
        cluster.release(job)
        strat.on_stop(job)
        doomed.discard(job.idx)
        shared_now.discard(job.idx)
        job.run_id += 1
        job.finish_token += 1
        job.reservation = None
        refresh(node, gpus, now)

    def apply_moves(now: float) -> bool:
        """Sharing's feedback asked to move the newest joiner of a GPU over its bound: stopped, its work
        since the checkpoint lost, back to the queue (as an eviction)."""
        nonlocal moved
        taken = False
        for m in strat.take_moves():
            if jobs[m].node >= 0:
                stop(jobs[m], now, lost=True)
                moved += 1
                taken = True
                push(now, "arrive", m)
        return taken

    while events:
        now = events[0][0]
        while next_sample <= now and next_sample <= last_arrival:
            series_t.append(next_sample)
            series_alloc.append(float(cluster.reserved.sum()) / cluster.total_cap)
            series_mem.append(float(cluster.used.sum()) / cluster.total_cap)
            series_busy.append(gpu_busy())
            series_held.append(float(sum(1 for i, row in enumerate(cluster.jobs_on) for g, on in enumerate(row)
                                         if on and cluster.present[i, g])) / n_gpus)
            next_sample += SAMPLE_EVERY_S
        freed = False
        arrived: list[int] = []
        while events and events[0][0] == now:
            _, _, kind, j, run = heapq.heappop(events)
            job = jobs[j]
            if kind == "arrive":
                job.admission_mib = strat.admission(job)
                arrived.append(j)
            elif kind == "finish":
                if run != job.finish_token or job.node < 0:
                    continue  # the job's rate changed since (a newer finish event) or it was stopped
                job.last_run_s = now - job.start
                stop(job, now)
                job.completion = now
                finished += 1
                freed = True
            elif run != job.run_id:
                continue  # stale event of an earlier run (preempted or killed)
            elif kind == "usage":
                freed |= strat.on_usage(job, now, samples(job) if world is not None else None)
                freed |= apply_moves(now)
            elif kind == "tick":
                assert world is not None
                for k in residents(job.node, job.gpus):
                    settle(k, now)
                world.drift(job)
                refresh(job.node, job.gpus, now)
                freed |= strat.on_sample(job, samples(job), now)
                push(now + world.tick_s, "tick", j, run)
                freed |= apply_moves(now)
            elif kind == "oom":
                stop(job, now, lost=True)
                freed = True
                if job.ooms >= MAX_RESTARTS and world is None:
                    job.failed = True
                    finished += 1
                else:
                    backoff = min(BACKOFF_S[0] * 2 ** (job.ooms - 1), BACKOFF_S[1])
                    push(now + backoff, "arrive", j)
        candidates = pending + arrived if freed else arrived
        pending = [j for j in pending if j not in set(arrived)] if not freed else []
        waiting = set(pending)
        order = sorted(candidates, key=lambda j: strat.order_key(jobs[j], now))
        failed_shapes: list[tuple[Any, ...]] = []
        for j in order:
            job = jobs[j]
            # a job no easier to place than one that just failed fails too (the sharing rule: a larger
            # duty, a longer predicted run or a high priority make joining a busy GPU no easier)
            extra = strat.hardness(job, now)
            shape = (job.pod.num_gpu, job.admission_mib, job.pod.cpu_milli, job.pod.memory_mib, job.pod.spec,
                     job.pod.gpu_milli, *extra)
            if any(s[0] == shape[0] and s[4] == shape[4] and shape[1] >= s[1] and shape[2] >= s[2]
                   and shape[3] >= s[3] and shape[5] >= s[5] and all(a >= b for a, b in zip(shape[6:], s[6:],
                                                                                          strict=True))
                   for s in failed_shapes):
                if j not in waiting:
                    pending.append(j)
                    waiting.add(j)
                continue
            choice = strat.place(job, now)
            if choice is None:
                victims = strat.preempt(job, now)
                if victims:
                    for v in victims:
                        victim = jobs[v]
                        stop(victim, now, lost=True)
                        victim.evicted_by = strat.kind(job)
                        victim.preempted += 1
                        strat.preemptions += 1
                        push(now, "arrive", v)  # back to the queue, progress lost
                    choice = strat.place(job, now)
            if choice is None:
                failed_shapes.append(shape)
                if j not in waiting:
                    pending.append(j)
                    waiting.add(j)
                continue
            if j in waiting:
                waiting.discard(j)
                pending.remove(j)
            start(job, *choice, now)
        steps += 1
        if progress is not None and steps % 2000 == 0:
            progress(f"    {strat.name}: t={now:,.0f} s, finished {finished}/{len(jobs)}, pending {len(pending)}")
    if world is not None:  # none dropped: a job that never completed counts, its JCT until the end
        for job in jobs:
            if math.isnan(job.completion):
                job.failed = True
    out = _outcome(strat, jobs, ooms, series_t, series_alloc, series_mem)
    if world is not None:
        from extender.simulate.capworld import capacity_metrics

        out.metrics.update(capacity_metrics(jobs, max([j.arrival for j in jobs] + [
            j.completion for j in jobs if not math.isnan(j.completion)])))
    # a shared job's slowdown: its final run's wall time over that run alone (after a restart: the work
    # left from its checkpoint plus the restart, not its whole run time)
    shared = [j.last_run_s / (j.run_alone_s or j.duration) for j in jobs
              if not j.failed and not math.isnan(j.completion) and j.shared_s > 0.0]
    done = [j for j in jobs if not j.failed and not math.isnan(j.completion)]
    jct = sorted(j.completion - j.arrival for j in done)
    out.metrics.update({
        "median_jct_s": round(float(np.median(jct)), 1) if jct else math.nan,
        "shared_jobs": float(len(shared)),
        "shared_slowdown_p95": round(float(np.percentile(shared, 95)), 4) if shared else 1.0,
        "shared_slowdown_max": round(max(shared), 4) if shared else 1.0,
        "gpu_busy": round(statistics.fmean(series_busy), 4) if series_busy else math.nan,
        "gpu_held": round(statistics.fmean(series_held), 4) if series_held else math.nan,
        "interference": float(interference),
        "sharing_moves": float(moved),
    })
    for q, members in out.per_qos.items():
        times = sorted(j.completion - j.arrival for j in done if j.qos == q)
        members["median_jct_s"] = float(np.median(times)) if times else math.nan
        members["p95_jct_s"] = _p95(times)
    return out


def _p95(values: Sequence[float]) -> float:
    return float(np.percentile(values, 95)) if values else math.nan


def _outcome(strat: Strategy, jobs: Sequence[Job], ooms: int, series_t: list[float], series_alloc: list[float],
             series_mem: list[float]) -> ReplayOutcome:
    done = [j for j in jobs if not j.failed and not math.isnan(j.completion)]
    jct = [j.completion - j.arrival for j in done]
    queue = [max(j.completion - j.arrival - j.duration, 0.0) for j in done]
    speed = [j.duration / max(j.completion - j.arrival, 1e-9) for j in done]
    jain = (sum(speed) ** 2 / (len(speed) * sum(s * s for s in speed))) if speed else math.nan
    ls = [j for j in jobs if j.deadline is not None]
    misses = sum(1 for j in ls if j.failed or math.isnan(j.completion) or j.completion > (j.deadline or 0))
    metrics = {
        "jobs": float(len(jobs)), "completed": float(len(done)), "failed": float(sum(j.failed for j in jobs)),
        "never_placed": float(sum(1 for j in jobs if not j.failed and math.isnan(j.completion))),
        "mean_jct_s": round(statistics.fmean(jct), 1) if jct else math.nan, "p95_jct_s": round(_p95(jct), 1),
        "mean_queue_s": round(statistics.fmean(queue), 1) if queue else math.nan,
        "p95_queue_s": round(_p95(queue), 1),
        "oom_kills": float(ooms), "oom_rate": round(ooms / max(len(jobs), 1), 5),
        "preemptions": float(strat.preemptions), "usage_followed": float(strat.usage_followed),
        "whole_gpu_binds": float(strat.whole_gpu_binds), "whole_gpu_jobs": float(len(strat.whole_gpu_jobs)),
        # of those, jobs whose bound fits a GPU they may use: the nodes holding one were not candidates
        # (CPU or memory short) when the fallback took a whole smaller GPU
        "whole_gpu_jobs_bound_fits": float(sum(1 for i in strat.whole_gpu_jobs
                                              if jobs[i].upper_mib <= strat.c.largest_gpu_mib(jobs[i].pod))),
        "deadline_miss_rate": round(misses / max(len(ls), 1), 4), "jain": round(jain, 4),
        "mean_alloc": round(statistics.fmean(series_alloc), 4) if series_alloc else math.nan,
        "mean_mem_use": round(statistics.fmean(series_mem), 4) if series_mem else math.nan,
    }
    per_qos: dict[str, dict[str, float]] = {}
    for q in sorted({j.qos for j in jobs}):
        members = [j for j in done if j.qos == q]
        if members:
            per_qos[q] = {"jobs": float(len(members)),
                          "mean_jct_s": statistics.fmean(j.completion - j.arrival for j in members),
                          "mean_queue_s": statistics.fmean(max(j.completion - j.arrival - j.duration, 0.0)
                                                           for j in members)}
    return ReplayOutcome(strat.name, metrics, per_qos, jct, series_t, series_alloc, series_mem)


def run_replay_experiment(data: Path, seed: int = 42, limit: int = 0, policies: Sequence[str] = POLICIES,
                          progress: Callable[[str], None] | None = None, node_stride: int = 1) -> ReplayExperiment:
    """The three policies on the default trace with the same jobs, on every `node_stride`-th node."""
    all_nodes = read_nodes(node_list_path(data))
    nodes = all_nodes[::max(node_stride, 1)]
    pods = read_pods(pod_list_path(data, "default"))
    pool = load_job_pool()
    predictor, predictor_note = load_predictor(pool, seed)
    caps = {n.model: GPU_MEMORY_GB.get(n.model, 16) * MIB_PER_GB for n in nodes}

    def min_cap(pod: Pod) -> float:
        models = [m for m in caps if not pod.spec or m in pod.spec] or list(caps)
        return min(caps[m] for m in models)

    jobs = build_jobs(pods, pool, predictor, seed, min_cap, limit)
    params = PolicySettings().params()  # the live extender's defaults
    classes: dict[str, type[Strategy]] = {"static": Static, "request": Request, "deepres": DeepRes,
                                          "deepres-pack": DeepResPack, "deepres-nofrag": DeepResNoFrag}
    outcomes = {}
    for name in policies:
        if progress is not None:
            progress(f"replay: {name} ({len(jobs)} GPU jobs)")
        outcomes[name] = simulate(classes[name], jobs, nodes, params, progress)
    under = sum(1 for j in jobs if j.upper_mib < j.true_mib)
    gpus = sum(n.gpus for n in nodes)
    notes = [f"cluster: every {node_stride}th of the {len(all_nodes)} name-sorted openb nodes: {len(nodes)} nodes, "
             f"{gpus} GPUs" if node_stride > 1 else f"cluster: all {len(nodes)} openb nodes, {gpus} GPUs",
             f"jobs: {len(jobs)} GPU pods of openb_pod_list_default (CPU-only pods left out), "
             f"training jobs from {pool.source}, drawn with numpy seed {seed} among jobs whose true peak fits "
             "the smallest GPU the pod may use",
             f"predictor: {predictor_note}; its upper bound is below the true peak for {under} jobs "
             f"({100 * under / max(len(jobs), 1):.1f} %)",
             f"GPU memory per model (GB): {GPU_MEMORY_GB} (G2, G3 undisclosed: assumed)",
             "DeepRes and its ablations run the extender's rules with its default settings "
             "(`PolicySettings().params()`): the usage rule (`observe_usage`) at the first report after the "
             f"{params.usage_warmup_s:.0f} s warm-up (a job's true use is its peak from the start, so later reports "
             "change nothing), admission corrected by observed peaks only after "
             f"{params.correction_min_pods} pods on {params.correction_min_nodes} nodes (`corrected_admission`), "
             "and the extender's self-preemption (`choose_preemption`: any pod, strictly lower-priority victims, "
             "on the nodes the filter failed for memory); kube-scheduler's own preemption for CPU and memory "
             "(by PriorityClass) is not modelled",
             f"OOM: the newcomer is killed after {OOM_AFTER_S:.0f} s and restarts after a back-off; "
             f"LS deadline = arrival + {DEADLINE_FACTOR:g} x run time; queue time = JCT - run time "
             "(waiting plus work lost to OOM kills and preemptions)"]
    deepres = outcomes.get("deepres")
    if deepres is not None:
        def max_cap(pod: Pod) -> float:
            return max(caps[m] for m in ([m for m in caps if not pod.spec or m in pod.spec] or list(caps)))

        above = [j for j in jobs if j.upper_mib > max_cap(j.pod)]
        whole = sum(1 for j in above if j.predicted_mib <= max_cap(j.pod))
        notes.append(f"whole-GPU fallback (`whole_gpu_request`, the extender's filter): {len(above)} jobs have an "
                     f"upper bound above the largest GPU they may use ({sum(1 for j in above if not j.pod.spec)} of "
                     f"them may use any GPU, the largest being {max(caps.values()) / MIB_PER_GB:.0f} GB); for the "
                     f"{whole} whose point estimate fits that GPU, DeepRes asks for an empty GPU of that size and "
                     "reserves it whole until the usage rule follows the observed peak (the others are refused); "
                     f"DeepRes placed {deepres.metrics['whole_gpu_binds']:.0f} runs of "
                     f"{deepres.metrics['whole_gpu_jobs']:.0f} jobs so. The fallback looks at the nodes the pod fits "
                     "by CPU and memory at that moment (as the live filter sees only the nodes kube-scheduler "
                     f"sends), so {deepres.metrics['whole_gpu_jobs_bound_fits']:.0f} of those jobs have a bound "
                     "that fits a larger GPU they may use, whose nodes were short of CPU or memory then; the "
                     "replay cannot show the risk this takes (an OOM kill on the smaller GPU), since every job's "
                     "true peak fits the smallest GPU it may use")
    qos_order = [q for q in ("LS", "BE", "Burstable", "Guaranteed") if any(j.qos == q for j in jobs)]
    return ReplayExperiment(outcomes, notes, qos_order, node_stride, len(nodes), gpus)
