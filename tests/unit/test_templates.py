"""Architecture templates: parameter targets, determinism, and models that really train."""

from __future__ import annotations

import pytest
import torch

from predictor.dataset import templates
from predictor.spec import MODEL_FAMILIES, JobSpec

# (family, params_millions, num_layers, input_dim): small but non-trivial sizes
SMALL_SPECS = [
    ("mlp", 0.5, 3, 256), ("cnn", 0.8, 4, 32), ("resnet", 1.2, 4, 32), ("rnn", 0.3, 2, 16),
    ("lstm", 1.0, 2, 16), ("gru", 0.7, 3, 16), ("transformer", 1.5, 2, 32), ("gpt", 2.0, 2, 32),
    ("vit", 1.1, 2, 32),
]


def _meta_params(spec: JobSpec) -> int:
    with torch.device("meta"):
        return templates.count_parameters(templates.build(spec))


def test_every_family_has_a_small_case() -> None:
    assert {family for family, *_ in SMALL_SPECS} == set(MODEL_FAMILIES)


@pytest.mark.parametrize(("family", "params", "layers", "dim"), SMALL_SPECS)
def test_template_hits_the_parameter_target(family: str, params: float, layers: int, dim: int) -> None:
    spec = JobSpec(model_type=family, params_millions=params, num_layers=layers, input_dim=dim)
    plan = templates.plan(spec)
    built = _meta_params(spec)
    assert built == plan.params, "plan's closed-form count must equal the built model's"
    assert abs(built - params * 1e6) <= 0.05 * params * 1e6
    assert plan.matched


@pytest.mark.parametrize("family", ["rnn", "lstm", "gru"])
def test_tracing_stand_in_has_the_same_parameters(family: str) -> None:
    spec = JobSpec(model_type=family, params_millions=2.0, num_layers=3, input_dim=64)
    with torch.device("meta"):
        real = templates.build(spec)
        stand_in = templates.build(spec, for_tracing=True)
    assert sorted(p.numel() for p in real.parameters()) == sorted(p.numel() for p in stand_in.parameters())


@pytest.mark.parametrize(("family", "params", "layers", "dim"), [
    ("gpt", 350.0, 24, 1024), ("transformer", 110.0, 12, 512), ("resnet", 25.0, 16, 224), ("lstm", 60.0, 4, 512),
])
def test_large_models_match_too(family: str, params: float, layers: int, dim: int) -> None:
    spec = JobSpec(model_type=family, params_millions=params, num_layers=layers, input_dim=dim)
    plan = templates.plan(spec)
    assert plan.matched
    assert _meta_params(spec) == plan.params


def test_plan_is_deterministic_and_cheap_to_repeat() -> None:
    spec = JobSpec(model_type="vit", params_millions=86, num_layers=12, input_dim=224)
    first, second = templates.plan(spec), templates.plan(spec)
    assert first == second
    assert first.arch_json() == second.arch_json()
    with torch.device("meta"):
        shapes_a = [tuple(p.shape) for p in templates.build(spec).parameters()]
        shapes_b = [tuple(p.shape) for p in templates.build(spec).parameters()]
    assert shapes_a == shapes_b


def test_unreachable_request_is_recorded_not_hidden() -> None:
    # 96 conv layers cannot be made as small as 1,000 parameters: the closest is the narrowest model
    spec = JobSpec(model_type="cnn", params_millions=0.001, num_layers=96, input_dim=32)
    plan = templates.plan(spec)
    assert not plan.matched
    assert plan.hparams["width"] == 1
    assert plan.params > 1000


def test_width_grows_with_the_budget() -> None:
    specs = [JobSpec(model_type="gpt", params_millions=p, num_layers=6, input_dim=128) for p in (5, 20, 80)]
    widths = [templates.plan(spec).hparams["d_model"] for spec in specs]
    assert widths == sorted(widths) and len(set(widths)) == 3


@pytest.mark.parametrize(("family", "params", "layers", "dim"), SMALL_SPECS)
def test_template_trains_for_real_on_cpu(family: str, params: float, layers: int, dim: int) -> None:
    spec = JobSpec(model_type=family, params_millions=params, num_layers=layers, input_dim=dim, batch_size=2,
                   regularization=True)
    plan = templates.plan(spec)
    torch.manual_seed(0)
    model = templates.build(spec, plan)
    x, y = templates.make_batch(spec, plan)
    loss = templates.loss_of(plan.family, model(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
