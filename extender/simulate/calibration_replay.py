"""The `online_calibration` figure: a GPU model that keeps more per process than the predictor's lines
(e.g. +700 MiB: another driver, CUDA or framework) replayed through `extender.policy.calibration`.

The campaign's measured exact-path jobs (predictor/data/measured/, the rows the traced table
answers) arrive one pod at a time in a seeded order on a GPU model the predictor was never
calibrated on; each observed peak is the measured one plus `extra_mib`. Each pod is admitted with
the exact path's bound shifted by the offset learned from the pods observed before it (none until
MIN_PODS). Figures: the under-rate of the bound on the pods after the first `after` observed
pods, without and with the learner. `python -m extender.simulate.calibration_replay` merges the key into
reports/predictor.json.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

REPORT = Path(__file__).resolve().parents[2] / "reports" / "predictor.json"


def exact_jobs() -> list[tuple[float, float, float]]:
    """(predicted point, bound, measured peak) MiB of every measured job the traced table answers."""
    from predictor import exact
    from predictor.dataset import campaign
    from predictor.spec import SpecError

    out = []
    for table in sorted(campaign.MEASURED_DIR.glob("*.csv")):
        for r in campaign.read_table(table):
            try:
                e = exact.estimate(r["name"], int(r["batch_size"]), int(r["input_dim"]), r["precision"],
                                   r["optimizer"])
            except (SpecError, KeyError):
                continue
            out.append((e.memory_mib, e.memory_mib_upper, float(r["nvml_process_peak_mib"])))
    return out


#: Nodes the pods are spread over, round robin (the calibration learns from 3 agreeing nodes at least).
NODES = 4


def replay(jobs: list[tuple[float, float, float]], extra_mib: float, after: int = 20, seed: int = 0,
           gpu: str = "NVIDIA A100-SXM4-40GB", image: str = "driver-550") -> dict[str, Any]:
    from extender.policy import calibration

    order = list(range(len(jobs)))
    random.Random(seed).shuffle(order)
    seen: list[calibration.Observation] = []
    under_static = under_learned = counted = 0
    ratios: list[float] = []
    offsets_at_after = 0.0
    for step, i in enumerate(order):
        point, upper, peak = jobs[i]
        observed = peak + extra_mib
        offsets = calibration.learn(seen)
        bound = calibration.corrected(point, upper, offsets, (gpu, image, "exact")).memory_mib_upper
        if step >= after:
            counted += 1
            under_static += upper < observed
            under_learned += bound < observed
            ratios.append(bound / observed)
        if step == after:
            learned = offsets.get((gpu, image, "exact"))
            offsets_at_after = learned.shift if learned is not None else 1.0
        seen.append(calibration.Observation(f"pod-{i}", f"node-{step % NODES}", gpu, image, "exact", point,
                                            observed, float(step), upper))
    return {"extra_mib": extra_mib, "after_pods": after, "pods_scored": counted, "seed": seed,
            "under_rate_without": round(under_static / counted, 4),
            "under_rate_with": round(under_learned / counted, 4),
            "median_bound_ratio_with": round(sorted(ratios)[len(ratios) // 2], 4),
            "shift_learned_at_after": offsets_at_after}


def figure(extra_mib: float = 700.0, after: int = 20, seeds: int = 5) -> dict[str, Any]:
    jobs = exact_jobs()
    runs = [replay(jobs, extra_mib, after, seed) for seed in range(seeds)]
    return {"extra_mib": extra_mib, "after_pods": after, "jobs": len(jobs), "seeds": seeds,
            "under_rate_without": max(r["under_rate_without"] for r in runs),
            "under_rate_with": max(r["under_rate_with"] for r in runs),
            "median_bound_ratio_with": max(r["median_bound_ratio_with"] for r in runs), "runs": runs,
            "method": "measured exact-path jobs in a seeded order on an uncalibrated GPU whose processes keep "
                      f"{extra_mib:g} MiB more; each bound calibrated by extender.policy.calibration "
                      f"learned from the pods observed before it; under-rates on the pods after the first {after} "
                      f"(the worst of {seeds} seeds)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extender.simulate.calibration_replay",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--extra-mib", type=float, default=700.0)
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    result = figure(args.extra_mib)
    data = json.loads(args.report.read_text()) if args.report.exists() else {}
    data["online_calibration"] = result
    args.report.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
