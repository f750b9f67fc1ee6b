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

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from predictor.sizing import (  # the arithmetic lives in the torch-free module; re-exported here
    DROPOUT_P,
    PARAM_TOLERANCE,
    RNN_FEATURES,
    SMALL_CLASSES,
    HParams,
    Plan,
    _cnn_pools,
    _gates,
    plan,
)
from predictor.spec import JobSpec

__all__ = ["DROPOUT_P", "PARAM_TOLERANCE", "RNN_FEATURES", "SMALL_CLASSES", "HParams", "Plan", "plan"]


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
