"""`deepres profile pkg.module:build`: trace the user's own training step on the CPU, no GPU, and print
the pod annotations to paste (`deepres.io/traced-peak-mib` and the family fields).

`build()` returns `(model, optimizer, batch, loss_fn)`: the model, the optimizer over its parameters,
one example batch `(inputs, targets)` (inputs a tensor, a tuple of tensors, or a dict of keyword
tensors) and `loss_fn(output, targets) -> loss`. It is called on PyTorch's meta device with random
initialisation skipped, so nothing is allocated and a model of a billion parameters builds and traces
in seconds: the same tracer as the dataset (predictor/dataset/tracing.py): forward, loss, backward
and the optimizer's step, at the steady state (optimizer state present), with the optimizer's
multi-tensor implementation, as CUDA runs it. `build` may also be a path `file.py:build`.

The Python API takes the same inputs: `profile_step(model, optimizer, batch, loss_fn, precision=...)`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from predictor import exact
from predictor.dataset import tracing
from predictor.spec import MODEL_ALIASES, PRECISIONS

PREFIX = "deepres.io/"


@dataclass(frozen=True)
class Profile(tracing.Trace):
    """One traced training step of the user's code (the tracer's `Trace`: peak, breakdown, FLOPs,
    seconds) and what to annotate the pod with."""

    memory_mib: float
    memory_mib_upper: float
    params_millions: float
    batch_size: int
    input_dim: int
    model_type: str
    precision: str
    optimizer: str
    activations_millions: float = 0.0  # one sample's forward activation count (`deepres.io/activations-millions`)

    @property
    def traced_peak_mib(self) -> float:
        return round(self.peak_mib, 1)

    @property
    def gflops_per_iteration(self) -> float:
        return round(self.flops / 1e9, 3)

    def annotations(self) -> dict[str, str]:
        return {
            "traced-peak-mib": f"{self.traced_peak_mib:.1f}", "model-type": self.model_type,
            "params-millions": f"{self.params_millions:.2f}", "batch-size": str(self.batch_size),
            "input-dim": str(self.input_dim), "precision": annotation_precision(self.precision),
            "optimizer": self.optimizer,
            **({"activations-millions": f"{self.activations_millions:.4g}"} if self.activations_millions > 0 else {}),
        }


def annotation_precision(precision: str) -> str:
    """The annotation for a traced precision: the whole model in bf16 is `bf16-true` (a plain `bf16`
    annotation reads as bf16-mixed)."""
    return "bf16-true" if precision == "bf16" else precision


#: What each accepted --precision is traced as (bf16-mixed has amp's byte widths: fp32 weights,
#: gradients and states, half activations).
TRACED_AS = {"bf16-mixed": "amp"}


class _Call(nn.Module):
    """The user's model called with its batch's inputs however they are packed."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Any) -> Any:
        if isinstance(inputs, dict):
            return self.model(**inputs)
        if isinstance(inputs, tuple | list):
            return self.model(*inputs)
        return self.model(inputs)


_OPTIMIZER_NAMES = {"Adam": "adam", "AdamW": "adamw", "RMSprop": "rmsprop", "Adagrad": "adagrad"}


def optimizer_name(optimizer: torch.optim.Optimizer) -> str:
    """The annotation's optimizer for a torch optimizer (SGD with momentum > 0 is `momentum`)."""
    kind = type(optimizer).__name__
    if kind == "SGD":
        return "momentum" if float(optimizer.defaults.get("momentum", 0.0) or 0.0) > 0 else "sgd"
    return _OPTIMIZER_NAMES.get(kind, "adamw" if "adam" in kind.lower() else "sgd")


def guess_model_type(model: nn.Module) -> str:
    """A family for the annotation when the user gives none: by the layers the model has."""
    kinds = {type(m).__name__.lower() for m in model.modules()}
    if any("lstm" in k for k in kinds):
        return "lstm"
    if any(k.startswith("gru") for k in kinds):
        return "gru"
    if any(k.endswith("forcausallm") or k.startswith(("gpt", "llama", "mistral", "qwen", "opt")) for k in kinds):
        return "gpt"
    if any("attention" in k for k in kinds):
        return "vit" if any("conv2d" in k or "patch" in k for k in kinds) else "transformer"
    if any("conv" in k for k in kinds):  # docs/data-scientist.md's rule by the network's class name (ResNet, VGG...)
        from predictor.dataset.archs import image_family

        family = image_family(type(model).__name__.lower(), "")
        return family if family in ("resnet", "vgg") else "cnn"
    return "mlp"


def _optimizer_step(optimizer: torch.optim.Optimizer, numel: dict[str, int]) -> tuple[int, int]:
    """(state bytes, step bytes) of the user's optimizer class and settings (multi-tensor, as on CUDA)."""
    flats = [nn.Parameter(torch.empty(n, dtype=getattr(torch, d), device="meta")) for d, n in sorted(numel.items())]
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {k: v for k, v in optimizer.defaults.items()
                if k in accepted and k not in ("fused", "capturable", "differentiable")}
    if "foreach" in accepted:
        defaults["foreach"] = True
    step, state = tracing.second_step_cost(type(optimizer)(flats, **defaults), flats)
    return sum(t.untyped_storage().nbytes() for t in state), step


def profile_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[Any, Any],
                 loss_fn: Callable[[Any, Any], torch.Tensor], *, precision: str = "fp32",
                 model_type: str | None = None) -> Profile:
    """Trace one steady-state training step of (model, optimizer, batch, loss_fn) on the meta
    device. Built elsewhere than under `build_on_meta`, the model is moved to the meta device."""
    started = time.perf_counter()
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    model = model.to("meta")
    if precision in ("fp16", "bf16"):
        model = model.to(torch.float16 if precision == "fp16" else torch.bfloat16)
    model.train()
    inputs, targets = _to_meta(batch[0]), _to_meta(batch[1])
    wrapped = _Call(model)

    def make_batch(dtype: torch.dtype) -> tuple[Any, Any]:
        return _cast(inputs, dtype), targets

    from predictor.dataset.attention import gpu_attention

    with gpu_attention():  # the fused attention kernels a GPU runs, as in the dataset
        components = tracing.trace_components(wrapped, make_batch, loss_fn, precision=precision)
    state, step = _optimizer_step(optimizer, components.numel_by_dtype)
    peak, parts = components.peak_for(state, step)
    peak_mib = peak / tracing.MIB
    memory, upper = exact.traced_memory(round(peak_mib, 1))
    first = _first_tensor(inputs)
    batch_size = int(first.shape[0]) if first is not None and first.dim() > 0 else 1
    if first is None or first.dim() < 2:
        input_dim = 1
    elif first.dim() == 4:
        input_dim = int(first.shape[-1])  # image side
    elif first.dim() == 2 and not first.is_floating_point():
        input_dim = int(first.shape[1])  # token ids: sequence length
    elif first.dim() == 3:
        input_dim = int(first.shape[1])  # (batch, time, features): sequence length
    else:
        input_dim = int(first.shape[-1])  # features
    family = MODEL_ALIASES.get((model_type or guess_model_type(model)).lower(), "mlp")
    activations = _activations_millions(wrapped, inputs)
    return Profile(
        peak_bytes=peak, breakdown_bytes=parts, flops=components.flops, seconds=time.perf_counter() - started,
        memory_mib=memory, memory_mib_upper=upper, params_millions=sum(components.numel_by_dtype.values()) / 1e6,
        batch_size=batch_size, input_dim=input_dim, model_type=family, precision=precision,
        optimizer=optimizer_name(optimizer), activations_millions=activations)


def _activations_millions(wrapped: nn.Module, inputs: Any) -> float:
    """One sample's forward activation count (the dataset's rule, predictor/dataset/shapes.py), from
    the first sample of the batch; 0 when the inputs have no batch dimension to take it from."""
    from predictor.dataset.shapes import activations_millions

    def first(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value[:1] if value.dim() > 0 else value
        if isinstance(value, dict):
            return {k: first(v) for k, v in value.items()}
        if isinstance(value, tuple | list):
            return type(value)(first(v) for v in value)
        return value

    dtype = next((p.dtype for p in wrapped.parameters() if p.is_floating_point()), torch.float32)
    sample = _cast(first(inputs), dtype)  # the model as traced (fp16/bf16 weights for those precisions)
    try:
        return activations_millions(wrapped, lambda dtype: (sample, None))
    finally:
        wrapped.train()


def build_on_meta(build: Callable[[], Any]) -> tuple[nn.Module, torch.optim.Optimizer, tuple[Any, Any], Any]:
    """Call the user's build() on the meta device, random initialisation skipped."""
    with torch.device("meta"), tracing._SkipInit():  # type: ignore[no-untyped-call]
        result = build()
    if not isinstance(result, tuple | list) or len(result) != 4:
        raise ValueError("build() must return (model, optimizer, batch, loss_fn)")
    model, optimizer, batch, loss_fn = result
    if not isinstance(model, nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError("build() must return an nn.Module and a torch.optim.Optimizer first")
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        raise ValueError("the batch must be (inputs, targets)")
    return model, optimizer, (batch[0], batch[1]), loss_fn


def load_target(target: str) -> Callable[[], Any]:
    """`pkg.module:build` or `path/to/file.py:build` -> the callable."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{target!r}: expected pkg.module:build or file.py:build")
    if module_name.endswith(".py"):
        path = Path(module_name)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ValueError(f"{module_name}: no such Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{target!r}: {module_name} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_to_meta(v) for v in value)
    return value


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple | list) else ()
    for v in items:
        found = _first_tensor(v)
        if found is not None:
            return found
    return None


def render(target: str, prof: Profile, annotations: dict[str, str] | None = None) -> str:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in prof.breakdown_mib().items())
    lines = [
        f"# deepres profile {target}: one {prof.precision} training step with {prof.optimizer}, "
        f"traced on the CPU in {prof.seconds:.1f} s (meta device, no GPU)",
        f"# traced peak {prof.traced_peak_mib:.1f} MiB ({parts})",
        f"# as nvidia-smi would show it: {prof.memory_mib:.0f} MiB, bound {prof.memory_mib_upper:.0f} MiB; "
        f"{prof.gflops_per_iteration:.1f} GFLOPs per iteration",
        "# paste under metadata.annotations:",
    ]
    lines += [f'{PREFIX}{k}: "{v}"' for k, v in (annotations or prof.annotations()).items()]
    return "\n".join(lines)


#: The largest per-GPU batch and input (image side or sequence length, seq2seq target) `profile` traces: far
#: above any training job's, small enough that the traced shapes' byte counts stay exact integers.
PROFILE_BATCH_MAX = 65_536
PROFILE_INPUT_DIM_MAX = 1_048_576


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="a named model (timm/NAME, torchvision/NAME, hf/CONFIG: no code to write) "
                                       "or your own pkg.module:build / file.py:build; build() returns "
                                       "(model, optimizer, (inputs, targets), loss_fn)")
    parser.add_argument("--precision", default="fp32",
                        help="how the job trains, as your framework spells it: fp32, amp (16-mixed), bf16-mixed "
                             "(HF Trainer bf16=True; plain bf16 reads so), bf16-true or fp16 (whole model)")
    parser.add_argument("--model-type", default=None, help="the family annotation (default: guessed from the layers)")
    named = parser.add_argument_group("a named model (timm/NAME, torchvision/NAME, hf/CONFIG)")
    named.add_argument("--batch-size", type=int, default=32, help="per-GPU batch size (default 32)")
    named.add_argument("--input-dim", type=int, default=0, help="image side or sequence length (default: the model's)")
    named.add_argument("--task", default="", help="the head (hf text models): sequence-classification, "
                                                  "token-classification, masked-lm, causal-lm, seq2seq")
    named.add_argument("--target-dim", type=int, default=0, help="seq2seq target tokens (default: a quarter of input)")
    named.add_argument("--optimizer", default="adamw",
                       help="sgd, momentum, adam, adamw, rmsprop, adagrad (default adamw)")


def is_named(target: str) -> bool:
    return ":" not in target and target.split("/", 1)[0] in exact.SOURCES


def profile_named(name: str, batch_size: int, input_dim: int, precision: str, optimizer: str, task: str = "",
                  target_dim: int = 0) -> tuple[Profile, dict[str, str]]:
    """Trace a named architecture (the dataset's builders, meta device) as the user's job runs it, and
    the annotations to paste: `deepres.io/model` and the job's fields where the traced table answers
    for that input, else the traced peak and the family fields."""
    from predictor import tasks
    from predictor.dataset import archs as A
    from predictor.dataset import heads
    from predictor.spec import JobSpec, SpecError

    resolved = exact.resolve(name)
    e = exact.entry(resolved)
    default_task, _ = tasks.tasks_of(resolved)
    chosen = tasks.check_task(resolved, e["family"], tasks.parse_task(task) if task else "", target_dim)
    want = input_dim or int(e["default_input"])
    if resolved.startswith("hf/") and e["kind"] != "image":
        arch = next(a for a in A.hf_archs() if a.name == resolved)
    else:
        inputs = tuple(int(i) for i in e["inputs"])
        arch = A.Arch(resolved, resolved.split("/", 1)[0], e["group"], e["family"], e["kind"],
                      (int(e["default_input"]), *(i for i in inputs if i != int(e["default_input"]))),
                      tuple(int(b) for b in e["batches"]))
    with torch.device("meta"), tracing._SkipInit():  # type: ignore[no-untyped-call]
        if chosen != default_task or (chosen == "seq2seq" and target_dim):
            target = target_dim or max(16, want // 4)
            model, batch_of, loss = heads.build_head(arch, want, chosen, target)
        else:
            model, batch_of, loss = A.build(arch, want)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = tracing.make_optimizer(optimizer, params, 1e-3, 0.0)
        batch = batch_of(batch_size)(torch.float32)  # on the meta device too: a big batch allocates nothing
    traced_as = TRACED_AS.get(precision, precision)
    prof = replace(profile_step(model, opt, batch, loss, precision=traced_as,
                                model_type=e["family"]), precision=precision)
    raw = {"model": resolved, "batch-size": str(batch_size), "input-dim": str(want),
           "precision": annotation_precision(precision), "optimizer": optimizer,
           **({"task": chosen} if task else {}), **({"target-dim": str(target_dim)} if target_dim else {})}
    try:
        spec = JobSpec.parse(raw)
        exact.estimate(spec.model, spec.batch_size, spec.input_dim, spec.precision, spec.optimizer,
                       task=spec.task, target_dim=spec.target_dim)
        return prof, raw
    except SpecError:  # the table has no trace of that input or head: the figure traced here instead
        return prof, {**prof.annotations(), "precision": annotation_precision(precision)}


def run(args: argparse.Namespace) -> int:
    from predictor.errors import UsageError
    from predictor.spec import OPTIMIZERS, PRECISION_CHOICES, PRECISION_SPELLINGS, SpecError

    if args.model_type is not None and args.model_type.lower() not in MODEL_ALIASES:
        raise UsageError(f"--model-type {args.model_type!r}: expected one of {', '.join(sorted(MODEL_ALIASES))}")
    precision = PRECISION_SPELLINGS.get(str(args.precision).strip().lower())
    if precision is None:
        raise UsageError(f"--precision {args.precision!r}: expected one of {', '.join(PRECISION_CHOICES)}")
    if is_named(args.target):
        if args.optimizer not in OPTIMIZERS:
            raise UsageError(f"--optimizer {args.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
        bounds = (("--batch-size", args.batch_size, 1, PROFILE_BATCH_MAX),
                  ("--input-dim", args.input_dim, 0, PROFILE_INPUT_DIM_MAX),
                  ("--target-dim", args.target_dim, 0, PROFILE_INPUT_DIM_MAX))
        for flag, value, low, high in bounds:
            if not low <= value <= high:
                raise UsageError(f"{flag} {value}: expected a whole number from {low} to {high:,}"
                                 + (" (0: the model's default)" if low == 0 else ""))
        try:
            prof, annotations = profile_named(args.target, args.batch_size, args.input_dim, precision,
                                              args.optimizer, args.task, args.target_dim)
        except SpecError as err:
            raise UsageError(str(err)) from None
        print(render(args.target, prof, annotations))
        return 0
    sys.path.insert(0, str(Path.cwd()))
    try:
        build = load_target(args.target)
        model, optimizer, batch, loss_fn = build_on_meta(build)
        prof = replace(profile_step(model, optimizer, batch, loss_fn, precision=TRACED_AS.get(precision, precision),
                                    model_type=args.model_type), precision=precision)
    except (ValueError, ImportError) as err:
        raise UsageError(str(err)) from None
    except Exception as err:  # the user's code failed on the meta device: say where, no traceback
        print(f"deepres profile: tracing {args.target} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(render(args.target, prof))
    return 0
