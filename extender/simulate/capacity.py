"""The capacity experiment (issue 33): more work on the same GPUs at the same service.

    deepres simulate --experiment capacity [--seeds 5] [--quick]   # reports/simulation.json "capacity"

The load is the compute replay's GPU-bound one (`compute.gpu_bound_pods`: the openb default trace's
GPU pods, their GPUs, shares, classes and run times, arriving as a Poisson process on 8 nodes x 8
H100s) at multiples of the rate at which static holds 85 % of the GPUs (`compute.calibrate`, per
seed), in the world of `simulate.capworld` (not the policy's forecaster). Per distribution of GPU
duty, seed and policy every rate of the grid `RATES` is run (issue 46: no early stop, so the
bounded-slowdown capacities and the never-worse checks are not truncated); only the memory-only
ablation, not a compared policy, stops at `MEMORY_MAX_RATE`. `JOBS` jobs per run (>= 1,000: one OOM
kill is 0.1 %). Beside each result, the oracle ceiling: DeepRes told every job's true duty
(`OracleDeepRes`), what better duty knowledge could gain at most.

Capacity: the highest rate of the grid at which the p95 queueing delay is <= `WAIT_BOUND_S` (and,
given beside it, the highest with mean bounded slowdown <= `BSLD_BOUND`). Queueing delay: time in
the queue, first placement and every re-queue after an eviction or OOM kill (the backoff included).
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from extender.policy import PodRequest, PolicyParams, PriorityInputs
from extender.policy.preemption import arrival_kind
from extender.provenance import params_hash
from extender.settings import PolicySettings
from extender.simulate import capworld, compute, measuredworld, replay
from extender.simulate.adapters import GPU_MEMORY_GB
from extender.simulate.traces import pod_list_path, read_pods
from predictor.progress import Bar, say

RATES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
POLICIES = ("static", "static-sjf", "static-priority", "request", "deepres", "deepres-memory", "deepres-one-class",
            "deepres-oracle")
WAIT_BOUND_S = 1800.0
#: Memory-only co-location (the opt-in ablation) is measured up to this rate: its runs are the slowest
#: (every GPU shared, rates moving at each change) and its cost shows at the lowest rates already.
MEMORY_MAX_RATE = 1.0
BSLD_BOUND = 2.0
JOBS = 1000
QUICK_JOBS = 150
#: PAI-like duty: lognormal with the trace's median (1.5 %) and a mean near 10 % (sigma 1.95), in
#: [DUTY_FLOOR, 1]. Philly-like: Beta(2, 1.85) (mean 0.52), as the compute replay (assumed).
PAI_MEDIAN = 0.015
PAI_SIGMA = 1.95
DISTRIBUTIONS = {
    "pai": {"draw": "lognormal(ln 0.015, 1.95) clipped to [0.005, 1]",
            "source": "Alibaba PAI 2020, cluster-trace-gpu-v2020 (github.com/alibaba/clusterdata), pai_sensor_table "
                      "gpu_wrk_util per instance: mean near 10 %, median near 1.5 %; Weng et al., \"MLaaS in the Wild: "
                      "Workload Analysis and Scheduling in Large-Scale Heterogeneous GPU Clusters\", NSDI 2022",
            "verified": "published statistics of the trace as stated in issue 33 (mean ~10 %, median ~1.5 %); the "
                        "lognormal shape is ours"},
    "philly": {"draw": "Beta(2, 1.85) (mean 0.52)",
               "source": "Microsoft Philly, Jeon et al., \"Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN "
                         "Training Workloads\", USENIX ATC 2019",
               "verified": "assumed: the mean 0.52 (1-GPU jobs' mean utilisation) could not be verified from the paper "
                           "here; the shape is assumed"},
}


class LiveDeepRes(replay.DeepRes):
    """DeepRes as the live default places: a declared gpu-share counts only down to the default share
    floor (`PolicySettings.default_gpu_share_floor`) until its signature's duty is observed. This world's
    declarations are not all truthful (`capworld.UNDER_DECLARED`): trusting them would be an oracle."""

    share_floor = PolicySettings().default_gpu_share_floor


class OneClassDeepRes(LiveDeepRes):
    """Ablation: DeepRes as the live default, every pod of one criticality (normal) and without a deadline,
    so its queue is ordered by predicted size alone: separates what sharing gains from what the
    criticality order trades (high-criticality pods first, best-effort ones wait)."""

    name = "deepres-one-class"

    def inputs(self, job: replay.Job) -> PriorityInputs:
        return replace(super().inputs(job), criticality=1, deadline_s=None)

    def kind(self, job: replay.Job) -> str:
        return arrival_kind(1, job.pod.num_gpu)


class OracleDeepRes(LiveDeepRes):
    """The oracle ceiling (not a policy: it reads the world's truth): DeepRes told every job's true
    current duty (its admission's and every resident's), declarations and samples ignored. What the
    default gets of it is what better duty knowledge could still gain."""

    name = "deepres-oracle"

    def admission(self, job: replay.Job) -> float:
        admitted = super().admission(job)
        job.admission_duty = job.duty
        return admitted

    def _duty_of(self, j: int) -> float:
        return self.jobs[j].duty

    def request(self, job: replay.Job, now: float) -> PodRequest:
        return replace(super().request(job, now), duty=job.duty)

    def on_sample(self, job: replay.Job, busy: dict[str, float], now: float) -> bool:
        if job.node >= 0:  # its duty drifted: the node's views show the new truth
            self.c.version[job.node] += 1
        return False


class FeedbackDeepRes(LiveDeepRes):
    """DeepRes as the live default with sharing's feedback on (`policy.feedback`, `PolicySettings.sharing_feedback`):
    a GPU whose shared jobs run slower than their bound (from the world's samples) takes no joiner, its newest
    joiner is moved after `sharing_move_after_s`, and each signature's forecast error widens its later joins."""

    name = "deepres-feedback"

    def __init__(self, cluster: replay.Cluster, jobs: list[replay.Job], params: PolicyParams) -> None:
        super().__init__(cluster, jobs, replace(params, sharing_feedback=True))


#: The policies as this experiment runs them.
CLASSES: dict[str, type[replay.Strategy]] = {**compute.CLASSES, "static-priority": replay.StaticPriority,
                                             "deepres": LiveDeepRes, "deepres-one-class": OneClassDeepRes,
                                             "deepres-oracle": OracleDeepRes, "deepres-feedback": FeedbackDeepRes}


def capacity_params() -> PolicyParams:
    """DeepRes's parameters in this experiment: the live defaults with the sharing rule on."""
    return replace(PolicySettings().params(), sharing=True)


def draw_duties(dist: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 35_000)
    if dist == "pai":
        raw = np.exp(rng.normal(math.log(PAI_MEDIAN), PAI_SIGMA, size=n))
    elif dist == "philly":
        raw = rng.beta(*compute.DUTY_BETA, size=n)
    else:
        raise ValueError(f"unknown duty distribution {dist!r}; expected one of {sorted(DISTRIBUTIONS)}")
    return np.clip(raw, capworld.DUTY_FLOOR, 1.0)


def duty_draw(dist: str) -> Callable[[np.random.Generator], float]:
    """One draw of `dist`'s duty (as `draw_duties`), for a job signature's base duty (`measuredworld`)."""
    if dist == "pai":
        return lambda rng: float(np.clip(math.exp(rng.normal(math.log(PAI_MEDIAN), PAI_SIGMA)), capworld.DUTY_FLOOR, 1))
    if dist == "philly":
        return lambda rng: float(np.clip(rng.beta(*compute.DUTY_BETA), capworld.DUTY_FLOOR, 1.0))
    raise ValueError(f"unknown duty distribution {dist!r}; expected one of {sorted(DISTRIBUTIONS)}")


#: The worlds the experiment can run in: issue 33's (`capworld`) and issue 46's, both ways (`measuredworld`).
WORLDS = ("capworld", *measuredworld.VARIANTS)


def _jobs(ctx: dict[str, Any], dist: str, seed: int, scale: float) -> tuple[list[replay.Job], capworld.World]:
    cap = GPU_MEMORY_GB[compute.GPU_BOUND_MODEL] * compute.MIB_PER_GB
    pods = compute.gpu_bound_pods(ctx["trace"], seed, scale, ctx["count"])
    jobs = compute.build(pods, ctx["pool"], ctx["calibration"], seed, lambda p: cap)
    kind = ctx.get("world", "capworld")
    if kind == "capworld":
        world = capworld.World(seed, ctx["residual_k"])
        capworld.assign(jobs, world, draw_duties(dist, len(jobs), seed).tolist())
        return jobs, world
    world = measuredworld.MeasuredWorld(seed, ctx["residual_k"], tau=ctx["tau"], variant=kind)
    measuredworld.assign_by_signature(jobs, world, duty_draw(dist), seed)
    return jobs, world


KEEP = ("mean_wait_s", "p95_wait_s", "p95_wait_s_ls", "p95_wait_s_be", "mean_jct_all_s", "median_jct_all_s",
        "zero_wait_mean_jct_s", "zero_wait_median_jct_s", "mean_bounded_slowdown", "zero_wait_mean_bounded_slowdown",
        "shared_slowdown_p95", "shared_jobs", "oom_rate", "failure_rate", "gpu_held", "gpu_busy", "preemptions",
        "lost_gpu_hours", "restarts", "sharing_moves")


#: where run_task sends each run's line: ("run", line); set by `run` before its worker processes fork
def _say_run(message: tuple[str, Any]) -> None:
    say(str(message[1]))


_emit: Callable[[tuple[str, Any]], None] = _say_run


def runs_per_task(rates: Sequence[float], policies: Sequence[str]) -> int:
    """The (policy, rate) runs one distribution and seed makes."""
    return sum(1 for policy in policies for rate in rates
               if not (policy == "deepres-memory" and rate > MEMORY_MAX_RATE))


def run_task(task: tuple[str, int, dict[str, Any]]) -> dict[str, Any]:
    """One distribution and seed: calibrate the base rate, then every policy up the rate grid."""
    dist, seed, ctx = task
    started = time.monotonic()
    base, held = compute.calibrate(ctx["trace"], ctx["pool"], ctx["calibration"], seed, ctx["count"],
                                   lambda line: None)
    params = capacity_params()
    out: dict[str, Any] = {"dist": dist, "seed": seed, "base_scale": base, "static_held": held[-1], "runs": {},
                           "jobs": ctx["count"]}
    for policy in ctx["policies"]:
        runs: dict[str, Any] = {}
        for rate in ctx["rates"]:
            if policy == "deepres-memory" and rate > MEMORY_MAX_RATE:
                break
            jobs, world = _jobs(ctx, dist, seed, base * rate)
            t0 = time.monotonic()
            res = replay.simulate(CLASSES[policy], jobs, compute.gpu_bound_nodes(), params, world=world)
            m = res.metrics
            runs[f"{rate:g}"] = {k: m.get(k, math.nan) for k in KEEP}
            _emit(("run", f"capacity {dist} seed {seed} {policy} x{rate:g}: p95 wait {m['p95_wait_s']:,.0f} s, "
                          f"mean bsld {m['mean_bounded_slowdown']:.2f}, OOM {m['oom_rate']:.4f}, shared p95 "
                          f"{m['shared_slowdown_p95']:.3f}, preemptions {m['preemptions']:.0f} "
                          f"({time.monotonic() - t0:.1f} s)"))
        out["runs"][policy] = runs
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def capacity_of(runs: dict[str, Any], key: str, bound: float) -> float:
    """The highest rate run whose `key` is within `bound` (0.0 when none is)."""
    ok = [float(r) for r, m in runs.items() if m[key] <= bound]
    return max(ok, default=0.0)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def aggregate(results: Sequence[dict[str, Any]], dists: Sequence[str], policies: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    never_sjf, never_static, never_prio = True, True, True
    compared = 0
    for dist in dists:
        mine = sorted((r for r in results if r["dist"] == dist), key=lambda r: r["seed"])
        if not mine:
            continue
        doc: dict[str, Any] = {**DISTRIBUTIONS[dist], "seeds": [r["seed"] for r in mine],
                               "base_rate_scale_by_seed": [round(r["base_scale"], 4) for r in mine],
                               "calibration_static_held_by_seed": [round(r["static_held"], 4) for r in mine]}
        draws = draw_duties(dist, 100_000, 0)
        doc["duty_draws"] = {"mean": round(float(draws.mean()), 4), "median": round(float(np.median(draws)), 4)}
        caps = {p: [capacity_of(r["runs"][p], "p95_wait_s", WAIT_BOUND_S) for r in mine] for p in policies}
        caps_b = {p: [capacity_of(r["runs"][p], "mean_bounded_slowdown", BSLD_BOUND) for r in mine] for p in policies}
        doc["capacity_by_seed"] = {p.replace("-", "_"): v for p, v in caps.items()}
        doc["capacity_bounded_slowdown_by_seed"] = {p.replace("-", "_"): v for p, v in caps_b.items()}
        for mine_p, base in (("deepres", "static"), ("deepres", "static-sjf"), ("deepres", "static-priority"),
                             ("deepres-one-class", "static"), ("deepres-one-class", "static-sjf"),
                             ("deepres-oracle", "static"), ("deepres-oracle", "static-sjf"),
                             ("deepres", "deepres-oracle"), ("deepres-one-class", "deepres-oracle")):
            if mine_p not in caps or base not in caps:
                continue
            ratios = [_ratio(d, s) for d, s in zip(caps[mine_p], caps[base], strict=True)]
            ratios_b = [_ratio(d, s) for d, s in zip(caps_b[mine_p], caps_b[base], strict=True)]
            finite = [x for x in ratios if x is not None]
            finite_b = [x for x in ratios_b if x is not None]
            doc[f"{mine_p.replace('-', '_')}_vs_{base.replace('-', '_')}"] = {
                "worst_seed_ratio": min(finite) if finite else None, "by_seed": ratios,
                "bounded_slowdown_worst_seed_ratio": min(finite_b) if finite_b else None,
                "bounded_slowdown_by_seed": ratios_b}
        per_rate: dict[str, Any] = {}
        for rate in sorted({k for r in mine for p in policies for k in r["runs"][p]}, key=float):
            row: dict[str, Any] = {}
            for p in policies:
                present = [r["runs"][p][rate] for r in mine if rate in r["runs"][p]]
                if not present:
                    continue
                fig: dict[str, Any] = {"seeds_run": len(present)}
                for k in KEEP:
                    values = [v[k] for v in present if isinstance(v[k], int | float) and math.isfinite(v[k])]
                    if values:
                        fig[k] = round(statistics.fmean(values), 4)
                        fig[f"{k}_worst"] = round(max(values) if k not in ("gpu_held", "gpu_busy") else min(values), 4)
                row[p.replace("-", "_")] = fig
            per_rate[f"{rate}x"] = row
        doc["per_rate"] = per_rate
        dr = [m for r in mine for m in r["runs"]["deepres"].values()]
        doc["deepres"] = {"max_oom_rate": max(m["oom_rate"] for m in dr),
                          "max_shared_slowdown_p95": max(m["shared_slowdown_p95"] for m in dr),
                          "max_failure_rate": max(m["failure_rate"] for m in dr),
                          "max_preemptions": max(m["preemptions"] for m in dr),
                          "max_lost_gpu_hours": max(m["lost_gpu_hours"] for m in dr),
                          "rates_run": sorted({float(k) for r in mine for k in r["runs"]["deepres"]}),
                          "jobs_per_run": mine[0].get("jobs", 0)}
        worse = _worse_at(mine, "deepres", ("static-sjf", "static"))
        never_sjf = never_sjf and not any(w.startswith("static-sjf ") for w in worse)
        never_static = never_static and not any(w.startswith("static ") for w in worse)
        compared += sum(1 for r in mine for rate in r["runs"]["deepres"] if rate in r["runs"]["static-sjf"])
        doc["deepres_worse_bounded_slowdown_at"] = worse
        if "static-priority" in policies:  # the same order without sharing: does sharing ever hurt?
            doc["deepres_worse_than_static_priority_at"] = _worse_at(mine, "deepres", ("static-priority",))
            never_prio = never_prio and not doc["deepres_worse_than_static_priority_at"]
        if "deepres-one-class" in policies:  # the ablation against the same baseline, same rule
            doc["deepres_one_class_worse_bounded_slowdown_at"] = _worse_at(mine, "deepres-one-class", ("static-sjf",))
        out[dist] = doc
    out["never_worse_than_static_sjf"] = never_sjf
    out["never_worse_than_static"] = never_static
    if "static-priority" in policies:
        out["never_worse_than_static_priority"] = never_prio
    out["comparisons"] = compared
    return out


def _worse_at(results: Sequence[dict[str, Any]], policy: str, bases: Sequence[str]) -> list[str]:
    """`base seed S xR` wherever `policy`'s mean bounded slowdown is above a base's at a rate both ran."""
    return [f"{base} seed {r['seed']} x{rate}" for r in results for rate, m in r["runs"][policy].items()
            for base in bases if (other := r["runs"][base].get(rate)) is not None
            and m["mean_bounded_slowdown"] > other["mean_bounded_slowdown"] + 1e-9]


def _measured_model(world: str, tau: float) -> dict[str, Any]:
    """What `capacity.model` says of a measured world (`measuredworld`): its rule, its fitted context cost
    and its premises with their sources (the keys of issue 33's world below stay, describing that one)."""
    return {"measured_world": {"variant": world, "tau_per_extra_context": tau, "premises": measuredworld.PREMISES,
                               "run_to_run_noise_sd": measuredworld.RUN_NOISE,
                               "context_extra_mib": measuredworld.CONTEXT_EXTRA_MIB,
                               "note": "the interference/duty keys below describe capworld (issue 33's world), "
                                       "which this world replaces for the rates and the duties"}}


def _cache_key(count: int, rates: Sequence[float], policies: Sequence[str], world: str = "capworld") -> str:
    """A hash of the code that decides the figures (policy and simulate sources) and the plan."""
    root = Path(__file__).resolve().parents[1]
    plan: list[Any] = [count, list(rates), list(policies)] + ([world] if world != "capworld" else [])
    digest = hashlib.sha256(json.dumps(plan).encode())
    for path in sorted([*root.joinpath("policy").glob("*.py"), *root.joinpath("simulate").glob("*.py"),
                        root / "settings.py"]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def run(out_dir: Path, data: Path, seeds: Sequence[int], quick: bool = False, workers: int = 2,
        dists: Sequence[str] = ("pai", "philly"), rates: Sequence[float] = RATES,
        policies: Sequence[str] = POLICIES, cache: Path | None = None, write: bool = True,
        colocation: Path | None = None, count: int | None = None,
        log: Callable[[str], None] = say, world: str = "capworld") -> dict[str, Any]:
    """The sweep; merges it into out_dir/simulation.json as "capacity" (other keys kept) and returns it.
    With `cache`, each finished (distribution, seed) is appended there and reused (resumable).
    Progress: one bar over every (distribution, seed, policy, rate) run left, its total known up front
    (a policy's early stop advances it by the runs skipped); each run's line goes to `log`, above it."""
    from extender.simulate.interference import COLOCATION, build_report, load

    started = time.monotonic()
    pool, pool_note, calibration = compute.load_measured(seeds[0])
    trace = read_pods(pod_list_path(data, "default"))
    if world not in WORLDS:
        raise ValueError(f"unknown world {world!r}; expected one of {list(WORLDS)}")
    interference = build_report(load(colocation or COLOCATION))
    residual_k = capworld.residual_exponents(interference)
    tau = measuredworld.fit_tau(measuredworld.measured_rows(interference))
    count = count or (QUICK_JOBS if quick else JOBS)
    ctx = {"trace": trace, "pool": pool, "calibration": calibration, "residual_k": residual_k, "count": count,
           "rates": list(rates), "policies": list(policies), "world": world, "tau": tau}
    key = _cache_key(count, rates, policies, world)
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if cache is not None and cache.is_file():
        for line in cache.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("key") == key:
                done[(rec["result"]["dist"], rec["result"]["seed"])] = rec["result"]
        log(f"capacity: {len(done)} (distribution, seed) results reused from {cache}")
    todo = [(d, s, ctx) for s in seeds for d in dists if (d, s) not in done]  # each seed's both first
    results = list(done.values())

    per_task = runs_per_task(rates, policies)
    bar = Bar(len(todo) * per_task, "capacity runs", unit="run")

    def show(message: tuple[str, Any]) -> None:
        """A run's line (one step of the bar) or a task's end (the runs its early stops skipped)."""
        kind, value = message
        if kind == "skipped":
            bar.advance(int(value))
        else:
            log(str(value))
            bar.advance(1 if kind == "run" else 0)

    def keep(res: dict[str, Any], tell: Callable[[tuple[str, Any]], None]) -> None:
        results.append(res)
        tell(("log", f"capacity: {res['dist']} seed {res['seed']} done in {res['wall_s']:.0f} s "
                     f"({len(results)}/{len(dists) * len(seeds)})"))
        tell(("skipped", per_task - sum(len(runs) for runs in res["runs"].values())))
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            with cache.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"key": key, "result": res}) + "\n")

    global _emit
    before = _emit
    with bar:
        if workers > 1 and len(todo) > 1:
            fork = multiprocessing.get_context("fork")
            lines = fork.SimpleQueue()  # the workers' lines, said here (a child writing stderr tears the bar)
            _emit = lines.put
            def drain() -> None:
                for message in iter(lines.get, None):
                    show(message)

            shower = threading.Thread(target=drain, daemon=True)
            try:
                with fork.Pool(min(workers, len(todo))) as procs:
                    shower.start()  # after the fork: the workers inherit no thread
                    for res in procs.imap_unordered(run_task, todo):
                        keep(res, lines.put)
            finally:
                lines.put(None)
                if shower.is_alive():
                    shower.join()
                _emit = before
        else:
            _emit = show
            try:
                for task in todo:
                    keep(run_task(task), show)
            finally:
                _emit = before
    params = capacity_params()
    result: dict[str, Any] = {
        "yardstick": {"capacity": f"the highest arrival rate (x the rate at which static holds "
                                  f"{compute.TARGET_BUSY:.0%} of the GPUs, per seed) at which the p95 queueing delay "
                                  f"is <= {WAIT_BOUND_S / 60:.0f} min; also given for mean bounded slowdown <= "
                                  f"{BSLD_BOUND:g} (JCT / max(run time alone, {capworld.SLOWDOWN_FLOOR_S / 60:.0f} "
                                  "min))",
                      "rates": list(rates), "wait_bound_s": WAIT_BOUND_S, "bounded_slowdown_bound": BSLD_BOUND,
                      "zero_wait_bound": "zero_wait_* beside each JCT figure: every job alone from its arrival",
                      "early_stop": "none: every policy compared runs every rate of the grid (issue 46); only the "
                                    f"memory-only ablation deepres-memory stops at {MEMORY_MAX_RATE:g}x (its runs are "
                                    "the slowest; it is no compared policy)",
                      "oracle_ceiling": "deepres_oracle: DeepRes told every job's true current duty (an oracle, "
                                        "not a policy); deepres_vs_deepres_oracle is the share of it the default gets",
                      "load": {"nodes": compute.GPU_BOUND_NODES, "gpus_per_node": compute.GPU_BOUND_GPUS,
                               "model": compute.GPU_BOUND_MODEL, "jobs": count}},
        "model": {
            "same_interference_model": False,
            "world": world,
            "duty_per_signature": world != "capworld",
            "context_cost": world != "capworld",
            **(_measured_model(world, tau) if world != "capworld" else {}),
            "interference": "true rate fraction = the model's prediction ** k per job, k = ln(measured)/ln(predicted) "
                            f"of a held-out row of the model's leave-one-group-out ({len(residual_k)} rows, k "
                            f"{min(residual_k):.2f}..{max(residual_k):.2f}, from simulate.interference.build_report "
                            "on ../shared/data/colocation); the policy forecasts with the model itself",
            "duty": f"per job, drifting every {capworld.TICK_S:.0f} s (log factor AR(1): keep {capworld.DRIFT_KEEP}, "
                    f"sd {capworld.DRIFT_SD}); learned by the policy only from NVML-like samples (busy share +- "
                    f"{capworld.SAMPLE_NOISE} sd, whole percent) through duty.alone_duties",
            "under_declared": f"{capworld.UNDER_DECLARED:.0%} of the pods declaring a gpu-share run at x "
                              f"U{capworld.UNDER_FACTOR} of it",
            "eviction_cost": True,
            "eviction_cost_rule": f"a victim (or an OOM-killed job) keeps the work of its last checkpoint "
                                  f"({capworld.CHECKPOINTING:.0%} declare an interval of "
                                  f"{[int(i) for i in capworld.CHECKPOINT_INTERVALS]} s; the others lose all) and pays "
                                  f"a restart of {capworld.World(0, [1.0]).restart_s:.0f} s",
            "failed_jobs_counted": True,
            "failed_jobs_rule": "OOM-killed jobs restart until they finish (no cap); a job that never completes is a "
                                "failure and counts with its JCT until the end of the run",
            "oracle": False,
            "truncated": False,
            "jobs": pool_note,
            "not_modelled": "kube-scheduler's own preemption, input pipelines contending for host CPU, multi-GPU "
                            "communication",
        },
        "deepres_params_hash": params_hash(params),
        "live_default_params_hash": params_hash(PolicySettings().params()),
        "seeds": list(seeds),
        **aggregate(results, [d for d in dists if any(r["dist"] == d for r in results)], policies),
        "wall_s": round(time.monotonic() - started, 1),
        "command": "deepres simulate " + " ".join(sys.argv[2:]),
    }
    if write and not quick:
        from extender.provenance import stamp

        result["provenance"] = stamp(result["command"])
        path = out_dir / "simulation.json"
        report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        report["capacity"] = result
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return result
