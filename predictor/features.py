"""Job descriptions -> numeric feature matrices, the same for every model that is compared.

Two feature sets exist:

* `seed`: the seed paper's 11 input columns as numbers (categories as integer codes), which is all
  the paper's Transformer-BiGRU saw.
* `physics`: our own. Logs of the job's sizes, plus *analytic* estimates of what a training step
  holds in memory (weights, gradients, optimizer state, activations) and how many FLOPs it does,
  worked out with textbook formulas from the architecture the JobSpec realises (the dataset's
  templates size every network from the JobSpec alone). The estimates are deliberately simple
  (they ignore allocator behaviour, temporaries and which tensors autograd really keeps), but they
  have the right *shape*: memory is a sum of terms that scale with parameters and with batch x
  tokens x width, so in log space a model only has to learn corrections, not the physics.

A batch of 10,000 jobs and a single JobSpec at request time share one code path (no pandas on the
request path).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from predictor.sizing import plan
from predictor.spec import MODEL_FAMILIES, OPTIMIZERS, PRECISIONS, SHAPE_KEYS, VISION_FAMILIES, JobSpec, SpecError

FloatArray = npt.NDArray[np.float64]

#: The seed dataset's input columns, in its order (its 12th column was the target).
SEED_COLUMNS: tuple[str, ...] = (
    "model_type", "params_millions", "batch_size", "input_dim", "num_layers", "iterations",
    "precision", "optimizer", "learning_rate", "regularization", "data_augmentation",
)
#: The optional shape annotation's column (`activations_millions`; 0: not given), read when present.
SHAPE_COLUMNS: tuple[str, ...] = tuple(attr for _, attr in SHAPE_KEYS)
#: The activation-count table beside the dataset (predictor.dataset.shapes.SHAPES_FILE; that module
#: imports torch, this one must not: the replay reads the table too).
SHAPES_FILE = "real_shapes.json"
#: Share of the architectures whose optional activation count (`activations-millions`) the rows a
#: model fits leave out, drawn per architecture from a hash of its name (`shapes_dropped`): the model
#: learns with and without it, and a job that leaves it out is one of the rows it fitted.
SHAPES_DROPPED_SHARE = 0.5
NUMERIC_COLUMNS: tuple[str, ...] = (
    "params_millions", "batch_size", "input_dim", "num_layers", "iterations", "learning_rate",
    "regularization", "data_augmentation",
)
FEATURE_SETS: tuple[str, ...] = ("seed", "physics")

#: Categorical columns of the physics set, always last in the matrix, with their cardinalities.
CATEGORICAL: tuple[tuple[str, int], ...] = (
    ("model_type", len(MODEL_FAMILIES)), ("precision", len(PRECISIONS)), ("optimizer", len(OPTIMIZERS)),
)

MIB = 1024.0 * 1024.0
#: A first-order nvidia-smi model: CUDA context + framework, and allocator caching/rounding on top of
#: the tensors (the issue's first look at ../shared/data/gpumem: measured ~ 1441 MiB + 1.28 x traced).
#: Used only to shape one input feature (log of the prior is nearly linear in log of the label);
#: the dataset's own fitted calibration is what the labels use.
PRIOR_CONTEXT_MIB = 1441.0
PRIOR_FACTOR = 1.28
#: Bytes per stored weight/gradient; amp trains fp32 master weights (autocast casts copies).
_WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "amp": 4.0}
#: Bytes per saved activation element.
_ACTIVATION_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "amp": 2.0}
#: Optimizer state tensors per parameter (PyTorch defaults: rmsprop keeps square_avg, adagrad sum).
_OPTIMIZER_STATES = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0, "adamw": 2.0, "rmsprop": 1.0, "adagrad": 1.0}
#: Gate count of one recurrent cell (how many d x d matrices per input and hidden state).
_GATES = {"rnn": 1.0, "lstm": 4.0, "gru": 3.0}


@dataclass(frozen=True)
class FeatureMatrix:
    """A feature matrix with its column names; `n_categorical` trailing columns hold integer codes."""

    values: FloatArray
    names: tuple[str, ...]
    categorical: tuple[int, ...] = ()  # cardinalities of the trailing categorical columns


def columns_from_frame(frame: Any) -> dict[str, npt.NDArray[Any]]:
    """The JobSpec columns of a dataset frame (pandas DataFrame or mapping of arrays); the shape
    columns are 0 (not given) where the frame has none."""
    cols: dict[str, npt.NDArray[Any]] = {}
    for name in SEED_COLUMNS:
        values = np.asarray(frame[name])
        if name in ("model_type", "precision", "optimizer"):
            cols[name] = values.astype(str)
        else:
            cols[name] = values.astype(np.float64)
    n = len(cols["model_type"])
    for name in SHAPE_COLUMNS:
        cols[name] = np.nan_to_num(np.asarray(frame[name], dtype=np.float64)) if name in frame else np.zeros(n)
    return cols


def columns_from_specs(specs: Sequence[JobSpec]) -> dict[str, npt.NDArray[Any]]:
    """The same columns for JobSpecs (the request path)."""
    cols: dict[str, npt.NDArray[Any]] = {}
    for name in (*SEED_COLUMNS, *SHAPE_COLUMNS):
        values = [getattr(spec, name) for spec in specs]
        if name in ("model_type", "precision", "optimizer"):
            cols[name] = np.asarray(values, dtype=str)
        else:
            cols[name] = np.asarray(values, dtype=np.float64)
    return cols


def _codes(values: npt.NDArray[Any], options: Sequence[str], column: str) -> FloatArray:
    return _lookup(values, _code_table(tuple(options)), column)


@functools.cache
def _code_table(options: tuple[str, ...]) -> dict[str, float]:
    return {option: float(index) for index, option in enumerate(options)}


def seed_features(cols: Mapping[str, npt.NDArray[Any]]) -> FeatureMatrix:
    """The seed paper's 11 inputs, categories label-encoded (as a MATLAB table import would)."""
    out = np.column_stack([
        _codes(cols["model_type"], MODEL_FAMILIES, "model_type") if name == "model_type"
        else _codes(cols["precision"], PRECISIONS, "precision") if name == "precision"
        else _codes(cols["optimizer"], OPTIMIZERS, "optimizer") if name == "optimizer"
        else np.asarray(cols[name], dtype=np.float64)
        for name in SEED_COLUMNS
    ])
    return FeatureMatrix(out, SEED_COLUMNS)


def analytic_estimates(cols: Mapping[str, npt.NDArray[Any]]) -> dict[str, FloatArray]:
    """Textbook estimates per job of one training step: bytes of weights, gradients, optimizer
    state and saved activations, and FLOPs per iteration.

    The realised architecture (width, stages, vocabulary, tokens) comes from the dataset's
    sizing plan (`predictor.sizing.plan`, pure arithmetic on the JobSpec), so the
    estimates describe the very network a JobSpec stands for. Activations are split into three
    terms that scale differently: linear in batch x tokens x width, quadratic in tokens (attention
    scores), and the vocabulary logits; the model learns how much of each really stays alive.
    FLOPs are 3 x forward, forward = 2 x multiply-accumulates of every matmul and convolution.
    The per-family activation factors (elements kept per layer) are round numbers set by comparing
    with the traced breakdown of the first ~1,100 generated jobs; they only shape inputs.
    """
    n = len(cols["model_type"])
    out = {name: np.zeros(n) for name in _ESTIMATES}
    for i in range(n):
        spec = JobSpec(
            model_type=str(cols["model_type"][i]), params_millions=float(cols["params_millions"][i]),
            batch_size=int(cols["batch_size"][i]), input_dim=int(cols["input_dim"][i]),
            num_layers=int(cols["num_layers"][i]), precision=str(cols["precision"][i]),
            optimizer=str(cols["optimizer"][i]), regularization=bool(cols["regularization"][i]),
        )
        for name, value in _estimate_one(spec).items():
            out[name][i] = value
    return out


_ESTIMATES: tuple[str, ...] = (
    "width", "tokens", "weights_bytes", "grads_bytes", "optimizer_bytes", "act_linear_bytes", "act_attention_bytes",
    "act_logits_bytes", "activation_bytes", "static_bytes", "total_bytes", "forward_peak_bytes", "step_peak_bytes",
    "peak_bytes", "flops", "prior_memory_mib",
)


def _estimate_one(spec: JobSpec) -> dict[str, float]:
    the_plan = plan(spec)
    hp, b, family = the_plan.hparams, float(spec.batch_size), the_plan.family
    params = float(the_plan.params)
    linear = attention = logits = flops = 0.0  # activation elements, FLOPs
    tokens = 1.0
    if family == "mlp":
        w, layers = hp["width"], hp["layers"]
        linear = 5.0 * b * (hp["features"] + w * layers * (3.0 if hp["dropout"] else 2.0) + hp["classes"])
        flops = 6.0 * b * params
        width = float(w)
    elif family in ("cnn", "resnet"):
        linear, flops, tokens = _conv_estimates(family, hp, b)
        width = float(hp["width"])
    elif family in ("rnn", "lstm", "gru"):
        h, gates, tokens = hp["hidden"], _GATES[family], float(hp["seq"])
        n_in, mac = hp["features"], 0.0
        for _ in range(hp["layers"]):
            mac += gates * (n_in * h + h * h)
            n_in = h
        linear = b * tokens * h * hp["layers"] * (3.0 * gates + 2.0)
        flops = 6.0 * b * tokens * mac
        width = float(h)
    else:  # transformer, gpt, vit
        d, layers, heads = hp["d_model"], hp["layers"], hp["heads"]
        tokens = float(hp["tokens"] if family == "vit" else hp["seq"])
        linear = layers * 16.0 * b * tokens * d + b * tokens * d * 2.0
        attention = layers * 2.5 * b * heads * tokens * tokens
        block_mac = layers * 12.0 * d * d
        flops = 6.0 * b * tokens * block_mac + 12.0 * layers * b * tokens * tokens * d
        if family == "gpt":
            logits = 5.0 * b * tokens * hp["vocab"]
            flops += 6.0 * b * tokens * d * hp["vocab"]
        if family == "vit":
            flops += 6.0 * b * (tokens - 1.0) * 3.0 * hp["patch"] ** 2 * d
        width = float(d)
    weight_b = _WEIGHT_BYTES[spec.precision]
    act_b = _ACTIVATION_BYTES[spec.precision]
    weights = params * weight_b
    amp_copy = params * 2.0 if spec.precision == "amp" else 0.0  # autocast's half copy of the weights
    grads = params * weight_b
    opt_state = params * weight_b * _OPTIMIZER_STATES[spec.optimizer]
    # fused attention kernels do not keep the T x T scores: the attention term stays a separate
    # input (the model learns how much of it is real), outside the activation sum
    activations = (linear + logits) * act_b + amp_copy
    # the step's peak is either the end of the forward pass (gradients were freed by zero_grad)
    # or the optimizer step (gradients + state + about one parameter-sized temporary)
    forward_peak = weights + opt_state + activations
    step_peak = 2.0 * weights + grads + opt_state
    peak = max(forward_peak, step_peak)
    return {
        "width": width, "tokens": tokens, "weights_bytes": weights, "grads_bytes": grads,
        "optimizer_bytes": opt_state, "act_linear_bytes": linear * act_b, "act_attention_bytes": attention * act_b,
        "act_logits_bytes": logits * act_b, "activation_bytes": activations,
        "static_bytes": weights + grads + opt_state, "total_bytes": weights + grads + opt_state + activations,
        "forward_peak_bytes": forward_peak, "step_peak_bytes": step_peak, "peak_bytes": peak,
        "flops": flops, "prior_memory_mib": PRIOR_CONTEXT_MIB + PRIOR_FACTOR * peak / MIB,
    }


def _conv_estimates(family: str, hp: dict[str, Any], b: float) -> tuple[float, float, float]:
    """(activation elements, FLOPs, input pixels) of the VGG-like or residual template."""
    w, side = hp["width"], float(hp["image"])
    act = mac = 0.0
    r, c_in = side, 3
    if family == "cnn":
        pools = min(len(hp["stages"]), max(0, int(math.log2(side)))) if side > 1 else 0
        for s, count in enumerate(hp["stages"]):
            c_out = w * (1 << min(s, 3))
            for _ in range(count):
                mac += 9.0 * c_in * c_out * r * r
                act += 3.0 * c_out * r * r  # conv out, BatchNorm out, ReLU out
                c_in = c_out
            if s < pools:
                r = max(1.0, math.floor(r / 2))
                act += c_out * r * r
    else:
        if side >= 128:
            r = math.ceil(side / 2)
            mac += 49.0 * 3 * w * r * r
            act += 3.0 * w * r * r
            r = math.ceil(r / 2)
        else:
            mac += 9.0 * 3 * w * r * r
            act += 3.0 * w * r * r
        c_in = w
        for s, count in enumerate(hp["stages"]):
            c_out = w * (1 << s)
            for block in range(count):
                if block == 0 and s > 0 and r > 1:
                    r = math.ceil(r / 2)
                mac += 9.0 * c_in * c_out * r * r + 9.0 * c_out * c_out * r * r
                if block == 0 and (s > 0 or c_in != c_out):
                    mac += c_in * c_out * r * r
                act += 5.0 * c_out * r * r
                c_in = c_out
    return b * act, 6.0 * b * mac, side * side


#: Bytes per parameter of each tensor held all step long (weights, and each optimizer state tensor):
#: amp keeps fp32 master weights; fp16 and bf16 train half-precision weights (the dataset's rule).
_STATE_BYTES = {"fp32": 4.0, "amp": 4.0, "fp16": 2.0, "bf16": 2.0}


#: The activation term is never taken below this share of the traced peak (rows whose peak is the
#: optimizer step have almost nothing beyond the fixed bytes).
ACTIVATION_FLOOR = 0.01


@dataclass(frozen=True)
class Decomposition:
    """What the annotations determine exactly, and the scales of what they do not, per job.

    The peak of a training step is weights + optimizer state (arithmetic on params, precision and
    optimizer: `fixed_mib`) plus what the step saves for backward and its temporaries, which grows
    with batch x input and with the network's width and depth and which no annotation gives exactly.
    Models learn that remainder as a density, `activation / act_scale` with act_scale = batch x input
    units (`input_units`: pixels of an image, tokens; 1 for an MLP) x sqrt(params x layers) (width x depth for a network
    whose layers hold ~width^2 parameters each), and FLOPs as `gflops / flops_scale` (batch x input
    units x params). nvidia-smi memory is `calibration[0] + calibration[1] x traced` (the dataset's
    context MiB and factor). `identity` (the paper's network, raw targets) decodes a target as itself.
    """

    fixed_mib: FloatArray
    act_scale: FloatArray
    flops_scale: FloatArray
    calibration: tuple[float, float] = (0.0, 1.0)

    @classmethod
    def identity(cls, n: int) -> Decomposition:
        return cls(np.zeros(n), np.ones(n), np.ones(n))

    def take(self, rows: npt.NDArray[np.int64]) -> Decomposition:
        return Decomposition(self.fixed_mib[rows], self.act_scale[rows], self.flops_scale[rows], self.calibration)

    def encode(self, y: FloatArray) -> FloatArray:
        """(memory_mib, gflops) (n, 2) -> (activation density, FLOPs density), both positive."""
        context_mib, factor = self.calibration
        traced = (y[:, 0] - context_mib) / factor
        activation = np.maximum(traced - self.fixed_mib, ACTIVATION_FLOOR * np.maximum(traced, 1e-9))
        return np.column_stack([activation / self.act_scale, y[:, 1] / self.flops_scale])

    def memory(self, density: FloatArray) -> FloatArray:
        """Activation density -> nvidia-smi memory (MiB)."""
        context_mib, factor = self.calibration
        out: FloatArray = context_mib + factor * (self.fixed_mib + density * self.act_scale)
        return out

    def flops(self, density: FloatArray) -> FloatArray:
        out: FloatArray = density * self.flops_scale
        return out


def shapes_dropped(names: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """(rows, shape columns): which optional shape annotation the fits leave out of each row: all of them
    for SHAPES_DROPPED_SHARE of the architectures, by a hash of the name (deterministic)."""
    dropped = np.fromiter((hashlib.sha256(str(n).encode()).digest()[0] < 256 * SHAPES_DROPPED_SHARE for n in names),
                          dtype=bool, count=len(names))
    return np.repeat(dropped[:, None], len(SHAPE_COLUMNS), axis=1)


def shape_columns(cols: dict[str, npt.NDArray[Any]], names: npt.NDArray[Any],
                  table_path: Path) -> dict[str, FloatArray]:
    """The optional shape annotations of each row's architecture (predictor/dataset/shapes.py's table
    next to the dataset), 0 where the architecture has none or the table is absent. The table's
    activation count is at the architecture's default input; a row at another input reads it scaled
    as docs/data-scientist.md tells a user to scale a model card's figure: by the input units (pixels of an
    image, tokens of a sequence; an MLP's count does not depend on its input features)."""
    table = read_shapes_table(table_path)
    out = {c: np.asarray([float(table.get(str(n), {}).get(c, 0)) for n in names], dtype=np.float64)
           for c in SHAPE_COLUMNS}
    default = np.asarray([float(table.get(str(n), {}).get("input_default", 0)) for n in names], dtype=np.float64)
    at_default = input_units({"input_dim": np.where(default > 0, default, 1.0), "model_type": cols["model_type"]})
    out["activations_millions"] = out["activations_millions"] * input_units(cols) / at_default
    return out


def read_shapes_table(path: Path) -> dict[str, dict[str, float]]:
    """predictor/dataset/shapes.py's table (name -> {attribute: value}); {} when absent. Read here
    without importing that module (it builds models with torch)."""
    if not path.is_file():
        return {}
    return {name: {k: float(v) for k, v in values.items()}
            for name, values in json.loads(path.read_text())["architectures"].items()}


def input_units(cols: Mapping[str, npt.NDArray[Any]]) -> FloatArray:
    """What one sample's activations scale with besides the network: the pixels of an image (side^2),
    the tokens or steps of a sequence, and 1 for an MLP (its hidden activations do not grow with the
    number of input features; the input itself is one more term the model learns from `input_dim`)."""
    dim = np.asarray(cols["input_dim"], dtype=np.float64)
    families = [str(f) for f in cols["model_type"]]
    vision = np.fromiter((f in VISION_FAMILIES for f in families), dtype=bool, count=len(dim))
    mlp = np.fromiter((f == "mlp" for f in families), dtype=bool, count=len(dim))
    out: FloatArray = np.where(vision, dim * dim, np.where(mlp, 1.0, dim))
    return out


def decomposition(cols: Mapping[str, npt.NDArray[Any]], context_mib: float = 0.0,
                  factor: float = 1.0, *, shapes: bool = True) -> Decomposition:
    """The `Decomposition` of each job (pure arithmetic on its annotations). A job that states its
    activation count (`activations-millions`, and `shapes`) has the activation scale batch x that count
    (the learned density is then bytes per counted activation, ACTIVATION_COUNT_UNIT of them a MiB);
    the others batch x input units x sqrt(params x layers)."""
    params = np.asarray(cols["params_millions"], dtype=np.float64)
    batch = np.asarray(cols["batch_size"], dtype=np.float64)
    layers = np.maximum(np.asarray(cols["num_layers"], dtype=np.float64), 1.0)
    state_bytes = _lookup(cols["precision"], _STATE_BYTES, "precision")
    states = 1.0 + _lookup(cols["optimizer"], _OPTIMIZER_STATES, "optimizer")
    fixed = params * 1e6 * state_bytes * states / MIB
    units = batch * input_units(cols)
    act_scale = units * np.sqrt(params * layers)
    if shapes and "activations_millions" in cols:
        counted = np.asarray(cols["activations_millions"], dtype=np.float64)
        act_scale = np.where(counted > 0, batch * counted * ACTIVATION_COUNT_UNIT, act_scale)
    return Decomposition(fixed, act_scale, units * params, (context_mib, factor))


#: Counted activations per million (`activations-millions` is in millions): the learned density of a
#: job that states its count is MiB per counted activation (~1e-5), of the order of the others' densities.
ACTIVATION_COUNT_UNIT = 1e6


def _lookup(values: npt.NDArray[Any], table: Mapping[str, float], column: str) -> FloatArray:
    """The table's number for each value; a value not in it is a clear error naming the column."""
    try:
        return np.fromiter((table[str(v)] for v in values), dtype=np.float64, count=len(values))
    except KeyError as err:
        raise ValueError(f"column {column!r} holds {err.args[0]!r}: expected one of {', '.join(table)}") from None


PHYSICS_NAMES: tuple[str, ...] = (
    "log2_params_millions", "log2_num_layers", "log2_params_per_layer", "regularization", "image_input",
    "log2_batch_size", "log2_input_dim", "log2_input_units", "log2_batch_units",
    "log2_fixed_mib", "log2_act_scale", "log2_fixed_per_act_scale", "activation_bytes",
    *(SHAPE_NAMES := ("log2_activations_per_scale", "activations_given")),
)


def shape_features(cols: Mapping[str, npt.NDArray[Any]]) -> FloatArray:
    """The optional activation count as physics (`SHAPE_NAMES`): one sample's counted activations against
    what params and layers imply (input units x sqrt(params x layers), the scale a job without it gets),
    in log2, and a "given" flag; both 0 when not given, so a job without it reads exactly as one of the
    rows the model was trained without it."""
    n = len(cols["model_type"])
    params = np.asarray(cols["params_millions"], dtype=np.float64) * 1e6
    layers = np.maximum(np.asarray(cols["num_layers"], dtype=np.float64), 1.0)
    acts = np.asarray(cols.get("activations_millions", np.zeros(n)), dtype=np.float64) * 1e6
    given = acts > 0
    out: FloatArray = np.column_stack([
        np.where(given, np.log2(np.where(given, acts, 1.0) / (input_units(cols) * np.sqrt(params * layers))), 0.0),
        given.astype(np.float64),
    ])
    return out


def image_input(cols: Mapping[str, npt.NDArray[Any]]) -> FloatArray:
    """1 for a model of images: every vision family, and an MLP whose annotation says it trains with data
    augmentation (docs/data-scientist.md's rule sets it for image models: MLP-Mixer, ResMLP). Augmentation runs in
    the CPU loader and costs no GPU memory; as an input of its own it only told image rows apart (the
    dataset sets it for every image model), and a vision pod that left it at its default `false` fell
    off the trained range (3.5 GB for resnet18 at batch 32 instead of 1.9 GB)."""
    families = [str(f) for f in cols["model_type"]]
    vision = np.fromiter((f in VISION_FAMILIES for f in families), dtype=bool, count=len(families))
    out: FloatArray = np.where(vision, 1.0, np.asarray(cols["data_augmentation"], dtype=np.float64))
    return out


def physics_features(cols: Mapping[str, npt.NDArray[Any]], terms: Decomposition | None = None) -> FeatureMatrix:
    """Our feature set: log2 sizes and the `decomposition`'s terms, the dropout flag, the optional shape
    annotations (`shape_features`), then 3 categorical codes.

    All arithmetic on the annotations (no architecture is built: real networks of a family differ
    too much for a template to stand for them). `iterations` and `learning_rate` are left out: they
    change neither the per-step memory nor the per-step FLOPs; `data_augmentation` only through
    `image_input`. `terms`: the columns' decomposition
    when the caller has it already (the runtime needs it to decode anyway).
    """
    # the columns besides the shape annotations' own read the decomposition without them, so a job
    # that leaves them out reads exactly as one that states them in every other column
    terms = decomposition(cols, shapes=False) if terms is None or "activations_millions" in cols else terms
    params = np.asarray(cols["params_millions"], dtype=np.float64)
    layers = np.maximum(np.asarray(cols["num_layers"], dtype=np.float64), 1.0)
    batch = np.asarray(cols["batch_size"], dtype=np.float64)
    units = input_units(cols)
    act_bytes = _lookup(cols["precision"], _ACTIVATION_BYTES, "precision")
    log2 = np.log2
    numeric = [
        log2(params), log2(layers), log2(params / layers),
        np.asarray(cols["regularization"], dtype=np.float64), image_input(cols),
        log2(batch), log2(np.asarray(cols["input_dim"], dtype=np.float64)), log2(units), log2(batch * units),
        log2(np.maximum(terms.fixed_mib, 1e-6)), log2(terms.act_scale),
        log2(np.maximum(terms.fixed_mib, 1e-6) / terms.act_scale), act_bytes,
        *shape_features(cols).T,
    ]
    categorical = [
        _codes(cols["model_type"], MODEL_FAMILIES, "model_type"),
        _codes(cols["precision"], PRECISIONS, "precision"),
        _codes(cols["optimizer"], OPTIMIZERS, "optimizer"),
    ]
    names = (*PHYSICS_NAMES, *(name for name, _ in CATEGORICAL))
    values = np.column_stack(numeric + categorical)
    return FeatureMatrix(values, names, tuple(card for _, card in CATEGORICAL))


#: Physics features grouped into tokens by meaning (the network's size and shape, the input, the
#: memory terms, the optional activation count); with the 3 categorical tokens the sequence has 7
#: steps, what the BiGRU's cost scales with.
PHYSICS_TOKEN_GROUPS: tuple[tuple[str, ...], ...] = (
    ("log2_params_millions", "log2_num_layers", "log2_params_per_layer", "regularization", "image_input"),
    ("log2_batch_size", "log2_input_dim", "log2_input_units", "log2_batch_units"),
    ("log2_fixed_mib", "log2_act_scale", "log2_fixed_per_act_scale", "activation_bytes"),
    SHAPE_NAMES,
)


def physics_token_groups() -> tuple[tuple[int, ...], ...]:
    """PHYSICS_TOKEN_GROUPS as column indices of the physics feature matrix."""
    return tuple(tuple(PHYSICS_NAMES.index(n) for n in group) for group in PHYSICS_TOKEN_GROUPS)


def build_features(cols: Mapping[str, npt.NDArray[Any]], feature_set: str) -> FeatureMatrix:
    """The named feature set (`seed` or `physics`) for the given columns."""
    if feature_set == "seed":
        return seed_features(cols)
    if feature_set == "physics":
        return physics_features(cols)
    raise ValueError(f"unknown feature set {feature_set!r}: expected one of {', '.join(FEATURE_SETS)}")


#: The dataset columns a data scientist's annotations come from (docs/CONTRACTS.md, jobs.csv).
SPEC_COLUMNS = ("model_type", "params_millions", "batch_size", "input_dim", "num_layers", "iterations",
                "precision", "optimizer", "learning_rate", "regularization", "data_augmentation")


#: docs/data-scientist.md's rule for vision mixers (MLP-Mixer, ResMLP, gMLP): annotate them `vit` (patch tokens
#: through blocks, input-dim the image side), not `mlp` (whose input-dim is a feature count). The
#: dataset keeps their family `mlp` (what the shipped network was trained on); a user, and
#: `row_spec`, write `vit`.
MIXER_RULE = "vision mixers (MLP-Mixer, ResMLP, gMLP) are annotated vit"


def row_spec(row: Mapping[str, str], activations_millions: float = 0.0) -> JobSpec | None:
    """A dataset row as the annotations a user writes by docs/data-scientist.md's rules (None: the row does not
    parse): a real vision mixer (`family` mlp, not a torch.nn stack) as `vit` (MIXER_RULE)."""
    raw = {c.replace("_", "-"): row[c] for c in SPEC_COLUMNS if row.get(c) not in (None, "")}
    for key in ("regularization", "data-augmentation"):
        if key in raw:
            raw[key] = "true" if raw[key] in ("1", "1.0", "true", "True") else "false"
    if activations_millions > 0:
        raw["activations-millions"] = f"{activations_millions:.6g}"
    if raw.get("precision") == "bf16":  # the dataset's bf16 is the whole model (an annotation's plain bf16 is not)
        raw["precision"] = "bf16-true"
    if row.get("family") == "mlp" and row.get("source") not in (None, "", "nn"):
        raw["model-type"] = "vit"  # MIXER_RULE
    try:
        return JobSpec.parse(raw)
    except SpecError:
        return None


def annotated_specs(rows: Sequence[Mapping[str, str]], data_dir: Path) -> list[JobSpec | None]:
    """Real-architecture rows as a data scientist describing a custom model would annotate them: the
    family fields, plus the activation count (SHAPES_FILE in `data_dir`, scaled to the row's input)
    for the architectures the predictor's own fits give it to (`shapes_dropped`), so a consumer
    meets the bound with and without it as the evaluation does. The replay and the real-GPU
    campaign's report both ask the predictor this way."""
    names = np.asarray([row.get("name", "") for row in rows], dtype=str)
    cols = {"model_type": np.asarray([row["model_type"] for row in rows], dtype=str),
            "input_dim": np.asarray([float(row["input_dim"] or 0) for row in rows], dtype=np.float64)}
    counts = shape_columns(cols, names, data_dir / SHAPES_FILE)["activations_millions"]
    given = np.where(shapes_dropped(names)[:, 0], 0.0, counts)
    return [row_spec(row, float(count)) for row, count in zip(rows, given, strict=True)]
