"""The real-GPU measurement campaign: peak GPU memory of real training steps, as nvidia-smi sees it.

Every label the predictor learns from is traced on a CPU (`predictor.dataset.tracing`) and mapped to
what nvidia-smi would show by a line fitted on public MLP measurements on an A100. This measures the
same jobs on a real GPU, so that the line, the exact-architecture path and the predictor meet real
peaks: convolutional nets with cuDNN's workspaces, autocast instead of the tracer's fp16 copies,
the caching allocator's rounding, the CUDA context of today's driver.

Three steps, two machines:

    python -m predictor.dataset.campaign plan  --out predictor/data/measured/plan.jsonl     # here
    python -m predictor.dataset.campaign run   --plan ... --out $OUT/runs.jsonl            # GPU machine
    python -m predictor.dataset.campaign write --runs ... --gpu h100                         # here

`run` needs only torch, timm, transformers, torchvision and nvidia-ml-py (what the GPU machine has;
no deepres install): it builds each planned job with the dataset's own builders
(`predictor.dataset.archs.build`, the real cuDNN RNN modules for the recurrent stacks), runs three
real training iterations (the precision and optimizer of the job: `amp` is torch.autocast with a
GradScaler, `bf16` the whole model in bfloat16) in a fresh process forked from a parent that has
already imported the libraries (a fresh CUDA context per job, without paying the imports), and
records the process's own used memory as NVML reports it (sampled by the parent every ~5 ms, the
peak), torch's max allocated / reserved, the step time and whether it ran out of memory. Small jobs
run a few at a time (per-process memory does not depend on the neighbours; a job that ran out of
memory beside others is run again alone); a deadline stops it inside the machine's time limit and a
later call resumes with `--skip`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = float(1 << 20)
ITERATIONS = 3
#: GPU memory the parent lets running jobs expect at once (MiB), and the most jobs at once.
PACK_BUDGET_MIB = 56_000.0
MAX_AT_ONCE = 4
#: A job expecting more than this runs alone.
ALONE_ABOVE_MIB = 26_000.0
JOB_TIMEOUT_S = 150.0
#: The share of planned jobs per family (the dataset's own mix is 83% timm image models).
FAMILY_SHARE = {"vit": 0.18, "cnn": 0.18, "resnet": 0.18, "gpt": 0.08, "transformer": 0.08, "vgg": 0.03,
                "mlp": 0.06, "rnn": 0.04, "lstm": 0.04, "gru": 0.04}
POLL_S = 0.005


# ---------------------------------------------------------------------------------------------
# plan (here: needs pandas and the dataset)


def plan(out: Path, n: int, seed: int, max_mib: float) -> list[dict[str, Any]]:
    """Jobs drawn from the real-architecture dataset across families, precisions, optimizers, batch
    sizes and inputs, half of them from the architecture groups the shipped predictor's grouped
    split holds out (so its answers on them are for unseen architectures), each with its traced
    peak and the A100-calibrated label it is compared with."""
    import numpy as np
    import pandas as pd

    from predictor.dataset import archs, paths
    from predictor.splits import grouped_split

    table = {name: (e["kind"], int(e["default_input"]))
             for name, e in json.loads(paths.EXACT_OUT.read_text())["models"].items()}
    table.update({a.name: (a.kind, a.inputs[0]) for a in archs.nn_archs()})
    jobs = pd.read_csv(paths.JOBS_OUT)
    jobs = jobs[(jobs.status == "ok") & (jobs.memory_mib <= max_mib) & jobs.name.isin(table)]
    groups = jobs.group.astype(str).to_numpy()
    held_out = set(groups[grouped_split(groups.astype(str), 0.3, 0).test].tolist())
    rng = np.random.default_rng(seed)
    # per family, its groups in turn, one architecture of the group at a time, two jobs of it
    # (different precision, optimizer, batch or input), until the family's share of n
    picked: list[int] = []
    by_name = {name: frame for name, frame in jobs.groupby("name")}
    for family, frame in sorted(jobs.groupby("family")):
        quota = round(n * FAMILY_SHARE.get(str(family), 0.05))
        cells = {str(g): sorted(set(f.name)) for g, f in frame.groupby("group")}
        for names in cells.values():
            rng.shuffle(names)
        order = sorted(cells, key=lambda g: (g not in held_out, rng.random()))
        taken = 0
        while taken < quota and any(cells.values()):
            for group in order:
                if not cells[group] or taken >= quota:
                    continue
                rows = by_name[cells[group].pop()]
                for i in rng.choice(len(rows), size=min(2, len(rows)), replace=False):
                    picked.append(int(rows.index[i]))
                    taken += 1
    chosen = jobs.loc[picked]
    records = []
    for i, (_, row) in enumerate(chosen.iterrows()):
        kind, default_input = table[row["name"]]
        records.append({
            "job": f"c{i:04d}", "name": row["name"], "source": row["source"], "group": str(row["group"]),
            "family": row["family"], "kind": kind, "default_input": default_input,
            "input_dim": int(row["input_dim"]), "batch_size": int(row["batch_size"]),
            "precision": row["precision"], "optimizer": row["optimizer"],
            "params_millions": float(row["params_millions"]), "num_layers": int(row["num_layers"]),
            "traced_peak_mib": float(row["traced_peak_mib"]), "label_mib": float(row["memory_mib"]),
            "held_out_group": str(row["group"]) in held_out})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


# ---------------------------------------------------------------------------------------------
# run (the GPU machine: torch, timm, transformers, nvidia-ml-py; no deepres install)


def _recurrent(cell: str, layers: int, hidden: int) -> Any:
    """The recurrent stack a data scientist writes: cuDNN's module, the last step's state to a head."""
    import torch
    from torch import nn

    from predictor.dataset.archs import RNN_CLASSES, RNN_FEATURES

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            kind = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[cell]
            self.rnn = kind(RNN_FEATURES, hidden, layers, batch_first=True)
            self.head = nn.Linear(hidden, RNN_CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(x)
            return self.head(out[:, -1])  # type: ignore[no-any-return]

    return Stack()


def _model_and_batch(job: dict[str, Any], device: str) -> tuple[Any, Any, Any, int]:
    """The model on `device`, a batch maker (dtype -> inputs), the loss and the number of classes
    (or vocabulary) targets are drawn from."""
    import re

    import torch

    from predictor.dataset import archs as A

    arch = A.Arch(job["name"], job["source"], job["group"], job["family"], job["kind"],
                  (job["default_input"], job["input_dim"]), (job["batch_size"],))
    b, side = job["batch_size"], job["input_dim"]
    with torch.device(device):
        if job["source"] == "nn" and job["family"] in ("rnn", "lstm", "gru"):
            cell, layers, hidden = re.match(r"nn/(\w+)-l(\d+)-h(\d+)", job["name"]).groups()  # type: ignore[union-attr]
            model = _recurrent(cell, int(layers), int(hidden))
            return (model, lambda dt: torch.randn(b, side, A.RNN_FEATURES, dtype=dt), torch.nn.functional.cross_entropy,
                    A.RNN_CLASSES)
        model, _, loss = A.build(arch, side)
    model = model.to(device)
    if job["kind"] in ("text", "seq2seq"):
        wrapped: Any = model
        vocab = int(wrapped.model.config.vocab_size)
        return model, lambda dt: torch.randint(0, vocab, (b, side)), loss, vocab
    if job["kind"] == "features":
        return model, lambda dt: torch.randn(b, side, dtype=dt), loss, A.IMAGE_CLASSES
    return model, lambda dt: torch.randn(b, 3, side, side, dtype=dt), loss, 0


def measure(job: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
    """Build the job and run ITERATIONS training iterations; torch's own peaks and the step time."""
    import torch

    from predictor.dataset.tracing import make_optimizer

    started = time.perf_counter()
    torch.manual_seed(0)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.cuda.reset_peak_memory_stats()
    model, batch_of, loss_fn, classes = _model_and_batch(job, device)
    precision = job["precision"]
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(job["optimizer"], params, 1e-3, 0.0)
    scaler = torch.amp.GradScaler(device.split(":")[0], enabled=precision == "amp")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    build_s = time.perf_counter() - started
    step_s: list[float] = []
    for _ in range(ITERATIONS):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x = batch_of(dtype).to(device)
        with torch.autocast(device.split(":")[0], dtype=torch.float16, enabled=precision == "amp"):
            out = model(x)
            n = classes or out.shape[-1]
            y = torch.randint(0, n, out.shape[:-1], device=device)
            loss = loss_fn(out, y)
        del x, out
        scaler.scale(loss).backward()
        del loss
        scaler.step(opt)
        scaler.update()
        if cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
    result: dict[str, Any] = {
        "params_measured_millions": round(sum(p.numel() for p in params) / 1e6, 6),
        "build_s": round(build_s, 3), "step_s": round(step_s[-1], 5), "first_step_s": round(step_s[0], 4)}
    if cuda:
        result.update(torch_max_allocated_mib=round(torch.cuda.max_memory_allocated() / MIB, 2),
                      torch_max_reserved_mib=round(torch.cuda.max_memory_reserved() / MIB, 2))
    return result


def _child(job: dict[str, Any], path: str, device: str) -> None:
    """A forked child: measure, write the result, exit without running the parent's atexit hooks.

    One CPU thread: a parent that already ran torch on the CPU holds an OpenMP thread pool, which a
    forked child cannot use (its threads were not copied) and blocks on; the measurement runs on the GPU."""
    import torch

    torch.set_num_threads(1)
    code = 0
    try:
        result = {"status": "ok", **measure(job, device)}
    except Exception as err:  # an OOM, a model that does not build: recorded, never fatal
        oom = isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err)
        result = {"status": "oom" if oom else "error", "error": f"{type(err).__name__}: {str(err)[:300]}"}
        if device.startswith("cuda") and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            result.update(torch_max_allocated_mib=round(torch.cuda.max_memory_allocated() / MIB, 2),
                          torch_max_reserved_mib=round(torch.cuda.max_memory_reserved() / MIB, 2))
        code = 1
    with open(path, "w") as f:
        json.dump(result, f)
    os._exit(code)


class _Nvml:
    """The parent's view of the GPU: per-process used memory (what nvidia-smi lists) and the device's."""

    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def environment(self) -> dict[str, Any]:
        n = self.nvml
        name = n.nvmlDeviceGetName(self.handle)
        driver = n.nvmlSystemGetDriverVersion()
        return {"gpu": name.decode() if isinstance(name, bytes) else name,
                "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "gpu_total_mib": round(n.nvmlDeviceGetMemoryInfo(self.handle).total / MIB, 1)}

    def sample(self) -> tuple[dict[int, float], float]:
        n = self.nvml
        procs = {int(p.pid): (p.usedGpuMemory or 0) / MIB for p in n.nvmlDeviceGetComputeRunningProcesses(self.handle)}
        return procs, n.nvmlDeviceGetMemoryInfo(self.handle).used / MIB


def _libraries() -> dict[str, str]:
    import torch

    versions = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "python": sys.version.split()[0]}
    for lib in ("torchvision", "timm", "transformers"):
        module = __import__(lib)
        versions[lib] = module.__version__
    return versions


def run(plan_path: Path, out: Path, deadline_s: float, skip: set[str], device: str = "cuda",
        at_once: int = MAX_AT_ONCE) -> int:
    """Measure the planned jobs (smallest expected first) until the deadline; one JSON line per job."""
    import timm  # noqa: F401  (imported once here, inherited by every forked child)
    import torch
    import torchvision  # noqa: F401
    import transformers  # noqa: F401

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError("CUDA is initialised in the parent: forked children could not use it")
    started = time.monotonic()
    jobs = [j for j in (json.loads(line) for line in plan_path.read_text().splitlines() if line.strip())
            if j["job"] not in skip]
    jobs.sort(key=lambda j: j["label_mib"])
    nvml = _Nvml() if device.startswith("cuda") else None
    env = {**(nvml.environment() if nvml else {"gpu": "cpu"}), **_libraries(), "iterations": ITERATIONS,
           "cudnn_benchmark": False, "host": os.uname().nodename}
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError("CUDA was initialised in the parent: forked children could not use it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="campaign-"))
    done = 0
    with out.open("a") as sink:
        if nvml:  # what an idle CUDA context costs: three fresh processes that do almost nothing
            for k, probe in enumerate(("context", "matmul", "conv")):
                jobs.insert(k, {"job": f"probe-{probe}", "probe": probe, "label_mib": 0.0})
        queue = list(jobs)
        retry: list[dict[str, Any]] = []
        running: dict[int, tuple[dict[str, Any], float, str, int, bool]] = {}
        peaks: dict[int, float] = {}
        device_peak = 0.0
        while (queue or retry or running) and time.monotonic() - started < deadline_s + JOB_TIMEOUT_S:
            late = time.monotonic() - started > deadline_s
            if late and not running:
                break
            expected = sum(_expect(j) for j, *_ in running.values())
            for source in (queue, retry) if not late else ():
                while source and len(running) < at_once and not any(a for *_, a in running.values()):
                    job = source[0]
                    alone = _expect(job) > ALONE_ABOVE_MIB or source is retry or "probe" in job
                    if running and (alone or expected + _expect(job) > PACK_BUDGET_MIB):
                        break
                    source.pop(0)
                    path = str(tmp / f"{job['job']}.json")
                    pid = os.fork()
                    if pid == 0:
                        if "probe" in job:
                            _probe(job["probe"], path)
                        _child(job, path, device)
                    running[pid] = (job, time.monotonic(), path, len(running), alone)
                    peaks[pid] = 0.0
                    expected += _expect(job)
            if nvml:
                procs, used = nvml.sample()
                device_peak = max(device_peak, used)
                for pid in running:
                    peaks[pid] = max(peaks[pid], procs.get(pid, 0.0))
            for pid in list(running):
                job, t0, path, peers, _ = running[pid]
                waited, _ = os.waitpid(pid, os.WNOHANG)
                if waited == 0 and time.monotonic() - t0 < JOB_TIMEOUT_S:
                    continue
                if waited == 0:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                del running[pid]
                result: dict[str, Any] = {"status": "timeout"}
                if Path(path).exists():
                    result = json.loads(Path(path).read_text())
                peers = max(peers, len(running))
                if result["status"] == "oom" and peers and "probe" not in job:
                    retry.append(job)  # it may have met its neighbours' memory: alone, once more
                    continue
                record = {**job, **result, "nvml_process_peak_mib": round(peaks.pop(pid), 2),
                          "ran_beside": peers, "wall_s": round(time.monotonic() - t0, 3), **env}
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                done += 1
                print(f"[{time.monotonic() - started:6.1f}s] {job['job']} {job.get('name', job.get('probe'))} "
                      f"{job.get('precision', '')} b{job.get('batch_size', '')}: {result['status']} "
                      f"nvml {record['nvml_process_peak_mib']:.0f} MiB (label {job['label_mib']:.0f})", flush=True)
            time.sleep(POLL_S)
        for pid in running:
            os.kill(pid, signal.SIGKILL)
    left = len(queue) + len(retry) + len(running)
    print(f"measured {done} jobs in {time.monotonic() - started:.0f}s; {left} left for a later call "
          f"(device peak {device_peak:.0f} MiB)", flush=True)
    return done


def _expect(job: dict[str, Any]) -> float:
    return float(job["label_mib"]) * 1.3 + 1500.0


def _probe(kind: str, path: str) -> None:
    """A process that only creates a CUDA context (and cuBLAS's or cuDNN's handle and workspace),
    waits for the parent to sample it, and exits: the fixed cost under every job's peak."""
    import torch

    torch.cuda.init()  # type: ignore[no-untyped-call]
    x = torch.ones(256, 256, device="cuda")
    if kind == "matmul":
        x = x @ x
    elif kind == "conv":
        x = torch.nn.functional.conv2d(x.view(1, 1, 256, 256), torch.ones(8, 1, 3, 3, device="cuda"))
    torch.cuda.synchronize()
    time.sleep(0.3)
    with open(path, "w") as f:
        json.dump({"status": "ok", "cudnn": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
                   "torch_max_allocated_mib": round(torch.cuda.max_memory_allocated() / MIB, 2),
                   "torch_max_reserved_mib": round(torch.cuda.max_memory_reserved() / MIB, 2)}, f)
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# report (here: the measured table, the calibration on it, the predictor's paths on real peaks)

MEASURED_DIR = Path(__file__).resolve().parents[1] / "data" / "measured"
REPORTS_DIR = Path(__file__).resolve().parents[2] / "reports"
#: The measured table's columns (the data card says what each means).
COLUMNS = ("job", "name", "source", "group", "family", "kind", "input_dim", "batch_size", "precision", "optimizer",
           "params_millions", "num_layers", "traced_peak_mib", "label_mib", "held_out_group", "status", "error",
           "nvml_process_peak_mib", "torch_max_allocated_mib", "torch_max_reserved_mib", "step_s", "build_s",
           "ran_beside", "gpu", "driver", "torch", "cuda", "torchvision", "timm", "transformers")
CALIBRATION_HOLDOUT = 0.3


def read_runs(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(jobs, probes) from `run`'s JSON lines; a job measured twice keeps its last record."""
    jobs: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                jobs[record["job"]] = record
    probes = [r for r in jobs.values() if "probe" in r]
    return sorted((r for r in jobs.values() if "probe" not in r), key=lambda r: r["job"]), probes


def write_table(jobs: list[dict[str, Any]], path: Path) -> None:
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for job in jobs:
            writer.writerow({c: job.get(c, "") for c in COLUMNS})


def read_table(path: Path) -> list[dict[str, Any]]:
    """The measured rows that ran (status ok), numbers as numbers."""
    import csv

    numeric = {"input_dim", "batch_size", "params_millions", "num_layers", "traced_peak_mib", "label_mib",
               "nvml_process_peak_mib", "torch_max_allocated_mib", "torch_max_reserved_mib"}
    with path.open(newline="") as handle:
        return [{k: (float(v) if k in numeric else v) for k, v in row.items()}
                for row in csv.DictReader(handle) if row["status"] == "ok"]


def exact_on_measured(rows: list[dict[str, Any]]) -> tuple[Any, Any, Any]:
    """The exact-architecture path (`deepres.io/model`) on measured rows: (memory, upper, measured) of
    the rows whose architecture, input and precision the shipped table answers."""
    import numpy as np

    from predictor import exact
    from predictor.spec import SpecError

    out = []
    for row in rows:
        try:
            e = exact.estimate(row["name"], int(row["batch_size"]), int(row["input_dim"]), row["precision"],
                               row["optimizer"])
        except (SpecError, KeyError):
            continue
        out.append((e.memory_mib, e.memory_mib_upper, row["nvml_process_peak_mib"]))
    memory, upper, measured = (np.asarray(v, dtype=np.float64) for v in zip(*out, strict=True))
    return memory, upper, measured


def family_on_measured(rows: list[dict[str, Any]]) -> tuple[Any, Any, Any, Any]:
    """The shipped predictor on the family annotations a data scientist writes for each measured job
    (its dataset row, annotated by `features.annotated_specs` as the replay does):
    (memory, upper, measured, index of the row in `rows`)."""
    import csv
    import gzip

    import numpy as np

    from predictor import features
    from predictor.dataset import paths
    from predictor.runtime import Predictor

    def key(r: dict[str, Any]) -> tuple[str, int, int, str, str]:
        return (r["name"], int(float(r["batch_size"])), int(float(r["input_dim"])), r["precision"], r["optimizer"])

    wanted = {key(r): i for i, r in enumerate(rows)}
    with gzip.open(paths.JOBS_OUT, "rt", newline="") as handle:
        source = [r for r in csv.DictReader(handle) if r.get("status") == "ok" and key(r) in wanted]
    predictor = Predictor.load()
    out = [(d.memory_mib, d.memory_mib_upper, rows[wanted[key(r)]]["nvml_process_peak_mib"], wanted[key(r)])
           for r, spec in zip(source, features.annotated_specs(source, paths.DATA_DIR), strict=True)
           if spec is not None and (d := predictor.predict(spec))]
    memory, upper, measured, index = (np.asarray(v) for v in zip(*out, strict=True))
    return memory, upper, measured, index


#: Share of a GPU's fitted jobs a measured line's bound may leave above it.
LINE_UNDER = 0.025


def calibration_split(rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    """(fit, held-out) row indices of a measured table: 30% of the jobs by whole architecture group
    (seed 0) never fit a line, so the lines' error and the bounds' coverage are measured on them."""
    import numpy as np

    from predictor.splits import grouped_split

    split = grouped_split(np.asarray([r["group"] for r in rows], dtype=str), CALIBRATION_HOLDOUT, 0)
    return split.train, split.test


def measured_lines(table: Path) -> list[dict[str, Any]]:
    """The bound's lines for the GPU of one measured table: per precision (and `any`, for a traced
    peak of unknown precision and architecture), the line fitted on the calibration's 70% of architecture groups and
    the relative margin above it that leaves LINE_UNDER of those jobs uncovered. `predictor.exact`
    keeps its point on the shipped calibration and takes the highest of these bounds, so a bound
    covers the GPUs measured, each with its own CUDA context and allocator."""
    import numpy as np

    from predictor.dataset.calibration import fit_line

    rows = read_table(table)
    traced = np.asarray([r["traced_peak_mib"] for r in rows])
    measured = np.asarray([r["nvml_process_peak_mib"] for r in rows])
    precision = np.asarray([r["precision"] for r in rows], dtype=str)
    named = np.asarray([r["source"] != "nn" for r in rows])
    fit, _ = calibration_split(rows)
    out = []
    for name in (*sorted(set(precision[fit].tolist())), "any"):
        # a precision's line serves named architectures (the exact table holds no torch.nn stack);
        # `any` serves `deepres profile`'s traced peaks of custom code, the hand-written stacks included
        rows_p = fit if name == "any" else fit[(precision[fit] == name) & named[fit]]
        line = fit_line(traced[rows_p].tolist(), measured[rows_p].tolist())
        context, factor = line.context_mib, line.factor
        above = measured[rows_p] / (context + factor * traced[rows_p]) - 1.0
        margin = float(np.quantile(above, 1.0 - LINE_UNDER, method="higher"))
        out.append({"gpu": rows[0]["gpu"], "precision": name, "context_mib": round(context, 1),
                    "factor": round(factor, 5), "rel": round(max(margin, 0.0), 4), "n": len(rows_p),
                    "source": f"predictor/data/measured/{table.name}"})
    return out


def report(runs: list[Path], gpu: str, date: str, measured_dir: Path = MEASURED_DIR,
           reports_dir: Path = REPORTS_DIR) -> dict[str, Any]:
    """Write the measured table and reports/campaign.json (+ the `campaign` key of calibration.json)."""
    import numpy as np

    from predictor.dataset.calibration import calibration_constants, fit_line
    from predictor.metrics import bound_figures

    jobs, probes = read_runs(runs)
    table = measured_dir / f"{gpu}-{date}.csv"
    write_table(jobs, table)
    rows = read_table(table)
    traced = np.asarray([r["traced_peak_mib"] for r in rows])
    measured = np.asarray([r["nvml_process_peak_mib"] for r in rows])
    reserved = np.asarray([r["torch_max_reserved_mib"] for r in rows])
    precision = np.asarray([r["precision"] for r in rows])
    fit, test = calibration_split(rows)
    lines = {p: fit_line(traced[fit][precision[fit] == p].tolist(), measured[fit][precision[fit] == p].tolist())
             for p in sorted(set(precision.tolist()))}
    pooled = fit_line(traced[fit].tolist(), measured[fit].tolist())
    mlp = calibration_constants()
    per_precision = np.asarray([lines[p].predict(t) for p, t in zip(precision, traced, strict=True)])
    rel = np.abs(per_precision[test] / measured[test] - 1.0)
    mlp_rel = np.abs((mlp.context_mib + mlp.factor * traced[test]) / measured[test] - 1.0)
    pooled_rel = np.abs((pooled.context_mib + pooled.factor * traced[test]) / measured[test] - 1.0)
    held = np.asarray([r["held_out_group"] == "True" for r in rows])
    families = np.asarray([r["family"] for r in rows])
    ex_mem, ex_up, ex_meas = exact_on_measured(rows)
    hx_mem, hx_up, hx_meas = exact_on_measured([rows[i] for i in test])
    fam_mem, fam_up, fam_meas, fam_index = family_on_measured(rows)
    unseen = held[fam_index]
    status: dict[str, int] = {}
    for j in jobs:
        status[j["status"]] = status.get(j["status"], 0) + 1
    result: dict[str, Any] = {
        "gpu": jobs[0]["gpu"], "driver": jobs[0]["driver"],
        "libraries": {k: jobs[0][k] for k in ("torch", "cuda", "torchvision", "timm", "transformers")},
        "jobs_planned": len(jobs), "jobs_by_status": status, "jobs_measured": len(rows),
        "families": {f: int(np.sum(families == f)) for f in sorted(set(families.tolist()))},
        "precisions": {p: int(np.sum(precision == p)) for p in sorted(set(precision.tolist()))},
        "context_probes_mib": {p["probe"]: p["nvml_process_peak_mib"] for p in probes if p["status"] == "ok"},
        "nvml_minus_torch_reserved_mib": {f"p{q}": round(float(np.percentile(measured - reserved, q)), 1)
                                          for q in (1, 50, 99)},
        "campaign": {
            "median_abs_rel_err": round(float(np.median(rel)), 4),
            "p90_abs_rel_err": round(float(np.percentile(rel, 90)), 4),
            "mlp_calibration_median_abs_rel_err": round(float(np.median(mlp_rel)), 4),
            "mlp_calibration_p90_abs_rel_err": round(float(np.percentile(mlp_rel, 90)), 4),
            "one_line_median_abs_rel_err": round(float(np.median(pooled_rel)), 4),
            "n_fit": len(fit), "n_holdout": len(test),
            "lines": {p: {"context_mib": round(line.context_mib, 1), "factor": round(line.factor, 4)}
                      for p, line in lines.items()},
            "one_line": {"context_mib": round(pooled.context_mib, 1), "factor": round(pooled.factor, 4)},
            "mlp_line": {"context_mib": mlp.context_mib, "factor": mlp.factor},
            "per_family_signed_median": {
                f: round(float(np.median(per_precision[families == f] / measured[families == f] - 1.0)), 4)
                for f in sorted(set(families.tolist()))},
            "method": "traced peak -> NVML per-process peak, one line per precision minimising squared relative "
                      "error, fitted on 70% of the measured jobs by architecture group (grouped_split seed 0) and "
                      "scored on the other 30%; mlp_calibration_*: the shipped line fitted on the public A100 MLP "
                      "runs (predictor/dataset/calibration.json) on the same held-out rows."},
        "exact_path": {"all": bound_figures(ex_meas, ex_mem, ex_up),
                       "held_out_30": bound_figures(hx_meas, hx_mem, hx_up)},
        "family_path": {"all": bound_figures(fam_meas, fam_mem, fam_up),
                        "held_out_groups": bound_figures(fam_meas[unseen], fam_mem[unseen], fam_up[unseen])},
        "held_out_group_jobs": int(held.sum()),
    }
    reports_dir.mkdir(parents=True, exist_ok=True)
    (reports_dir / "campaign.json").write_text(json.dumps(result, indent=2) + "\n")
    calibration_path = reports_dir / "calibration.json"
    calibration = json.loads(calibration_path.read_text()) if calibration_path.exists() else {}
    calibration["campaign"] = {k: result["campaign"][k] for k in (
        "median_abs_rel_err", "p90_abs_rel_err", "mlp_calibration_median_abs_rel_err", "n_fit", "n_holdout")}
    calibration["campaign"]["source"] = f"reports/campaign.json ({table.name})"
    calibration_path.write_text(json.dumps(calibration, indent=2) + "\n")
    return result


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predictor.dataset.campaign", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("plan", help="choose the jobs (here)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("-n", type=int, default=640)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-mib", type=float, default=60_000.0, help="largest A100-calibrated label planned")
    r = sub.add_parser("run", help="measure them (the GPU machine)")
    r.add_argument("--plan", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--deadline-s", type=float, default=480.0, help="launch no job after this many seconds")
    r.add_argument("--skip", type=Path, nargs="*", default=[], help="results files whose jobs are done")
    r.add_argument("--device", default="cuda")
    r.add_argument("--at-once", type=int, default=MAX_AT_ONCE)
    w = sub.add_parser("report", help="the measured table and reports/campaign.json (here)")
    w.add_argument("--runs", type=Path, nargs="+", default=sorted((MEASURED_DIR / "raw").glob("runs-*.jsonl")))
    w.add_argument("--gpu", default="h100")
    w.add_argument("--date", default="2026-11-24")
    args = parser.parse_args(argv)
    if args.action == "report":
        print(json.dumps(report(args.runs, args.gpu, args.date), indent=2))
        return 0
    if args.action == "plan":
        records = plan(args.out, args.n, args.seed, args.max_mib)
        print(f"planned {len(records)} jobs -> {args.out}")
        return 0
    skip = {json.loads(line)["job"] for f in args.skip if f.exists() for line in f.read_text().splitlines()
            if line.strip()}
    run(args.plan, args.out, args.deadline_s, skip, args.device, args.at_once)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
