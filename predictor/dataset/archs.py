"""The real architectures of the dataset and the written rules that annotate them.

Four sources, all built on the meta device without any weights:
- timm: every image model of `timm.list_models()` (`pretrained=False`);
- torchvision: every classification model (`weights=None`);
- Hugging Face transformers: the named models of `hf_models.json`, built from their config class
  with the published hyper-parameters (the table names each source; never `from_pretrained`);
- torch.nn: custom stacks a data scientist writes by hand (a labelled minority, source `nn`):
  recurrent stacks (RNN, LSTM, GRU), MLPs and small CNNs over depths and widths.

Each architecture carries what the grouped splits need: `group` (resnet50 and resnet50d are one
group: a timm module, the same module for torchvision's copy of a timm family, an HF model type
with its close relatives) and `family`, the `deepres.io/model-type` a data scientist would write.
The rules (docs/data-scientist.md, "How to fill the family annotations"):

- model-type: `vit` for image models whose blocks are attention (ViT, DeiT, BEiT, EVA, Swin, CaiT,
  XCiT, PVT, MaxViT, CoAtNet, LeViT...: the timm modules in `_VIT_MODULES`); `mlp` for MLP-Mixer,
  ResMLP and gMLP; `vgg` for VGG; `resnet` for the ResNet lineage (ResNet, ResNet-D, SE/SK/ECA-ResNet,
  ResNeXt, Wide ResNet, Res2Net, ResNeSt, RegNet, NFNet, EfficientNet: `_RESNET_NAME`); `cnn` for every
  other image model (MobileNet, ConvNeXt, Inception, DenseNet...); `transformer` for encoders and
  encoder-decoders (BERT, RoBERTa, DeBERTa, XLNet, T5, BART); `gpt` for decoder-only LMs; `rnn`,
  `lstm`, `gru`, `mlp`, `cnn` for the torch.nn stacks (a hand-written CNN is `cnn`).
- params-millions: trainable parameters / 1e6 of the model as trained (at that input size).
- input-dim: image side (vision), sequence length (text, recurrent), input features (MLP).
- num-layers: the depth in the name when the name states one (resnet50 -> 50, vgg16 -> 16,
  densenet121 -> 121, wide_resnet50_2 -> 50); else for attention and mixer image models the number
  of blocks (ViT-B 12, Swin-T 2+2+6+2 = 12); else for other image models the number of weight
  layers (Conv2d and Linear modules: efficientnet_b0 82, a hand-written CNN of four convolutions
  and a Linear head 5); for text models the
  transformer blocks (encoder + decoder for encoder-decoders: t5-base 24, bert-base 12); for
  recurrent stacks the recurrent layers; for MLPs the Linear layers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from predictor.dataset import templates

HF_TABLE = Path(__file__).with_name("hf_models.json")
IMAGE_BATCHES = (8, 32, 128)
TEXT_BATCHES = (1, 8, 64)
SEQ_BATCHES = (8, 32, 128)
MLP_BATCHES = (32, 256, 2048)
TEXT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
IMAGE_CLASSES = 1000

#: timm modules whose image models are attention (or attention-like token mixer) networks.
_VIT_MODULES = frozenset({
    "beit", "cait", "coat", "convit", "crossvit", "csatv2", "davit", "deepseek_vit", "deit", "efficientformer",
    "efficientformer_v2", "efficientvit_mit", "efficientvit_msra", "eva", "focalnet", "gcvit", "gemma4_vit",
    "hiera", "hieradet_sam2", "iformer", "levit", "lowformer", "maxxvit", "mvitv2", "naflexvit", "nest",
    "nextvit", "pit", "pvt_v2", "qwen3_vit", "sequencer", "shvit", "swiftformer", "swin_transformer",
    "swin_transformer_v2", "swin_transformer_v2_cr", "tiny_vit", "tnt", "twins", "visformer",
    "vision_transformer", "vision_transformer_hybrid", "vision_transformer_relpos", "vision_transformer_sam",
    "vitamin", "volo", "xcit",
})
_MLP_MODULES = frozenset({"mlp_mixer"})
_RESNET_NAME = re.compile(r"resne[stx]|resnet|regnet|efficientnet|nfnet|res2ne|wide_res")
_NAME_DEPTH = re.compile(r"^(?:[a-z0-9]+_)??(?:se|sk|eca|gc|ge|seres|tv|tv2|gluon|legacy|wide_)?"
                         r"(?:resnet|resnext|vgg|densenet|res2net|resnest|resnetrs|resnetblur|resnetaa)(\d+)")
#: torchvision model name prefix -> the timm module that holds the same family (one group across sources).
_TV_GROUPS: tuple[tuple[str, str], ...] = (
    ("resnext", "resnet"), ("wide_resnet", "resnet"), ("resnet", "resnet"), ("vgg", "vgg"),
    ("densenet", "densenet"), ("efficientnet", "efficientnet"), ("mobilenet_v2", "efficientnet"),
    ("mnasnet", "efficientnet"), ("mobilenet_v3", "mobilenetv3"), ("regnet", "regnet"),
    ("convnext", "convnext"), ("inception_v3", "inception_v3"), ("swin_v2", "swin_transformer_v2"),
    ("swin", "swin_transformer"), ("vit", "vision_transformer"), ("maxvit", "maxxvit"),
    ("googlenet", "googlenet"), ("alexnet", "alexnet"), ("squeezenet", "squeezenet"),
    ("shufflenet", "shufflenet"),
)
#: HF model type -> group (close relatives share one).
_HF_GROUPS = {
    "bert": "bert", "roberta": "bert", "distilbert": "bert", "albert": "bert", "deberta": "deberta",
    "deberta-v2": "deberta", "xlnet": "xlnet", "t5": "t5", "bart": "bart", "gpt2": "gpt2", "opt": "opt",
    "gpt_neox": "gpt_neox", "llama": "llama", "mistral": "llama", "qwen2": "llama", "phi": "phi",
    "xlm-roberta": "bert", "electra": "bert", "modernbert": "modernbert", "mbart": "bart", "pegasus": "bart",
    "marian": "bart", "gpt_neo": "gpt_neo", "gptj": "gpt_neo", "bloom": "bloom", "gemma": "llama", "phi3": "phi",
    "vit": "vision_transformer", "beit": "beit", "swin": "swin_transformer", "convnext": "convnext",
    "resnet": "resnet",
}


@dataclass(frozen=True)
class Arch:
    """One architecture of the dataset (what is traced, and how a data scientist annotates it)."""

    name: str  # "timm/resnet50", "torchvision/vgg16", "hf/bert-base-uncased", "nn/lstm-l2-h1024"
    source: str  # timm | torchvision | hf | nn
    group: str
    family: str  # the model-type a data scientist writes (vgg is kept: an alias of cnn)
    kind: str  # image | text | seq2seq | sequence | features
    inputs: tuple[int, ...]  # the default input first
    batches: tuple[int, ...]


def image_family(name: str, module: str) -> str:
    """The model-type rule for an image model (see the module docstring)."""
    base = name.split("/")[-1]
    if module in _VIT_MODULES or base.startswith(("vit_", "swin", "maxvit", "deit", "beit")):
        return "vit"
    if module in _MLP_MODULES:
        return "mlp"
    if base.startswith("vgg"):
        return "vgg"
    if _RESNET_NAME.search(base):
        return "resnet"
    return "cnn"


def name_depth(name: str) -> int | None:
    """The depth a model's name states (resnet50 -> 50, vgg16_bn -> 16), or None."""
    match = _NAME_DEPTH.match(name.split("/")[-1])
    return int(match.group(1)) if match else None


def _sides(default: int) -> tuple[int, ...]:
    """The default image side and two others (3/4 and 3/2 of it, to multiples of 32)."""
    others = [max(32, round(default * f / 32) * 32) for f in (0.75, 1.5)]
    return tuple(dict.fromkeys([default, *others]))


def _lengths(max_len: int) -> tuple[int, ...]:
    fit = [n for n in TEXT_LENGTHS if n <= max_len] or [max_len]
    return tuple(dict.fromkeys([fit[0], fit[len(fit) // 2], fit[-1]]))


@cache
def timm_modules() -> dict[str, str]:
    import timm

    return {name: module for module in timm.list_modules() for name in timm.list_models(module=module)}


def timm_archs() -> list[Arch]:
    import timm.models

    out = []
    for name, module in sorted(timm_modules().items()):
        cfg = timm.models.get_pretrained_cfg(name)
        side = int(cfg.input_size[-1]) if cfg is not None else 224
        out.append(Arch(f"timm/{name}", "timm", module, image_family(name, module), "image", _sides(side),
                        IMAGE_BATCHES))
    return out


def torchvision_archs() -> list[Arch]:
    import torchvision

    out = []
    for name in sorted(torchvision.models.list_models(module=torchvision.models)):
        group = next((g for prefix, g in _TV_GROUPS if name.startswith(prefix)), name.rstrip("0123456789_"))
        side = 299 if name == "inception_v3" else 224
        out.append(Arch(f"torchvision/{name}", "torchvision", group, image_family(name, group), "image",
                        _sides(side), IMAGE_BATCHES))
    return out


@cache
def hf_table() -> dict[str, dict[str, Any]]:
    data = json.loads(HF_TABLE.read_text())
    return {m["name"]: m for m in data["models"]}


def hf_config(entry: dict[str, Any]) -> Any:
    import transformers

    config = getattr(transformers, entry["config"])(**entry["hparams"])
    config.use_cache = False
    return config


def _max_len(config: Any) -> int:
    for attr in ("max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return min(value - (2 if config.model_type == "roberta" else 0), 4096)
    return 4096


def hf_archs() -> list[Arch]:
    out = []
    for name, entry in sorted(hf_table().items()):
        config = hf_config(entry)
        task = entry["task"]
        group = _HF_GROUPS.get(config.model_type, config.model_type)
        if task == "image":
            side = int(config.image_size) if hasattr(config, "image_size") else 224
            out.append(Arch(f"hf/{name}", "hf", group, image_family(name, group), "image", _sides(side),
                            IMAGE_BATCHES))
            continue
        family = "gpt" if task == "clm" and config.model_type != "xlnet" else "transformer"
        out.append(Arch(f"hf/{name}", "hf", group, family, "seq2seq" if task == "seq2seq" else "text",
                        _lengths(_max_len(config)), TEXT_BATCHES))
    return out


#: torch.nn stacks a data scientist writes by hand: (cell, layers, hidden), (depth, width) and small
#: CNNs (depth = Conv2d + Linear layers, base width, head); inputs are sequence lengths / features / sides.
RNN_GRID = [(cell, layers, hidden) for cell in ("rnn", "lstm", "gru") for layers in (1, 2, 4, 8)
            for hidden in (128, 256, 1024, 2048)]
MLP_GRID = [(depth, width) for depth in (2, 3, 4, 6, 8, 12, 16) for width in (256, 1024, 4096)]
MLP_GRID += [(depth, 64) for depth in (2, 3, 4, 6)]
CNN_GRID = [(depth, width, "gap") for depth in (2, 3, 4, 5, 6, 8, 10, 12) for width in (16, 64, 256)]
CNN_GRID += [(depth, width, "fc") for depth in (3, 5, 8, 12) for width in (32, 128)]
CNN_SIDES = (224, 32, 64)  # ImageNet-sized, CIFAR-sized, Tiny-ImageNet-sized
RNN_FEATURES = 256
RNN_CLASSES = 10


def nn_archs() -> list[Arch]:
    out = [Arch(f"nn/{cell}-l{layers}-h{hidden}", "nn", f"nn-{cell}", cell, "sequence", (256, 64, 1024), SEQ_BATCHES)
           for cell, layers, hidden in RNN_GRID]
    out += [Arch(f"nn/mlp-d{depth}-w{width}", "nn", "nn-mlp", "mlp", "features", (1024, 784, 16384), MLP_BATCHES)
            for depth, width in MLP_GRID]
    out += [Arch(f"nn/cnn-d{depth}-w{width}-{head}", "nn", "nn-cnn", "cnn", "image", CNN_SIDES, IMAGE_BATCHES)
            for depth, width, head in CNN_GRID]
    return out


def small_cnn(depth: int, width: int, head: str, classes: int = IMAGE_CLASSES) -> nn.Module:
    """The plain CNN people write by hand: `depth` weight layers, i.e. 3x3 Conv2d + BatchNorm + ReLU
    blocks in up to four stages (widths w, 2w, 4w, 8w, 2x2 max-pool after each), then a head of one
    Linear after global average pooling (`gap`) or two Linear layers with dropout after a 4x4
    adaptive pool (`fc`, the VGG-style classifier)."""
    convs = depth - (1 if head == "gap" else 2)
    if convs < 1:
        raise ValueError(f"small_cnn: depth {depth} leaves no convolution for head {head!r}")
    n_stages = min(4, convs)
    per_stage = [convs // n_stages + (1 if s >= n_stages - convs % n_stages else 0) for s in range(n_stages)]
    layers: list[nn.Module] = []
    c_in = 3
    for stage, count in enumerate(per_stage):
        c_out = width * 2 ** stage
        for _ in range(count):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            c_in = c_out
        layers.append(nn.MaxPool2d(2))
    if head == "gap":
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes)]
    else:
        layers += [nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(c_in * 16, 512), nn.ReLU(inplace=True),
                   nn.Dropout(0.5), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def all_archs(sources: tuple[str, ...] = ("timm", "torchvision", "hf", "nn")) -> list[Arch]:
    listing: dict[str, Callable[[], list[Arch]]] = {
        "timm": timm_archs, "torchvision": torchvision_archs, "hf": hf_archs, "nn": nn_archs}
    return [a for s in sources for a in listing[s]()]


# ---------------------------------------------------------------------------------------------
# Building one architecture for tracing: (model, make_batch, loss)

Batch = Callable[[torch.dtype], tuple[torch.Tensor, torch.Tensor]]
BatchOf = Callable[[int], Batch]  # batch size -> batch maker
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _Logits(nn.Module):
    """An HF model as `forward(x) -> logits` (what the traced loop calls)."""

    def __init__(self, model: nn.Module, task: str, target_len: int) -> None:
        super().__init__()
        self.model = model
        self.task = task
        self.target_len = target_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.task == "image":
            return self.model(pixel_values=x).logits  # type: ignore[no-any-return]
        if self.task == "seq2seq":
            return self.model(input_ids=x, decoder_input_ids=x[:, : self.target_len]).logits  # type: ignore[no-any-return]
        return self.model(input_ids=x).logits  # type: ignore[no-any-return]


@contextmanager
def _regnet_widths_on_cpu() -> Iterator[None]:
    """torchvision's RegNet computes its block widths with tensors of the default device and reads
    them back (`.tolist()`): on the meta device there is nothing to read, so compute them on the CPU."""
    from torchvision.models import regnet

    original = regnet.BlockParams.__dict__["from_init_params"]

    def on_cpu(cls: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.device("cpu"):
            return original.__func__(cls, *args, **kwargs)

    regnet.BlockParams.from_init_params = classmethod(on_cpu)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        regnet.BlockParams.from_init_params = original  # type: ignore[method-assign]


def _token_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), target.reshape(-1))


def build(arch: Arch, input_dim: int) -> tuple[nn.Module, BatchOf, Loss]:
    """The architecture at this input size (call on the meta device), batch size -> batch maker
    (inputs, targets; floating inputs in the dtype asked for), and the loss."""
    base = arch.name.split("/", 1)[1]
    if arch.source == "timm":
        import timm
        import timm.models

        cfg = timm.models.get_pretrained_cfg(base)
        fixed = cfg is not None and bool(getattr(cfg, "fixed_input_size", False))
        default = arch.inputs[0]
        if fixed and input_dim != default:
            model = timm.create_model(base, pretrained=False, img_size=input_dim)
        else:
            model = timm.create_model(base, pretrained=False)
        return model, _image_batch(input_dim), F.cross_entropy
    if arch.source == "torchvision":
        import torchvision

        kwargs: dict[str, Any] = {"weights": None}
        if base.startswith("vit_") and input_dim != arch.inputs[0]:
            kwargs["image_size"] = input_dim
        if base == "inception_v3":
            kwargs.update(aux_logits=False, init_weights=False)
        if base == "googlenet":
            kwargs.update(aux_logits=False, init_weights=False)
        if base.startswith("regnet"):
            with _regnet_widths_on_cpu():
                model = torchvision.models.get_model(base, **kwargs)
        else:
            model = torchvision.models.get_model(base, **kwargs)
        return model, _image_batch(input_dim), F.cross_entropy
    if arch.source == "hf":
        import transformers

        entry = hf_table()[base]
        config = hf_config(entry)
        task = entry["task"]
        if task == "image":
            config.image_size = input_dim
            model = transformers.AutoModelForImageClassification.from_config(config)  # type: ignore[no-untyped-call]
            return _Logits(model, task, 0), _image_batch(input_dim), F.cross_entropy
        auto = {"mlm": transformers.AutoModelForMaskedLM, "clm": transformers.AutoModelForCausalLM,
                "seq2seq": transformers.AutoModelForSeq2SeqLM}[task]
        target_len = max(16, input_dim // 4) if task == "seq2seq" else input_dim
        model = auto.from_config(config)  # type: ignore[no-untyped-call]
        return _Logits(model, task, target_len), _token_batch(input_dim, target_len), _token_loss
    if arch.family in ("rnn", "lstm", "gru"):
        _, layers, hidden = re.match(r"(\w+)-l(\d+)-h(\d+)", base).groups()  # type: ignore[union-attr]
        hp = {"features": RNN_FEATURES, "hidden": int(hidden), "layers": int(layers), "dropout": 0.0,
              "classes": RNN_CLASSES}
        model = templates._TimeParallelRecurrent(arch.family, hp)  # same parameters, FLOPs and saved tensors
        return model, _sequence_batch(input_dim), F.cross_entropy
    if arch.family == "cnn":
        depth, width, head = re.match(r"cnn-d(\d+)-w(\d+)-(\w+)", base).groups()  # type: ignore[union-attr]
        return small_cnn(int(depth), int(width), head), _image_batch(input_dim), F.cross_entropy
    depth, width = (int(v) for v in re.match(r"mlp-d(\d+)-w(\d+)", base).groups())  # type: ignore[union-attr]
    modules: list[nn.Module] = []
    n_in = input_dim
    for _ in range(depth - 1):
        modules += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    modules.append(nn.Linear(n_in, IMAGE_CLASSES))
    return nn.Sequential(*modules), _features_batch(input_dim), F.cross_entropy


def _image_batch(side: int) -> BatchOf:
    return lambda b: lambda dtype: (torch.empty(b, 3, side, side, dtype=dtype), torch.empty(b, dtype=torch.long))


def _token_batch(length: int, target_len: int) -> BatchOf:
    return lambda b: lambda dtype: (torch.empty(b, length, dtype=torch.long),
                                    torch.empty(b, target_len, dtype=torch.long))


def _sequence_batch(length: int) -> BatchOf:
    return lambda b: lambda dtype: (torch.empty(b, length, RNN_FEATURES, dtype=dtype), torch.empty(b, dtype=torch.long))


def _features_batch(features: int) -> BatchOf:
    return lambda b: lambda dtype: (torch.empty(b, features, dtype=dtype), torch.empty(b, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# The annotation a data scientist writes for a built model


def num_layers(arch: Arch, model: nn.Module) -> int:
    """The num-layers rule (module docstring)."""
    base = arch.name.split("/", 1)[1]
    if arch.kind == "image":
        depth = name_depth(base)
        if depth is not None:
            return depth
        if arch.family in ("vit", "mlp"):
            blocks = _count_blocks(model)
            if blocks:
                return blocks
        return sum(isinstance(m, nn.Conv2d | nn.Linear) for m in model.modules())
    if arch.source == "hf":
        config = hf_config(hf_table()[base])
        return int(_hf_depth(config))
    if arch.family in ("rnn", "lstm", "gru"):
        return int(re.search(r"-l(\d+)", base).group(1))  # type: ignore[union-attr]
    return sum(isinstance(m, nn.Linear) for m in model.modules())


def _hf_depth(config: Any) -> int:
    if getattr(config, "is_encoder_decoder", False):
        enc = getattr(config, "encoder_layers", None) or getattr(config, "num_layers", 0)
        dec = getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None) or enc
        return int(enc or 0) + int(dec or 0)
    for attr in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    depths = getattr(config, "depths", None)
    return int(sum(depths)) if depths else 0


def _count_blocks(model: nn.Module) -> int:
    """Transformer/mixer blocks: `model.blocks` (ViT-style), else the blocks of each stage."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.Sequential | nn.ModuleList) and len(blocks) > 0:
        extra = getattr(model, "blocks_token_only", None)  # CaiT's class-attention blocks
        return len(blocks) + (len(extra) if isinstance(extra, nn.Sequential | nn.ModuleList) else 0)
    total = 0
    for stages_attr in ("stages", "layers", "levels"):
        stages = getattr(model, stages_attr, None)
        if isinstance(stages, nn.Sequential | nn.ModuleList):
            for stage in stages:
                inner = getattr(stage, "blocks", None)
                if isinstance(inner, nn.Sequential | nn.ModuleList):
                    total += len(inner)
            if total:
                return total
    return sum(1 for m in model.modules() if type(m).__name__.lower().endswith("attention")
               and not any(type(c).__name__.lower().endswith("attention") for c in m.children()))


def has_dropout(model: nn.Module) -> bool:
    """regularization: the model trains with an active dropout layer (p > 0)."""
    return any(isinstance(m, nn.Dropout | nn.Dropout2d) and m.p > 0 for m in model.modules())


def trainable_params(model: nn.Module) -> int:
    return templates.count_parameters(model)
