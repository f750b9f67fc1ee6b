"""How a JobSpec's architecture is realised, in arithmetic only (no torch): the width that meets
the declared parameter budget and the hyper-parameters around it (`plan`).

The dataset's templates (`predictor.dataset.templates`) build their `torch.nn` modules from this
plan, and the predictor's analytic features (`predictor.features`) read it at request time, so it
lives here, importable by the torch-free runtime. The conventions per family are the templates'
(see that module's docstring).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from predictor.spec import JobSpec

#: Tolerance on the parameter count for `param_match`.
PARAM_TOLERANCE = 0.05
#: Features per time step fed to the recurrent families.
RNN_FEATURES = 64
#: Classes of the MLP and recurrent heads.
SMALL_CLASSES = 10
DROPOUT_P = 0.1
_MAX_WIDTH = 1 << 17

HParams = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """The realised architecture of a JobSpec: hyper-parameters and exact trainable parameters."""

    family: str
    hparams: HParams
    params: int
    requested_params: int

    @property
    def matched(self) -> bool:
        """Whether the realised count is within PARAM_TOLERANCE of the request."""
        return abs(self.params - self.requested_params) <= PARAM_TOLERANCE * self.requested_params

    @property
    def params_millions(self) -> float:
        return self.params / 1e6

    def arch_json(self) -> str:
        """Short, stable JSON of the realised hyper-parameters (the dataset's `arch` column)."""
        return json.dumps(self.hparams, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Parameter counts (exact, in closed form, so the width can be solved without building anything)


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _encoder_block(d: int) -> int:
    # qkv (3d^2+3d) + out proj (d^2+d) + 2 LayerNorms (4d) + ff d->4d->d (8d^2+5d)
    return 12 * d * d + 13 * d


def _vocab_size(family: str, requested: int) -> int:
    """Vocabulary grows with the budget; the top tier is the usual BERT/GPT-2 vocabulary."""
    if requested < 1_000_000:
        return 256
    if requested < 10_000_000:
        return 2048
    if requested < 50_000_000:
        return 8192
    return 50_304 if family == "gpt" else 30_522


def _image_classes(side: int) -> int:
    return 1000 if side >= 128 else 100


def _cnn_stages(num_layers: int, side: int) -> list[int]:
    """Conv layers per stage: up to 5 stages, extra layers go to the later stages (as in VGG)."""
    stages = min(5, num_layers)
    base, extra = divmod(num_layers, stages)
    return [base + (1 if s >= stages - extra else 0) for s in range(stages)]


def _cnn_pools(stages: int, side: int) -> int:
    return min(stages, max(0, int(math.log2(side)))) if side > 1 else 0


def _resnet_stages(num_blocks: int) -> list[int]:
    stages = min(4, num_blocks)
    base, extra = divmod(num_blocks, stages)
    return [base + (1 if s >= stages - extra else 0) for s in range(stages)]


def _vit_patch(side: int) -> int:
    return 16 if side >= 128 else 8 if side >= 64 else 4


def _heads(d: int) -> int:
    """Largest head count <= d/64 (at least 1) that divides d: ~64-wide heads like BERT/GPT."""
    for h in range(max(1, d // 64), 0, -1):
        if d % h == 0:
            return h
    return 1


def _count_mlp(w: int, spec: JobSpec) -> int:
    n = _linear(spec.input_dim, w) + (spec.num_layers - 1) * _linear(w, w)
    return n + _linear(w, SMALL_CLASSES)


def _count_cnn(w: int, spec: JobSpec) -> int:
    total, c_in = 0, 3
    for s, n in enumerate(_cnn_stages(spec.num_layers, spec.input_dim)):
        c_out = w * (1 << min(s, 3))
        for _ in range(n):
            total += 9 * c_in * c_out + 2 * c_out  # conv (no bias) + BatchNorm
            c_in = c_out
    return total + _linear(c_in, _image_classes(spec.input_dim))


def _count_resnet(w: int, spec: JobSpec) -> int:
    big = spec.input_dim >= 128
    total = (49 if big else 9) * 3 * w + 2 * w  # stem conv + BN
    c_in = w
    for s, n in enumerate(_resnet_stages(spec.num_layers)):
        c_out = w * (1 << s)
        for b in range(n):
            total += 9 * c_in * c_out + 2 * c_out + 9 * c_out * c_out + 2 * c_out
            if b == 0 and (s > 0 or c_in != c_out):
                total += c_in * c_out + 2 * c_out  # 1x1 downsample + BN
            c_in = c_out
    return total + _linear(c_in, _image_classes(spec.input_dim))


def _gates(family: str) -> int:
    return {"rnn": 1, "lstm": 4, "gru": 3}[family]


def _count_recurrent(h: int, spec: JobSpec) -> int:
    g = _gates(spec.model_type)
    total, n_in = 0, RNN_FEATURES
    for _ in range(spec.num_layers):
        total += g * (n_in * h + h * h + 2 * h)
        n_in = h
    return total + _linear(h, SMALL_CLASSES)


def _count_transformer(d: int, spec: JobSpec) -> int:
    vocab = _vocab_size("transformer", int(spec.params_millions * 1e6))
    emb = vocab * d + spec.input_dim * d + 2 * d  # tokens + positions + embedding LayerNorm
    return emb + spec.num_layers * _encoder_block(d) + _linear(d, 2)


def _count_gpt(d: int, spec: JobSpec) -> int:
    vocab = _vocab_size("gpt", int(spec.params_millions * 1e6))
    # tokens (tied with the vocabulary head) + positions + blocks + final LayerNorm
    return vocab * d + spec.input_dim * d + spec.num_layers * _encoder_block(d) + 2 * d


def _count_vit(d: int, spec: JobSpec) -> int:
    p = _vit_patch(spec.input_dim)
    n_patches = (spec.input_dim // p) ** 2
    emb = 3 * p * p * d + d + d + (n_patches + 1) * d  # patch conv + class token + positions
    return emb + spec.num_layers * _encoder_block(d) + 2 * d + _linear(d, _image_classes(spec.input_dim))


# family -> (count(width, spec), width step, width name)
_COUNTERS: dict[str, tuple[Callable[[int, JobSpec], int], int, str]] = {
    "mlp": (_count_mlp, 1, "width"),
    "cnn": (_count_cnn, 1, "width"),
    "resnet": (_count_resnet, 1, "width"),
    "rnn": (_count_recurrent, 1, "hidden"),
    "lstm": (_count_recurrent, 1, "hidden"),
    "gru": (_count_recurrent, 1, "hidden"),
    "transformer": (_count_transformer, 1, "d_model"),
    "gpt": (_count_gpt, 1, "d_model"),
    "vit": (_count_vit, 1, "d_model"),
}


def _solve_width(count: Callable[[int], int], step: int, target: int) -> int:
    """Width (a multiple of `step`) whose count is closest to target; counts grow with width."""
    lo, hi = 1, _MAX_WIDTH // step  # in units of step
    while lo < hi:  # first k with count(k*step) >= target
        mid = (lo + hi) // 2
        if count(mid * step) >= target:
            hi = mid
        else:
            lo = mid + 1
    best = lo
    if lo > 1 and abs(count((lo - 1) * step) - target) <= abs(count(lo * step) - target):
        best = lo - 1
    return best * step


def plan(spec: JobSpec) -> Plan:
    """The realised hyper-parameters and exact parameter count for a JobSpec, without building."""
    family = spec.model_type
    counter, step, knob = _COUNTERS[family]
    requested = max(1, round(spec.params_millions * 1e6))
    width = _solve_width(lambda w: counter(w, spec), step, requested)
    hp: HParams = {knob: width, "layers": spec.num_layers}
    if family == "mlp":
        hp.update(features=spec.input_dim, classes=SMALL_CLASSES)
    elif family in ("cnn", "resnet"):
        stages = _cnn_stages(spec.num_layers, spec.input_dim) if family == "cnn" else _resnet_stages(spec.num_layers)
        hp.update(stages=stages, image=spec.input_dim, classes=_image_classes(spec.input_dim))
    elif family in ("rnn", "lstm", "gru"):
        hp.update(seq=spec.input_dim, features=RNN_FEATURES, classes=SMALL_CLASSES)
    elif family in ("transformer", "gpt"):
        hp.update(seq=spec.input_dim, heads=_heads(width), vocab=_vocab_size(family, requested))
    else:  # vit
        p = _vit_patch(spec.input_dim)
        hp.update(image=spec.input_dim, patch=p, tokens=(spec.input_dim // p) ** 2 + 1, heads=_heads(width),
                  classes=_image_classes(spec.input_dim))
    hp["dropout"] = DROPOUT_P if spec.regularization else 0.0
    return Plan(family=family, hparams=hp, params=counter(width, spec), requested_params=requested)
