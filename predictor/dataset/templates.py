"""Architecture templates: one concrete `torch.nn` model per family, sized from a JobSpec.

A JobSpec gives a family, a parameter budget, a depth and an input size but no width. Each template
fixes everything except one width knob and solves for the width whose exact trainable-parameter
count is closest to the request (`plan`), so the same JobSpec always builds the same model and the
model really has (within 5%, or as close as the family allows) the parameters the user declared.
`plan` only does arithmetic, so it is cheap enough to run for every sampled job; `build` makes the
modules and `make_batch` the input and target tensors of one training step.

Conventions (stated so the labels can be interpreted):
- mlp: `input_dim` features, `num_layers` hidden layers of equal width, 10 classes.
- cnn: VGG-style, `num_layers` 3x3 conv+BatchNorm+ReLU layers in up to 5 stages (channels
  w, 2w, 4w, 8w, 8w; 2x2 max-pool after each stage while the image is larger than 1 pixel),
  global average pool, linear classifier (1000 classes for images >= 128 px, else 100).
- resnet: `num_layers` basic residual blocks (two 3x3 convs each) in up to 4 stages (w..8w).
- rnn/lstm/gru: `input_dim` time steps of 64 features, `num_layers` stacked layers of width h,
  a 10-class head on the last step.
- transformer: BERT-like encoder over `input_dim` tokens (learned positions), post-norm blocks,
  ff = 4d, classification head on the first token.
- gpt: decoder with causal attention, pre-norm blocks, tied token embedding / vocabulary head,
  next-token loss over every position.
- vit: patches of 16 px (8 below 128 px, 4 below 64 px), class token, pre-norm encoder blocks.
Vocabulary sizes grow with the parameter budget (256 .. 50,304) so small models are not all
embedding. `regularization` adds dropout (p=0.1) where the family has a natural place for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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


# ---------------------------------------------------------------------------------------------
# Modules


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, causal: bool) -> torch.Tensor:
    """Fused attention. On the meta device (tracing) call the kernel a GPU would pick: flash for
    fp16/bf16 heads up to 256 wide, memory-efficient otherwise; the generic entry point would fall
    back to the math kernel there and keep the (T x T) attention matrix, which GPUs never do."""
    if q.device.type == "meta":
        if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
            out: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, False)[0]
            return out
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, dropout, causal)[0]
        return out
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal)


class _Attention(nn.Module):
    """Multi-head self-attention through scaled_dot_product_attention (fused kernels on GPUs)."""

    def __init__(self, d: int, heads: int, dropout: float, causal: bool) -> None:
        super().__init__()
        self.heads, self.dropout, self.causal = heads, dropout, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        y = _attention(q, k, v, self.dropout if self.training else 0.0, self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))  # type: ignore[no-any-return]


class _Block(nn.Module):
    """Transformer block; pre-norm (GPT, ViT) or post-norm (BERT)."""

    def __init__(self, d: int, heads: int, dropout: float, causal: bool, pre_norm: bool) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = _Attention(d, heads, dropout, causal)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.ff(self.ln2(x))  # type: ignore[no-any-return]
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ff(x))  # type: ignore[no-any-return]


class _TokenModel(nn.Module):
    """BERT-like classifier (`causal=False`) or GPT-like language model (`causal=True`)."""

    def __init__(self, hp: HParams, causal: bool) -> None:
        super().__init__()
        d, self.causal = hp["d_model"], causal
        self.tok = nn.Embedding(hp["vocab"], d)
        self.pos = nn.Embedding(hp["seq"], d)
        self.drop = nn.Dropout(hp["dropout"])
        self.blocks = nn.ModuleList(
            _Block(d, hp["heads"], hp["dropout"], causal, pre_norm=causal) for _ in range(hp["layers"])
        )
        self.norm = nn.LayerNorm(d)
        self.head: nn.Module
        if causal:
            self.head = nn.Linear(d, hp["vocab"], bias=False)
            self.head.weight = self.tok.weight  # tied, as GPT-2
        else:
            self.head = nn.Linear(d, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tok(ids) + self.pos(positions))  # (B, T, d)
        if not self.causal:
            x = self.norm(x)  # BERT normalises the embeddings
        for block in self.blocks:
            x = block(x)
        if self.causal:
            return self.head(self.norm(x))  # type: ignore[no-any-return]  # (B, T, vocab)
        return self.head(x[:, 0])  # type: ignore[no-any-return]  # (B, 2)


class _ViT(nn.Module):
    def __init__(self, hp: HParams) -> None:
        super().__init__()
        d, p = hp["d_model"], hp["patch"]
        self.patch = nn.Conv2d(3, d, kernel_size=p, stride=p)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, hp["tokens"], d))
        self.blocks = nn.Sequential(
            *(_Block(d, hp["heads"], hp["dropout"], causal=False, pre_norm=True) for _ in range(hp["layers"]))
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, hp["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # (B, N, d)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])  # type: ignore[no-any-return]


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out),
        )
        self.short: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.short = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.short(x))


def _build_resnet(hp: HParams) -> nn.Module:
    w, side = hp["width"], hp["image"]
    layers: list[nn.Module]
    if side >= 128:
        layers = [nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
                  nn.MaxPool2d(3, 2, 1)]
        side = (side + 1) // 2
        side = (side + 1) // 2
    else:
        layers = [nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
    c_in = w
    for s, n in enumerate(hp["stages"]):
        c_out = w * (1 << s)
        for b in range(n):
            stride = 2 if (b == 0 and s > 0 and side > 1) else 1
            layers.append(_BasicBlock(c_in, c_out, stride))
            side = (side + 1) // 2 if stride == 2 else side
            c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, hp["classes"])]
    return nn.Sequential(*layers)


def _build_cnn(hp: HParams) -> nn.Module:
    w, side = hp["width"], hp["image"]
    layers: list[nn.Module] = []
    c_in, pools = 3, _cnn_pools(len(hp["stages"]), side)
    for s, n in enumerate(hp["stages"]):
        c_out = w * (1 << min(s, 3))
        for _ in range(n):
            layers += [nn.Conv2d(c_in, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            c_in = c_out
        if s < pools:
            layers.append(nn.MaxPool2d(2))
    if hp["dropout"]:
        layers.append(nn.Dropout(hp["dropout"]))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, hp["classes"])]
    return nn.Sequential(*layers)


def _build_mlp(hp: HParams) -> nn.Module:
    layers: list[nn.Module] = []
    n_in = hp["features"]
    for _ in range(hp["layers"]):
        layers += [nn.Linear(n_in, hp["width"]), nn.ReLU()]
        if hp["dropout"]:
            layers.append(nn.Dropout(hp["dropout"]))
        n_in = hp["width"]
    layers.append(nn.Linear(n_in, hp["classes"]))
    return nn.Sequential(*layers)


class _Recurrent(nn.Module):
    def __init__(self, family: str, hp: HParams) -> None:
        super().__init__()
        cell: Any = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[family]
        self.rnn = cell(hp["features"], hp["hidden"], num_layers=hp["layers"], batch_first=True,
                        dropout=hp["dropout"] if hp["layers"] > 1 else 0.0)
        self.head = nn.Linear(hp["hidden"], hp["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)  # (B, T, h)
        return self.head(out[:, -1])  # type: ignore[no-any-return]


class _TimeParallelLayer(nn.Module):
    """One recurrent layer traced without its time loop (see `_TimeParallelRecurrent`)."""

    def __init__(self, family: str, n_in: int, h: int) -> None:
        super().__init__()
        g = _gates(family)
        self.family, self.h = family, h
        self.weight_ih = nn.Parameter(torch.empty(g * h, n_in))
        self.weight_hh = nn.Parameter(torch.empty(g * h, h))
        self.bias_ih = nn.Parameter(torch.empty(g * h))
        self.bias_hh = nn.Parameter(torch.empty(g * h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.h
        pre = F.linear(x, self.weight_ih, self.bias_ih)  # (B, T, g*h): all input projections at once
        prev = torch.tanh(pre[..., :h])  # (B, T, h): stands in for h_{t-1}
        rec = F.linear(prev, self.weight_hh, self.bias_hh)  # (B, T, g*h): the T recurrent matmuls as one
        if self.family == "rnn":
            return torch.tanh(pre + rec)
        if self.family == "gru":
            r, z, n_in = pre.chunk(3, dim=-1)
            hr, hz, hn = rec.chunk(3, dim=-1)
            z = torch.sigmoid(z + hz)
            n = torch.tanh(n_in + torch.sigmoid(r + hr) * hn)
            return (1 - z) * n + z * prev
        i, f, g, o = (pre + rec).chunk(4, dim=-1)
        c = torch.sigmoid(f) * prev + torch.sigmoid(i) * torch.tanh(g)  # (B, T, h) cell states
        return torch.sigmoid(o) * torch.tanh(c)


class _TimeParallelRecurrent(nn.Module):
    """The recurrent model with each layer's time loop replaced by batched matmuls over time.

    Tracing a real nn.LSTM off-GPU decomposes it into T x layers small steps (tens of seconds for a
    long sequence); cuDNN instead runs one batched input GEMM and keeps the per-step gates for the
    backward pass. This stand-in has the same parameters, the same matmul FLOPs (the T recurrent
    (B, h) x (h, g*h) products are done as one (B*T, h) x (h, g*h) product) and keeps per-step gate
    and state tensors of the same sizes, so the traced memory and FLOPs match; its numerics do not
    matter for tracing.
    """

    def __init__(self, family: str, hp: HParams) -> None:
        super().__init__()
        n_in, layers = hp["features"], []
        for _ in range(hp["layers"]):
            layers.append(_TimeParallelLayer(family, n_in, hp["hidden"]))
            n_in = hp["hidden"]
        self.layers = nn.ModuleList(layers)
        self.drop = nn.Dropout(hp["dropout"])
        self.head = nn.Linear(hp["hidden"], hp["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x if i == 0 else self.drop(x))  # (B, T, h)
        return self.head(x[:, -1])  # type: ignore[no-any-return]


def build(spec: JobSpec, the_plan: Plan | None = None, *, for_tracing: bool = False) -> nn.Module:
    """The concrete model of a JobSpec (parameters on the current default device).

    `for_tracing` swaps the recurrent families' time loop for `_TimeParallelRecurrent` (same
    parameters, FLOPs and saved tensors, one dispatch per layer instead of T).
    """
    p = the_plan or plan(spec)
    hp, family = p.hparams, p.family
    if family == "mlp":
        return _build_mlp(hp)
    if family == "cnn":
        return _build_cnn(hp)
    if family == "resnet":
        return _build_resnet(hp)
    if family in ("rnn", "lstm", "gru"):
        return _TimeParallelRecurrent(family, hp) if for_tracing else _Recurrent(family, hp)
    if family in ("transformer", "gpt"):
        return _TokenModel(hp, causal=family == "gpt")
    return _ViT(hp)


def make_batch(spec: JobSpec, the_plan: Plan, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """One training batch (inputs, targets) of the shapes the model expects; floats in `dtype`."""
    hp, b = the_plan.hparams, spec.batch_size
    family = the_plan.family
    x: torch.Tensor
    if family == "mlp":
        x = torch.randn(b, hp["features"], dtype=dtype)
    elif family in ("cnn", "resnet", "vit"):
        x = torch.randn(b, 3, hp["image"], hp["image"], dtype=dtype)
    elif family in ("rnn", "lstm", "gru"):
        x = torch.randn(b, hp["seq"], hp["features"], dtype=dtype)
    else:
        x = torch.randint(0, hp["vocab"], (b, hp["seq"]))
    if family == "gpt":
        return x, torch.randint(0, hp["vocab"], (b, hp["seq"]))
    classes = 2 if family == "transformer" else hp["classes"]
    return x, torch.randint(0, classes, (b,))


def loss_of(family: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the family's head (per token for GPT)."""
    if family == "gpt":
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return F.cross_entropy(output, target)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor once (tied embeddings count once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
