"""One-off diagnoses of the replay, reproducible: what docs/capacity.md cites as "one-off runs".

    python -m devtools.replay_probe capacity --dist philly --seed 44 --rates 0.75 1 1.25 \
        --policies deepres --set max_slowdown_high=1.25        # a live knob, one seed, the capacity world
    python -m devtools.replay_probe slice --seed 44 --policies deepres deepres-point deepres-sized
    python -m devtools.replay_probe calibration --seed 44 --observed 20 50 100 300

`capacity`: the capacity experiment's world (`simulate.capacity`) for one distribution and seed, each
policy at each rate, with policy parameters changed by `--set`; prints p95 queueing over all jobs and
by class (LS, BE). `slice`: the compute replay's default slice (`simulate.compute`, interference on, no
world) for one seed; besides the experiment's policies, two diagnoses that are not policies:
`deepres-point` admits every pod at 1.1x its predicted point (it reads no observation: an upper
bound on what a tighter memory bound could do) and `deepres-sized` counts, in the wait for an empty
GPU, only GPUs that can hold the pod's admission. Both print the jobs that waited longest.
`calibration`: the live calibration (`policy.calibration.learn`) fed the slice's first N jobs as observed
pods (their point and true peak, family path, one GPU model, ten nodes): how many of the other jobs
keep a bound above 16 GiB.

Nothing here writes a report: a figure from it is a diagnosis on one seed, and is cited as such.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from extender.policy import calibration as cal
from extender.policy.duty import admission_duty
from extender.simulate import capacity, capworld, compute, replay
from extender.simulate.adapters import GPU_MEMORY_GB
from extender.simulate.interference import COLOCATION, build_report, load
from extender.simulate.traces import DEFAULT_DATA, Pod, node_list_path, pod_list_path, read_nodes, read_pods
from extender.simulate.world import Job


class PointAdmission(replay.DeepRes):
    """Diagnosis: every pod admitted at 1.1x its predicted point (not a policy: no observation behind it)."""

    name = "deepres-point"

    def admission(self, job: Job) -> float:
        job.admission_duty = admission_duty(job.declared_share, self.duties.get(job.spec_key), self.share_floor)
        return job.predicted_mib * 1.1


class SizedWait(replay.DeepRes):
    """Diagnosis: the wait for an empty GPU counts only GPUs that can hold the pod's admission (since
    issue 46 the policy's own rule, `sharing.can_hold`: this name stays for the probe's command line)."""

    name = "deepres-sized"

    def wait_s(self, job: Job, rows: Sequence[int], now: float, need_mib: float = 0.0) -> float:
        return super().wait_s(job, rows, now, max(need_mib, job.admission_mib))


SLICE_CLASSES: dict[str, type[replay.Strategy]] = {**compute.CLASSES, "deepres-point": PointAdmission,
                                                   "deepres-sized": SizedWait}


def _params(base: Any, sets: Sequence[str]) -> Any:
    for item in sets:
        key, _, value = item.partition("=")
        if not hasattr(base, key):
            raise SystemExit(f"--set {item}: the policy has no parameter {key!r}")
        current = getattr(base, key)
        typed: Any = value.lower() in ("1", "true", "yes") if isinstance(current, bool) else float(value)
        base = dataclasses.replace(base, **{key: typed})
    return base


def _jobs_of_run(run: Any) -> list[Job]:
    """Run `run()` and return the jobs the replay made (its copies of the templates, in order)."""
    made: list[Job] = []
    original = copy.copy

    def recording(x: Any) -> Any:
        y = original(x)
        if isinstance(y, Job):
            made.append(y)
        return y

    copy.copy = recording
    try:
        run()
    finally:
        copy.copy = original
    return made


def _by_class(jobs: Sequence[Job], waited: Any) -> str:
    parts = []
    for qos in ("LS", "BE"):
        waits = sorted(waited(j) for j in jobs if j.qos == qos)
        if waits:
            parts.append(f"{qos} p95 {waits[int(0.95 * (len(waits) - 1))]:,.0f} s")
    return ", ".join(parts)


def probe_capacity(args: argparse.Namespace) -> None:
    pool, _, calibration = compute.load_measured(42)
    trace = read_pods(pod_list_path(Path(args.data), "default"))
    ctx = {"trace": trace, "pool": pool, "calibration": calibration, "count": capacity.JOBS,
           "residual_k": capworld.residual_exponents(build_report(load(COLOCATION)))}
    base, _ = compute.calibrate(trace, pool, calibration, args.seed, capacity.JOBS, lambda line: None)
    params = _params(capacity.capacity_params(), args.set)
    for rate in args.rates:
        for policy in args.policies:
            jobs, world = capacity._jobs(ctx, args.dist, args.seed, base * rate)
            out: list[Any] = []
            made = _jobs_of_run(lambda: out.append(replay.simulate(  # noqa: B023
                capacity.CLASSES[policy], jobs, compute.gpu_bound_nodes(), params, world=world)))  # noqa: B023
            m = out[0].metrics
            print(f"{args.dist} seed {args.seed} x{rate:g} {policy}: p95 queueing {m['p95_wait_s']:,.0f} s "
                  f"({_by_class(made, lambda j: j.waited_s)}), mean bounded slowdown "
                  f"{m['mean_bounded_slowdown']:.2f}, shared jobs {m['shared_jobs']:.0f}")


def _slice(args: argparse.Namespace) -> tuple[list[Job], list[Any]]:
    """The compute replay's default slice for `args.seed`: its jobs and nodes."""
    data = Path(args.data)
    pool, _, calibration = compute.load_measured(42)
    trace = read_pods(pod_list_path(data, "default"))
    nodes = read_nodes(node_list_path(data))[::compute.DEFAULT_STRIDE]
    caps = {n.model: GPU_MEMORY_GB.get(n.model, 16) * compute.MIB_PER_GB for n in nodes}

    def min_cap(pod: Pod) -> float:
        return min(caps[m] for m in ([m for m in caps if not pod.spec or m in pod.spec] or list(caps)))

    return compute.build(trace[:compute.DEFAULT_PODS], pool, calibration, args.seed, min_cap), nodes


def probe_calibration(args: argparse.Namespace) -> None:
    jobs, _ = _slice(args)
    key, limit = ("replay", "", "family"), 16 * compute.MIB_PER_GB
    for n in args.observed:
        seen = [cal.Observation(str(j.idx), f"n{j.idx % 10}", *key, j.predicted_mib, j.true_mib, order=i,
                                upper_mib=j.upper_mib) for i, j in enumerate(jobs[:n])]
        shifts = cal.learn(seen)
        rest = jobs[n:]
        bounds = [cal.corrected(j.predicted_mib, j.upper_mib, shifts, key).memory_mib_upper for j in rest]
        print(f"after {n} observed: {'calibrated' if key in shifts else 'not calibrated'}, bound above 16 GiB for "
              f"{sum(b > limit for b in bounds) / len(rest):.1%} of the other {len(rest)} jobs, median bound / true "
              f"peak {statistics.median(b / j.true_mib for b, j in zip(bounds, rest, strict=True)):.2f}, under it "
              f"{sum(j.true_mib > b for b, j in zip(bounds, rest, strict=True)) / len(rest):.1%}")


def probe_slice(args: argparse.Namespace) -> None:
    jobs, nodes = _slice(args)
    over = [j for j in jobs if j.upper_mib > 16 * compute.MIB_PER_GB]
    print(f"seed {args.seed}: {len(jobs)} jobs on {sum(n.gpus for n in nodes)} GPUs; bound above 16 GiB: "
          f"{len(over)}, of which the true peak fits 16 GiB: {sum(j.true_mib <= 16 * compute.MIB_PER_GB for j in over)}"
          f"; median bound / true peak {statistics.median(j.upper_mib / j.true_mib for j in jobs):.2f}")
    params = _params(compute.COMPUTE_PARAMS, args.set)
    for policy in args.policies:
        out: list[Any] = []
        made = _jobs_of_run(lambda: out.append(replay.simulate(  # noqa: B023
            SLICE_CLASSES[policy], jobs, nodes, params, interference=True)))  # noqa: B023
        m = out[0].metrics

        def waited(j: Job) -> float:
            return j.start - j.arrival if not math.isnan(j.start) else math.inf

        print(f"{policy}: mean JCT {m['mean_jct_s']:,.0f} s, p95 queue {m['p95_queue_s']:,.0f} s, "
              f"{sum(waited(j) > 86_400 for j in made)} jobs waited more than a day ({_by_class(made, waited)})")
        for j in sorted(made, key=lambda j: -waited(j))[:args.longest]:
            print(f"  waited {waited(j):,.0f} s: {j.pod.num_gpu} GPU(s), {j.qos}, run {j.duration:,.0f} s, "
                  f"admitted {j.admission_mib:,.0f} MiB (true peak {j.true_mib:,.0f})")


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The probe's command line: the parser, and each probe's own (their flags, for the docs check)."""
    parser = argparse.ArgumentParser(prog="python -m devtools.replay_probe", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="probe", required=True)
    out = {"": parser}
    for name in ("capacity", "slice", "calibration"):
        p = out[name] = sub.add_parser(name)
        p.add_argument("--seed", type=int, default=44)
        p.add_argument("--data", default=str(DEFAULT_DATA), help="the openb trace folder")
        p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="policy parameters changed")
        if name == "capacity":
            p.add_argument("--dist", choices=sorted(capacity.DISTRIBUTIONS), default="philly")
            p.add_argument("--rates", type=float, nargs="+", default=[1.0])
            p.add_argument("--policies", nargs="+", choices=sorted(capacity.CLASSES), default=["deepres"])
        elif name == "slice":
            p.add_argument("--policies", nargs="+", choices=sorted(SLICE_CLASSES), default=["deepres"])
            p.add_argument("--longest", type=int, default=5, help="the longest waiters listed per policy")
        else:
            p.add_argument("--observed", type=int, nargs="+", default=[20, 50, 100, 300],
                           help="how many of the slice's first jobs the calibration observes")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parsers()[""].parse_args(argv)
    {"capacity": probe_capacity, "slice": probe_slice, "calibration": probe_calibration}[args.probe](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
