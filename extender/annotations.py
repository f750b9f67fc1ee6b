"""Pod annotations (`deepres.io/*`) -> the job description and the priority inputs.

The job keys go through `predictor.spec.JobSpec.parse`, so the pod, the dataset and `/v1/predict`
share one parser; this module adds the scheduling keys (`gpus`, `deadline`, `criticality`,
`gpu-memory`). Every error names the key as the user wrote it (with the `deepres.io/` prefix), the
value, and what is accepted. A pod with none of `model-type`, `model` and `gpu-memory` is not a GPU job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from extender.policy.priority import cap_criticality, criticality_from_priority_class
from extender.policy.types import CRITICALITIES
from predictor.parsing import SPELLING, read_number, read_whole
from predictor.spec import (
    ACTIVATIONS_MILLIONS_RANGE,
    BATCH_SIZE_RANGE,
    INPUT_DIM_RANGE,
    ITERATIONS_RANGE,
    JOB_KEYS,
    LEARNING_RATE_RANGE,
    MODEL_ALIASES,
    NUM_LAYERS_RANGE,
    OPTIMIZERS,
    PARAMS_MILLIONS_RANGE,
    PRECISION_CHOICES,
    TRACED_PEAK_RANGE_MIB,
    JobSpec,
    SpecError,
)
from predictor.tasks import TARGET_DIM_RANGE, TASK_ALIASES

PREFIX = "deepres.io/"
MAX_GPUS = 64
DEFAULT_GPUS = 1
DEFAULT_CRITICALITY = "normal"
#: gpu-memory override bounds (MiB): below 64 MiB nothing trains; above 4 TiB is a typo.
GPU_MEMORY_RANGE_MIB = (64.0, 4.0 * 1024 * 1024)
#: deadline durations longer than this (a year) are typos.
MAX_DEADLINE_S = 366 * 86400.0
#: Longest value of a key this module parses (characters): the longest real one (an RFC 3339 time, a
#: model name) is far shorter; numbers are held to `predictor.parsing.NUMBER_MAX_CHARS`.
VALUE_MAX_CHARS = 256

SCHEDULING_KEYS: tuple[str, ...] = ("gpus", "deadline", "criticality", "gpu-memory", "gpu-share",
                                    "checkpoint-interval")
#: Keys whose written value must be in range (ACCEPTED): JobSpec takes 0 for "not given" and fills the
#: default, so a pod saying `input-dim: 0` would silently be planned as another job.
EXPLICIT_KEYS: tuple[str, ...] = ("input-dim", "num-layers", "activations-millions", "target-dim")
#: Written by the extender at bind (see docs/CONTRACTS.md); accepted on a pod, never required.
ASSIGNED_GPUS = "assigned-gpus"
PREDICTED_MEMORY = "predicted-memory-mib"
ADMISSION_MEMORY = "admission-memory-mib"
PREDICTOR_VERSION = "predictor-version"
ASSIGNED_NODE = "assigned-node"
#: the placement in words (prediction, GPU indexes): what a `Placed` Event said, at no extra API write
PLACEMENT = "placement"
#: the wall time of the bind (RFC 3339, UTC): a restart rebuilds the attained service preemption protects
BOUND_AT = "bound-at"
#: the kind of arrival that evicted the pod's workload before this pod (`Reservation.evicted_by`; "none"):
#: a restart keeps the churn rule (the same kind does not evict it again)
EVICTED_BY = "evicted-by"
WRITTEN_KEYS: tuple[str, ...] = (ASSIGNED_GPUS, PREDICTED_MEMORY, ADMISSION_MEMORY, PREDICTOR_VERSION, ASSIGNED_NODE,
                                 PLACEMENT, BOUND_AT, EVICTED_BY)
KNOWN_KEYS: frozenset[str] = frozenset((*JOB_KEYS, *SCHEDULING_KEYS, *WRITTEN_KEYS))

@dataclass(frozen=True)
class Accepted:
    """What one annotation's value may be: the statement its parser checks (JobSpec for the job keys,
    with the same range constants; this module for the scheduling keys) and its JSON Schema is made from
    (`value_schema`, for /v1/predict's OpenAPI document)."""

    kind: str  # "integer", "number", "choice", "bool", "quantity" (MiB), "duration" (s), "architecture"
    low: float = 0.0
    high: float = 0.0
    low_open: bool = False
    choices: tuple[str, ...] = ()


#: Every key a pod may carry (without the prefix), in the order of docs/data-scientist.md's table.
ACCEPTED: dict[str, Accepted] = {
    "model-type": Accepted("choice", choices=tuple(sorted(MODEL_ALIASES))),
    "params-millions": Accepted("number", *PARAMS_MILLIONS_RANGE),
    "batch-size": Accepted("integer", *BATCH_SIZE_RANGE),
    "input-dim": Accepted("integer", *INPUT_DIM_RANGE),
    "num-layers": Accepted("integer", *NUM_LAYERS_RANGE),
    "iterations": Accepted("integer", *ITERATIONS_RANGE),
    "precision": Accepted("choice", choices=PRECISION_CHOICES),
    "optimizer": Accepted("choice", choices=OPTIMIZERS),
    "learning-rate": Accepted("number", *LEARNING_RATE_RANGE, low_open=True),
    "regularization": Accepted("bool"),
    "data-augmentation": Accepted("bool"),
    "model": Accepted("architecture"),
    "traced-peak-mib": Accepted("number", *TRACED_PEAK_RANGE_MIB),
    # optional; a written value is above 0 (JobSpec reads 0 as "not given")
    "activations-millions": Accepted("number", *ACTIVATIONS_MILLIONS_RANGE, low_open=True),
    "task": Accepted("choice", choices=tuple(TASK_ALIASES)),
    "target-dim": Accepted("integer", *TARGET_DIM_RANGE),
    "gpus": Accepted("integer", 1, MAX_GPUS),
    "deadline": Accepted("duration", 0.0, MAX_DEADLINE_S, low_open=True),
    "criticality": Accepted("choice", choices=CRITICALITIES),
    "gpu-memory": Accepted("quantity", *GPU_MEMORY_RANGE_MIB),
    # the prior of the job's GPU duty until observed (`policy.duty`); 0..1
    "gpu-share": Accepted("number", 0.0, 1.0),
    # how often the job checkpoints: preemption may evict it only within what it would lose
    "checkpoint-interval": Accepted("duration", 0.0, MAX_DEADLINE_S, low_open=True),
}


#: The rule across keys that the schema states in words (a pattern cannot): with `model`, the task must be
#: one the architecture was traced with (vision models: image-classification); the answer names them.
TASK_ACROSS_KEYS = ("what the model is trained for; with deepres.io/model, one of the tasks that architecture was "
                    "traced with (vision models: image-classification), else 400 naming them")


def value_schema(key: str) -> dict[str, Any]:
    """The JSON Schema of one annotation's value (a string), from ACCEPTED. Numbers are strings in
    annotations, so a range is a pattern: exactly the range's whole numbers in plain decimal, and for
    fractions those with up to three decimals (the parser takes more spellings: 3e-4, 032...)."""
    rule = ACCEPTED[key]
    low, high = rule.low, rule.high
    if rule.kind == "integer":
        return _pattern(_whole(int(low), int(high)), f"a whole number from {low:g} to {high:g}")
    if rule.kind == "number":
        return _pattern(_decimal(low, high, low_open=rule.low_open),
                        f"a number in {'(' if rule.low_open else '['}{low:g}, {high:g}]")
    if rule.kind == "quantity":
        gib_low = math.ceil(low / 1024)
        return _pattern(f"(?:{_whole(int(low), int(high))}Mi|{_whole(gib_low, int(high // 1024))}Gi)",
                        f"a memory quantity from {low:g} MiB to {high:g} MiB (24Gi, 24576Mi; Ki, Ti, k, M, G, T too)")
    if rule.kind == "duration":
        parts = [f"{_whole(1, int(high // unit))}{name}" for name, unit in _UNIT_S.items()]
        return _pattern("(?:" + "|".join(parts) + ")", "a duration from pod creation up to a year (6h, 90m, 2d), "
                        "or an RFC 3339 time with a zone")
    if rule.kind == "bool":
        return {"type": "string", "enum": ["true", "false"], "description": "true or false (yes/no, 1/0, on/off)"}
    if rule.kind == "architecture":
        from predictor import exact  # the traced table, read only when the schema is asked for

        return {"type": "string", "enum": exact.names(), "description": "an architecture of the traced table"}
    if key == "task":  # the one rule across keys of the job: a named model has the heads it was traced with
        return {"type": "string", "enum": list(rule.choices), "description": TASK_ACROSS_KEYS}
    return {"type": "string", "enum": list(rule.choices)}


def _pattern(regex: str, description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^{regex}$", "description": description}


def _whole(low: int, high: int) -> str:
    """A regex matching exactly the whole numbers low..high (0 <= low <= high) in plain decimal."""
    parts: list[str] = []
    while low <= high:
        top = min(high, 10 ** len(str(low)) - 1)  # the same number of digits
        parts.append(_digits(str(low), str(top)))
        low = top + 1
    return "(?:" + "|".join(parts) + ")"


def _digits(a: str, b: str) -> str:
    """Digit strings from a to b, of one length."""
    if a == b:
        return a
    if len(a) == 1:
        return f"[{a}-{b}]"
    if a[0] == b[0]:
        return a[0] + _digits(a[1:], b[1:])
    rest = len(a) - 1
    parts = []
    first, last = int(a[0]), int(b[0])
    if a[1:] != "0" * rest:
        parts.append(a[0] + _digits(a[1:], "9" * rest))
        first += 1
    if b[1:] != "9" * rest:
        parts.append(b[0] + _digits("0" * rest, b[1:]))
        last -= 1
    if first <= last:
        parts.append(f"[{first}-{last}][0-9]{{{rest}}}")
    return "(?:" + "|".join(parts) + ")"


def _decimal(low: float, high: float, *, low_open: bool) -> str:
    """A regex of numbers in the range written with up to three decimals: a subset of the range."""
    top = int(high)
    start = math.ceil(low) + (1 if low_open and low == math.ceil(low) else 0)
    parts = []
    if start <= top - 1:
        parts.append(f"{_whole(max(start, 0), top - 1)}(?:\\.[0-9]{{1,3}})?")
    if start <= top:
        parts.append(str(top))
    if low < 1:
        thousandths = math.floor(low * 1000) + 1 if low_open else math.ceil(low * 1000)
        if thousandths <= 999:
            parts.append(f"0\\.{_digits(f'{max(thousandths, 0):03d}', '999')}")
    return "(?:" + "|".join(parts) + ")"


_BINARY = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0, "Ti": 1024.0**2}
_DECIMAL = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}  # bytes
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|k|M|G|T)\s*$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(d|h|m|s)")
_DURATION = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?(?:d|h|m|s))+$")
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


#: Characters of a rejected key or value that an error message repeats. The message is the reason
#: given for every candidate node of the pod (and an Event): with whole values, one 250 KB value and
#: 5,000 candidates made a 1.25 GB answer.
SHOWN_CHARS = 64


def shown(value: object, limit: int = SHOWN_CHARS, *, quoted: bool = True) -> str:
    """`repr(value)` (`str` unless `quoted`), cut to `limit` characters with the full length said."""
    text = repr(value) if quoted else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(value) if isinstance(value, str) else len(text)} characters)"


class AnnotationError(ValueError):
    """A pod annotation that cannot be accepted: the key (with prefix), its value, what is accepted."""

    def __init__(self, key: str, value: object, accepted: str) -> None:
        self.key = key
        self.value = value
        self.accepted = accepted
        super().__init__(f"{shown(key, quoted=False)}={shown(value)} is not valid: expected {accepted}")


@dataclass(frozen=True)
class JobRequest:
    """What a pod asks for. `spec` is None when only `gpu-memory` was given (no prediction)."""

    gpu_job: bool
    spec: JobSpec | None = None
    gpus: int = DEFAULT_GPUS
    memory_override_mib: float | None = None
    deadline_s: float | None = None
    criticality: int = 1
    criticality_source: str = "default"  # "annotation", "annotation (capped)", "PriorityClass", "default"
    gpu_share: float | None = None  # declared GPU duty (0..1); None: not declared (GPU-bound prior)
    checkpoint_interval_s: float | None = None

    @property
    def signature(self) -> str:
        """A stable key for the usage rule's per-signature peaks: the job's description."""
        if self.spec is None:
            return ""
        return ",".join(f"{k}={v}" for k, v in sorted(self.spec.to_annotations().items()))


def parse_job(
    annotations: Mapping[str, str],
    *,
    created_s: float | None,
    now_s: float,
    priority_value: int | None = None,
    priority_class: str = "",
    criticality_ceiling: int = len(CRITICALITIES) - 1,
) -> JobRequest:
    """Annotations -> JobRequest; raises AnnotationError naming the first bad key.

    `created_s` anchors a duration deadline (`6h` from pod creation; `now_s` when unknown). A
    PriorityClass (`priority_class` set and `priority_value` known) sets the criticality and wins
    over the annotation; otherwise the annotation is capped by `criticality_ceiling`.
    """
    ours = {key[len(PREFIX):]: value for key, value in annotations.items() if key.startswith(PREFIX)}
    for key, value in ours.items():
        if key not in KNOWN_KEYS:
            raise AnnotationError(PREFIX + key, value, "one of the keys " + ", ".join(
                PREFIX + k for k in (*JOB_KEYS, *SCHEDULING_KEYS)))
        if key in ACCEPTED and len(value) > VALUE_MAX_CHARS:
            raise AnnotationError(PREFIX + key, value, f"a value of at most {VALUE_MAX_CHARS} characters")
    override = _memory(ours["gpu-memory"]) if "gpu-memory" in ours else None
    described = "model-type" in ours or "model" in ours  # `model` (exact architecture) implies its type
    if not described and override is None:
        return JobRequest(gpu_job=False)
    spec: JobSpec | None = None
    if described:
        for key in EXPLICIT_KEYS:  # JobSpec reads 0 as "the family's default"
            if key in ours and _is_zero(ours[key]):
                rule = ACCEPTED[key]
                accepted = (f"a number in (0, {rule.high:g}]" if rule.kind == "number" else
                            f"a whole number from {int(rule.low)} to {int(rule.high):,}")
                raise AnnotationError(PREFIX + key, ours[key], f"{accepted} (leave the key out for its default)")
        try:
            spec = JobSpec.parse({k: v for k, v in ours.items() if k in JOB_KEYS})
        except SpecError as err:
            raise AnnotationError(PREFIX + err.key, err.value, err.accepted) from None
    gpus = _gpus(ours["gpus"]) if "gpus" in ours else DEFAULT_GPUS
    anchor_s = created_s if created_s is not None else now_s
    deadline = _deadline(ours["deadline"], anchor_s) if "deadline" in ours else None
    requested = _criticality(ours.get("criticality", DEFAULT_CRITICALITY))
    if priority_class and priority_value is not None:
        level, source = criticality_from_priority_class(priority_value), "PriorityClass"
    else:
        level = cap_criticality(requested, criticality_ceiling)
        source = "annotation (capped)" if level < requested else ("annotation" if "criticality" in ours else "default")
    share = _gpu_share(ours["gpu-share"]) if "gpu-share" in ours else None
    checkpoint = _checkpoint_interval(ours["checkpoint-interval"]) if "checkpoint-interval" in ours else None
    return JobRequest(True, spec, gpus, override, deadline, level, source, share, checkpoint)


def format_time(wall_s: float) -> str:
    """Unix seconds -> RFC 3339 in UTC with a `Z` (what `deepres.io/bound-at` holds)."""
    return datetime.fromtimestamp(wall_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """An RFC 3339 time with a zone -> Unix seconds; raises ValueError for anything else."""
    value = text.strip()
    if len(value) > VALUE_MAX_CHARS or "T" not in value.upper() or not value.isascii():
        raise ValueError(text)
    moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(text)
    stamp = moment.timestamp()
    if not math.isfinite(stamp):
        raise ValueError(text)
    return stamp


def parse_memory_quantity(text: str) -> float:
    """`24Gi`, `24576Mi`, `25G` -> MiB; raises ValueError for anything else."""
    match = _QUANTITY.match(text) if len(text) <= VALUE_MAX_CHARS else None
    if not match:
        raise ValueError(text)
    number, unit = float(match.group(1)), match.group(2)
    return number * _BINARY[unit] if unit in _BINARY else number * _DECIMAL[unit] / (1024.0 * 1024.0)


def parse_duration_s(text: str) -> float:
    """`6h`, `1h30m`, `2d`, `90s` -> seconds; raises ValueError for anything else."""
    compact = text.strip()
    if len(compact) > VALUE_MAX_CHARS or not _DURATION.match(compact):
        raise ValueError(text)
    return sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(compact))


def _is_zero(text: str) -> bool:
    try:
        return read_number(text) == 0.0
    except ValueError:
        return False  # not a number: JobSpec's parser names the problem


def _memory(text: str) -> float:
    accepted = "a memory quantity with a unit, e.g. 24Gi or 24576Mi (Ki, Mi, Gi, Ti, k, M, G, T), 64Mi to 4Ti"
    try:
        mib = parse_memory_quantity(text)
    except ValueError:
        raise AnnotationError(PREFIX + "gpu-memory", text, accepted) from None
    low, high = GPU_MEMORY_RANGE_MIB
    if not low <= mib <= high:
        raise AnnotationError(PREFIX + "gpu-memory", text, accepted)
    return mib


def _gpus(text: str) -> int:
    accepted = f"a whole number from 1 to {MAX_GPUS} (ASCII digits)"
    rule = ACCEPTED["gpus"]
    try:  # not str.isdigit(): "²" and "①" pass it and int() refuses them (predictor/parsing.py)
        value = read_whole(text)
    except ValueError:
        raise AnnotationError(PREFIX + "gpus", text, accepted) from None
    if not rule.low <= value <= rule.high:
        raise AnnotationError(PREFIX + "gpus", text, accepted)
    return value


def _deadline(text: str, anchor_s: float) -> float:
    accepted = "an RFC 3339 time with a zone (2026-05-01T18:00:00Z) or a duration from pod creation (6h, 1h30m, 2d)"
    value = text.strip()
    try:
        seconds = parse_duration_s(value)
    except ValueError:
        pass
    else:
        if seconds <= 0 or seconds > MAX_DEADLINE_S:
            raise AnnotationError(PREFIX + "deadline", text, accepted)
        return anchor_s + seconds
    try:
        return parse_time(value)
    except (ValueError, OverflowError, OSError):
        raise AnnotationError(PREFIX + "deadline", text, accepted) from None


def _criticality(text: str) -> int:
    try:
        return CRITICALITIES.index(text.strip().lower())
    except ValueError:
        raise AnnotationError(PREFIX + "criticality", text, "one of " + ", ".join(CRITICALITIES)) from None


def _gpu_share(text: str) -> float:
    accepted = f"a number from 0 to 1 (the share of time the job keeps the GPU busy, e.g. 0.3; {SPELLING})"
    try:
        value = read_number(text)
    except ValueError:
        raise AnnotationError(PREFIX + "gpu-share", text, accepted) from None
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise AnnotationError(PREFIX + "gpu-share", text, accepted)
    return value


def _checkpoint_interval(text: str) -> float:
    accepted = "a duration above 0, e.g. 30m, 1h30m, 90s (how often the job saves a checkpoint)"
    try:
        seconds = parse_duration_s(text.strip())
    except ValueError:
        raise AnnotationError(PREFIX + "checkpoint-interval", text, accepted) from None
    if not 0.0 < seconds <= MAX_DEADLINE_S:
        raise AnnotationError(PREFIX + "checkpoint-interval", text, accepted)
    return seconds
