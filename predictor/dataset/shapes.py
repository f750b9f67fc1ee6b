"""The optional shape annotations of every architecture (`activations-millions`, `hidden-size`,
`patch-size`, `vocab-size`), derived by the written rule a data scientist follows (README, "How to fill
the family annotations"):

- activations-millions: the output elements of every convolution and matrix product (Conv2d, Linear,
  matmul) of one sample's forward pass, in millions, at the job's input: fvcore's activation count, the
  "Activations (M)" of timm's model cards (resnet50 11.1, efficientnet_b0 6.7, vit_base_patch16_224 16.5
  at 224 px). Counted here on the meta device in eval mode at the architecture's default input; the
  training rows at other inputs scale it by the input units (`predictor.train.shape_columns`).

- hidden-size: text models the hidden size of the transformer (`config.hidden_size`: d_model,
  n_embd; bert-base 768, gpt2 768, t5-base 768); recurrent stacks the hidden units of a layer; MLPs
  the width of the hidden Linear layers; image models the channels of the first feature map the
  network keeps, i.e. timm's `model.feature_info[0]["num_chs"]` (ViT-B/16 768, Swin-T 96, ResNet-50
  64, EfficientNet-B0 16, ConvNeXt-T 96; a hand-written CNN its first convolution's channels).
- patch-size (image models): the input side over that feature map's side, timm's
  `feature_info[0]["reduction"]` (ViT-B/16 16, Swin-T 4, ConvNeXt-T 4, ResNet-50 2; a hand-written
  CNN whose first convolution keeps the resolution 1).
- vocab-size (text models): the vocabulary of the output logits (`config.vocab_size`).

torchvision models take the figures of the timm model of the same name (torchvision resnet50 is timm
resnet50); those without one are left without (the annotations are optional and the predictor is
trained with them missing too). Hugging Face image models read them off their config. Written by
`deepres dataset real --shapes` to predictor/data/real_shapes.json (name -> {key: value}); the
training rows take them from there (`predictor.train.load_dataset`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from predictor.dataset import archs as A
from predictor.dataset.tracing import _SkipInit

SHAPES_FILE = "real_shapes.json"
#: JobSpec attribute names of the shape annotations (predictor.spec.SHAPE_KEYS), in the table's order.
ATTRS: tuple[str, ...] = ("hidden_size", "patch_size", "vocab_size")


class _OutputCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the output elements of every convolution and matrix product (fvcore's activation count)."""

    OPS = frozenset({"convolution", "mm", "addmm", "bmm", "baddbmm"})

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func._overloadpacket.__name__ in self.OPS and isinstance(out, torch.Tensor):
            self.elements += out.numel()
        return out


def activations_millions(model: nn.Module, batch: Any) -> float:
    """The activation count of one sample's forward pass, in millions (the module docstring's rule)."""
    from predictor.dataset.real import gpu_attention

    with torch.device("meta"):
        inputs, _ = batch(torch.float32)
    counter = _OutputCounter()
    model.eval()
    with torch.device("meta"), torch.no_grad(), gpu_attention(), counter:
        model(inputs)
    return counter.elements / 1e6


def _first_level(model: nn.Module) -> dict[str, int]:
    first: Any = model.feature_info[0]  # type: ignore[index]  # timm's FeatureInfo
    return {"hidden_size": int(first["num_chs"]), "patch_size": int(first["reduction"])}


def _built(arch: A.Arch) -> tuple[nn.Module, Any]:
    with torch.device("meta"), _SkipInit():  # type: ignore[no-untyped-call]
        model, batch_of, _ = A.build(arch, arch.inputs[0])
    return model.to("meta"), batch_of(1)


def _hf_shapes(entry: dict[str, Any]) -> dict[str, int]:
    config = A.hf_config(entry)
    if entry["task"] != "image":
        return {"hidden_size": int(config.hidden_size), "vocab_size": int(config.vocab_size)}
    kind = config.model_type
    if kind in ("vit", "beit", "deit"):
        return {"hidden_size": int(config.hidden_size), "patch_size": int(config.patch_size)}
    if kind == "swin":
        return {"hidden_size": int(config.embed_dim), "patch_size": int(config.patch_size)}
    if kind == "convnext":
        return {"hidden_size": int(config.hidden_sizes[0]), "patch_size": int(config.patch_size)}
    if kind == "resnet":  # the stem's 7x7 stride-2 convolution, as timm's resnet feature_info[0]
        return {"hidden_size": int(config.embedding_size), "patch_size": 2}
    return {}


def _shape_fields(arch: A.Arch, model: nn.Module) -> dict[str, int]:
    base = arch.name.split("/", 1)[1]
    if arch.source == "timm":
        return _first_level(model)
    if arch.source == "torchvision":
        if base not in A.timm_modules():
            return {}
        import timm

        with torch.device("meta"), _SkipInit():  # type: ignore[no-untyped-call]
            return _first_level(timm.create_model(base, pretrained=False))
    if arch.source == "hf":
        return _hf_shapes(A.hf_table()[base])
    if arch.family in ("rnn", "lstm", "gru"):
        return {"hidden_size": int(re.search(r"-h(\d+)", base).group(1))}  # type: ignore[union-attr]
    if arch.family == "cnn":
        return {"hidden_size": int(re.search(r"-w(\d+)", base).group(1)), "patch_size": 1}  # type: ignore[union-attr]
    return {"hidden_size": int(re.search(r"-w(\d+)", base).group(1))}  # type: ignore[union-attr]


def shapes_of(arch: A.Arch) -> dict[str, float]:
    """The shape annotations of one architecture by the module's rule (a key is absent where the rule
    gives none); `activations_millions` at the architecture's default input (`input_default`)."""
    model, batch = _built(arch)
    out: dict[str, float] = dict(_shape_fields(arch, model))
    out["activations_millions"] = round(activations_millions(model, batch), 4)
    out["input_default"] = arch.inputs[0]
    return out


def write_table(path: Path, sources: tuple[str, ...] = ("timm", "torchvision", "hf", "nn")) -> dict[str, Any]:
    """Derive every architecture's shape annotations and write them (sorted, so the file is deterministic)."""
    table: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    arch_list = A.all_archs(sources)
    for i, arch in enumerate(arch_list):
        try:
            table[arch.name] = shapes_of(arch)
        except Exception as err:  # a model that does not build is recorded, not fatal
            errors[arch.name] = f"{type(err).__name__}: {err}"[:200]
        if i % 100 == 0:
            print(f"shapes: {i}/{len(arch_list)} {arch.name}", file=sys.stderr, flush=True)
    path.write_text(render_table(table, errors))
    return {"architectures": len(table), "with_hidden_size": sum("hidden_size" in v for v in table.values()),
            "errors": len(errors)}


def render_table(table: dict[str, dict[str, float]], errors: dict[str, str]) -> str:
    """The table as JSON with one architecture per line (small diffs), sorted by name."""
    rows = [f"    {json.dumps(name)}: {json.dumps(values)}" for name, values in sorted(table.items())]
    return ("{\n" + '  "about": "optional shape annotations per architecture (predictor/dataset/shapes.py)",\n'
            + '  "architectures": {\n' + ",\n".join(rows) + "\n  },\n"
            + f'  "errors": {json.dumps(dict(sorted(errors.items())))}\n' + "}\n")
