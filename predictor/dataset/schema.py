"""The dataset's columns and the constants its data card states (one floor below `generate`,
`real` and `datacard`, which all read them)."""

from __future__ import annotations

GPU_MIB = 80 * 1024  # the largest common GPU (A100/H100 80 GB): what "fits" means in the data card

#: The dataset's columns, exactly as docs/CONTRACTS.md fixes them.
COLUMNS: tuple[str, ...] = (
    "model_type", "params_millions", "batch_size", "input_dim", "num_layers", "iterations", "precision",
    "optimizer", "learning_rate", "regularization", "data_augmentation",
    "actual_params_millions", "param_match", "arch",
    "traced_peak_mib", "params_mib", "grads_mib", "optimizer_mib", "activations_mib", "temporaries_mib",
    "memory_mib", "gflops_per_iteration",
    "job_id", "seed", "status", "error", "trace_seconds",
)
LABEL_COLUMNS = ("traced_peak_mib", "params_mib", "grads_mib", "optimizer_mib", "activations_mib", "temporaries_mib")

#: Share of jobs whose batch ignores the family's usual per-GPU budget (many of these do not fit).
UNBOUNDED_BATCH_SHARE = 0.15
