"""Labels by tracing one whole training step without allocating real memory.

The model, its optimizer state and its batch live on PyTorch's `meta` device: every operator
computes only shapes and dtypes, so a 2-billion-parameter model traces on a laptop CPU. What is
traced is the steady state, i.e. the second iteration: the optimizer has already taken a step (its
state exists), gradients were freed by `zero_grad(set_to_none=True)`, and the iteration runs
forward, loss, backward and the optimizer step under `LiveTensorTracker`, our TorchDispatchMode.
It follows every live storage (weakref finalizers fire when the last reference dies, as the CUDA
caching allocator would get the block back) and records the peak with its breakdown: parameters
(and buffers), gradients, optimizer state, activations (allocated in forward and still alive) and
temporaries (allocated in backward or the optimizer step, not gradients). The loop holds the input
batch until the forward pass has consumed it and the targets until the step ends; with that
convention the peak equals MemTracker's to the byte (tests/unit/test_dataset.py). In the same pass it adds
up FLOPs with `torch.utils.flop_counter`'s formulas, which count only matmul, convolution and
attention kernels, not element-wise work.

Why not `torch.distributed._tools.mem_tracker.MemTracker` under `FakeTensorMode`, as first planned:
measured on this machine, one BERT-base step took 15-30 s under it (FakeTensor dispatch plus the
tracker's per-module bookkeeping), which would not let 4,000 jobs finish in an hour on 1.5 cores.
The meta device, this tracker and three economies trace the same step in about 0.1-1 s of CPU:
random initialisation is skipped (shapes do not depend on it); the optimizer step is measured on
one flat tensor per dtype (`_optimizer_step_profile`); and functional operators met again with the
same input shapes replay their recorded output shapes instead of re-running Python meta kernels.
Tests check the accounting against hand-computed bytes and FLOPs.

Precision: `fp16`/`bf16` put the whole model (and so grads and optimizer state) in that dtype.
`amp` keeps fp32 master weights, grads and optimizer state and runs forward and backward on fp16
copies of the weights (what autocast's weight cast cache holds), with the loss computed in fp32 as
autocast does; element-wise ops autocast would run in fp32 (softmax, layer norm) run in fp16 here.
GradScaler's few scalars are not modelled. Optimizers use the multi-tensor (`foreach`)
implementations, the default on CUDA, whose temporaries are part of the peak.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from predictor.dataset import templates
from predictor.spec import JobSpec

_SCALAR = torch.ops.aten._local_scalar_dense.default
CATEGORIES: tuple[str, ...] = ("params", "grads", "optimizer", "activations", "temporaries")
MIB = float(1 << 20)

_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "amp": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class Trace:
    """The traced steady-state peak of one training step and the FLOPs of one iteration."""

    peak_bytes: int
    breakdown_bytes: dict[str, int]
    flops: int
    seconds: float

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MIB

    def breakdown_mib(self) -> dict[str, float]:
        return {k: v / MIB for k, v in self.breakdown_bytes.items()}


class LiveTensorTracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Bytes of live meta storages by category, and the peak with its breakdown.

    A storage is counted once however many views share it, from the operator that creates it until
    its last reference dies. `phase` decides the category of new storages ("forward" makes
    activations, anything else temporaries); `classify` re-labels existing ones (gradients).
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.phase = "forward"
        self.totals: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.peak = 0
        self.peak_breakdown: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.flops = 0
        self._cache: dict[Any, Any] = {}
        self._uncacheable: set[Any] = set()
        self._live: dict[int, list[Any]] = {}  # id(storage) -> [nbytes, category]

    def classify(self, tensor: torch.Tensor, category: str) -> None:
        """Count `tensor`'s storage under `category` (registering it if new)."""
        self._see(tensor, category)
        entry = self._live.get(id(tensor.untyped_storage()))
        if entry is not None and entry[1] != category:
            self.totals[entry[1]] -= entry[0]
            self.totals[category] += entry[0]
            entry[1] = category

    def _see(self, tensor: torch.Tensor, category: str) -> None:
        if tensor.device.type != "meta":
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        nbytes = storage.nbytes()
        self._live[key] = [nbytes, category]
        self.totals[category] += nbytes
        self.current += nbytes
        weakref.finalize(storage, self._free, key)
        if self.current > self.peak:
            self.peak = self.current
            self.peak_breakdown = dict(self.totals)

    def transient(self, category: str, nbytes: int) -> None:
        """Account for `nbytes` allocated and released at once (a measured temporary)."""
        if self.current + nbytes > self.peak:
            self.peak = self.current + nbytes
            self.peak_breakdown = dict(self.totals)
            self.peak_breakdown[category] += nbytes

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.totals[entry[1]] -= entry[0]
            self.current -= entry[0]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _SCALAR and args[0].device.type == "meta" and args[0].dtype == torch.bool:
            return True  # a data-dependent check (`torch.isfinite(x).all()`): as on healthy data
        out, flops = self._run(func, args, kwargs or {})
        self.flops += flops
        category = "activations" if self.phase == "forward" else "temporaries"
        for leaf in _tensors(out):
            self._see(leaf, category)
        return out

    def _run(self, func: Any, args: Any, kwargs: Any) -> tuple[Any, int]:
        """Run `func` (output, FLOPs), or replay both when the same functional op met the same shapes.

        Many meta kernels are Python code; a deep model repeats one block's operators with the
        same shapes dozens of times, so replaying (fresh, empty meta tensors of the recorded sizes,
        strides and dtypes) makes tracing a 96-block model cost much less than running each kernel.
        Only operators that neither mutate nor alias their inputs are replayed.
        """
        cacheable = func not in self._uncacheable and _is_functional(func)
        key = _cache_key(func, args, kwargs) if cacheable else None
        if key is not None:
            hit = self._cache.get(key)
            if hit is not None:
                return _materialise(hit[0]), hit[1]
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        flops = int(count(*args, **kwargs, out_val=out)) if count is not None else 0
        if key is not None:
            spec = _describe(out)
            if spec is None:
                self._uncacheable.add(func)
            else:
                self._cache[key] = (spec, flops)
        elif cacheable:
            self._uncacheable.add(func)
        return out, flops


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for o in out for t in _tensors(o)]
    return []


_FUNCTIONAL: dict[Any, bool] = {}


def _is_functional(func: Any) -> bool:
    """No argument written, no output aliasing an input (schema says so)."""
    known = _FUNCTIONAL.get(func)
    if known is None:
        schema = func._schema
        known = not schema.is_mutable and all(r.alias_info is None for r in schema.returns) and all(
            a.alias_info is None for a in schema.arguments)
        _FUNCTIONAL[func] = known
    return known


def _key_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), value.stride(), value.dtype, value.storage_offset(), value.device.type)
    if isinstance(value, list | tuple):
        return tuple(_key_of(v) for v in value)
    if value is None or isinstance(value, bool | int | float | str | torch.dtype | torch.device | torch.layout
                                   | torch.memory_format):
        return value
    raise TypeError("unhashable")


def _cache_key(func: Any, args: Any, kwargs: Any) -> Any:
    try:
        return (func, _key_of(args), _key_of(tuple(sorted(kwargs.items()))))
    except TypeError:
        return None


def _describe(out: Any) -> Any:
    """A replayable description of an operator's output (None when it cannot be replayed)."""
    if isinstance(out, torch.Tensor):
        if out.device.type != "meta":
            return None
        return ("T", tuple(out.shape), out.stride(), out.dtype, out.storage_offset(), out.untyped_storage().nbytes())
    if isinstance(out, list | tuple):
        parts = [_describe(o) for o in out]
        return None if any(p is None for p in parts) else (type(out), parts)
    if out is None or isinstance(out, bool | int | float):
        return ("V", out)
    return None


def _materialise(spec: Any) -> Any:
    if spec[0] == "T":
        _, shape, stride, dtype, offset, nbytes = spec
        storage = torch.empty(nbytes, dtype=torch.uint8, device="meta")
        return torch.empty(0, dtype=dtype, device="meta").set_(storage.untyped_storage(), offset, shape, stride)
    if spec[0] == "V":
        return spec[1]
    kind, parts = spec
    return kind(None if p is None else _materialise(p) for p in parts)


def make_optimizer(
    name: str, params: list[nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """The JobSpec's optimizer with the multi-tensor implementation CUDA uses by default."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay or 0.01, foreach=True)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay, foreach=True)
    raise ValueError(f"unknown optimizer {name!r}")


def trace_training_step(
    make_model: Callable[[], nn.Module],
    make_batch: Callable[[torch.dtype], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    optimizer: str = "adam",
    precision: str = "fp32",
    learning_rate: float = 1e-3,
    weight_decay: float = 0.0,
) -> Trace:
    """Trace a steady-state training iteration; see the module docstring.

    `make_batch(dtype)` returns (inputs, targets) with floating inputs in `dtype`.
    """
    started = time.perf_counter()
    dtype = _DTYPES[precision]
    with torch.device("meta"):
        with _SkipInit():  # type: ignore[no-untyped-call]  # random initialisation is irrelevant to shapes and slow on meta
            model = make_model()
        if dtype != torch.float32:
            model = model.to(dtype)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
    # outside the meta device context: optimizers keep their step counters on the CPU
    step_extra, opt_state = _optimizer_step_profile(optimizer, params, learning_rate, weight_decay)
    with torch.device("meta"):
        tracker = LiveTensorTracker()
        for p in params:
            tracker.classify(p, "params")
        for b in model.buffers():
            tracker.classify(b, "params")
        for t in opt_state:
            tracker.classify(t, "optimizer")
        with _grad_classifier(params, tracker), tracker:
            _targets = _forward_backward(model, make_batch, loss_fn, precision, tracker)  # held to the step's end
            tracker.phase = "optimizer"
            tracker.transient("temporaries", step_extra)
    return Trace(tracker.peak, dict(tracker.peak_breakdown), tracker.flops, time.perf_counter() - started)


@dataclass(frozen=True)
class StepComponents:
    """One traced forward+backward, from which the step's peak under any optimizer follows exactly.

    The optimizer's state is alive during the whole iteration (a constant `state` bytes on top of
    everything), and its step runs after backward, when only parameters, gradients and the targets
    are left (`end_bytes`), allocating `step` bytes of temporaries. So for every optimizer:
    peak = max(fb_peak + state, end + state + step). One trace per (precision, input, batch) thus
    serves all six optimizers (tests/unit/test_real_dataset.py checks it against full traces).
    """

    fb_peak_bytes: int
    fb_breakdown: dict[str, int]
    end_bytes: int
    end_breakdown: dict[str, int]
    flops: int
    numel_by_dtype: dict[str, int]  # trainable parameter elements per dtype name ("float32", ...)
    seconds: float

    def peak_for(self, state_bytes: int, step_bytes: int) -> tuple[int, dict[str, int]]:
        """(peak bytes, breakdown at the peak) with an optimizer of that state and step size."""
        during = self.fb_peak_bytes + state_bytes
        after = self.end_bytes + state_bytes + step_bytes
        if during >= after:
            parts = dict(self.fb_breakdown)
        else:
            parts = dict(self.end_breakdown)
            parts["temporaries"] += step_bytes
        parts["optimizer"] += state_bytes
        return max(during, after), parts


def trace_components(
    model: nn.Module,
    make_batch: Callable[[torch.dtype], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    precision: str = "fp32",
) -> StepComponents:
    """Trace forward, loss and backward of a model already on the meta device, in the precision's
    dtype (fp32 for amp), without an optimizer; see `StepComponents`. The model can be reused."""
    started = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    numel: dict[str, int] = {}
    for p in params:
        key = str(p.dtype).removeprefix("torch.")
        numel[key] = numel.get(key, 0) + p.numel()
    with torch.device("meta"):
        tracker = LiveTensorTracker()
        seen: set[int] = set()
        for p in params:
            tracker.classify(p, "params")
            seen.add(id(p))
        for t in (*model.parameters(), *model.buffers()):  # frozen parameters and buffers too
            if id(t) not in seen:
                tracker.classify(t, "params")
        with _grad_classifier(params, tracker), tracker:
            y = _forward_backward(model, make_batch, loss_fn, precision, tracker)
            components = StepComponents(
                tracker.peak, dict(tracker.peak_breakdown), tracker.current, dict(tracker.totals),
                tracker.flops, numel, 0.0)
        del y
    for p in params:
        p.grad = None
    return replace(components, seconds=time.perf_counter() - started)


def _forward_backward(
    model: nn.Module,
    make_batch: Callable[[torch.dtype], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    precision: str,
    tracker: LiveTensorTracker,
) -> torch.Tensor:
    """Forward, loss and backward of one iteration under `tracker` (already entered); returns the
    targets, which the caller holds until its step ends. The input batch and the output die before
    backward, as in a training loop. `amp` runs on fp16 copies of the weights (autocast's cast cache)
    and drops them when the forward pass ends."""
    x, y = make_batch(torch.float16 if precision == "amp" else _DTYPES[precision])
    if precision == "amp":
        # functional_call restores a module shared under two names with the cast copy
        # (timm's CoaT): put every original back ourselves
        saved = [(m, kind, name, t) for m in model.modules() for kind in ("_parameters", "_buffers")
                 for name, t in getattr(m, kind).items()]
        state = {n: _half(t) for n, t in (*model.named_parameters(), *model.named_buffers())}
        out = functional_call(model, state, (x,)).float()
        del state
        for m, kind, name, t in saved:
            getattr(m, kind)[name] = t
        del saved
    else:
        out = model(x)
    loss = loss_fn(out, y)
    del x, out
    tracker.phase = "backward"
    loss.backward()  # type: ignore[no-untyped-call]
    del loss
    return y


def optimizer_cost(name: str, numel_by_dtype: dict[str, int], learning_rate: float = 1e-3,
                   weight_decay: float = 0.0) -> tuple[int, int]:
    """(state bytes, step temporaries bytes) of `name` over parameters of these sizes and dtypes."""
    flats = [nn.Parameter(torch.empty(n, dtype=getattr(torch, d), device="meta"))
             for d, n in sorted(numel_by_dtype.items()) if n > 0]
    if not flats:
        return 0, 0
    step, state = _optimizer_step_profile(name, flats, learning_rate, weight_decay)
    return sum(t.untyped_storage().nbytes() for t in state), step


def _optimizer_step_profile(
    name: str, params: list[nn.Parameter], lr: float, weight_decay: float
) -> tuple[int, list[torch.Tensor]]:
    """(extra bytes the optimizer's second step allocates on top of params+grads+state, the state).

    The step runs on one flat stand-in parameter per dtype holding as many elements as the model's
    parameters of that dtype. The multi-tensor (`foreach`) implementations allocate their
    temporaries per tensor, so the total is the same as on the real list, but the stand-in takes
    a handful of dispatches instead of thousands (meta kernels of foreach ops are Python code).
    """
    numel: dict[torch.dtype, int] = {}
    for p in params:
        numel[p.dtype] = numel.get(p.dtype, 0) + p.numel()
    flats = [nn.Parameter(torch.empty(n, dtype=d, device="meta")) for d, n in numel.items()]
    return second_step_cost(make_optimizer(name, flats, lr, weight_decay), flats)


def second_step_cost(opt: torch.optim.Optimizer, flats: list[nn.Parameter]) -> tuple[int, list[torch.Tensor]]:
    """(extra bytes `opt`'s second step allocates over params+grads+state, the state) on the meta
    stand-ins `flats` it optimises: the first step creates the state, the second is measured.
    The dataset and `deepres profile` both measure optimizers this way."""
    for f in flats:
        f.grad = torch.empty_like(f)
    opt.step()  # the first step creates the state
    state = [v for st in opt.state.values() for v in st.values()
             if isinstance(v, torch.Tensor) and v.device.type == "meta"]
    tracker = LiveTensorTracker()
    for f in flats:
        tracker.classify(f, "params")
        assert f.grad is not None
        tracker.classify(f.grad, "grads")
    for t in state:
        tracker.classify(t, "optimizer")
    baseline = tracker.current
    with tracker:
        opt.step()
    return max(0, tracker.peak - baseline), state


class _SkipInit(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Turn in-place operators (initialisers such as uniform_, normal_, zero_) into no-ops."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func._overloadpacket.__name__.endswith("_") and args and isinstance(args[0], torch.Tensor):
            return args[0]
        return func(*args, **(kwargs or {}))


def _half(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float16) if t.is_floating_point() else t


@contextmanager
def _grad_classifier(params: list[nn.Parameter], tracker: LiveTensorTracker) -> Iterator[None]:
    """Label each parameter's .grad as a gradient once autograd has accumulated it."""

    def hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            tracker.classify(p.grad, "grads")

    handles = [p.register_post_accumulate_grad_hook(hook) for p in params]  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def trace_job(spec: JobSpec, the_plan: templates.Plan | None = None) -> Trace:
    """Trace one training step of the JobSpec's template model."""
    p = the_plan or templates.plan(spec)
    weight_decay = 1e-4 if spec.regularization else 0.0
    return trace_training_step(
        lambda: templates.build(spec, p, for_tracing=True),
        lambda dtype: templates.make_batch(spec, p, dtype),
        lambda out, target: templates.loss_of(p.family, out, target),
        optimizer=spec.optimizer,
        precision=spec.precision,
        learning_rate=spec.learning_rate,
        weight_decay=weight_decay,
    )
