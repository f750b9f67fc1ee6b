"""`deepres dataset`: sample training jobs, trace each one, write predictor/data/jobs.csv.

Work file (readable while the generation runs): predictor/dataset/_work/jobs.partial.csv, a CSV
with exactly the columns of jobs.csv (docs/CONTRACTS.md, "Dataset"), one row appended and flushed
per finished job in completion order (not sorted; a job_id may appear twice after a crash, the
last row wins). Its `memory_mib` uses the calibration constants present when the job was traced;
the final jobs.csv recomputes `memory_mib` from `traced_peak_mib` with the final constants.

Why it is built this way:
- deterministic: job i is sampled from its own `random.Random(f"{seed}:{i}")`, so the jobs do not
  depend on the order in which processes finish, on --jobs, or on a restart;
- resumable: job ids already in the work file are skipped; the final file is rebuilt from the
  work file and sorted by job_id (every column but the measured `trace_seconds` is byte-identical
  for the same seed and --n);
- failures are data: a job that raises or exceeds --timeout-s gets status=error and its message;
- parallel over processes (tracing is CPU-bound Python), progress on stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from types import FrameType

from predictor.dataset import calibration, templates, tracing
from predictor.dataset.schema import COLUMNS, UNBOUNDED_BATCH_SHARE
from predictor.progress import progress
from predictor.spec import MODEL_FAMILIES, JobSpec

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "predictor" / "data" / "jobs.csv"
DEFAULT_WORK = calibration.WORK_DIR / "jobs.partial.csv"
DEFAULT_N = 6000


#: Constants used for `memory_mib` in the work file until calibration.json exists (the first look).
FALLBACK_CALIBRATION = calibration.LineFit(context_mib=1441.0, factor=1.28)


@dataclass(frozen=True)
class SamplerLimits:
    """Ranges the sampler draws from (per family where it matters). Smaller limits make smoke runs."""

    max_params_millions: float = 2000.0
    max_layers: int = 96
    max_batch: int = 1024
    max_seq: int = 4096
    max_side: int = 512
    families: tuple[str, ...] = MODEL_FAMILIES


# family -> (params range in millions, depth range): realistic sizes of each kind of model
_FAMILY_PARAMS: dict[str, tuple[float, float]] = {
    "mlp": (0.1, 300.0), "cnn": (0.1, 200.0), "resnet": (0.2, 150.0),
    "rnn": (0.1, 200.0), "lstm": (0.1, 400.0), "gru": (0.1, 400.0),
    "transformer": (1.0, 1500.0), "gpt": (1.0, 2000.0), "vit": (1.0, 1000.0),
}
_FAMILY_LAYERS: dict[str, tuple[int, int]] = {
    "mlp": (1, 16), "cnn": (2, 24), "resnet": (2, 50), "rnn": (1, 8), "lstm": (1, 8), "gru": (1, 8),
    "transformer": (2, 48), "gpt": (2, 96), "vit": (4, 48),
}
_SIDES = (32, 64, 96, 128, 160, 192, 224, 224, 224, 256, 288, 320, 384, 448, 512)
_PRECISIONS = (("fp32", 0.3), ("amp", 0.35), ("fp16", 0.15), ("bf16", 0.2))
_OPTIMIZERS = (("adam", 0.25), ("adamw", 0.3), ("sgd", 0.1), ("momentum", 0.15), ("rmsprop", 0.1), ("adagrad", 0.1))


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _weighted(rng: random.Random, options: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def sample_job(seed: int, job_id: int, limits: SamplerLimits = SamplerLimits()) -> JobSpec:
    """Job `job_id` of the dataset with this seed; depends on nothing else (not on order or --jobs)."""
    rng = random.Random(f"{seed}:{job_id}")
    family = rng.choice(limits.families)
    p_low, p_high = _FAMILY_PARAMS[family]
    p_high = max(p_low * 1.01, min(p_high, limits.max_params_millions))
    l_low, l_high = _FAMILY_LAYERS[family]
    l_high = max(l_low, min(l_high, limits.max_layers))
    if family in ("cnn", "resnet", "vit"):
        input_dim = min(rng.choice(_SIDES), limits.max_side)
    elif family == "mlp":
        input_dim = round(_log_uniform(rng, 16, 16384))
    else:
        input_dim = min(2 ** rng.randint(4, 12) if rng.random() < 0.7 else round(_log_uniform(rng, 16, 4096)),
                        limits.max_seq)
    spec = JobSpec(model_type=family)
    for _ in range(40):  # redraw size and depth until the family can realise the size (param_match)
        params = _sig(_log_uniform(rng, p_low, p_high))
        layers = round(_log_uniform(rng, l_low, l_high))
        spec = JobSpec(model_type=family, params_millions=params, num_layers=layers, input_dim=input_dim)
        if templates.plan(spec).matched:
            break
    batch = _sample_batch(rng, family, input_dim, min(1024, limits.max_batch))
    return replace(
        spec,
        batch_size=batch,
        iterations=int(_sig(_log_uniform(rng, 100, 1_000_000), 2)),
        precision=_weighted(rng, _PRECISIONS),
        optimizer=_weighted(rng, _OPTIMIZERS),
        learning_rate=_sig(_log_uniform(rng, 1e-5, 1e-1), 3),
        regularization=rng.random() < 0.5,
        data_augmentation=rng.random() < (0.5 if family in ("cnn", "resnet", "vit") else 0.15),
    )


def _sample_batch(rng: random.Random, family: str, input_dim: int, max_batch: int) -> int:
    """Per-GPU batch: usually within what such a job would use, sometimes anything in [1, 1024]."""
    if rng.random() < UNBOUNDED_BATCH_SHARE:
        cap = max_batch
    elif family in ("transformer", "gpt"):
        cap = max(1, 65_536 // input_dim)  # tokens per batch
    elif family in ("rnn", "lstm", "gru"):
        cap = max(1, 131_072 // input_dim)
    elif family in ("cnn", "resnet", "vit"):
        cap = max(1, (256 * 224 * 224) // (input_dim * input_dim))  # pixels per batch
    else:
        cap = max_batch
    cap = max(1, min(cap, max_batch))
    batch = _log_uniform(rng, 1, cap + 0.999)
    if rng.random() < 0.7:
        return min(cap, 1 << round(math.log2(batch)))
    return max(1, min(cap, int(batch)))


# ---------------------------------------------------------------------------------------------
# One job


class TraceTimeout(Exception):
    """A trace that took longer than --timeout-s."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise TraceTimeout("trace timed out")


def current_calibration() -> calibration.LineFit:
    try:
        return calibration.calibration_constants()
    except (OSError, ValueError, KeyError):
        return FALLBACK_CALIBRATION


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def spec_columns(spec: JobSpec) -> dict[str, str]:
    return {
        "model_type": spec.model_type, "params_millions": repr(spec.params_millions),
        "batch_size": str(spec.batch_size), "input_dim": str(spec.input_dim), "num_layers": str(spec.num_layers),
        "iterations": str(spec.iterations), "precision": spec.precision, "optimizer": spec.optimizer,
        "learning_rate": repr(spec.learning_rate), "regularization": str(int(spec.regularization)),
        "data_augmentation": str(int(spec.data_augmentation)),
    }


TraceFn = Callable[[JobSpec, templates.Plan], tracing.Trace]


def run_job(job_id: int, seed: int, limits: SamplerLimits, timeout_s: float,
            trace_fn: TraceFn | None = None) -> dict[str, str]:
    """Sample, plan and trace one job; any failure becomes an error row, never an exception."""
    started = time.perf_counter()
    row = dict.fromkeys(COLUMNS, "")
    row.update(job_id=str(job_id), seed=str(seed))
    try:
        spec = sample_job(seed, job_id, limits)
        row.update(spec_columns(spec))
        the_plan = templates.plan(spec)
        row.update(actual_params_millions=f"{the_plan.params_millions:.6f}", param_match=str(int(the_plan.matched)),
                   arch=the_plan.arch_json())
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            result = (trace_fn or tracing.trace_job)(spec, the_plan)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        parts = result.breakdown_mib()
        row.update(traced_peak_mib=_fmt(result.peak_mib), **{f"{k}_mib": _fmt(v) for k, v in parts.items()},
                   memory_mib=_fmt(current_calibration().predict(result.peak_mib)),
                   gflops_per_iteration=f"{result.flops / 1e9:.4f}", status="ok")
    except TraceTimeout:
        row.update(status="error", error=f"trace exceeded {timeout_s:g} s")
    except Exception as err:  # recorded, not fatal: one odd job must not stop the dataset
        row.update(status="error", error=f"{type(err).__name__}: {err}"[:300].replace("\n", " "))
    row["trace_seconds"] = f"{time.perf_counter() - started:.3f}"
    return row


def _worker(args: tuple[int, int, SamplerLimits, float]) -> dict[str, str]:
    return run_job(*args)


# ---------------------------------------------------------------------------------------------
# Work file, progress, final file


def read_rows(path: Path) -> dict[int, dict[str, str]]:
    """Rows of a work file by job_id (the last row of an id wins; a torn last line is ignored)."""
    rows: dict[int, dict[str, str]] = {}
    if not path.exists():
        return rows
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("trace_seconds") in (None, "") or None in row:
                continue  # incomplete line from an interrupted write
            rows[int(row["job_id"])] = row
    return rows


def generate(n: int, seed: int, work: Path, jobs: int, timeout_s: float,
             limits: SamplerLimits = SamplerLimits(), trace_fn: TraceFn | None = None,
             stop_after: int | None = None) -> dict[int, dict[str, str]]:
    """Trace jobs 0..n-1 not yet in `work`, appending each row as it finishes.

    `stop_after` stops after that many new rows (to test resumption); `trace_fn` replaces the
    tracer (tests), which forces the in-process path.
    """
    done = read_rows(work)
    todo = [i for i in range(n) if i not in done]
    if stop_after is not None:
        todo = todo[:stop_after]
    work.parent.mkdir(parents=True, exist_ok=True)
    new_file = not work.exists() or work.stat().st_size == 0
    with open(work, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        if new_file:
            writer.writeheader()
        for row in progress(_results(todo, seed, limits, timeout_s, jobs, trace_fn), "tracing", len(todo), "job"):
            writer.writerow(row)
            handle.flush()
            done[int(row["job_id"])] = row
    return done


def _results(todo: list[int], seed: int, limits: SamplerLimits, timeout_s: float, jobs: int,
             trace_fn: TraceFn | None) -> Iterator[dict[str, str]]:
    if jobs <= 1 or trace_fn is not None or len(todo) <= 1:
        for i in todo:
            yield run_job(i, seed, limits, timeout_s, trace_fn)
        return
    ctx = get_context("fork")
    with ctx.Pool(jobs, maxtasksperchild=100) as pool:
        yield from pool.imap_unordered(_worker, [(i, seed, limits, timeout_s) for i in todo], chunksize=1)


def finalize(rows: dict[int, dict[str, str]], n: int, out: Path, fit: calibration.LineFit) -> list[dict[str, str]]:
    """Write rows 0..n-1 sorted by job_id, `memory_mib` recomputed with the final calibration."""
    final: list[dict[str, str]] = []
    for i in range(n):
        if i not in rows:
            continue
        row = {c: rows[i].get(c, "") for c in COLUMNS}
        if row["status"] == "ok":
            row["memory_mib"] = _fmt(fit.predict(float(row["traced_peak_mib"])))
        final.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(final)
    os.replace(tmp, out)
    return final


# ---------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mode", nargs="?", choices=("templates", "real"), default="templates",
                        help="templates: sampled jobs on the architecture templates (jobs.csv); real: real "
                             "architectures (timm, torchvision, HF configs, torch.nn), predictor/dataset/real.py")
    parser.add_argument("--n", type=int, default=DEFAULT_N, help=f"number of jobs (default {DEFAULT_N})")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--jobs", type=int, default=calibration.default_jobs(),
                        help="worker processes (default: the CPUs this process may use)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="final CSV (default predictor/data/jobs.csv)")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK,
                        help="work file rows are appended to while tracing (resumable)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-trace time limit (default 600)")
    parser.add_argument("--calibrate", action="store_true",
                        help="refit the calibration on ../shared/data/gpumem first (also done when no constants exist)")
    parser.add_argument("--calibration-only", action="store_true", help="only fit the calibration, then stop")
    parser.add_argument("--gpumem-dir", type=Path, default=calibration.SOURCE_DIR,
                        help="GPUMemNet measurements for --calibrate (default ../shared/data/gpumem)")
    parser.add_argument("--datacard", type=Path, default=None,
                        help="data card to write (default DATACARD.md beside --out)")
    parser.add_argument("--max-params-millions", type=float, default=2000.0, help="sampler limit (smoke runs)")
    parser.add_argument("--max-layers", type=int, default=96, help="sampler limit (smoke runs)")
    from predictor.dataset import realcard

    realcard.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from predictor.errors import UsageError

    if getattr(args, "mode", "templates") == "real":
        from predictor.dataset import realcard

        return realcard.run(args)
    if args.n < 1 or args.jobs < 1 or args.timeout_s <= 0:
        raise UsageError("--n, --jobs and --timeout-s must be positive")
    if args.max_params_millions < 0.2 or args.max_layers < 1:
        raise UsageError("--max-params-millions must be >= 0.2 and --max-layers >= 1")
    report_path = REPO_ROOT / "reports" / "calibration.json"
    if args.calibrate or args.calibration_only or not calibration.CONSTANTS_PATH.exists():
        if not (args.gpumem_dir / calibration.SOURCE_FILES[0]).exists():
            raise UsageError(f"calibration needs the GPUMemNet files in {args.gpumem_dir} (see --gpumem-dir)")
        report = calibration.run_calibration(jobs=args.jobs, source_dir=args.gpumem_dir, report_path=report_path)
        print(f"calibration: memory = {report['context_mib']} MiB + {report['factor']} x traced; held-out median "
              f"error {report['median_abs_rel_err']:.2%}, p90 {report['p90_abs_rel_err']:.2%} "
              f"({report['n_holdout']} runs)", file=sys.stderr)
        if args.calibration_only:
            return 0
    limits = SamplerLimits(max_params_millions=args.max_params_millions, max_layers=args.max_layers)
    started = time.monotonic()
    rows = generate(args.n, args.seed, args.work, args.jobs, args.timeout_s, limits)
    session_s = time.monotonic() - started
    total_s = _add_session_time(args.work, session_s)
    final = finalize(rows, args.n, args.out, calibration.calibration_constants())
    datacard = args.datacard or args.out.with_name("DATACARD.md")
    from predictor.dataset.datacard import write_datacard

    write_datacard(datacard, final, args, total_s, report_path)
    n_err = sum(r["status"] != "ok" for r in final)
    print(f"dataset: {len(final)} jobs ({n_err} errors) -> {args.out}; data card {datacard}", file=sys.stderr)
    return 0


def _add_session_time(work: Path, seconds: float) -> float:
    """Total generation wall time over every (resumed) session of this work file."""
    path = work.with_suffix(".sessions.json")
    sessions: list[float] = json.loads(path.read_text()) if path.exists() else []
    sessions.append(round(seconds, 1))
    path.write_text(json.dumps(sessions))
    return float(sum(sessions))
