"""The capacity experiment's world (issue 33): a world that is not the policy's forecaster.

What the replay (`replay.simulate(..., world=World(...))`) does differently in it:

- Interference: a co-located job's true step-rate fraction is the fitted model's prediction
  (`policy.interference.step_rate_fractions` over the true duties) raised to a per-job exponent
  `Job.interference_k` = ln(measured) / ln(predicted) of a row drawn from the model's held-out
  residuals (the leave-one-group-out of `simulate.interference.build_report` on
  ../shared/data/colocation). The exponent keeps a lone job at full speed and a nearly idle partner
  nearly harmless, and reproduces each measured row's error where it was measured. The policy
  forecasts with the model itself: `same_interference_model` is false.
- Duty: per job (not per signature), drifting (`TICK_S` apart, an AR(1) log factor on its base duty);
  the policy learns it only from noisy NVML-like samples (busy share while sharing, +-`SAMPLE_NOISE`,
  whole percent), turned into alone duties by the live rule (`duty.alone_duties`).
- Declarations: a share of the pods that declare a `gpu-share` declare less than their real duty.
- Evictions and OOM kills cost the progress since the job's last checkpoint (all of it without a
  declared interval) plus a restart (`preemption.RESTART_S`); OOM-killed jobs restart as often as
  it takes (never dropped) and a job that never completes counts (failure rate; its JCT is the
  time until the end of the run, a lower bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from extender.policy.interference import SHARED_SERVICE, step_rate_fractions
from extender.policy.preemption import RESTART_S
from extender.simulate.world import Job

#: Seconds between a running job's duty drifting and the agent's sample of it.
TICK_S = 1800.0
#: The drift: log factor x <- DRIFT_KEEP x + N(0, DRIFT_SD), duty = base x e^x (in [DUTY_FLOOR, 1]).
DRIFT_KEEP = 0.8
DRIFT_SD = 0.15
DUTY_FLOOR = 0.005
#: NVML-like sample: the busy share +- this (sd), rounded to whole percent.
SAMPLE_NOISE = 0.02
#: Share of the pods declaring a gpu-share whose real duty is above it, and by how much (x U(lo, hi)).
UNDER_DECLARED = 0.25
UNDER_FACTOR = (1.5, 3.0)
#: Share of jobs declaring a checkpoint interval, and the intervals (wall seconds) they declare.
CHECKPOINTING = 0.5
CHECKPOINT_INTERVALS = (900.0, 1800.0, 3600.0)


@dataclass
class World:
    """The world's own randomness and rules; the replay calls it, the policy never sees it."""

    seed: int
    residual_k: Sequence[float]
    restart_s: float = RESTART_S
    tick_s: float = TICK_S
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed + 33_000)
        if not self.residual_k:
            raise ValueError("the world needs at least one held-out residual")

    def fractions(self, jobs: Sequence[Job]) -> tuple[float, ...]:
        """The true step-rate fractions of `jobs` sharing one GPU (alone: full speed)."""
        if len(jobs) <= 1:
            return (1.0,) * len(jobs)
        predicted = step_rate_fractions([j.duty for j in jobs])
        return tuple(min(1.0, f ** j.interference_k) for f, j in zip(predicted, jobs, strict=True))

    def drift(self, job: Job) -> None:
        job.drift = DRIFT_KEEP * job.drift + float(self.rng.normal(0.0, DRIFT_SD))
        job.duty = min(max(job.base_duty * math.exp(job.drift), DUTY_FLOOR), 1.0)

    def sample(self, jobs: Sequence[Job], fractions: Sequence[float]) -> dict[str, float]:
        """The agent's busy-share samples (NVML per-process, whole percent) of `jobs` on one GPU
        running at `fractions`: busy = s x f x duty when shared (duty alone), plus noise."""
        scale = SHARED_SERVICE if len(jobs) > 1 else 1.0
        out = {}
        for job, f in zip(jobs, fractions, strict=True):
            busy = scale * f * job.duty + float(self.rng.normal(0.0, SAMPLE_NOISE))
            out[str(job.idx)] = round(min(max(busy, 0.0), 1.0), 2)
        return out

    def lose(self, job: Job, now: float) -> None:
        """A stop that is not a finish (eviction, OOM kill): the job keeps the work of its last
        checkpoint (wall-clock checkpoints every `checkpoint_s` since this run's start; none
        declared: it starts over) and pays a restart. `work_left` must be settled to `now`."""
        done = job.duration - job.work_left
        ran = max(now - job.start, 0.0)
        this_run = max(done - job.kept_s, 0.0)
        if job.checkpoint_s and ran > 0.0:
            since = ran % job.checkpoint_s
            lost = this_run * since / ran
            job.kept_s = max(done - lost, 0.0)
        else:
            lost = done  # no checkpoint: everything
            job.kept_s = 0.0
        job.lost_gpu_s += (lost + self.restart_s) * max(job.pod.num_gpu, 1)
        job.restarts += 1


def assign(jobs: Sequence[Job], world: World, duty_of: Sequence[float]) -> None:
    """Per job: its true base duty (`duty_of`, already drawn), a declared share below it for
    `UNDER_DECLARED` of the declaring pods, a checkpoint interval for `CHECKPOINTING` of them, and its
    interference exponent (a held-out residual)."""
    rng = np.random.default_rng(world.seed + 34_000)
    for job, duty in zip(jobs, duty_of, strict=True):
        job.base_duty = job.duty = float(duty)
        if job.declared_share is not None:
            job.base_duty = job.duty = job.declared_share
            if rng.random() < UNDER_DECLARED:
                job.base_duty = job.duty = min(1.0, job.declared_share * float(rng.uniform(*UNDER_FACTOR)))
        if rng.random() < CHECKPOINTING:
            job.checkpoint_s = float(CHECKPOINT_INTERVALS[int(rng.integers(len(CHECKPOINT_INTERVALS)))])
        job.interference_k = float(world.residual_k[int(rng.integers(len(world.residual_k)))])


def residual_exponents(report: dict[str, object]) -> list[float]:
    """ln(measured) / ln(predicted) of every held-out row of an interference report's
    leave-one-group-out (`simulate.interference.build_report`) where both are below 1."""
    logo = report["leave_one_group_out"]
    assert isinstance(logo, dict)
    out = []
    for group in logo["per_group"]:
        for m in group["members"]:
            measured, predicted = float(m["measured_fraction"]), float(m["predicted_fraction"])
            if 0.0 < measured < 1.0 and 0.0 < predicted < 1.0:
                out.append(math.log(measured) / math.log(predicted))
    return out


#: Bounded slowdown's floor: JCT / max(run time alone, this).
SLOWDOWN_FLOOR_S = 600.0


def capacity_metrics(jobs: Sequence[Job], end_s: float) -> dict[str, float]:
    """The capacity yardstick's figures over every job (none dropped: a job that never completed
    counts with its JCT until `end_s`, a lower bound, and as a failure); beside each JCT figure its
    zero-wait bound (every job alone from its arrival: its run time alone)."""
    if not jobs:
        return {}
    ends = [j.completion if not math.isnan(j.completion) else end_s for j in jobs]
    jct = np.array([e - j.arrival for e, j in zip(ends, jobs, strict=True)])
    alone = np.array([j.duration for j in jobs])
    waits = np.array([j.waited_s + (max(end_s - j.queued_at, 0.0) if j.node < 0 and math.isnan(j.completion)
                                    else 0.0) for j in jobs])
    bounded = jct / np.maximum(alone, SLOWDOWN_FLOOR_S)
    return {
        "failure_rate": round(sum(1 for j in jobs if math.isnan(j.completion)) / len(jobs), 5),
        "mean_wait_s": round(float(waits.mean()), 1),
        "p95_wait_s": round(float(np.percentile(waits, 95)), 1),
        "mean_jct_all_s": round(float(jct.mean()), 1),
        "median_jct_all_s": round(float(np.median(jct)), 1),
        "zero_wait_mean_jct_s": round(float(alone.mean()), 1),
        "zero_wait_median_jct_s": round(float(np.median(alone)), 1),
        "mean_bounded_slowdown": round(float(bounded.mean()), 4),
        "zero_wait_mean_bounded_slowdown": round(float((alone / np.maximum(alone, SLOWDOWN_FLOOR_S)).mean()), 4),
        "lost_gpu_hours": round(sum(j.lost_gpu_s for j in jobs) / 3600.0, 2),
        "restarts": float(sum(j.restarts for j in jobs)),
        # by the trace's class (LS: high criticality, BE: low; the rest normal): what the priority order trades
        **{f"p95_wait_s_{name}": round(float(np.percentile(waits[mask], 95)), 1) if mask.any() else math.nan
           for name, mask in (("ls", np.array([j.qos == "LS" for j in jobs])),
                              ("be", np.array([j.qos == "BE" for j in jobs])))},
    }
