"""The shared vocabulary between the predictor and the extender: what a training job is (JobSpec)
and what it will need from a GPU (Demand).

A JobSpec is parsed from `key -> string` pairs named like the pod annotations without their
`deepres.io/` prefix (`model-type`, `batch-size`, ...), so the data scientist's annotations, the
dataset rows and the `/v1/predict` endpoint all share one parser and one set of error messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from predictor.errors import SpecError as SpecError  # re-exported: its home is one floor down (the table uses it)
from predictor.parsing import SPELLING, read_number, read_whole

#: Architecture families the predictor has templates for.
MODEL_FAMILIES: tuple[str, ...] = ("mlp", "cnn", "resnet", "rnn", "lstm", "gru", "transformer", "gpt", "vit")

#: Accepted spellings (case-insensitive) mapped to their family.
MODEL_ALIASES: dict[str, str] = {
    **{family: family for family in MODEL_FAMILIES},
    "vgg": "cnn",
    "convnet": "cnn",
    "bert": "transformer",
    "encoder": "transformer",
    "llm": "gpt",
    "decoder": "gpt",
    "fc": "mlp",
    "vision-transformer": "vit",
}

#: The precisions the dataset traces and the network reads: `fp16`/`bf16` train the whole model in
#: that type (weights, gradients, optimizer states: Lightning's `16-true`/`bf16-true`), `amp` is
#: autocast fp16 with fp32 weights, gradients and optimizer states (`16-mixed`, HF Trainer `fp16=True`).
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "amp")
#: A JobSpec's precision: those, and `bf16-mixed` (autocast bf16 with fp32 weights, gradients and
#: optimizer states: HF Trainer `bf16=True`, Lightning `bf16-mixed`). Its memory is amp's (the same
#: byte widths); the predictor answers the larger of amp and whole-model bf16 for it.
JOB_PRECISIONS: tuple[str, ...] = (*PRECISIONS, "bf16-mixed")
#: How frameworks spell them (case-insensitive) -> the JobSpec precision. Plain `bf16` means
#: bf16-mixed for HF Trainer (`bf16=True`) and Lightning (`precision="bf16"` is `bf16-mixed`) but the
#: whole model in bf16 for `model.to(torch.bfloat16)`: it is read as bf16-mixed, the larger of the two
#: (fp32 weights, gradients and states instead of bf16 ones), with a warning in the Demand.
PRECISION_SPELLINGS: dict[str, str] = {
    "fp32": "fp32", "32": "fp32", "32-true": "fp32", "fp32-true": "fp32", "float32": "fp32", "tf32": "fp32",
    "fp16": "fp16", "16-true": "fp16", "fp16-true": "fp16", "half": "fp16",
    "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed", "bf16-true": "bf16",
    "amp": "amp", "16-mixed": "amp", "fp16-mixed": "amp", "16": "amp",
}
#: The note a Demand carries when the precision was written as plain `bf16`.
PLAIN_BF16_NOTE = ("precision=bf16 read as bf16-mixed (autocast, fp32 weights/gradients/optimizer states: HF "
                   "Trainer bf16=True, Lightning bf16-mixed), the larger of the two; write bf16-true if the whole "
                   "model is bf16")
OPTIMIZERS: tuple[str, ...] = ("sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad")

#: Families whose `input-dim` is an image side; for sequence models it is a sequence length and for
#: an MLP the number of input features.
VISION_FAMILIES: frozenset[str] = frozenset({"cnn", "resnet", "vit"})

#: Defaults applied when an optional key is missing. `input-dim` and `num-layers` depend on the family.
DEFAULT_PARAMS_MILLIONS = 25.0
DEFAULT_BATCH_SIZE = 32
DEFAULT_ITERATIONS = 10_000
DEFAULT_PRECISION = "fp32"
DEFAULT_OPTIMIZER = "adam"
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_INPUT_DIM: dict[str, int] = {
    "mlp": 1024, "cnn": 224, "resnet": 224, "vit": 224,
    "rnn": 128, "lstm": 128, "gru": 128, "transformer": 512, "gpt": 1024,
}
DEFAULT_NUM_LAYERS: dict[str, int] = {
    "mlp": 4, "cnn": 5, "resnet": 4, "vit": 12,
    "rnn": 2, "lstm": 2, "gru": 2, "transformer": 12, "gpt": 12,
}

# Accepted ranges: wide enough for any real job, narrow enough to catch typos (a batch of 10^9).
PARAMS_MILLIONS_RANGE = (0.001, 1_000_000.0)
BATCH_SIZE_RANGE = (1, 1_000_000)
INPUT_DIM_RANGE = (1, 10_000_000)
NUM_LAYERS_RANGE = (1, 10_000)
ITERATIONS_RANGE = (1, 10**12)
LEARNING_RATE_RANGE = (0.0, 100.0)
TRACED_PEAK_RANGE_MIB = (0.0, 16.0 * 1024 * 1024)  # 0 means "not given"; 16 TiB is a typo
# The optional activation count (docs/data-scientist.md, "How to fill the family annotations"); 0 means "not given".
ACTIVATIONS_MILLIONS_RANGE = (0.0, 10_000_000.0)

_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


@dataclass(frozen=True)
class JobSpec:
    """One training process's description, as the data scientist annotates it.

    `batch_size` is per GPU. `input_dim` is the sequence length (text/sequence models), the image
    side (vision models) or the number of features (MLP). `defaulted` lists the keys that were
    missing and took a default; it does not take part in equality, so caching ignores it.
    """

    model_type: str
    params_millions: float = DEFAULT_PARAMS_MILLIONS
    batch_size: int = DEFAULT_BATCH_SIZE
    input_dim: int = 0  # 0: the family's default, filled in by __post_init__
    num_layers: int = 0  # 0: the family's default, filled in by __post_init__
    iterations: int = DEFAULT_ITERATIONS
    precision: str = DEFAULT_PRECISION
    optimizer: str = DEFAULT_OPTIMIZER
    learning_rate: float = DEFAULT_LEARNING_RATE
    regularization: bool = False
    data_augmentation: bool = False
    model: str = ""  # exact architecture (`timm/resnet50`...): its traced curve wins over the family fields
    traced_peak_mib: float = 0.0  # the user's own traced peak (`deepres profile`); 0: none
    # optional: one sample's forward activation count at input-dim, in millions (timm's model cards'
    # "Activations (M)", `deepres profile`): how much a network of this size keeps for backward, which
    # the family fields cannot tell (docs/data-scientist.md, "How to fill the family annotations"); 0: not given
    activations_millions: float = 0.0
    # what the model is trained for (`predictor.tasks`): "" the default head of the model or family;
    # `target_dim` the target length of a seq2seq task in tokens (0: a quarter of the input)
    task: str = ""
    target_dim: int = 0
    # how the user's spelling was read, where it could mean two things (`PLAIN_BF16_NOTE`): shown in the Demand
    notes: tuple[str, ...] = ()
    defaulted: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.model:
            from predictor import table  # the table is read once, only when a model name is given

            object.__setattr__(self, "model", table.resolve(self.model))
        _check_range("traced-peak-mib", self.traced_peak_mib, TRACED_PEAK_RANGE_MIB)
        _check_range("activations-millions", self.activations_millions, ACTIVATIONS_MILLIONS_RANGE)
        family = MODEL_ALIASES.get(str(self.model_type).strip().lower())
        if family is None:
            raise SpecError("model-type", self.model_type, _one_of(sorted(MODEL_ALIASES)))
        object.__setattr__(self, "model_type", family)
        if self.input_dim == 0:
            object.__setattr__(self, "input_dim", DEFAULT_INPUT_DIM[family])
        if self.num_layers == 0:
            object.__setattr__(self, "num_layers", DEFAULT_NUM_LAYERS[family])
        _check_range("params-millions", self.params_millions, PARAMS_MILLIONS_RANGE, low_open=False)
        _check_range("batch-size", self.batch_size, BATCH_SIZE_RANGE)
        _check_range("input-dim", self.input_dim, INPUT_DIM_RANGE)
        _check_range("num-layers", self.num_layers, NUM_LAYERS_RANGE)
        _check_range("iterations", self.iterations, ITERATIONS_RANGE)
        _check_range("learning-rate", self.learning_rate, LEARNING_RATE_RANGE, low_open=True)
        if self.precision not in JOB_PRECISIONS:
            raise SpecError("precision", self.precision, _one_of(PRECISION_CHOICES))
        if self.task or self.target_dim:
            from predictor import tasks

            _check_range("target-dim", self.target_dim, (0, tasks.TARGET_DIM_RANGE[1]))
            task = tasks.check_task(self.model, self.model_type, tasks.parse_task(self.task) if self.task else "",
                                    self.target_dim)
            object.__setattr__(self, "task", task)
            if self.target_dim and task != "seq2seq":
                note = tasks.TARGET_IGNORED.format(task=task)
                object.__setattr__(self, "notes", tuple(dict.fromkeys((*self.notes, note))))
        if self.optimizer not in OPTIMIZERS:
            raise SpecError("optimizer", self.optimizer, _one_of(OPTIMIZERS))

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> JobSpec:
        """Parse annotation-style string values (keys without prefix); raises SpecError.

        Unknown keys are ignored here: the caller decides what else its mapping may hold.
        """
        values: dict[str, Any] = {}
        defaulted: set[str] = set()
        if "model" in raw:  # the exact architecture fills what the user left out, by docs/data-scientist.md's rule
            from predictor import table

            name = table.resolve(raw["model"])
            known = table.entry(name)
            default_input = str(known["default_input"])
            traced = known["inputs"]
            at_input = traced.get(raw.get("input-dim", "").strip()) or traced.get(default_input) or next(
                iter(traced.values()))
            values["model"] = name
            raw = {"model-type": known["family"], "input-dim": default_input,
                   "params-millions": str(at_input["params_millions"]),
                   "num-layers": str(at_input["num_layers"]), **raw}
        if "model-type" not in raw:
            raise SpecError("model-type", None, _one_of(sorted(MODEL_ALIASES)))
        values["model_type"] = raw["model-type"].strip()
        for key, attr, parser in _PARSERS:
            if key in raw:
                values[attr] = parser(key, raw[key])
            elif key not in _OPTIONAL_KEYS:
                defaulted.add(key)
        if "precision" in raw and raw["precision"].strip().lower() == "bf16":
            values["notes"] = (PLAIN_BF16_NOTE,)
        try:
            return cls(**values, defaulted=frozenset(defaulted))
        except SpecError as err:  # report the text the user wrote, not the parsed number
            raise SpecError(err.key, raw.get(err.key, err.value), err.accepted) from None

    def to_annotations(self) -> dict[str, str]:
        """The inverse of `parse`: annotation-style strings (without prefix)."""
        out = {"model-type": self.model_type}
        for key, attr, _ in _PARSERS:
            value = getattr(self, attr)
            if key in _OPTIONAL_KEYS and not value:
                continue
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        if out["precision"] == "bf16":  # the annotation `bf16` reads as bf16-mixed (PRECISION_SPELLINGS)
            out["precision"] = "bf16-true"
        return out

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("defaulted")
        return data

    @property
    def is_vision(self) -> bool:
        return self.model_type in VISION_FAMILIES


@dataclass(frozen=True)
class Demand:
    """What one training process of a JobSpec needs from each GPU it runs on.

    `memory_mib` is the peak GPU memory as nvidia-smi shows it (tensors at the peak + allocator
    overhead + CUDA context); `memory_mib_upper` is a calibrated upper bound used for admission.
    `gpu_seconds` is the whole job's GPU time on the reference GPU: `step_seconds` x iterations
    (predictor/runtime.py), or `estimate_gpu_seconds` from the FLOPs alone where no step is known.
    `warnings` says when the prediction is less sure than usual (inputs outside what the model was
    trained on, for which the bound was widened): shown to the user, never silently dropped.
    """

    memory_mib: float
    memory_mib_upper: float
    gflops_per_iteration: float
    gpu_seconds: float
    model_version: str
    warnings: tuple[str, ...] = ()
    # seconds per training step on the reference GPU (the measured H100) and its parts (per-step,
    # compute, memory traffic) from which `predictor.steptime.on_gpu` scales it to any GPU model;
    # 0 / () where unknown (a Demand built before the step time existed)
    step_seconds: float = 0.0
    step_parts: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        data["step_parts"] = list(self.step_parts)
        return data


class DemandPredictor(Protocol):
    """Anything that turns a JobSpec into a Demand (the shipped `predictor.runtime.Predictor`)."""

    def predict(self, spec: JobSpec) -> Demand: ...


#: Reference sustained throughput used to turn FLOPs into GPU time: an A100's dense peak
#: (TF32 156 TFLOPS for fp32 training, 312 TFLOPS for fp16/bf16/amp) at a model FLOPs utilisation
#: of 40%, typical of well-tuned training. Only relative values matter to the scheduler.
REFERENCE_TFLOPS: dict[str, float] = {"fp32": 156.0, "fp16": 312.0, "bf16": 312.0, "amp": 312.0, "bf16-mixed": 312.0}
REFERENCE_UTILISATION = 0.4


def estimate_gpu_seconds(gflops_per_iteration: float, iterations: int, precision: str) -> float:
    """GPU time of the whole job on the reference GPU (seconds)."""
    tflops = REFERENCE_TFLOPS[precision] * REFERENCE_UTILISATION
    return gflops_per_iteration * iterations / (tflops * 1000.0)


def _one_of(options: Any) -> str:
    return "one of " + ", ".join(str(o) for o in options)


def _check_range(
    key: str, value: float, bounds: tuple[float, float], *, low_open: bool = False
) -> None:
    low, high = bounds
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise SpecError(key, value, f"a number in {bracket}{low:g}, {high:g}]")


def _parse_int(key: str, text: str) -> int:
    try:  # the one strict reader (predictor/parsing.py): ASCII digits, bounded length, finite
        return read_whole(text)
    except ValueError:
        raise SpecError(key, text, f"a whole number ({SPELLING})") from None


def _parse_float(key: str, text: str) -> float:
    try:
        return read_number(text)
    except ValueError:
        raise SpecError(key, text, f"a number ({SPELLING})") from None


def _parse_choice(options: tuple[str, ...]) -> Any:
    def parse(key: str, text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise SpecError(key, text, _one_of(options))
        return value

    return parse


def _parse_precision(key: str, text: str) -> str:
    value = PRECISION_SPELLINGS.get(text.strip().lower())
    if value is None:
        raise SpecError(key, text, _one_of(PRECISION_CHOICES))
    return value


def _parse_task(key: str, text: str) -> str:
    from predictor import tasks

    return tasks.parse_task(text)


def _parse_bool(key: str, text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SpecError(key, text, "true or false")


# (annotation key, JobSpec attribute, parser) for every optional field, in the table's order.
_PARSERS: tuple[tuple[str, str, Any], ...] = (
    ("params-millions", "params_millions", _parse_float),
    ("batch-size", "batch_size", _parse_int),
    ("input-dim", "input_dim", _parse_int),
    ("num-layers", "num_layers", _parse_int),
    ("iterations", "iterations", _parse_int),
    ("precision", "precision", _parse_precision),
    ("optimizer", "optimizer", _parse_choice(OPTIMIZERS)),
    ("learning-rate", "learning_rate", _parse_float),
    ("regularization", "regularization", _parse_bool),
    ("data-augmentation", "data_augmentation", _parse_bool),
    ("model", "model", lambda key, text: text.strip()),
    ("traced-peak-mib", "traced_peak_mib", _parse_float),
    ("activations-millions", "activations_millions", _parse_float),
    ("task", "task", _parse_task),
    ("target-dim", "target_dim", _parse_int),
)
#: Keys written by `to_annotations` only when set.
_OPTIONAL_KEYS = frozenset({"model", "traced-peak-mib", "activations-millions", "task", "target-dim"})
#: The precision spellings, the network's four first (what an error message lists).
PRECISION_CHOICES: tuple[str, ...] = tuple(dict.fromkeys((*PRECISIONS, *PRECISION_SPELLINGS)))
#: The optional shape annotations: (key, JobSpec attribute); also dataset columns of the same attribute name.
SHAPE_KEYS: tuple[tuple[str, str], ...] = (("activations-millions", "activations_millions"),)

#: The annotation keys (without prefix) that describe the job to the predictor.
JOB_KEYS: tuple[str, ...] = ("model-type", *(key for key, _, _ in _PARSERS))

#: JobSpec attribute names in the order the seed's dataset lists them.
JOB_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(JobSpec) if f.name not in ("defaulted", "notes"))
