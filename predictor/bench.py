"""`deepres bench predictor`: latency and throughput of the shipped predictor on this machine.

Measures one uncached prediction (every call a JobSpec not seen before), one cached prediction
(the same JobSpec again), batch throughput (`predict_many` over distinct JobSpecs, cache off) and
the process's resident memory; prints them and writes `reports/bench-predictor.json`.

`runtime_figures` (also run by `deepres evaluate`) measures what serving costs in a *fresh*
process: whether importing the runtime and predicting pulls in torch, the p99 of an uncached
prediction, and the wall time of a whole `deepres predict -f pod.yaml` command. It goes into
`reports/predictor.json` under `runtime`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from predictor.spec import MODEL_FAMILIES, OPTIMIZERS, PRECISIONS, JobSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per latency figure")
    parser.add_argument("--batch", type=int, default=5000, help="JobSpecs in the throughput batch")
    parser.add_argument("--artifact", type=Path, default=None, help="artifact directory (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic JobSpecs")
    parser.add_argument("--report", default=str(REPO_ROOT / "reports" / "predictor.json"),
                        help="also write the fresh-process runtime figures under `runtime` in this report "
                             "(default: %(default)s; '' skips)")


REPO_ROOT = Path(__file__).resolve().parent.parent
#: The pod `deepres predict` is timed on (the README's first example).
EXAMPLE_POD = REPO_ROOT / "deploy" / "examples" / "cnn-small.yaml"

_PROBE = """
import json, os, sys, time
t0 = time.perf_counter()
from predictor.bench import sample_specs
from predictor.runtime import Predictor
p = Predictor.load(sys.argv[1] or None, cache_size=0)
load_s = time.perf_counter() - t0
calls, rounds = int(sys.argv[2]), int(sys.argv[3])
specs = sample_specs(calls * rounds, 7)
for s in specs[:20]:
    p.predict(s)
out = {"imports_torch": "torch" in sys.modules, "load_s": load_s, "nice": os.nice(0), "rounds": []}
for r in range(rounds):
    samples, cpu = [], []
    for s in specs[r * calls:(r + 1) * calls]:
        t, c = time.perf_counter(), time.thread_time()
        p.predict(s)
        samples.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    samples.sort()
    cpu.sort()
    at = min(len(samples) - 1, int(0.99 * len(samples)))
    out["rounds"].append({"p50_ms": samples[len(samples) // 2] * 1e3, "p99_ms": samples[at] * 1e3,
                          "cpu_p99_ms": cpu[at] * 1e3, "loadavg_1m": os.getloadavg()[0]})
print(json.dumps(out))
"""
#: Rounds of uncached predictions the fresh-process probe times (`runtime_figures`).
PROBE_ROUNDS = 5


def runtime_figures(artifact: Path | None = None, calls: int = 1000, rounds: int = PROBE_ROUNDS) -> dict[str, Any]:
    """Serving measured in fresh processes: torch imported or not, p99 of an uncached prediction,
    and the wall time of `deepres predict -f` on the example pod (import, load, parse, predict).

    The probe times `rounds` rounds of `calls` distinct JobSpecs at normal priority. On a machine
    shared with other work a round's wall p99 is mostly how long the scheduler kept the probe off
    the CPU; `p99_ms` is the wall p99 of the quietest round (lowest load) and every round's figures
    are kept (`rounds`), with `cpu_p99_ms` (the CPU time of the same calls, which no neighbour inflates)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    # the probe runs at normal priority even when the caller is niced (`deepres evaluate` runs under
    # `nice -n 19` on a shared machine): the extender serves at normal priority, and a niced probe
    # would measure how long the other processes kept it waiting, not what a prediction costs
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(artifact or ""), str(calls), str(rounds)],
                           capture_output=True, text=True, env=env, timeout=600, check=False,
                           preexec_fn=_normal_priority)
    if probe.returncode != 0:
        raise RuntimeError(f"the runtime probe failed: {probe.stderr.strip()[-500:]}")
    figures: dict[str, Any] = json.loads(probe.stdout.strip().splitlines()[-1])
    command = [sys.executable, "-m", "extender.cli", "predict", "-f", str(EXAMPLE_POD)]
    if artifact is not None:
        command += ["--artifact", str(artifact)]
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False,
                              preexec_fn=_normal_priority)
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"deepres predict failed: {done.stderr.strip()[-500:]}")
    per_round = [{k: round(float(v), 4) for k, v in r.items()} for r in figures["rounds"]]
    quietest = min(per_round, key=lambda r: (r["loadavg_1m"], r["p99_ms"]))
    return {
        "imports_torch": bool(figures["imports_torch"]),
        "p50_ms": quietest["p50_ms"],
        "p99_ms": quietest["p99_ms"],
        # the CPU time of the same calls: what a prediction costs when the process is not descheduled
        "cpu_p99_ms": quietest["cpu_p99_ms"],
        "loadavg_1m": quietest["loadavg_1m"],
        "p99_ms_worst_round": max(r["p99_ms"] for r in per_round),
        "rounds": per_round,
        "probe_nice": int(figures["nice"]),  # the probe's priority (0: normal, as the extender serves)
        "load_s": round(float(figures["load_s"]), 3),
        "predict_cli_wall_s": round(sorted(walls)[1], 3),  # the median of 3 runs
        "calls": calls,
        "method": f"fresh process at nice {int(figures['nice'])}; {rounds} rounds of {calls} uncached predictions "
                  "of distinct JobSpecs; p50/p99/cpu_p99 of the round with the lowest 1-minute load average "
                  "(all rounds under `rounds`); `deepres predict -f` wall: median of 3 runs",
    }


def _normal_priority() -> None:
    """Raise the child back to nice 0 where allowed (root, or a caller that was never niced); else keep it."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def write_runtime_section(report: Path, figures: dict[str, Any]) -> None:
    """Merge the runtime figures into reports/predictor.json (the rest of it stays as evaluate wrote it)."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        data = {}
    data["runtime"] = figures
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(data, indent=2) + "\n")


def sample_specs(n: int, seed: int) -> list[JobSpec]:
    """n distinct, realistic JobSpecs (deterministic by seed)."""
    rng = np.random.default_rng(seed)
    specs: list[JobSpec] = []
    for i in range(n):
        family = str(rng.choice(MODEL_FAMILIES))
        vision = family in ("cnn", "resnet", "vit")
        specs.append(JobSpec(
            model_type=family,
            params_millions=round(float(np.exp(rng.uniform(np.log(0.5), np.log(1500)))), 2) + i * 1e-6,
            batch_size=int(2 ** rng.integers(0, 9)),
            input_dim=int(rng.choice([32, 64, 128, 224]) if vision else rng.choice([64, 128, 256, 512, 1024])),
            num_layers=int(rng.integers(2, 24)),
            precision=str(rng.choice(PRECISIONS)),
            optimizer=str(rng.choice(OPTIMIZERS)),
        ))
    return specs


def _percentiles_ms(samples: list[float]) -> tuple[float, float]:
    arr = np.asarray(samples) * 1e3
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def _rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(args: argparse.Namespace) -> int:
    from predictor.errors import UsageError
    from predictor.runtime import ArtifactError, Predictor

    if args.calls < 10 or args.batch < 1:
        raise UsageError("--calls must be >= 10 and --batch >= 1")
    try:
        predictor = Predictor.load(args.artifact, cache_size=args.calls + 10)
    except ArtifactError as err:
        print(f"deepres bench predictor: {err}")
        return 1
    specs = sample_specs(args.calls, args.seed)
    for spec in specs[:50]:  # warm-up: first calls pay for lazy initialisation
        predictor.predict(spec)
    predictor.cache_clear()

    uncached = []
    for spec in specs:
        start = time.perf_counter()
        predictor.predict(spec)
        uncached.append(time.perf_counter() - start)
    cached = []
    one = specs[0]
    for _ in range(args.calls):
        start = time.perf_counter()
        predictor.predict(one)
        cached.append(time.perf_counter() - start)

    batch_specs = sample_specs(args.batch, args.seed + 1)
    uncached_predictor = predictor.with_cache_size(0)
    start = time.perf_counter()
    uncached_predictor.predict_many(batch_specs)
    batch_seconds = time.perf_counter() - start

    u50, u99 = _percentiles_ms(uncached)
    c50, c99 = _percentiles_ms(cached)
    figures: dict[str, Any] = {
        "uncached_p50_ms": round(u50, 4), "uncached_p99_ms": round(u99, 4),
        "cached_p50_ms": round(c50, 5), "cached_p99_ms": round(c99, 5),
        "batch_per_s": round(len(batch_specs) / batch_seconds, 1), "rss_mib": round(_rss_mib(), 1),
    }
    if args.report:  # a string: Path("") would read as "." and be truthy
        runtime = runtime_figures(args.artifact)
        figures["fresh_process"] = runtime
        write_runtime_section(Path(args.report), runtime)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"predictor {predictor.version} ({args.calls} calls each, batch of {len(batch_specs)})")
        print(f"  uncached: p50 {u50:.3f} ms  p99 {u99:.3f} ms")
        print(f"  cached:   p50 {c50 * 1000:.1f} µs  p99 {c99 * 1000:.1f} µs")
        print(f"  batch:    {figures['batch_per_s']:,.0f} predictions/s")
        print(f"  RSS:      {figures['rss_mib']:.0f} MiB")
        if "fresh_process" in figures:
            fresh = figures["fresh_process"]
            print(f"  fresh process: imports torch {fresh['imports_torch']}, p99 {fresh['p99_ms']:.3f} ms, "
                  f"`deepres predict -f` {fresh['predict_cli_wall_s']:.2f} s wall")
            print(f"wrote {out} and the `runtime` section of {args.report}")
        else:
            print(f"wrote {out}")
    return 0
