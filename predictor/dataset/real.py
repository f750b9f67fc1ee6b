"""`deepres dataset real`: trace real architectures (timm, torchvision, HF configs, torch.nn) and
write the dataset, the traces and the exact-architecture table.

Grid, per architecture (predictor/dataset/archs.py lists them): three inputs (image: the default side,
3/4 and 3/2 of it; text: three lengths in 128..4096 within the model's position limit; recurrent:
64..1024 steps; MLP: 784..16384 features) x fp32/amp/bf16 x three batch sizes. Each trace is one
forward+backward (`tracing.trace_components`); the peak under each optimizer follows exactly from it
and from the optimizer's state and step size, traced once on flat tensors (`StepComponents.peak_for`;
tested equal to full traces). fp16 has bf16's bytes. Peak memory is affine in the batch over the
traced range to within the residual the data card shows (`fit_check`).

Work is done in units (architecture, tier): tier 0 is the default input, tier 1 the two other inputs,
so an interrupted run has every architecture at its default input before any at other inputs
(breadth first), and units are interleaved across groups. Every finished unit is one JSON record;
the records are the state of the dataset and live in the repository, sorted, in
predictor/data/real_units.jsonl.gz (exact bytes, FLOPs, parameters, errors), so a fresh clone resumes
where the last run stopped. A running command also appends each record to the git-ignored work file
predictor/dataset/_work/real.jsonl (crash safety: nothing finished is lost before the outputs are
rewritten); a restart reads both and skips the units they hold, unless the architecture's definition
changed since (other inputs or batches: traced again). Outputs are rebuilt from the records, sorted,
so they do not depend on the order units finished in: predictor/data/real_traces.csv.gz (one row per
trace), predictor/data/real_jobs.csv.gz (one row per trace and optimizer, the jobs.csv columns plus
group/family/name/source) and predictor/data/exact.json (the exact-architecture table read by
predictor/exact.py).

The command line, the batch-fit check (`--fit-check`) and the data card are predictor/dataset/realcard.py's
(it imports this module; this module never imports it).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import math
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from predictor.dataset import archs as A
from predictor.dataset import calibration, tracing
from predictor.dataset.attention import gpu_attention
from predictor.dataset.paths import DATA_DIR, EXACT_OUT, JOBS_OUT, STORE, TRACES_OUT
from predictor.dataset.schema import COLUMNS
from predictor.progress import progress, shown
from predictor.spec import MODEL_ALIASES

log = logging.getLogger(__name__)

WORK = calibration.WORK_DIR / "real.jsonl"
PRECISIONS = ("fp32", "amp", "bf16")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad")
JOB_OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
CATS = tracing.CATEGORIES
MIB = tracing.MIB
UNIT_TIMEOUT_S = 900.0
EXACT_VERSION = 1


# ---------------------------------------------------------------------------------------------
# One unit: an architecture at its inputs of one tier


def unit_key(arch: A.Arch, tier: int) -> str:
    return f"{arch.name}|t{tier}"


def tier_inputs(arch: A.Arch, tier: int) -> tuple[int, ...]:
    return arch.inputs[:1] if tier == 0 else arch.inputs[1:]


class UnitTimeout(Exception):
    pass


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise UnitTimeout("unit timed out")


def trace_input(arch: A.Arch, input_dim: int, batches: tuple[int, ...] | None = None,
                precisions: tuple[str, ...] = PRECISIONS,
                build: Callable[[A.Arch, int], tuple[Any, Any, Any]] | None = None) -> dict[str, Any]:
    """Every trace of one architecture at one input: the model is built once (meta, no weights) by
    `build` (default `archs.build`; `heads.build_head` for another task head)."""
    started = time.perf_counter()
    with torch.device("meta"), tracing._SkipInit():  # type: ignore[no-untyped-call]
        model, batch_of, loss = (build or A.build)(arch, input_dim)
    model = model.to("meta")  # legacy constructors (torch.FloatTensor in XLNet) ignore the device context
    model.train()
    build_s = time.perf_counter() - started
    info: dict[str, Any] = {
        "input": input_dim, "params": A.trainable_params(model), "num_layers": A.num_layers(arch, model),
        "dropout": int(A.has_dropout(model)), "build_seconds": round(build_s, 3), "traces": [], "optimizers": {}}
    with gpu_attention():
        for precision in precisions:
            if precision == "bf16":
                model = model.to(torch.bfloat16)
            costs: dict[str, list[int]] | None = None
            for batch in batches or arch.batches:
                c = tracing.trace_components(model, batch_of(batch), loss, precision=precision)
                if costs is None:
                    costs = {o: list(tracing.optimizer_cost(o, c.numel_by_dtype)) for o in OPTIMIZERS}
                    info["optimizers"][precision] = costs
                info["traces"].append({
                    "precision": precision, "batch": batch, "fb": c.fb_peak_bytes,
                    "fb_bd": [c.fb_breakdown[k] for k in CATS], "end": c.end_bytes,
                    "end_bd": [c.end_breakdown[k] for k in CATS], "flops": c.flops,
                    "seconds": round(c.seconds, 3)})
    return info


def run_unit(arch: A.Arch, tier: int, timeout_s: float = UNIT_TIMEOUT_S) -> dict[str, Any]:
    """Trace one unit; failures (per input) are recorded, never raised."""
    started = time.perf_counter()
    record: dict[str, Any] = {"key": unit_key(arch, tier), "arch": asdict(arch), "inputs": [], "errors": {}}
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        for input_dim in tier_inputs(arch, tier):
            try:
                record["inputs"].append(trace_input(arch, input_dim))
            except UnitTimeout:
                raise
            except Exception as err:  # one input that does not build must not stop the others
                record["errors"][str(input_dim)] = f"{type(err).__name__}: {err}"[:300].replace("\n", " ")
    except UnitTimeout:
        record["errors"]["timeout"] = f"unit exceeded {timeout_s:g} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    record["seconds"] = round(time.perf_counter() - started, 3)
    return record


def _worker(args: tuple[A.Arch, int, float]) -> dict[str, Any]:
    torch.set_num_threads(1)
    return run_unit(*args)


# ---------------------------------------------------------------------------------------------
# Scheduling the work


#: Models people train most (the first traced, so the exact table has them early in a partial run).
WELL_KNOWN = frozenset(f"timm/{n}" for n in (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet50d", "resnext50_32x4d", "wide_resnet50_2",
    "vgg11", "vgg13", "vgg16", "vgg19", "vgg16_bn", "efficientnet_b0", "efficientnet_b1", "efficientnet_b2",
    "efficientnet_b3", "efficientnet_b4", "tf_efficientnetv2_s", "inception_v3", "inception_v4", "xception65",
    "mobilenetv2_100", "mobilenetv3_large_100", "mobilenetv3_small_100", "densenet121", "densenet169",
    "convnext_tiny", "convnext_small", "convnext_base", "convnext_large", "regnety_032", "regnety_040",
    "regnetx_032", "vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224",
    "vit_base_patch32_224", "deit_base_patch16_224", "deit_small_patch16_224", "swin_tiny_patch4_window7_224",
    "swin_small_patch4_window7_224", "swin_base_patch4_window7_224", "beit_base_patch16_224", "mixer_b16_224",
    "efficientnet_b5", "ghostnet_100", "mnasnet_100", "squeezenet1_0", "dla34", "dpn92", "hrnet_w18",
    "res2net50_26w_4s", "resnest50d", "seresnet50", "nfnet_f0", "coatnet_0_rw_224", "maxvit_tiny_tf_224",
    "levit_128", "xcit_small_12_p16_224", "cait_s24_224", "pvt_v2_b2", "twins_svt_small", "poolformer_s24",
    "eva02_base_patch14_224.mim_in22k", "efficientformer_l1", "mobilevit_s", "repvgg_a2", "rexnet_100",
    "tresnet_m", "cspresnet50", "ecaresnet50d", "gernet_m", "sebotnet33ts_256"))


def plan_units(arch_list: list[A.Arch], tiers: tuple[int, ...] = (0, 1)) -> list[tuple[A.Arch, int]]:
    """Breadth first, deterministic: round-robin over groups (a partial run covers many groups);
    first three architectures of every group at their default input, then the other inputs of the
    few text, recurrent, MLP and torchvision models (their only input-size variation), then the
    remaining default inputs, then the remaining other inputs."""
    ranked: dict[int, list[tuple[int, A.Arch]]] = {}
    for tier in tiers:
        by_group: dict[str, list[A.Arch]] = defaultdict(list)
        for a in sorted(arch_list, key=lambda a: a.name):
            if tier_inputs(a, tier):
                by_group[a.group].append(a)
        ranked[tier] = sorted(((rank, a) for members in by_group.values() for rank, a in enumerate(members)),
                              key=lambda x: (x[0], x[1].group, x[1].name))
    well_known = [(a, 0) for _, a in ranked.get(0, []) if a.name in WELL_KNOWN or a.source in ("torchvision", "hf")]
    first = well_known + [(a, 0) for rank, a in ranked.get(0, []) if rank < 3 and (a, 0) not in well_known]
    small = [(a, 1) for _, a in ranked.get(1, []) if a.source in ("hf", "nn", "torchvision")]
    rest0 = [(a, 0) for rank, a in ranked.get(0, []) if rank >= 3 and (a, 0) not in well_known]
    rest1 = [(a, 1) for _, a in ranked.get(1, []) if a.source not in ("hf", "nn", "torchvision")]
    return first + small + rest0 + rest1


def read_work(path: Path) -> dict[str, dict[str, Any]]:
    """Unit records by key from a work file (`.jsonl`) or the store (`.jsonl.gz`); a later line wins."""
    done: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return done
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from an interrupted write
            done[record["key"]] = record
    return done


def read_state(store: Path | None, work: Path) -> dict[str, dict[str, Any]]:
    """The records of the store (the repository's) updated by those of the work file (newer)."""
    done = read_work(store) if store is not None else {}
    done.update(read_work(work))
    return done


def write_store(done: dict[str, dict[str, Any]], path: Path) -> None:
    """Every record, sorted by key, one JSON line each, gzip without a timestamp (byte-identical reruns)."""
    text = "".join(json.dumps(done[k], sort_keys=True, separators=(",", ":")) + "\n" for k in sorted(done))
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    tmp.replace(path)


def _current(record: dict[str, Any], arch: A.Arch) -> bool:
    """The record was traced from this definition of the architecture (same inputs and batches)."""
    return bool(record["arch"] == json.loads(json.dumps(asdict(arch))))


def generate(arch_list: list[A.Arch], work: Path, workers: int, tiers: tuple[int, ...] = (0, 1),
             limit: int | None = None, timeout_s: float = UNIT_TIMEOUT_S,
             retry_errors: bool = False, store: Path | None = None) -> dict[str, dict[str, Any]]:
    """Trace every unit that neither `store` nor `work` holds for the architecture's current
    definition (appending one line per unit to `work`), with progress on stderr. `retry_errors`
    traces again the units that recorded an error (the new line wins)."""
    done = read_state(store, work)
    units = plan_units(arch_list, tiers)

    def wanted(a: A.Arch, t: int) -> bool:
        record = done.get(unit_key(a, t))
        return record is None or not _current(record, a) or (retry_errors and bool(record["errors"]))

    todo = [(a, t) for a, t in units if wanted(a, t)]
    if limit is not None:
        todo = todo[:limit]
    work.parent.mkdir(parents=True, exist_ok=True)
    total, start_done, started = len(units), len(units) - len(todo), time.monotonic()
    n = 0
    bar = shown()  # a bar with the time left on a terminal; one log line per unit otherwise
    with open(work, "a") as handle:
        for record in progress(_results(todo, workers, timeout_s), "tracing", total=len(todo), unit="unit"):
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()
            done[record["key"]] = record
            n += 1
            rate = n / max(1e-9, time.monotonic() - started)
            if not bar:
                log.info("[%d/%d] %s %.1fs errors=%d rate=%.1f units/min eta=%.0f min", start_done + n, total,
                         record["key"], record["seconds"], len(record["errors"]), rate * 60,
                         (len(todo) - n) / max(rate, 1e-9) / 60)
    return done


def _results(todo: list[tuple[A.Arch, int]], workers: int, timeout_s: float) -> Iterator[dict[str, Any]]:
    if len(todo) <= 1:  # otherwise worker processes even for one worker: recycled every 20 units (memory)
        for a, t in todo:
            yield run_unit(a, t, timeout_s)
        return
    with get_context("fork").Pool(workers, maxtasksperchild=20) as pool:
        yield from pool.imap_unordered(_worker, [(a, t, timeout_s) for a, t in todo], chunksize=1)


# ---------------------------------------------------------------------------------------------
# Outputs


def _records(done: dict[str, dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(arch dict, input info) for every traced input, sorted by (name, input)."""
    out = [(r["arch"], info) for r in done.values() for info in r["inputs"]]
    return sorted(out, key=lambda x: (x[0]["name"], x[1]["input"]))


TRACE_COLUMNS = ("name", "source", "group", "family", "kind", "input_dim", "precision", "batch_size",
                 "params_millions", "num_layers", "fb_peak_mib", *(f"fb_{k}_mib" for k in CATS), "end_mib",
                 *(f"end_{k}_mib" for k in CATS), "gflops_per_iteration", "trace_seconds")


def trace_rows(done: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for arch, info in _records(done):
        for t in info["traces"]:
            rows.append({
                "name": arch["name"], "source": arch["source"], "group": arch["group"], "family": arch["family"],
                "kind": arch["kind"], "input_dim": info["input"], "precision": t["precision"],
                "batch_size": t["batch"], "params_millions": round(info["params"] / 1e6, 6),
                "num_layers": info["num_layers"], "fb_peak_mib": _mib(t["fb"]),
                **{f"fb_{k}_mib": _mib(v) for k, v in zip(CATS, t["fb_bd"], strict=True)},
                "end_mib": _mib(t["end"]), **{f"end_{k}_mib": _mib(v) for k, v in zip(CATS, t["end_bd"], strict=True)},
                "gflops_per_iteration": round(t["flops"] / 1e9, 4), "trace_seconds": t["seconds"]})
    return rows


def _mib(nbytes: float) -> float:
    return round(nbytes / MIB, 3)


JOB_EXTRA = ("name", "source", "group", "family")


def job_rows(done: dict[str, dict[str, Any]], fit: calibration.LineFit) -> list[dict[str, Any]]:
    """The dataset: one row per (trace, optimizer), the jobs.csv columns (docs/CONTRACTS.md) + extras."""
    rows: list[dict[str, Any]] = []
    for arch, info in _records(done):
        for t in info["traces"]:
            comp = tracing.StepComponents(t["fb"], dict(zip(CATS, t["fb_bd"], strict=True)), t["end"],
                                          dict(zip(CATS, t["end_bd"], strict=True)), t["flops"], {}, 0.0)
            for opt in JOB_OPTIMIZERS:
                state, step = info["optimizers"][t["precision"]][opt]
                peak, parts = comp.peak_for(state, step)
                params_m = round(info["params"] / 1e6, 6)
                row: dict[str, Any] = dict.fromkeys(COLUMNS, "")
                row.update(
                    model_type=MODEL_ALIASES[arch["family"]], params_millions=params_m, batch_size=t["batch"],
                    input_dim=info["input"], num_layers=info["num_layers"], iterations=10000,
                    precision=t["precision"], optimizer=opt, learning_rate=0.001, regularization=info["dropout"],
                    data_augmentation=int(arch["kind"] == "image"), actual_params_millions=params_m, param_match=1,
                    arch=json.dumps({"name": arch["name"]}), traced_peak_mib=_mib(peak),
                    **{f"{k}_mib": _mib(v) for k, v in parts.items()},
                    memory_mib=round(fit.predict(peak / MIB), 2), gflops_per_iteration=round(t["flops"] / 1e9, 4),
                    seed=0, status="ok", error="", trace_seconds=t["seconds"],
                    name=arch["name"], source=arch["source"], group=arch["group"], family=arch["family"])
                rows.append(row)
    for i, row in enumerate(rows):
        row["job_id"] = i
    return rows


def exact_table(done: dict[str, dict[str, Any]], fit: calibration.LineFit, bound: dict[str, Any]) -> dict[str, Any]:
    """The exact-architecture table: per architecture, per precision and input, the traced
    forward/backward peak and the after-backward bytes at each traced batch (MiB), the GFLOPs, and
    each optimizer's (state, step) MiB. predictor/exact.py turns these into a Demand."""
    models: dict[str, Any] = {}
    for arch, info in _records(done):
        if arch["source"] == "nn":
            continue  # custom stacks have no name a pod could give; they are training data only
        entry = models.setdefault(arch["name"], {
            "group": arch["group"], "family": arch["family"], "kind": arch["kind"],
            "default_input": arch["inputs"][0], "batches": list(arch["batches"]), "inputs": {}})
        curves = curves_of(info, arch["batches"])
        if curves:
            entry["inputs"][str(info["input"])] = {"params_millions": round(info["params"] / 1e6, 4),
                                                   "num_layers": info["num_layers"], "curves": curves}
    models = {k: v for k, v in models.items() if v["inputs"]}
    return {"version": EXACT_VERSION,
            "about": "deepres exact-architecture table: written by `deepres dataset real`; read by predictor/exact.py",
            "calibration": {"context_mib": fit.context_mib, "factor": fit.factor}, "bound": bound,
            "precisions_traced": list(PRECISIONS), "models": dict(sorted(models.items()))}


def curves_of(info: dict[str, Any], batches: list[int]) -> dict[str, Any]:
    """One traced input's curves per precision, in the layout of exact.json (precisions whose traces
    do not cover every batch are left out)."""
    curves: dict[str, Any] = {}
    for precision in PRECISIONS:
        ts = sorted((t for t in info["traces"] if t["precision"] == precision), key=lambda t: t["batch"])
        if [t["batch"] for t in ts] != list(batches):
            continue
        curves[precision] = {
            "fb": [_mib(t["fb"]) for t in ts], "end": [_mib(t["end"]) for t in ts],
            "gflops": [round(t["flops"] / 1e9, 4) for t in ts],
            "optimizers": {o: [_mib(v) for v in info["optimizers"][precision][o]] for o in OPTIMIZERS}}
    return curves


def input_interpolation_check(table: dict[str, Any]) -> dict[str, Any]:
    """How well the table reads an untraced input: for every architecture traced at three inputs,
    the middle one predicted log-log from the outer two (adamw, every precision and batch)."""
    from predictor.exact import _at_input, _between_inputs

    errors: list[float] = []
    kinds: dict[str, list[float]] = defaultdict(list)
    for entry in table["models"].values():
        inputs = sorted(int(i) for i in entry["inputs"])
        if len(inputs) != 3:
            continue
        lo, mid, hi = inputs
        batches = [int(b) for b in entry["batches"]]
        for precision in PRECISIONS:
            curves = [entry["inputs"][str(i)]["curves"].get(precision) for i in inputs]
            if any(c is None for c in curves):
                continue
            for b in batches:
                p_mid = _at_input(curves[1], batches, b, "adamw")[0]  # type: ignore[arg-type]
                guess = _between_inputs([curves[0], curves[2]], [lo, hi], mid, batches, b,  # type: ignore[list-item]
                                        "adamw", entry["kind"])[0]
                errors.append(abs(guess - p_mid) / p_mid)
                kinds[entry["kind"]].append(errors[-1])

    def stats(values: list[float]) -> dict[str, Any]:
        values = sorted(values)

        def q(p: float) -> float:
            return round(values[min(len(values) - 1, int(p * len(values)))], 5) if values else math.nan

        return {"n": len(values), "median_abs_rel_err": q(0.5), "p90_abs_rel_err": q(0.9),
                "p975_abs_rel_err": q(0.975), "max_abs_rel_err": q(1.0)}

    return {**stats(errors), "by_kind": {k: stats(v) for k, v in sorted(kinds.items())}}


def fit_check(done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How affine the traced peaks are in the batch: per (arch, precision, input) the least-squares
    line through the three traced batches and its largest relative residual (fb and end)."""
    worst: list[float] = []
    for _, info in _records(done):
        for precision in PRECISIONS:
            ts = sorted((t for t in info["traces"] if t["precision"] == precision), key=lambda t: t["batch"])
            if len(ts) < 3:
                continue
            for field in ("fb", "end"):
                xs, ys = [t["batch"] for t in ts], [t[field] for t in ts]
                worst.append(_max_rel_residual(xs, ys))
    worst.sort()

    def q(p: float) -> float:
        return worst[min(len(worst) - 1, int(p * len(worst)))] if worst else 0.0

    return {"n_curves": len(worst), "median_max_rel_residual": q(0.5), "p90_max_rel_residual": q(0.9),
            "p99_max_rel_residual": q(0.99), "max_rel_residual": worst[-1] if worst else 0.0}


def _max_rel_residual(xs: list[int], ys: list[int]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return max(abs(my + slope * (x - mx) - y) / y for x, y in zip(xs, ys, strict=True) if y > 0)


def write_outputs(done: dict[str, dict[str, Any]], data_dir: Path = DATA_DIR) -> dict[str, Any]:
    """Rebuild every output from the work records (sorted: the same records give the same files)."""
    fit = calibration.calibration_constants()
    constants = json.loads(calibration.CONSTANTS_PATH.read_text())
    bound: dict[str, Any] = {"calibration_rel": round(float(constants.get("bound_rel", 0.05)), 4),
                             "batch_extrapolation_rel": 0.02, "input_interpolation_rel": 0.15}
    # real-GPU measurements, where the campaign left them: the bound covers those GPUs too
    from predictor.dataset import campaign

    lines = [line for t in sorted(campaign.MEASURED_DIR.glob("*.csv")) for line in campaign.measured_lines(t)]
    if lines:
        bound["measured_lines"] = lines
    data_dir.mkdir(parents=True, exist_ok=True)
    write_store(done, data_dir / STORE.name)
    traces = trace_rows(done)
    _write_csv(data_dir / TRACES_OUT.name, TRACE_COLUMNS, traces, compress=True)
    jobs = job_rows(done, fit)
    _write_csv(data_dir / JOBS_OUT.name, (*COLUMNS, *JOB_EXTRA), jobs, compress=True)
    table = exact_table(done, fit, bound)
    interp = input_interpolation_check(table)
    # the bound between traced inputs covers 97.5% of the leave-middle-out errors of its kind of input
    by_kind = {k: round(max(0.05, v["p975_abs_rel_err"]), 4) for k, v in interp["by_kind"].items() if v["n"] >= 30}
    if by_kind:
        table["bound"]["input_interpolation_rel"] = {**by_kind, "default": max(by_kind.values())}
    (data_dir / EXACT_OUT.name).write_text(json.dumps(table, separators=(",", ":"), sort_keys=False) + "\n")
    archs_ok = {a["name"] for a, _ in _records(done)}
    errors = {r["key"]: r["errors"] for r in done.values() if r["errors"]}
    memories = [float(r["memory_mib"]) for r in jobs]
    summary = {"rows_over_80gib": sum(m > 81920 for m in memories),
               "rows_by_source": dict(sorted(Counter(str(r["source"]) for r in jobs).items())),
               "memory_mib_min": min(memories, default=0.0), "memory_mib_max": max(memories, default=0.0),
               "units": len(done), "architectures": len(archs_ok), "traces": len(traces), "job_rows": len(jobs),
               "groups": len({a["group"] for a, _ in _records(done)}), "exact_models": len(table["models"]),
               "units_with_errors": len(errors), "fit_check": fit_check(done), "input_interpolation": interp,
               "bound": table["bound"]}
    return summary


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]], compress: bool) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    data = buffer.getvalue().encode()
    tmp = path.with_suffix(path.suffix + ".tmp")
    if compress:
        tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))  # mtime 0: byte-identical reruns
    else:
        tmp.write_bytes(data)
    tmp.replace(path)
