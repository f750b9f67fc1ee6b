"""`deepres report plots`: the docs' pictures, drawn from reports/ (and the measured rows a report names).

- docs/img/queueing-vs-load.png: queueing delay and bounded slowdown against load per policy, from
  reports/simulation.json `capacity` (per-rate, per-policy rows) when the report has it, else the compute
  replay's load sweep (`replay.gpu_bound_sweep`: p95 queueing delay and mean JCT), said in the title;
- docs/img/memory-predicted-vs-measured.png: each prediction path's Demand against the NVML peak
  measured on the real GPU (predictor/data/measured/*.csv, the rows of reports/predictor.json `realjobs`);
- docs/img/interference-model.png: the interference model's predicted speed of each co-located job
  against the measured one (reports/interference.json, leave-one-group-out), beside the 1/n rule.

matplotlib is in the `train` extra: the serving install does not draw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devtools import plotsource
from predictor.progress import progress

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
IMG = ROOT / "docs" / "img"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _num(key: str) -> float:
    """'1.5x' -> 1.5 (the sweep's load keys)."""
    return float(key.rstrip("x"))


def capacity_series(capacity: Any) -> tuple[dict[str, list[tuple[float, float, float]]], str, str]:
    """{policy: [(rate, queueing delay, bounded slowdown)]} from `capacity` rows, and the two metric names.

    Rows are dicts with a rate, a policy and metrics; the names are found by their words (`rate`,
    `policy`, `queue`, `slowdown`), preferring p95 queueing delay and the mean bounded slowdown.
    """
    rows = capacity.get("rows") if isinstance(capacity, dict) else capacity
    if rows is None and isinstance(capacity, dict):  # reports/simulation.json: {dist: {per_rate: {rate: {policy}}}}
        rows = [{"rate": _num(rate), "policy": f"{dist} {policy}", "p95_queue_s": m["p95_wait_s"],
                 "mean_bounded_slowdown": m["mean_bounded_slowdown"]}
                for dist, d in capacity.items() if isinstance(d, dict) and "per_rate" in d
                for rate, by_policy in d["per_rate"].items() for policy, m in by_policy.items()]
    if not isinstance(rows, list) or not rows:
        raise ValueError("capacity has no rows")
    keys = list(rows[0])

    def pick(words: Sequence[str], prefer: str) -> str:
        found = [str(k) for k in keys if all(w in str(k) for w in words)]
        if not found:
            raise ValueError(f"capacity rows have no {'/'.join(words)} column (keys: {keys})")
        return next((k for k in found if prefer in k), found[0])

    rate, policy = pick(["rate"], "arrival"), pick(["policy"], "policy")
    queue, slowdown = pick(["queue"], "p95"), pick(["slowdown"], "mean")
    series: dict[str, list[tuple[float, float, float]]] = {}
    for row in rows:
        series.setdefault(str(row[policy]), []).append((float(row[rate]), float(row[queue]), float(row[slowdown])))
    return {p: sorted(v) for p, v in series.items()}, queue, slowdown


def plot_load(out: Path, report: dict[str, Any]) -> str:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if "capacity" in report:
        series, queue, slowdown = capacity_series(report["capacity"])
        for name, points in series.items():
            rates = [p[0] for p in points]
            left.plot(rates, [p[1] / 60 for p in points], marker="o", label=name)
            right.plot(rates, [p[2] for p in points], marker="o", label=name)
        left.set(xlabel="arrival rate", ylabel=f"{queue} (min)", yscale="log")
        right.set(xlabel="arrival rate", ylabel=slowdown, yscale="log")
        note = "capacity experiment (reports/simulation.json `capacity`)"
    else:
        sweep = report["replay"]["gpu_bound_sweep"]
        loads = sorted(sweep, key=_num)
        policies = [p for p in sweep[loads[0]] if isinstance(sweep[loads[0]][p], dict) and "p95_queue_s" in
                    sweep[loads[0]][p]]
        for name in policies:
            have = [k for k in loads if name in sweep[k]]
            left.plot([_num(k) for k in have], [sweep[k][name]["p95_queue_s"] / 3600 for k in have], marker="o",
                      label=name)
            right.plot([_num(k) for k in have], [sweep[k][name]["mean_jct_s"] / 3600 for k in have], marker="o",
                       label=name)
        left.set(xlabel="load (x the rate that keeps static whole-GPU FIFO 85% held)", ylabel="p95 queueing delay (h)")
        right.set(xlabel="load (x the same rate)", ylabel="mean JCT (h)")
        note = "compute replay's load sweep (no `capacity` in the report yet: bounded slowdown not measured)"
    for axis in (left, right):
        axis.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle(f"Queueing against load per policy: {note}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return note


def memory_points() -> dict[str, list[tuple[float, float, str, str]]]:
    """{path: [(predicted MiB, measured MiB, precision, GPU)]} on the measured rows (shipped Demands)."""
    from predictor import realjobs

    rows = realjobs.measured()
    exact_d, family_d = realjobs.demands(rows)
    points: dict[str, list[tuple[float, float, str, str]]] = {}
    for path, found in (("exact (deepres.io/model)", exact_d), ("family annotations", family_d)):
        points[path] = [(float(d.memory_mib), float(r["nvml_process_peak_mib"]), r["precision"], r["gpu"])
                        for r, d in zip(rows, found, strict=True) if d is not None]
    return points


def plot_memory(out: Path, points: dict[str, list[tuple[float, float, str, str]]]) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(points), figsize=(5.5 * len(points), 4.6), squeeze=False)
    gpus = sorted({p[3] for path in points.values() for p in path})
    for axis, (path, pts) in zip(axes[0], points.items(), strict=True):
        for precision in sorted({p[2] for p in pts}):
            chosen = [p for p in pts if p[2] == precision]
            axis.scatter([p[1] for p in chosen], [p[0] for p in chosen], s=9, alpha=0.6, label=precision)
        top = max(max(p[0], p[1]) for p in pts) * 1.1
        axis.plot([100, top], [100, top], color="black", lw=0.8, label="predicted = measured")
        axis.set(xscale="log", yscale="log", xlabel="measured NVML peak (MiB)", ylabel="predicted (MiB)",
                 title=f"{path}: {len(pts)} jobs")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(f"Predicted against measured peak GPU memory on {', '.join(gpus)} (shipped predictor)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return ", ".join(f"{k}: {len(v)}" for k, v in points.items())


def plot_interference(out: Path, report: dict[str, Any]) -> str:
    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(5.8, 5))
    model, naive = [], []
    for group in report["leave_one_group_out"]["per_group"]:
        members = group["members"]
        for m in members:
            model.append((m["measured_fraction"], m["predicted_fraction"]))
            naive.append((m["measured_fraction"], 1.0 / len(members)))
    axis.scatter([m for m, _ in naive], [p for _, p in naive], marker="x", color="grey", label="1/n rule")
    axis.scatter([m for m, _ in model], [p for _, p in model], label="interference model (held-out group)")
    axis.plot([0, 1.05], [0, 1.05], color="black", lw=0.8)
    axis.set(xlim=(0, 1.05), ylim=(0, 1.05), xlabel="measured speed (fraction of alone)",
             ylabel="predicted speed (fraction of alone)",
             title=f"{report['groups']} co-location groups, {len(model)} jobs")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return f"{len(model)} jobs in {report['groups']} groups"


def draw_all(reports: Path = REPORTS, img: Path = IMG) -> dict[str, str]:
    """Every plot: {file: what it shows}. A plot whose input is missing is skipped with the reason."""
    img.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, Callable[[Path], str]]] = [
        ("queueing-vs-load.png", lambda out: plot_load(out, _read(reports / "simulation.json"))),
        ("interference-model.png", lambda out: plot_interference(out, _read(reports / "interference.json"))),
        ("memory-predicted-vs-measured.png", lambda out: plot_memory(out, memory_points())),
    ]
    done: dict[str, str] = {}
    for name, draw in progress(jobs, desc="plots", unit="plot"):
        try:
            done[name] = draw(img / name)
            # what it was drawn from, in the PNG: tests/unit/test_plot_sources.py catches a plot older than it
            plotsource.stamp(img / name, plotsource.SOURCES[name](reports))
        except (FileNotFoundError, KeyError, ValueError) as err:
            done[name] = 'skipped: ' + re.sub(r'\s+', ' ', str(err))
    return done


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
