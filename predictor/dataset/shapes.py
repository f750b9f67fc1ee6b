"""The optional activation count of every architecture (`deepres.io/activations-millions`), derived by
the written rule a data scientist follows (docs/data-scientist.md, "How to fill the family annotations"): the output
elements of every convolution and matrix product (Conv2d, Linear, matmul) of one sample's forward pass,
in millions, at the job's input. It is fvcore's activation count, the "Activations (M)" of timm's model
cards (resnet50 11.1, efficientnet_b0 6.7, vit_base_patch16_224 16.5 at 224 px), what `deepres profile`
prints for the user's own code. Counted here on the meta device in eval mode at the architecture's
default input; the training rows at other inputs scale it by the input units, as docs/data-scientist.md tells a
user to scale a card's figure (`predictor.features.shape_columns`). Written by `deepres dataset real
--shapes` to predictor/data/real_shapes.json (name -> {activations_millions, input_default}).

Also tried, as annotations by a written rule, and dropped: `hidden-size` (d_model, recurrent units, the
channels of an image model's first feature map), `patch-size` (that map's reduction) and `vocab-size`.
On the grouped split they moved no learner beyond noise once params and layers are given, and a job
giving some without the count fell into combinations the network had not seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from predictor.dataset import archs as A
from predictor.dataset.tracing import _SkipInit
from predictor.progress import progress

SHAPES_FILE = "real_shapes.json"


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
    from predictor.dataset.attention import gpu_attention

    with torch.device("meta"):
        inputs, _ = batch(torch.float32)
    counter = _OutputCounter()
    model.eval()
    with torch.device("meta"), torch.no_grad(), gpu_attention(), counter:
        model(inputs)
    return counter.elements / 1e6


def _built(arch: A.Arch) -> tuple[nn.Module, Any]:
    with torch.device("meta"), _SkipInit():  # type: ignore[no-untyped-call]
        model, batch_of, _ = A.build(arch, arch.inputs[0])
    return model.to("meta"), batch_of(1)


def shapes_of(arch: A.Arch) -> dict[str, float]:
    """The activation count of one architecture by the module's rule, at its default input (`input_default`)."""
    model, batch = _built(arch)
    return {"activations_millions": round(activations_millions(model, batch), 4), "input_default": arch.inputs[0]}


def write_table(path: Path, sources: tuple[str, ...] = ("timm", "torchvision", "hf", "nn")) -> dict[str, Any]:
    """Derive every architecture's shape annotations and write them (sorted, so the file is deterministic)."""
    table: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    arch_list = A.all_archs(sources)
    for arch in progress(arch_list, "shapes", unit="arch"):
        try:
            table[arch.name] = shapes_of(arch)
        except Exception as err:  # a model that does not build is recorded, not fatal
            errors[arch.name] = f"{type(err).__name__}: {err}"[:200]
    path.write_text(render_table(table, errors))
    return {"architectures": len(table), "with_count": sum("activations_millions" in v for v in table.values()),
            "errors": len(errors)}


def render_table(table: dict[str, dict[str, float]], errors: dict[str, str]) -> str:
    """The table as JSON with one architecture per line (small diffs), sorted by name."""
    rows = [f"    {json.dumps(name)}: {json.dumps(values)}" for name, values in sorted(table.items())]
    return ("{\n" + '  "about": "the activation count per architecture (predictor/dataset/shapes.py)",\n'
            + '  "architectures": {\n' + ",\n".join(rows) + "\n  },\n"
            + f'  "errors": {json.dumps(dict(sorted(errors.items())))}\n' + "}\n")
