"""The data card of the generated dataset (predictor/data/DATACARD.md), written from the rows.

Every figure in it is computed from the file it describes, so the card cannot drift from the data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from predictor.dataset import schema as gen

COLUMN_DOCS: dict[str, str] = {
    "model_type": "architecture family (mlp, cnn, resnet, rnn, lstm, gru, transformer, gpt, vit)",
    "params_millions": "requested trainable parameters, millions (the JobSpec value)",
    "batch_size": "per-GPU batch size",
    "input_dim": "image side (cnn/resnet/vit), sequence length (rnn/lstm/gru/transformer/gpt), features (mlp)",
    "num_layers": "depth: hidden layers, conv layers, residual blocks, recurrent layers or transformer blocks",
    "iterations": "planned training iterations (does not change the per-iteration labels)",
    "precision": "fp32, fp16, bf16 (whole model in that dtype) or amp (fp32 master weights, fp16 compute)",
    "optimizer": "sgd, momentum, adam, adamw, rmsprop, adagrad",
    "learning_rate": "learning rate (does not change memory or FLOPs; kept for the seed's experiment)",
    "regularization": "0/1: dropout p=0.1 in the model and weight decay 1e-4 in the optimizer",
    "data_augmentation": "0/1: kept for the seed's experiment (augmentation runs on the CPU input pipeline)",
    "actual_params_millions": "trainable parameters of the model actually built, millions",
    "param_match": "0/1: actual within 5% of requested",
    "arch": "JSON of the realised hyper-parameters (width, stages, heads, vocabulary, ...)",
    "traced_peak_mib": "traced peak of live tensor bytes in a steady-state iteration, MiB",
    "params_mib": "parameters and buffers at that peak, MiB",
    "grads_mib": "gradients alive at that peak, MiB",
    "optimizer_mib": "optimizer state at that peak, MiB",
    "activations_mib": "tensors allocated in the forward pass still alive at that peak, MiB",
    "temporaries_mib": "other tensors from backward / optimizer step alive at that peak, MiB",
    "memory_mib": "TARGET: calibrated peak GPU memory as nvidia-smi shows it, MiB",
    "gflops_per_iteration": "TARGET: GFLOPs of one iteration (matmul, convolution, attention only)",
    "job_id": "row id; the job is a pure function of (seed, job_id)",
    "seed": "sampling seed of the run",
    "status": "ok or error (models train on ok rows)",
    "error": "why a job failed (empty when ok)",
    "trace_seconds": "wall seconds the row took (sample + plan + trace) on the generating machine",
}


def _range(rows: list[dict[str, str]], column: str) -> str:
    values = [float(r[column]) for r in rows if r[column] not in ("", None)]
    if not values:
        return "-"
    return f"{min(values):g} .. {max(values):g} (median {statistics.median(values):g})"


def _values(rows: list[dict[str, str]], column: str) -> str:
    counts = Counter(r[column] for r in rows)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def write_datacard(path: Path, rows: list[dict[str, str]], args: argparse.Namespace, total_s: float,
                   calibration_report: Path) -> None:
    """Write the card for `rows` (the final file's rows)."""
    ok = [r for r in rows if r["status"] == "ok"]
    errors = [r for r in rows if r["status"] != "ok"]
    cal: dict[str, Any] = json.loads(calibration_report.read_text()) if calibration_report.exists() else {}
    over = sum(float(r["memory_mib"]) > gen.GPU_MIB for r in ok)
    categorical = {"model_type", "precision", "optimizer", "regularization", "data_augmentation", "param_match",
                   "status", "seed"}
    lines = [
        "# Data card: predictor/data/jobs.csv",
        "",
        "These jobs run on home-made architecture templates. The real architectures (timm, torchvision,",
        "Hugging Face configs, torch.nn stacks) are in `real_jobs.csv.gz`: see DATACARD-real.md.",
        "",
        "Traced, calibrated GPU demand of deep-learning training jobs: one row per job, the JobSpec that",
        "describes it (the 11 feature columns of the seed papers' dataset, plus its family), the model we",
        "built for it, and two targets: peak GPU memory (`memory_mib`) and compute per iteration",
        "(`gflops_per_iteration`). Written by `deepres dataset` (predictor/dataset/generate.py).",
        "",
        "## Regenerate",
        "",
        "```bash",
        f".venv/bin/deepres dataset --n {args.n} --seed {args.seed} --calibrate",
        "```",
        "",
        "Rows are a pure function of (seed, job_id); the file is sorted by job_id and every column except",
        "the measured `trace_seconds` comes out identical. `--calibrate` refits the calibration on",
        "../shared/data/gpumem first (cached in predictor/dataset/_work/); without it the shipped constants",
        "in predictor/dataset/calibration.json are used. An interrupted run resumes where it stopped.",
        "",
        "## Size and generation",
        "",
        f"- {len(rows)} jobs: {len(ok)} ok, {len(errors)} errors; families: {_values(rows, 'model_type')}.",
        f"- {over} ok jobs ({over / max(1, len(ok)):.1%}) need more than 80 GiB (`memory_mib` > {gen.GPU_MIB}):",
        "  the extender must reject those with a reason.",
        f"- parameter target met within 5% (`param_match` = 1) for "
        f"{sum(r['param_match'] == '1' for r in rows)} of {len(rows)} jobs.",
        f"- generation took {total_s / 60:.1f} min of wall time over all sessions, with {args.jobs} worker "
        f"processes on a machine with {os.cpu_count()} CPUs shared with other work (niced).",
        "- median seconds per trace by family: "
        + ", ".join(
            f"{fam} {statistics.median(float(r['trace_seconds']) for r in ok if r['model_type'] == fam):.2f}"
            for fam in sorted({r["model_type"] for r in ok})
        )
        + ".",
        "",
        "## How the jobs were sampled",
        "",
        "Family uniformly at random; parameters log-uniform in a realistic range per family (0.1M to 2B",
        "overall); depth log-uniform per family (1 to 96), redrawn with the size until the family can build",
        "that size; image side from common sizes 32..512, sequence length 16..4096 (mostly powers of two),",
        "MLP features 16..16384; batch log-uniform up to a per-GPU budget typical of the family (tokens or",
        f"pixels per batch), except {gen.UNBOUNDED_BATCH_SHARE:.0%} of jobs drawn from the whole 1..1024",
        "(many of those do not fit); precision fp32 30% / amp 35% / fp16 15% / bf16 20%; optimizer adam",
        "25% / adamw 30% / sgd 10% / momentum 15% / rmsprop 10% / adagrad 10%; learning rate log-uniform",
        "1e-5..1e-1; iterations log-uniform 100..1e6; regularization 50%; data augmentation 50% for vision,",
        "15% otherwise.",
        "",
        "## How the labels were made",
        "",
        "1. The JobSpec becomes a concrete `torch.nn` model (predictor/dataset/templates.py): the family's",
        "   template with the requested depth and input size, its width solved so the trainable parameter",
        "   count is the closest to the request (within 5% unless `param_match` = 0).",
        "2. One steady-state training iteration (forward, loss, backward, optimizer step with the job's",
        "   optimizer and precision) runs on PyTorch's meta device: shapes only, no real memory",
        "   (predictor/dataset/tracing.py). A TorchDispatchMode follows every live storage and records the",
        "   peak with its breakdown; the optimizer state already exists, as from the second iteration on.",
        "   FLOPs come from torch.utils.flop_counter's formulas, which count only matmul, convolution and",
        "   attention kernels: element-wise work (activations, norms, optimizer updates) is not in",
        "   `gflops_per_iteration`; attention is counted as dense even when causal. On small models the",
        "   traced peak equals PyTorch's own MemTracker (under FakeTensorMode) to the byte (unit test).",
        "3. `memory_mib = context_mib + factor x traced_peak_mib`, fitted on real measurements (below).",
        "",
        "Simplifications, stated so the labels are read correctly: attention uses the fused kernels a GPU",
        "picks (flash for fp16/bf16, memory-efficient for fp32); recurrent layers are traced through a",
        "time-parallel stand-in with the same parameters, matmul FLOPs and per-step saved tensors as",
        "cuDNN (tracing the real time loop off-GPU takes tens of seconds per job); the optimizer step is",
        "traced on one flat tensor per dtype (foreach optimizers allocate the same total temporaries);",
        "amp runs forward/backward on fp16 copies of the fp32 weights with the loss in fp32 (norms and",
        "softmax stay fp16, GradScaler is not modelled); no activation checkpointing, no cuDNN/cuBLAS",
        "workspaces beyond what the calibration constant absorbs.",
        "",
        "## Calibration",
        "",
    ]
    if cal:
        lines += [
            f"`memory_mib = {cal.get('context_mib')} MiB + {cal.get('factor')} x traced_peak_mib`, fitted on "
            f"{cal.get('n_fit')} and checked on {cal.get('n_holdout')} held-out GPUMemNet MLP training runs",
            "measured with nvidia-smi on an NVIDIA A100-40GB (itu-rad/GPUMemNet, Datasets/MLP). Held-out",
            f"absolute relative error: median {cal.get('median_abs_rel_err', 0):.2%}, 90th percentile "
            f"{cal.get('p90_abs_rel_err', 0):.2%} (reports/calibration.json); on the largest tenth of the held-out",
            f"runs (traced >= {cal.get('top_decile_traced_min_mib', 0)} MiB) median "
            f"{cal.get('top_decile_median_abs_rel_err', 0):.2%}, p90 {cal.get('top_decile_p90_abs_rel_err', 0):.2%}.",
            "The measurements do not say which optimizer or precision they used, and they cannot tell: traced",
            "as plain SGD or SGD with momentum instead of Adam, 500 sampled runs fit as well (held-out median",
            "0.5% vs 0.7%) but need factors of 2.67 and 1.80. We keep Adam, fp32, cross-entropy because",
            "its factor (about 1.1) is what a caching allocator plausibly adds over live tensors; the other",
            "two would be implausible. They are MLPs whose peak stays below "
            f"{cal.get('measured_mib_max', 0):.0f} MiB: for larger jobs and other families the factor is",
            "an extrapolation, which the predictor's upper bound must absorb.",
        ]
    else:
        lines.append("(no calibration report found)")
    lines += ["", "## Columns", "", "| column | meaning | values in this file |", "|---|---|---|"]
    for column in gen.COLUMNS:
        if column in ("arch", "error", "job_id"):
            observed = "-"
        elif column in categorical:
            observed = _values(rows, column)
        else:
            observed = _range(ok if column in gen.LABEL_COLUMNS or column.endswith("_mib") else rows, column)
        lines.append(f"| `{column}` | {COLUMN_DOCS[column]} | {observed} |")
    if errors:
        lines += ["", "## Errors", ""]
        for message, count in Counter(r["error"] for r in errors).most_common(10):
            lines.append(f"- {count} x {message}")
    lines += [
        "",
        "## Sources",
        "",
        "The jobs are synthetic (sampled); the calibration measurements are GPUMemNet's (itu-rad, no licence",
        "file in that repository), used only to fit two constants; none of their data is in this file.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
