"""`deepres bench predictor`: latency and throughput of the shipped predictor on this machine.

Measures one uncached prediction (every call a JobSpec not seen before), one cached prediction
(the same JobSpec again), batch throughput (`predict_many` over distinct JobSpecs, cache off) and
the process's resident memory; prints them and writes `reports/bench-predictor.json`.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np

from predictor.spec import MODEL_FAMILIES, OPTIMIZERS, PRECISIONS, JobSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per latency figure")
    parser.add_argument("--batch", type=int, default=5000, help="JobSpecs in the throughput batch")
    parser.add_argument("--artifact", type=Path, default=None, help="artifact directory (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic JobSpecs")


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
    from extender.cli import UsageError
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
    figures = {
        "uncached_p50_ms": round(u50, 4), "uncached_p99_ms": round(u99, 4),
        "cached_p50_ms": round(c50, 5), "cached_p99_ms": round(c99, 5),
        "batch_per_s": round(len(batch_specs) / batch_seconds, 1), "rss_mib": round(_rss_mib(), 1),
    }
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
        print(f"wrote {out}")
    return 0
